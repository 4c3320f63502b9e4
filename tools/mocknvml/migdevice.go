package main

// MIG devices, bridged from the mock's own GPU and compute instances.
//
// Why: go-nvml's mock models GPU and compute instances but not the MIG device handles NVML derives
// from them (nvmlDeviceGetMigDeviceHandleByIndex and the queries on such a handle), and every MIG
// consumer goes through those handles: GFD's MIG labels, the device plugin's MIG resources, our agent's
// inventory after a layout is applied. Without them nothing that runs on a MIG-enabled mock GPU can be
// compared. Each MIG device here is one compute instance of one GPU instance, as in NVML, and every
// value it reports is the mock's: memory and slices from the GPU-instance profile, multiprocessors and
// shared engines from the compute-instance profile, compute capability from the parent. Two things the
// mock has no notion of are derived, like the GPU UUIDs: the MIG UUID (SHA-1 of machine, GPU index, GI
// and CI IDs) and the name ("<parent name> MIG <profile>", the profile spelt by NVIDIA's go-nvlib
// from the same profile IDs and memory sizes). Queries NVML does not answer for a MIG handle (and
// this bridge does not model) are NVML_ERROR_NOT_SUPPORTED. The lookups by ID
// (nvmlDeviceGetGpuInstanceById, nvmlGpuInstanceGetComputeInstanceById) and the remaining-capacity
// calls read the same instances, with capacity.go's rules.

import (
	"crypto/sha1"
	"fmt"
	"sort"
	"unsafe"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

/*
typedef int nvmlReturn_t;
*/
import "C"

// migDevice is an NVML MIG device: the handle of one compute instance.
type migDevice struct {
	mock.Device
	parent *server.Device
	gi     *server.GpuInstance
	ci     *server.ComputeInstance
}

var migDevices = map[*server.ComputeInstance]*migDevice{}

// migDeviceFor is the one MIG device of a compute instance (the same object, so the same handle).
func migDeviceFor(parent *server.Device, gi *server.GpuInstance, ci *server.ComputeInstance) *migDevice {
	if m, ok := migDevices[ci]; ok {
		return m
	}
	m := &migDevice{parent: parent, gi: gi, ci: ci}
	giProfile := parent.Config.MIGProfiles.GpuInstanceProfiles[int(gi.Info.ProfileId)]
	ciProfile := gi.MIGProfiles.ComputeInstanceProfiles[int(gi.Info.ProfileId)][int(ci.Info.ProfileId)]
	sum := sha1.Sum([]byte(fmt.Sprintf("mocknvml/%s/gpu/%d/gi/%d/ci/%d", machine, parent.Index, gi.Info.Id, ci.Info.Id)))
	sum[6] = (sum[6] & 0x0f) | 0x50
	sum[8] = (sum[8] & 0x3f) | 0x80
	uuid := fmt.Sprintf("MIG-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
	m.GetUUIDFunc = func() (string, nvml.Return) { return uuid, nvml.SUCCESS }
	m.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	m.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return parent, nvml.SUCCESS }
	// A MIG handle's index is its place among the parent's MIG devices the process lists
	// (nvmlDeviceGetMigDeviceHandleByIndex's order), which NVIDIA's container toolkit names CDI devices by
	// ("<gpu index>:<MIG index>", pkg/nvcdi/mig-device-nvml.go), as nvidia-smi -L numbers "MIG ... Device <n>".
	m.GetIndexFunc = func() (int, nvml.Return) {
		for i, other := range listedMigDevicesOf(parent) {
			if other == m {
				return i, nvml.SUCCESS
			}
		}
		return 0, nvml.ERROR_INVALID_ARGUMENT // its compute instance is gone
	}
	m.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return int(gi.Info.Id), nvml.SUCCESS }
	m.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return int(ci.Info.Id), nvml.SUCCESS }
	m.GetCudaComputeCapabilityFunc = parent.GetCudaComputeCapability
	m.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		total := giProfile.MemorySizeMB << 20
		return nvml.Memory{Total: total, Free: total}, nvml.SUCCESS
	}
	m.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{
			MultiprocessorCount:       ciProfile.MultiprocessorCount,
			SharedCopyEngineCount:     ciProfile.SharedCopyEngineCount,
			SharedDecoderCount:        ciProfile.SharedDecoderCount,
			SharedEncoderCount:        ciProfile.SharedEncoderCount,
			SharedJpegCount:           ciProfile.SharedJpegCount,
			SharedOfaCount:            ciProfile.SharedOfaCount,
			GpuInstanceSliceCount:     giProfile.SliceCount,
			ComputeInstanceSliceCount: ciProfile.SliceCount,
			MemorySizeMB:              giProfile.MemorySizeMB,
		}, nvml.SUCCESS
	}
	m.GetNameFunc = func() (string, nvml.Return) {
		name, ret := parent.GetName()
		if ret != nvml.SUCCESS {
			return "", ret
		}
		p, err := nvdev.New(srv).NewMigProfile(int(gi.Info.ProfileId), int(ci.Info.ProfileId),
			nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, giProfile.MemorySizeMB, parent.MemoryInfo.Total)
		if err != nil {
			return "", nvml.ERROR_UNKNOWN
		}
		return name + " MIG " + p.String(), nvml.SUCCESS
	}
	migDevices[ci] = m
	return m
}

// forgetMigDevice drops a destroyed compute instance's MIG device (and its handle).
func forgetMigDevice(ci *server.ComputeInstance) {
	if m, ok := migDevices[ci]; ok {
		forget(m)
		delete(migDevices, ci)
	}
}

// migDevicesOf are a GPU's MIG devices in NVML's order: by GPU-instance ID, then compute-instance ID.
func migDevicesOf(dev *server.Device) []*migDevice {
	dev.RLock()
	gis := make([]*server.GpuInstance, 0, len(dev.GpuInstances))
	for gi := range dev.GpuInstances {
		gis = append(gis, gi)
	}
	dev.RUnlock()
	sort.Slice(gis, func(i, j int) bool { return gis[i].Info.Id < gis[j].Info.Id })
	var out []*migDevice
	for _, gi := range gis {
		gi.RLock()
		cis := make([]*server.ComputeInstance, 0, len(gi.ComputeInstances))
		for ci := range gi.ComputeInstances {
			cis = append(cis, ci)
		}
		gi.RUnlock()
		sort.Slice(cis, func(i, j int) bool { return cis[i].Info.Id < cis[j].Info.Id })
		for _, ci := range cis {
			out = append(out, migDeviceFor(dev, gi, ci))
		}
	}
	return out
}

// listedMigDevicesOf are the GPU's MIG devices this process may use (permission.go), in NVML's order: what
// it lists by index and finds by UUID.
func listedMigDevicesOf(dev *server.Device) []*migDevice {
	var out []*migDevice
	for _, m := range migDevicesOf(dev) {
		if mayUseMigDevice(m) {
			out = append(out, m)
		}
	}
	return out
}

// putMigHandleByUUID answers nvmlDeviceGetHandleByUUID for a MIG UUID: nvml.h's "UUID of the target GPU
// or MIG instance" resolves to the MIG device handle, which NVIDIA's container toolkit relies on (its CDI
// generation looks up every MIG device of NVIDIA_VISIBLE_DEVICES=all by UUID). Only MIG devices of GPUs
// this process sees and may use; NOT_FOUND for any other.
func putMigHandleByUUID(uuid string, out *unsafe.Pointer) nvml.Return {
	for _, d := range visibleDevices() {
		dev, ok := d.(*server.Device)
		if !ok {
			continue
		}
		for _, m := range listedMigDevicesOf(dev) {
			if id, _ := m.GetUUID(); id == uuid {
				return putHandle(out, m)
			}
		}
	}
	return nvml.ERROR_NOT_FOUND
}

// maxMigDevices is the most MIG devices the GPU can hold: the largest instanceCount of its profiles.
func maxMigDevices(dev *server.Device) uint32 {
	n := uint32(0)
	for _, p := range dev.Config.MIGProfiles.GpuInstanceProfiles {
		n = max(n, p.InstanceCount)
	}
	return n
}

// withFullGpu runs fn on a full GPU's handle (a MIG handle, or none, is NVML_ERROR_INVALID_ARGUMENT).
func withFullGpu(h unsafe.Pointer, fn func(*server.Device) nvml.Return) C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		dev, ret := lookup[*server.Device](h)
		if ret != nvml.SUCCESS {
			return ret
		}
		return fn(dev)
	}))
}

//export nvmlDeviceGetMaxMigDeviceCount
func nvmlDeviceGetMaxMigDeviceCount(device unsafe.Pointer, count *C.uint) C.nvmlReturn_t {
	return withFullGpu(device, func(dev *server.Device) nvml.Return { return put(count, C.uint(maxMigDevices(dev))) })
}

//export nvmlDeviceGetMigDeviceHandleByIndex
func nvmlDeviceGetMigDeviceHandleByIndex(device unsafe.Pointer, index C.uint, migHandle *unsafe.Pointer) C.nvmlReturn_t {
	return withFullGpu(device, func(dev *server.Device) nvml.Return {
		// nvml.h: NVML_ERROR_NOT_FOUND when no MIG device exists at the index, which is every index of a
		// GPU with MIG off (callers walk 0..max and skip NOT_FOUND, as go-nvlib does).
		if uint32(index) >= maxMigDevices(dev) {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		all := listedMigDevicesOf(dev)
		if int(index) >= len(all) {
			return nvml.ERROR_NOT_FOUND
		}
		return putHandle(migHandle, all[index])
	})
}

//export nvmlDeviceIsMigDeviceHandle
func nvmlDeviceIsMigDeviceHandle(device unsafe.Pointer, isMigDevice *C.uint) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		_, isMig := d.(*migDevice)
		v := C.uint(0)
		if isMig {
			v = 1
		}
		return put(isMigDevice, v)
	})
}

// withMigDevice runs fn on a MIG device's handle (a full GPU's is NVML_ERROR_NOT_SUPPORTED, as in NVML).
func withMigDevice(h unsafe.Pointer, fn func(*migDevice) nvml.Return) C.nvmlReturn_t {
	return withDevice(h, func(d nvml.Device) nvml.Return {
		m, ok := d.(*migDevice)
		if !ok {
			return nvml.ERROR_NOT_SUPPORTED
		}
		return fn(m)
	})
}

//export nvmlDeviceGetGpuInstanceId
func nvmlDeviceGetGpuInstanceId(device unsafe.Pointer, id *C.uint) C.nvmlReturn_t {
	return withMigDevice(device, func(m *migDevice) nvml.Return { return put(id, C.uint(m.gi.Info.Id)) })
}

//export nvmlDeviceGetComputeInstanceId
func nvmlDeviceGetComputeInstanceId(device unsafe.Pointer, id *C.uint) C.nvmlReturn_t {
	return withMigDevice(device, func(m *migDevice) nvml.Return { return put(id, C.uint(m.ci.Info.Id)) })
}

//export nvmlDeviceGetDeviceHandleFromMigDeviceHandle
func nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migHandle unsafe.Pointer, device *unsafe.Pointer) C.nvmlReturn_t {
	return withMigDevice(migHandle, func(m *migDevice) nvml.Return { return putHandle(device, m.parent) })
}

//export nvmlDeviceGetAttributes_v2
func nvmlDeviceGetAttributes_v2(device unsafe.Pointer, attributes unsafe.Pointer) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		if _, isMig := d.(*migDevice); !isMig {
			return nvml.ERROR_NOT_SUPPORTED // the mock models no attributes for a full GPU
		}
		a, ret := d.GetAttributes()
		if ret != nvml.SUCCESS {
			return ret
		}
		return putStruct(attributes, a)
	})
}

//export nvmlDeviceGetGpuInstanceById
func nvmlDeviceGetGpuInstanceById(device unsafe.Pointer, id C.uint, gpuInstance *unsafe.Pointer) C.nvmlReturn_t {
	return withFullGpu(device, func(dev *server.Device) nvml.Return {
		if !migEnabled(dev) {
			return nvml.ERROR_NOT_SUPPORTED
		}
		if ret := mayReadMig(dev); ret != nvml.SUCCESS {
			return ret
		}
		dev.RLock()
		defer dev.RUnlock()
		for gi := range dev.GpuInstances {
			if gi.Info.Id == uint32(id) {
				return putHandle(gpuInstance, gi)
			}
		}
		return nvml.ERROR_NOT_FOUND
	})
}

//export nvmlGpuInstanceGetComputeInstanceById
func nvmlGpuInstanceGetComputeInstanceById(gpuInstance unsafe.Pointer, id C.uint,
	computeInstance *unsafe.Pointer) C.nvmlReturn_t {
	return withGpuInstance(gpuInstance, func(g nvml.GpuInstance) nvml.Return {
		gi, ok := g.(*server.GpuInstance)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		gi.RLock()
		defer gi.RUnlock()
		for ci := range gi.ComputeInstances {
			if ci.Info.Id == uint32(id) {
				return putHandle(computeInstance, ci)
			}
		}
		return nvml.ERROR_NOT_FOUND
	})
}

//export nvmlDeviceGetGpuInstanceRemainingCapacity
func nvmlDeviceGetGpuInstanceRemainingCapacity(device unsafe.Pointer, profileID C.uint, count *C.uint) C.nvmlReturn_t {
	return withFullGpu(device, func(dev *server.Device) nvml.Return {
		p, ret := giProfileByID(dev, profileID)
		if ret != nvml.SUCCESS {
			return ret
		}
		n, ret := gpuInstanceRoom(dev, p)
		if ret != nvml.SUCCESS {
			return ret
		}
		return put(count, C.uint(n))
	})
}

//export nvmlGpuInstanceGetComputeInstanceRemainingCapacity
func nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gpuInstance unsafe.Pointer, profileID C.uint,
	count *C.uint) C.nvmlReturn_t {
	return withGpuInstance(gpuInstance, func(gi nvml.GpuInstance) nvml.Return {
		p, ret := ciProfileByID(gi, profileID)
		if ret != nvml.SUCCESS {
			return ret
		}
		n, ret := computeInstanceRoom(gi, p)
		if ret != nvml.SUCCESS {
			return ret
		}
		return put(count, C.uint(n))
	})
}
