package main

// The exported NVML functions, named and laid out as in nvml.h (NVML API 12/13). Handles and struct
// pointers are void* here: the same ABI as nvml.h's opaque handle and struct pointer types. The
// set is what the agent's NVML layer calls through nvidia-ml-py (node_agent/nvml/session.py, with
// the _v2/_v3 names pynvml resolves), plus the basic device queries any NVML client starts with.

/*
typedef int nvmlReturn_t; // nvml.h: enum nvmlReturn_enum (int-sized)
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// -- init and system -----------------------------------------------------------------------------

//export nvmlInit_v2
func nvmlInit_v2() C.nvmlReturn_t { return nvmlInitWithFlags(0) }

//export nvmlInitWithFlags
func nvmlInitWithFlags(flags C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if srv == nil { // MOCK_NVML_MACHINE named no machine: say so where a test log shows it
		fmt.Fprintln(os.Stderr, loadError)
		return C.nvmlReturn_t(nvml.ERROR_UNKNOWN)
	}
	if ret := srv.Init(); ret != nvml.SUCCESS {
		return C.nvmlReturn_t(ret)
	}
	if initCount == 0 {
		if err := loadState(); err != nil { // MOCK_NVML_STATE: the MIG layout other processes left
			fmt.Fprintf(os.Stderr, "mocknvml: MOCK_NVML_STATE: %v\n", err)
			return C.nvmlReturn_t(nvml.ERROR_UNKNOWN)
		}
		for _, d := range srv.Devices {
			handleFor(d)
		}
	}
	initCount++
	return C.nvmlReturn_t(nvml.SUCCESS)
}

//export nvmlShutdown
func nvmlShutdown() C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		if ret := srv.Shutdown(); ret != nvml.SUCCESS {
			return ret
		}
		initCount--
		return nvml.SUCCESS
	}))
}

// nvmlErrorString answers before init too, with go-nvml's own text for each code.
//
//export nvmlErrorString
func nvmlErrorString(result C.nvmlReturn_t) *C.char {
	mu.Lock()
	defer mu.Unlock()
	r := nvml.Return(result)
	if s, ok := messages[r]; ok {
		return s
	}
	s := C.CString(r.Error())
	messages[r] = s
	return s
}

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(version *C.char, length C.uint) C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		v, ret := srv.SystemGetDriverVersion()
		if ret != nvml.SUCCESS {
			return ret
		}
		return putString(version, length, v)
	}))
}

//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(version *C.char, length C.uint) C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		v, ret := srv.SystemGetNVMLVersion()
		if ret != nvml.SUCCESS {
			return ret
		}
		return putString(version, length, v)
	}))
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(cudaDriverVersion *C.int) C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		v, ret := srv.SystemGetCudaDriverVersion()
		if ret != nvml.SUCCESS {
			return ret
		}
		return put(cudaDriverVersion, C.int(v))
	}))
}

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion *C.int) C.nvmlReturn_t {
	return nvmlSystemGetCudaDriverVersion(cudaDriverVersion)
}

// -- devices -------------------------------------------------------------------------------------

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(deviceCount *C.uint) C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		if _, ret := srv.DeviceGetCount(); ret != nvml.SUCCESS {
			return ret
		}
		return put(deviceCount, C.uint(len(visibleDevices())))
	}))
}

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(index C.uint, device *unsafe.Pointer) C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		if _, ret := srv.DeviceGetCount(); ret != nvml.SUCCESS {
			return ret
		}
		visible := visibleDevices()
		if int(index) >= len(visible) {
			return nvml.ERROR_INVALID_ARGUMENT // nvml.h: index >= the accessible devices
		}
		return putHandle(device, visible[index])
	}))
}

//export nvmlDeviceGetHandleByUUID
func nvmlDeviceGetHandleByUUID(uuid *C.char, device *unsafe.Pointer) C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		if uuid == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if id := C.GoString(uuid); strings.HasPrefix(id, "MIG-") {
			return putMigHandleByUUID(id, device)
		}
		d, ret := srv.DeviceGetHandleByUUID(C.GoString(uuid))
		if ret != nvml.SUCCESS {
			return ret
		}
		if !isVisible(d) {
			return nvml.ERROR_NOT_FOUND
		}
		return putHandle(device, d)
	}))
}

// nvmlDeviceGetHandleByPciBusId_v2 finds a GPU by PCI address. NVML accepts the address in either of
// nvml.h's spellings ("domain:bus:device.function", "bus:device.function"), hex in any case; the mock
// matches its own spelling only, so both sides are parsed and compared as numbers.
//
//export nvmlDeviceGetHandleByPciBusId_v2
func nvmlDeviceGetHandleByPciBusId_v2(pciBusID *C.char, device *unsafe.Pointer) C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		if pciBusID == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		want, ok := parseBusID(C.GoString(pciBusID))
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		for _, d := range srv.Devices {
			if dev, isDev := d.(*server.Device); isDev {
				if have, ok := parseBusID(dev.PciBusID); ok && have == want && isVisible(d) {
					return putHandle(device, d)
				}
			}
		}
		return nvml.ERROR_NOT_FOUND
	}))
}

// nvmlDeviceGetHandleByPciBusId is the v1 name of the same call, which programs built against older
// headers (and go-nvml's wrappers) still link.
//
//export nvmlDeviceGetHandleByPciBusId
func nvmlDeviceGetHandleByPciBusId(pciBusID *C.char, device *unsafe.Pointer) C.nvmlReturn_t {
	return nvmlDeviceGetHandleByPciBusId_v2(pciBusID, device)
}

// parseBusID reads "[domain:]bus:device.function" (hex) as four numbers.
func parseBusID(s string) ([4]uint64, bool) {
	var out [4]uint64
	s = strings.TrimSpace(s)
	if strings.Count(s, ":") == 1 {
		s = "0:" + s
	}
	head, function, ok := strings.Cut(s, ".")
	if !ok {
		return out, false
	}
	parts := strings.Split(head, ":")
	if len(parts) != 3 {
		return out, false
	}
	for i, p := range append(parts, function) {
		v, err := strconv.ParseUint(p, 16, 32)
		if err != nil {
			return out, false
		}
		out[i] = v
	}
	return out, true
}

// withDevice runs fn on the mock device behind a handle (NVML_ERROR_INVALID_ARGUMENT if none).
func withDevice(h unsafe.Pointer, fn func(nvml.Device) nvml.Return) C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		d, ret := lookup[nvml.Device](h)
		if ret != nvml.SUCCESS {
			return ret
		}
		return fn(d)
	}))
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(device unsafe.Pointer, index *C.uint) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		i, ret := d.GetIndex()
		if ret != nvml.SUCCESS {
			return ret
		}
		if _, whole := d.(*server.Device); whole {
			v, ok := visibleIndex(d)
			if !ok {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			i = v
		}
		return put(index, C.uint(i))
	})
}

//export nvmlDeviceGetMinorNumber
func nvmlDeviceGetMinorNumber(device unsafe.Pointer, minorNumber *C.uint) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		m, ret := d.GetMinorNumber()
		if ret != nvml.SUCCESS {
			return ret
		}
		return put(minorNumber, C.uint(m))
	})
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(device unsafe.Pointer, name *C.char, length C.uint) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		s, ret := d.GetName()
		if ret != nvml.SUCCESS {
			return ret
		}
		return putString(name, length, s)
	})
}

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(device unsafe.Pointer, uuid *C.char, length C.uint) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		s, ret := d.GetUUID()
		if ret != nvml.SUCCESS {
			return ret
		}
		return putString(uuid, length, s)
	})
}

//export nvmlDeviceGetBrand
func nvmlDeviceGetBrand(device unsafe.Pointer, brand *C.int) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		b, ret := d.GetBrand()
		if ret != nvml.SUCCESS {
			return ret
		}
		return put(brand, C.int(b))
	})
}

//export nvmlDeviceGetArchitecture
func nvmlDeviceGetArchitecture(device unsafe.Pointer, arch *C.uint) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		a, ret := d.GetArchitecture()
		if ret != nvml.SUCCESS {
			return ret
		}
		return put(arch, C.uint(a))
	})
}

//export nvmlDeviceGetCudaComputeCapability
func nvmlDeviceGetCudaComputeCapability(device unsafe.Pointer, major, minor *C.int) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		ma, mi, ret := d.GetCudaComputeCapability()
		if ret != nvml.SUCCESS {
			return ret
		}
		if major == nil || minor == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*major, *minor = C.int(ma), C.int(mi)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetMemoryInfo
func nvmlDeviceGetMemoryInfo(device unsafe.Pointer, memory unsafe.Pointer) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		if ret := mayReadMig(d); ret != nvml.SUCCESS {
			return ret
		}
		m, ret := d.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return ret
		}
		return putStruct(memory, m)
	})
}

//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(device unsafe.Pointer, pci unsafe.Pointer) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		info, ret := pciInfo(d)
		if ret != nvml.SUCCESS {
			return ret
		}
		return putStruct(pci, info)
	})
}

// -- MIG mode and GPU instances ------------------------------------------------------------------

//export nvmlDeviceGetMigMode
func nvmlDeviceGetMigMode(device unsafe.Pointer, currentMode, pendingMode *C.uint) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		current, pending, ret := d.GetMigMode()
		if ret != nvml.SUCCESS {
			return ret
		}
		if currentMode == nil || pendingMode == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*currentMode, *pendingMode = C.uint(current), C.uint(pending)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceSetMigMode
func nvmlDeviceSetMigMode(device unsafe.Pointer, mode C.uint, activationStatus *C.nvmlReturn_t) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		if activationStatus == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if ret := mayChangeMigMode(); ret != nvml.SUCCESS {
			return ret
		}
		status, ret := d.SetMigMode(int(mode))
		if ret = changed(ret); ret != nvml.SUCCESS {
			return ret
		}
		*activationStatus = C.nvmlReturn_t(status)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetGpuInstanceProfileInfo
func nvmlDeviceGetGpuInstanceProfileInfo(device unsafe.Pointer, profile C.uint, info unsafe.Pointer) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		p, ret := d.GetGpuInstanceProfileInfo(int(profile))
		if ret != nvml.SUCCESS {
			return ret
		}
		return putStruct(info, p)
	})
}

// nvmlDeviceGetGpuInstancePossiblePlacements_v2: placements NULL asks for the count; otherwise
// *count must already hold at least that many (the array's size) or nothing is written.
//
//export nvmlDeviceGetGpuInstancePossiblePlacements_v2
func nvmlDeviceGetGpuInstancePossiblePlacements_v2(device unsafe.Pointer, profileID C.uint, placements unsafe.Pointer,
	count *C.uint) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		if count == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		p, ret := giProfileByID(d, profileID)
		if ret != nvml.SUCCESS {
			return ret
		}
		found, ret := d.GetGpuInstancePossiblePlacements(&p)
		if ret != nvml.SUCCESS {
			return ret
		}
		have := *count
		*count = C.uint(len(found))
		if placements == nil {
			return nvml.SUCCESS
		}
		if uint(have) < uint(len(found)) {
			return nvml.ERROR_INSUFFICIENT_SIZE
		}
		copy(unsafe.Slice((*nvml.GpuInstancePlacement)(placements), len(found)), found)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceCreateGpuInstance
func nvmlDeviceCreateGpuInstance(device unsafe.Pointer, profileID C.uint, gpuInstance *unsafe.Pointer) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		if ret := mayChangeInstances(); ret != nvml.SUCCESS {
			return ret
		}
		p, ret := giProfileByID(d, profileID)
		if ret != nvml.SUCCESS {
			return ret
		}
		placement, ret := placeGpuInstance(d, p, nil) // the mock would put every instance at {0,0}
		if ret != nvml.SUCCESS {
			return ret
		}
		gi, ret := d.CreateGpuInstanceWithPlacement(&p, &placement)
		if ret = changed(ret); ret != nvml.SUCCESS {
			return ret
		}
		return putHandle(gpuInstance, gi)
	})
}

//export nvmlDeviceCreateGpuInstanceWithPlacement
func nvmlDeviceCreateGpuInstanceWithPlacement(device unsafe.Pointer, profileID C.uint, placement unsafe.Pointer,
	gpuInstance *unsafe.Pointer) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		if placement == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if ret := mayChangeInstances(); ret != nvml.SUCCESS {
			return ret
		}
		p, ret := giProfileByID(d, profileID)
		if ret != nvml.SUCCESS {
			return ret
		}
		at, ret := placeGpuInstance(d, p, (*nvml.GpuInstancePlacement)(placement))
		if ret != nvml.SUCCESS {
			return ret
		}
		gi, ret := d.CreateGpuInstanceWithPlacement(&p, &at)
		if ret = changed(ret); ret != nvml.SUCCESS {
			return ret
		}
		return putHandle(gpuInstance, gi)
	})
}

//export nvmlDeviceGetGpuInstances
func nvmlDeviceGetGpuInstances(device unsafe.Pointer, profileID C.uint, gpuInstances unsafe.Pointer,
	count *C.uint) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		p, ret := giProfileByID(d, profileID)
		if ret != nvml.SUCCESS {
			return ret
		}
		if ret := mayReadMig(d); ret != nvml.SUCCESS {
			return ret
		}
		found, ret := d.GetGpuInstances(&p)
		if ret != nvml.SUCCESS {
			return ret
		}
		id := func(gi nvml.GpuInstance) uint32 { info, _ := gi.GetInfo(); return info.Id }
		return putInstances(gpuInstances, count, found, id, p.InstanceCount)
	})
}

func withGpuInstance(h unsafe.Pointer, fn func(nvml.GpuInstance) nvml.Return) C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		gi, ret := lookup[nvml.GpuInstance](h)
		if ret != nvml.SUCCESS {
			return ret
		}
		return fn(gi)
	}))
}

//export nvmlGpuInstanceGetInfo
func nvmlGpuInstanceGetInfo(gpuInstance unsafe.Pointer, info unsafe.Pointer) C.nvmlReturn_t {
	return withGpuInstance(gpuInstance, func(gi nvml.GpuInstance) nvml.Return {
		i, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return ret
		}
		return putStruct(info, gpuInstanceInfo{handleFor(i.Device), i.Id, i.ProfileId, i.Placement})
	})
}

//export nvmlGpuInstanceDestroy
func nvmlGpuInstanceDestroy(gpuInstance unsafe.Pointer) C.nvmlReturn_t {
	return withGpuInstance(gpuInstance, func(gi nvml.GpuInstance) nvml.Return {
		if ret := mayChangeInstances(); ret != nvml.SUCCESS {
			return ret
		}
		ret := changed(gi.Destroy())
		if ret == nvml.SUCCESS {
			forget(gi)
		}
		return ret
	})
}

// -- compute instances ---------------------------------------------------------------------------

//export nvmlGpuInstanceGetComputeInstanceProfileInfo
func nvmlGpuInstanceGetComputeInstanceProfileInfo(gpuInstance unsafe.Pointer, profile, engProfile C.uint,
	info unsafe.Pointer) C.nvmlReturn_t {
	return withGpuInstance(gpuInstance, func(gi nvml.GpuInstance) nvml.Return {
		p, ret := gi.GetComputeInstanceProfileInfo(int(profile), int(engProfile))
		if ret != nvml.SUCCESS {
			return ret
		}
		return putStruct(info, p)
	})
}

//export nvmlGpuInstanceCreateComputeInstance
func nvmlGpuInstanceCreateComputeInstance(gpuInstance unsafe.Pointer, profileID C.uint,
	computeInstance *unsafe.Pointer) C.nvmlReturn_t {
	return withGpuInstance(gpuInstance, func(gi nvml.GpuInstance) nvml.Return {
		if ret := mayChangeInstances(); ret != nvml.SUCCESS {
			return ret
		}
		p, ret := ciProfileByID(gi, profileID)
		if ret != nvml.SUCCESS {
			return ret
		}
		if ret := roomForComputeInstance(gi, p); ret != nvml.SUCCESS {
			return ret
		}
		ci, ret := gi.CreateComputeInstance(&p)
		if ret = changed(ret); ret != nvml.SUCCESS {
			return ret
		}
		return putHandle(computeInstance, ci)
	})
}

//export nvmlGpuInstanceGetComputeInstances
func nvmlGpuInstanceGetComputeInstances(gpuInstance unsafe.Pointer, profileID C.uint, computeInstances unsafe.Pointer,
	count *C.uint) C.nvmlReturn_t {
	return withGpuInstance(gpuInstance, func(gi nvml.GpuInstance) nvml.Return {
		p, ret := ciProfileByID(gi, profileID)
		if ret != nvml.SUCCESS {
			return ret
		}
		found, ret := gi.GetComputeInstances(&p)
		if ret != nvml.SUCCESS {
			return ret
		}
		id := func(ci nvml.ComputeInstance) uint32 { info, _ := ci.GetInfo(); return info.Id }
		return putInstances(computeInstances, count, found, id, p.InstanceCount)
	})
}

func withComputeInstance(h unsafe.Pointer, fn func(nvml.ComputeInstance) nvml.Return) C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		ci, ret := lookup[nvml.ComputeInstance](h)
		if ret != nvml.SUCCESS {
			return ret
		}
		return fn(ci)
	}))
}

//export nvmlComputeInstanceGetInfo_v2
func nvmlComputeInstanceGetInfo_v2(computeInstance unsafe.Pointer, info unsafe.Pointer) C.nvmlReturn_t {
	return withComputeInstance(computeInstance, func(ci nvml.ComputeInstance) nvml.Return {
		i, ret := ci.GetInfo()
		if ret != nvml.SUCCESS {
			return ret
		}
		return putStruct(info, computeInstanceInfo{handleFor(i.Device), handleFor(i.GpuInstance), i.Id, i.ProfileId,
			i.Placement})
	})
}

//export nvmlComputeInstanceDestroy
func nvmlComputeInstanceDestroy(computeInstance unsafe.Pointer) C.nvmlReturn_t {
	return withComputeInstance(computeInstance, func(ci nvml.ComputeInstance) nvml.Return {
		if ret := mayChangeInstances(); ret != nvml.SUCCESS {
			return ret
		}
		ret := changed(ci.Destroy())
		if ret == nvml.SUCCESS {
			if c, ok := ci.(*server.ComputeInstance); ok {
				forgetMigDevice(c)
			}
			forget(ci)
		}
		return ret
	})
}

// -- not modelled by the mock (see notModeled): argument checks, then NVML_ERROR_NOT_SUPPORTED ----

// unsupported validates the device handles a call names, then reports the feature missing.
func unsupported(devices ...unsafe.Pointer) C.nvmlReturn_t {
	return C.nvmlReturn_t(call(func() nvml.Return {
		for _, h := range devices {
			if _, ret := lookup[nvml.Device](h); ret != nvml.SUCCESS {
				return ret
			}
		}
		return nvml.ERROR_NOT_SUPPORTED
	}))
}

func unsupportedOnGpuInstance(gpuInstance unsafe.Pointer) C.nvmlReturn_t {
	return withGpuInstance(gpuInstance, func(nvml.GpuInstance) nvml.Return { return nvml.ERROR_NOT_SUPPORTED })
}

//export nvmlDeviceGetNumaNodeId
func nvmlDeviceGetNumaNodeId(device unsafe.Pointer, node *C.uint) C.nvmlReturn_t {
	return unsupported(device)
}

//export nvmlDeviceGetTopologyCommonAncestor
func nvmlDeviceGetTopologyCommonAncestor(device1, device2 unsafe.Pointer, pathInfo *C.uint) C.nvmlReturn_t {
	return unsupported(device1, device2)
}

//export nvmlDeviceGetNvLinkState
func nvmlDeviceGetNvLinkState(device unsafe.Pointer, link C.uint, isActive *C.uint) C.nvmlReturn_t {
	return unsupported(device)
}

//export nvmlDeviceGetNvLinkRemotePciInfo_v2
func nvmlDeviceGetNvLinkRemotePciInfo_v2(device unsafe.Pointer, link C.uint, pci unsafe.Pointer) C.nvmlReturn_t {
	return unsupported(device)
}

//export nvmlDeviceGetNvLinkRemoteDeviceType
func nvmlDeviceGetNvLinkRemoteDeviceType(device unsafe.Pointer, link C.uint, deviceType *C.uint) C.nvmlReturn_t {
	return unsupported(device)
}

//export nvmlDeviceGetComputeRunningProcesses_v3
func nvmlDeviceGetComputeRunningProcesses_v3(device unsafe.Pointer, infoCount *C.uint, infos unsafe.Pointer) C.nvmlReturn_t {
	return withDevice(device, func(d nvml.Device) nvml.Return {
		return runningProcesses(deviceHolders(d), (*uint32)(unsafe.Pointer(infoCount)), infos)
	})
}

//export nvmlDeviceGetGraphicsRunningProcesses_v3
func nvmlDeviceGetGraphicsRunningProcesses_v3(device unsafe.Pointer, infoCount *C.uint, infos unsafe.Pointer) C.nvmlReturn_t {
	return withDevice(device, func(nvml.Device) nvml.Return {
		return runningProcesses(nil, (*uint32)(unsafe.Pointer(infoCount)), infos) // no display: no graphics contexts
	})
}

//export nvmlDeviceGetSupportedEventTypes
func nvmlDeviceGetSupportedEventTypes(device unsafe.Pointer, eventTypes *C.ulonglong) C.nvmlReturn_t {
	return unsupported(device)
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(device unsafe.Pointer, eventTypes C.ulonglong, set unsafe.Pointer) C.nvmlReturn_t {
	return unsupported(device)
}

//export nvmlEventSetCreate
func nvmlEventSetCreate(set *unsafe.Pointer) C.nvmlReturn_t { return unsupported() }

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(set unsafe.Pointer, data unsafe.Pointer, timeoutms C.uint) C.nvmlReturn_t {
	return unsupported()
}

//export nvmlEventSetFree
func nvmlEventSetFree(set unsafe.Pointer) C.nvmlReturn_t { return unsupported() }
