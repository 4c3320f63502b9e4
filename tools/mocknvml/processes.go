package main

// The processes on a GPU: those holding its device node open.
//
// A CUDA or graphics context is made through the GPU's device node (/dev/nvidia<minor>, with
// nvidiactl), and nvidia-smi's reset refuses while "any process is using the GPU" (its manual names
// CUDA applications, the X server and monitoring tools); operators find them with `lsof /dev/nvidia*`
// or `fuser`. go-nvml's mock models no processes at all (Device.GetComputeRunningProcesses is nil), and
// answering NOT_SUPPORTED there would make a MIG manager that fails closed (node_agent.nvml
// NvmlSession.processes) wait forever on every mock GPU. So the bridge answers what the kernel can tell:
// every process in this process's view of /proc with a descriptor on the GPU's device node (the
// character device's numbers as the device directory, visibility.go, holds them) is a compute process
// on it, with its memory not available and no MIG instance. On a simulated node no process can open a
// node (no kernel module: ENXIO), so the list is empty there, as it is on a real node nothing uses; a
// test holds one open through a stand-in node with another device's numbers. Without a device
// directory no GPU has a node and none has processes. Graphics processes: none (no display).

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// processInfo is nvmlProcessInfo_t (v2 and v3 share the layout).
type processInfo struct {
	Pid               uint32
	UsedGpuMemory     uint64
	GpuInstanceID     uint32
	ComputeInstanceID uint32
}

const (
	valueNotAvailable = ^uint64(0) // NVML_VALUE_NOT_AVAILABLE for usedGpuMemory
	noInstance        = ^uint32(0) // a process outside MIG: no GPU or compute instance
)

// deviceHolders are the pids (in /proc order) with a descriptor on the GPU's device node.
func deviceHolders(d nvml.Device) []uint32 {
	dev, ok := d.(*server.Device)
	root := devRoot()
	if !ok || root == "" {
		return nil
	}
	var node syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("%s/nvidia%d", root, dev.Minor), &node); err != nil ||
		node.Mode&syscall.S_IFMT != syscall.S_IFCHR {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []uint32
	for _, e := range entries {
		pid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
		for _, fd := range fds {
			var st syscall.Stat_t
			if syscall.Stat(fd, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFCHR && st.Rdev == node.Rdev {
				pids = append(pids, uint32(pid))
				break
			}
		}
	}
	return pids
}

// runningProcesses fills an nvmlDevice*RunningProcesses answer: INSUFFICIENT_SIZE with the count when
// the caller's array is too small (NVML's two-call protocol), else the entries.
func runningProcesses(pids []uint32, infoCount *uint32, infos unsafe.Pointer) nvml.Return {
	if infoCount == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	room := *infoCount
	*infoCount = uint32(len(pids))
	if int(room) < len(pids) || (len(pids) > 0 && infos == nil) {
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	out := unsafe.Slice((*processInfo)(infos), len(pids))
	for i, pid := range pids {
		out[i] = processInfo{Pid: pid, UsedGpuMemory: valueNotAvailable, GpuInstanceID: noInstance,
			ComputeInstanceID: noInstance}
	}
	return nvml.SUCCESS
}
