package main

// Which GPUs a process sees, and which machine the library models when no environment says so.
//
// A process on a GPU node sees only the GPUs whose device node it can use: "CUDA, nvidia-smi and NVML
// ... report the right number of GPUs by ignoring the ones they don't have permission to use"
// (NVIDIA/nvidia-docker#170, NVIDIA's answer), and a CDI container given /dev/nvidia6 alone lists that
// one GPU (NVIDIA/nvidia-container-toolkit#1203). A container's runtime creates the allocated GPUs'
// nodes only, so that is how a workload's nvidia-smi shows exactly its allocation. The bridge models it
// when it is given a device directory: a GPU is listed (by index, UUID or PCI address, and counted)
// only while <dir>/nvidia<minor> exists as a character device; indices are the listed GPUs' order, as
// CUDA_VISIBLE_DEVICES-free NVML numbers what it can see. MIG state stays the machine's, whole.
//
// Where the setting comes from: MOCK_NVML_DEV_ROOT, else the value linked into the library
// (-ldflags "-X main.linkedDevRoot=/dev"); empty means every GPU is visible (the machine running the
// tests has no /dev/nvidia*). The machine likewise: MOCK_NVML_MACHINE, else main.linkedMachine. A
// simulated node's driver root gets a library linked for its machine and /dev (tools/mocknvml/build.sh):
// a workload container gets only the driver's files from its CDI spec, never our environment, and must
// still see the node's GPUs.

import (
	"fmt"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

var (
	linkedMachine = "dgxa100"
	linkedDevRoot = ""
)

// machineName is the machine this process models.
func machineName() string {
	if m := os.Getenv("MOCK_NVML_MACHINE"); m != "" {
		return m
	}
	return linkedMachine
}

// devRoot is the directory whose nvidia<minor> nodes decide visibility ("" when every GPU is visible).
func devRoot() string {
	if d, ok := os.LookupEnv("MOCK_NVML_DEV_ROOT"); ok {
		return d
	}
	return linkedDevRoot
}

// isVisible says whether this process may use the GPU (see the file comment).
func isVisible(d nvml.Device) bool {
	root := devRoot()
	if root == "" {
		return true
	}
	dev, ok := d.(*server.Device)
	if !ok {
		return true
	}
	info, err := os.Stat(fmt.Sprintf("%s/nvidia%d", root, dev.Minor))
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

// visibleDevices are the GPUs this process sees, in the machine's order.
func visibleDevices() []nvml.Device {
	out := make([]nvml.Device, 0, len(srv.Devices))
	for _, d := range srv.Devices {
		if isVisible(d) {
			out = append(out, d)
		}
	}
	return out
}

// visibleIndex is the GPU's index among the visible ones (NVML numbers what the process sees).
func visibleIndex(d nvml.Device) (int, bool) {
	for i, v := range visibleDevices() {
		if v == d {
			return i, true
		}
	}
	return 0, false
}
