// Command mocknvml builds libnvidia-ml.so.1: NVML's C ABI over NVIDIA's own Go models of DGX machines.
//
// Why it exists: the project checks its node agent, and its pure-Python NVML simulator
// (node_agent/nvml/sim), against an NVML peer nobody on the project wrote. The intended peer, the
// mock libnvidia-ml.so from github.com/NVIDIA/k8s-test-infra/pkg/gpu/mocknvml, cannot be had: the
// Go module proxy answers 403 for every version of that module. What can be had is
// github.com/NVIDIA/go-nvml, whose pkg/nvml/mock/dgx{a100,h100,h200,b200} packages are NVIDIA's
// models of those machines (names, UUIDs, memory, PCI device IDs, compute capability, MIG
// profiles and placements, driver/CUDA versions) behind go-nvml's nvml.Interface. This program is
// only the bridge: every exported function has the symbol name and argument layout of nvml.h, so
// nvidia-ml-py loads the library like a real driver's, and each call is answered by the mock.
//
// Rules the bridge keeps:
//   - The machine is chosen when the library loads, by MOCK_NVML_MACHINE (dgxa100 by default,
//     dgxh100, dgxh200, dgxb200; a node's copy links its machine in: visibility.go). With a device
//     directory (visibility.go), a process sees only the GPUs whose device node it has, as on a node. The mock's state (MIG mode, instances) lives as long as the
//     process, like a GPU's across nvmlShutdown/nvmlInit, or, with MOCK_NVML_STATE=<file>, as long
//     as the file (state.go), so a layout one program makes is the next one's. GPU UUIDs are derived
//     from the machine and index (the mock's own are random), so every process sees the same GPUs.
//   - Return codes are NVML's, and whatever the mock returns is passed through. The bridge adds
//     only what the C ABI itself defines and the Go API cannot express: NVML_ERROR_UNINITIALIZED
//     before nvmlInit, NVML_ERROR_INVALID_ARGUMENT for unknown handles and NULL outputs,
//     NVML_ERROR_INSUFFICIENT_SIZE for short buffers.
//   - A function the mock does not model (go-nvml v0.13.4-1 sets no mock function for it) returns
//     NVML_ERROR_NOT_SUPPORTED; the bridge never makes up a value the mock does not have. The list
//     is notModeled below, and main_test.go fails when a go-nvml upgrade starts modelling one.
//   - Handles are C-allocated one-byte blocks that the table below maps to mock objects, so C
//     never holds a Go pointer and a handle stays valid (and unique) while its object exists.
//   - Only the functions in exports.go are exported. go_nvml_refs.c gives go-nvml's own (never
//     used) cgo wrappers hidden definitions of the rest, so dlopen(RTLD_NOW) accepts the library
//     and a missing function still looks missing (NVML_ERROR_FUNCTION_NOT_FOUND in nvidia-ml-py).
package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"crypto/sha1"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// machines are the go-nvml mock servers MOCK_NVML_MACHINE can name.
var machines = map[string]func() *server.Server{
	"dgxa100": dgxa100.New,
	"dgxh100": dgxh100.New,
	"dgxh200": dgxh200.New,
	"dgxb200": dgxb200.New,
}

// notModeled are the NVML functions the agent calls that go-nvml's mock server leaves without an
// implementation (a nil ...Func, which would panic): the bridge answers NVML_ERROR_NOT_SUPPORTED.
// Keys are the C symbol names, values the mock method that is missing (checked by main_test.go).
var notModeled = map[string]string{
	"nvmlDeviceGetNumaNodeId":             "Device.GetNumaNodeId",
	"nvmlDeviceGetTopologyCommonAncestor": "Device.GetTopologyCommonAncestor",
	"nvmlDeviceGetNvLinkState":            "Device.GetNvLinkState",
	"nvmlDeviceGetNvLinkRemotePciInfo_v2": "Device.GetNvLinkRemotePciInfo",
	"nvmlDeviceGetNvLinkRemoteDeviceType": "Device.GetNvLinkRemoteDeviceType",
	"nvmlDeviceGetSupportedEventTypes":    "Device.GetSupportedEventTypes",
	"nvmlDeviceRegisterEvents":            "Device.RegisterEvents",
	"nvmlEventSetCreate":                  "Server.EventSetCreate",
	"nvmlEventSetWait_v2":                 "EventSet.Wait",
	"nvmlEventSetFree":                    "EventSet.Free",
}

// The versioned "V" profile calls (nvmlDeviceGetGpuInstanceProfileInfoV,
// nvmlGpuInstanceGetComputeInstanceProfileInfoV) are deliberately not exported: the mock models
// only the v1 calls, whose structs carry no profile name. Without the symbols nvidia-ml-py raises
// NVML_ERROR_FUNCTION_NOT_FOUND, which is what a driver older than the V calls does, and callers
// fall back to v1; answering NOT_SUPPORTED instead would claim the GPU has no MIG profiles.

var (
	mu        sync.Mutex // one NVML call at a time: the mock is not built for concurrent mutation
	machine   string
	srv       *server.Server // nil when MOCK_NVML_MACHINE names no machine
	loadError string
	initCount int
	objects   = map[uintptr]any{}        // handle address -> nvml.Device / nvml.GpuInstance / nvml.ComputeInstance
	handles   = map[any]unsafe.Pointer{} // the reverse
	messages  = map[nvml.Return]*C.char{}
)

func init() {
	machine = machineName() // MOCK_NVML_MACHINE, else the machine linked in (visibility.go)
	build, ok := machines[machine]
	if !ok {
		known := make([]string, 0, len(machines))
		for name := range machines {
			known = append(known, name)
		}
		sort.Strings(known)
		loadError = fmt.Sprintf("mocknvml: MOCK_NVML_MACHINE=%q is not one of %s", machine, strings.Join(known, ", "))
		return
	}
	srv = build()
	// go-nvml's mock draws a random UUID for every GPU each time a machine is built, so two processes on
	// the "same" machine (NVIDIA's device plugin and ours, side by side) would see different GPUs. Derive
	// them from the machine and the GPU's index instead: the same in every process, still unique.
	for _, d := range srv.Devices {
		if dev, ok := d.(*server.Device); ok {
			dev.UUID = stableUUID(machine, dev.Index)
		}
	}
}

// stableUUID is a GPU UUID in NVML's format (GPU- and a version-5 style UUID) from SHA-1 of the machine
// name and the GPU index.
func stableUUID(machine string, index int) string {
	sum := sha1.Sum([]byte(fmt.Sprintf("mocknvml/%s/gpu/%d", machine, index)))
	sum[6] = (sum[6] & 0x0f) | 0x50
	sum[8] = (sum[8] & 0x3f) | 0x80
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

func main() {}

// call runs one NVML function: the library must be initialised, and a panic inside the mock becomes a
// return code instead of killing the host process: NVML_ERROR_NOT_SUPPORTED for a method the mock does
// not implement (a feature this machine lacks), NVML_ERROR_UNKNOWN for anything else (a bug).
func call(fn func() nvml.Return) (ret C.int) {
	mu.Lock()
	defer mu.Unlock()
	defer func() {
		if p := recover(); p != nil {
			// A query the mock leaves without an implementation (its "method is nil" panic) is a
			// feature this machine does not have; anything else is a bug, said on stderr.
			if msg := fmt.Sprint(p); strings.Contains(msg, "method is nil") {
				ret = C.int(nvml.ERROR_NOT_SUPPORTED)
				return
			}
			fmt.Fprintf(os.Stderr, "mocknvml: %v\n", p)
			ret = C.int(nvml.ERROR_UNKNOWN)
		}
	}()
	if initCount == 0 {
		return C.int(nvml.ERROR_UNINITIALIZED)
	}
	return C.int(fn())
}

// handleFor is the C handle of a mock object, allocated the first time the object is handed out.
func handleFor(obj any) unsafe.Pointer {
	if h, ok := handles[obj]; ok {
		return h
	}
	h := C.malloc(1)
	handles[obj] = h
	objects[uintptr(h)] = obj
	return h
}

// forget invalidates a destroyed object's handle. The block is not freed, so a later malloc cannot
// hand the same address to another object and make a stale handle valid again.
func forget(obj any) {
	if h, ok := handles[obj]; ok {
		delete(objects, uintptr(h))
		delete(handles, obj)
	}
}

func lookup[T any](h unsafe.Pointer) (T, nvml.Return) {
	obj, ok := objects[uintptr(h)].(T)
	if !ok {
		return obj, nvml.ERROR_INVALID_ARGUMENT
	}
	return obj, nvml.SUCCESS
}

func putHandle(out *unsafe.Pointer, obj any) nvml.Return {
	if out == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	*out = handleFor(obj)
	return nvml.SUCCESS
}

// putString copies s and its NUL into a caller's buffer of size bytes.
func putString(buf *C.char, size C.uint, s string) nvml.Return {
	if buf == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if uint(len(s))+1 > uint(size) {
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(size))
	copy(dst, s)
	dst[len(s)] = 0
	return nvml.SUCCESS
}

// put stores v at a caller's output pointer (NULL is NVML_ERROR_INVALID_ARGUMENT).
func put[T any](out *T, v T) nvml.Return {
	if out == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	*out = v
	return nvml.SUCCESS
}

// putStruct writes a go-nvml struct into the caller's C struct. Only for go-nvml's types_gen.go
// structs, which cgo -godefs generated from nvml.h and so share its layout.
func putStruct[T any](out unsafe.Pointer, v T) nvml.Return {
	if out == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	*(*T)(out) = v
	return nvml.SUCCESS
}

// cBusID fills an int8 array (go-nvml's char[]) with s, NUL-terminated and truncated to fit.
func cBusID(dst []int8, s string) {
	n := copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), len(dst)-1), s)
	dst[n] = 0
}

// pciInfo is the mock's nvmlPciInfo_t. The mock's GetPciInfo fills only pciDeviceId; the bus
// address it models is the device's PciBusID field (what its DeviceGetHandleByPciBusId matches),
// so that address is written into the domain/bus/device fields and into busId/busIdLegacy in
// nvml.h's NVML_DEVICE_PCI_BUS_ID_FMT / _LEGACY_FMT spellings. Anything the mock did fill wins.
func pciInfo(d nvml.Device) (nvml.PciInfo, nvml.Return) {
	info, ret := d.GetPciInfo()
	if ret != nvml.SUCCESS || info.BusId[0] != 0 {
		return info, ret
	}
	dev, ok := d.(*server.Device)
	if !ok {
		return info, ret
	}
	var domain, bus, slot, function uint32
	if _, err := fmt.Sscanf(dev.PciBusID, "%x:%x:%x.%x", &domain, &bus, &slot, &function); err != nil {
		return info, ret
	}
	info.Domain, info.Bus, info.Device = domain, bus, slot
	cBusID(info.BusId[:], fmt.Sprintf("%08X:%02X:%02X.%X", domain, bus, slot, function))
	cBusID(info.BusIdLegacy[:], fmt.Sprintf("%04X:%02X:%02X.%X", domain, bus, slot, function))
	return info, ret
}

// giProfileByID finds a GPU-instance profile by profileInfo.id. NVML's C calls take that id where
// go-nvml's take the profile info itself; NVML resolves the id against the device's profiles too.
func giProfileByID(d nvml.Device, id C.uint) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	for p := 0; p < nvml.GPU_INSTANCE_PROFILE_COUNT; p++ {
		if info, ret := d.GetGpuInstanceProfileInfo(p); ret == nvml.SUCCESS && info.Id == uint32(id) {
			return info, nvml.SUCCESS
		}
	}
	return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
}

// ciProfileByID is giProfileByID for compute-instance profiles (shared engines, the only kind NVML has).
func ciProfileByID(gi nvml.GpuInstance, id C.uint) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	for p := 0; p < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; p++ {
		info, ret := gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && info.Id == uint32(id) {
			return info, nvml.SUCCESS
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
}

// gpuInstanceInfo and computeInstanceInfo are nvml.h's nvmlGpuInstanceInfo_t and
// nvmlComputeInstanceInfo_t (go-nvml's own versions hold Go interfaces where C has handles).
type gpuInstanceInfo struct {
	Device    unsafe.Pointer
	Id        uint32
	ProfileId uint32
	Placement nvml.GpuInstancePlacement
}

type computeInstanceInfo struct {
	Device      unsafe.Pointer
	GpuInstance unsafe.Pointer
	Id          uint32
	ProfileId   uint32
	Placement   nvml.ComputeInstancePlacement
}

// putInstances writes instance handles sorted by ID (the mock keeps them in a map, so its order
// changes from call to call). NVML sizes the caller's array by the profile's instanceCount; the
// mock does not enforce that count on create, so more instances than fit are refused rather than
// written past the array.
func putInstances[T any](out unsafe.Pointer, count *C.uint, found []T, id func(T) uint32, capacity uint32) nvml.Return {
	if out == nil || count == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	sort.Slice(found, func(i, j int) bool { return id(found[i]) < id(found[j]) })
	*count = C.uint(len(found))
	if uint32(len(found)) > capacity {
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	arr := unsafe.Slice((*unsafe.Pointer)(out), len(found))
	for i, obj := range found {
		arr[i] = handleFor(obj)
	}
	return nvml.SUCCESS
}
