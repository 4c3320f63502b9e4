package main

// Who may change MIG: the caller needs the mig-config capability, as on a real node.
//
// NVIDIA's MIG user guide ("Device Nodes and Capabilities"): "the mig-config capability allows one to
// create and destroy MIG instances on any MIG-capable GPU ... Without this capability, all attempts to
// create or destroy a MIG instance will fail", and "if you are the root-user (or any user with
// CAP_SYS_ADMIN privileges) ... you implicitly have access to all nvidia-capabilities". The capability
// is the device node /dev/nvidia-caps/nvidia-cap1 ("config 1" in /proc/driver/nvidia-caps/mig-minors),
// which the container toolkit gives a container only with NVIDIA_MIG_CONFIG_DEVICES and CAP_SYS_ADMIN
// (nvidia-container-toolkit TestMigCapsValidate: "errors when requested in a non-privileged container").
// Enabling or disabling MIG mode is root's alone (nvidia-smi -mig: "requires root"). NVML answers
// NVML_ERROR_NO_PERMISSION ("user doesn't have permission to perform this operation", nvml.h, for
// nvmlDeviceSetMigMode, nvmlDeviceCreateGpuInstance* and the destroy calls).
//
// In a container the capability is the device node, and nothing else: the device cgroup admits only the
// nodes the runtime gave it, so CAP_SYS_ADMIN alone (which our agents hold for the monitor capability)
// opens nothing the container lacks. So, where the library has a device directory (visibility.go: a
// simulated node's driver, linked for /dev), creating and destroying instances needs read access to
// <dir>/nvidia-caps/nvidia-cap1 as a character device, and changing MIG mode needs that and
// CAP_SYS_ADMIN in the effective set (/proc/self/status CapEff). Without a device directory (a test
// process on this machine, which has no /dev/nvidia*) CAP_SYS_ADMIN stands for the capability, as it
// does for root on a node's host. Everything else gets NO_PERMISSION before the mock changes anything.
//
// Reading a MIG GPU needs the mig-monitor capability (/dev/nvidia-caps/nvidia-cap2, "monitor 2"), or the
// config one: without it the driver answers NO_PERMISSION to the parent GPU's memory information and to
// the GPU-instance lookups on a GPU in MIG mode ("error getting parent memory info: Insufficient
// Permissions", NVIDIA/k8s-device-plugin#1683 and #399; NVIDIA/gpu-feature-discovery#6: "Without this,
// the container does not have privileges to read the state"). Queries on a MIG device's own handle and
// on GPUs outside MIG mode need no capability.
//
// Which MIG devices a process lists: those it may use. A MIG device is its GPU instance and compute
// instance, each with an access capability (/proc/driver/nvidia-caps/mig-minors: "gpu<minor>/gi<id>/access"
// and "gpu<minor>/gi<id>/ci<id>/access"; the MIG user guide's "/dev based nvidia-capabilities", which
// control "access mechanisms of MIG devices through cgroups"). The container toolkit gives a container
// allocated a MIG device the parent's node and exactly those two capability nodes (nvidia-container-toolkit
// internal/nvcaps NewGPUInstanceCap and NewComputeInstanceCap), and nvidia-smi -L in such a container
// lists that MIG device alone, numbered 0 (the GPU Operator's MIG guide). So, with a device directory, a
// MIG device is listed (by index, and by UUID) only while the process may read both nodes, or holds the
// monitor or config capability, which show all MIG state (the device plugin, GFD, the MIG manager).

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

const (
	capSysAdmin = 21 // linux/capability.h
	// configCapMinor and monitorCapMinor are the capabilities' minors in /proc/driver/nvidia-caps/mig-minors.
	configCapMinor  = 1
	monitorCapMinor = 2
)

// effectiveCaps is the process's effective capability set (0 when it cannot be read).
func effectiveCaps() uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "CapEff:"); ok {
			v, err := strconv.ParseUint(strings.TrimSpace(rest), 16, 64)
			if err != nil {
				return 0
			}
			return v
		}
	}
	return 0
}

// sysAdmin: CAP_SYS_ADMIN is in the process's effective set.
func sysAdmin() bool { return effectiveCaps()&(1<<capSysAdmin) != 0 }

// holds: the process holds the capability with this minor: it may read the capability's device node in
// the device directory, or, without a device directory (this machine's own processes), it has
// CAP_SYS_ADMIN, which stands for every capability there.
func holds(minor int) bool {
	root := devRoot()
	if root == "" {
		return sysAdmin()
	}
	path := fmt.Sprintf("%s/nvidia-caps/nvidia-cap%d", root, minor)
	info, err := os.Stat(path)
	if err != nil || info.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	return syscall.Access(path, 4 /* R_OK */) == nil
}

// answer is SUCCESS when allowed, NO_PERMISSION otherwise.
func answer(allowed bool) nvml.Return {
	if allowed {
		return nvml.SUCCESS
	}
	return nvml.ERROR_NO_PERMISSION
}

// mayChangeMigMode: enabling or disabling MIG mode needs CAP_SYS_ADMIN and the config capability.
func mayChangeMigMode() nvml.Return { return answer(sysAdmin() && holds(configCapMinor)) }

// mayChangeInstances: creating or destroying MIG instances needs the config capability.
func mayChangeInstances() nvml.Return { return answer(holds(configCapMinor)) }

// mayReadMig: a GPU in MIG mode is read with the monitor (or config) capability; any other GPU by anyone.
func mayReadMig(d nvml.Device) nvml.Return {
	dev, ok := d.(*server.Device)
	if !ok || !migEnabled(dev) {
		return nvml.SUCCESS
	}
	return answer(holds(monitorCapMinor) || holds(configCapMinor))
}

// migMinorsFile is the driver's table of MIG capability minors; a GPU node's containers see the node's
// (localcluster binds /proc/driver into them, as the kernel's procfs shows it on a real node).
var migMinorsFile = "/proc/driver/nvidia-caps/mig-minors"

var minorsCache struct {
	sync.Mutex
	path   string
	minors map[string]int
}

// migMinors is the table of migMinorsFile ("<capability> <minor>" per line), read once per file; empty
// when the file cannot be read (no MIG capability is then held through it).
func migMinors() map[string]int {
	minorsCache.Lock()
	defer minorsCache.Unlock()
	if minorsCache.minors != nil && minorsCache.path == migMinorsFile {
		return minorsCache.minors
	}
	out := map[string]int{}
	if data, err := os.ReadFile(migMinorsFile); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			name, minor, ok := strings.Cut(strings.TrimSpace(line), " ")
			if n, err := strconv.Atoi(minor); ok && err == nil {
				out[name] = n
			}
		}
	}
	minorsCache.path, minorsCache.minors = migMinorsFile, out
	return out
}

// mayUseMigDevice: the process may use (and so lists) this MIG device: every process without a device
// directory, one holding the monitor or config capability, or one that may read the access nodes of the
// device's GPU instance and compute instance.
func mayUseMigDevice(m *migDevice) bool {
	if devRoot() == "" || holds(monitorCapMinor) || holds(configCapMinor) {
		return true
	}
	minors := migMinors()
	gi, giOK := minors[fmt.Sprintf("gpu%d/gi%d/access", m.parent.Minor, m.gi.Info.Id)]
	ci, ciOK := minors[fmt.Sprintf("gpu%d/gi%d/ci%d/access", m.parent.Minor, m.gi.Info.Id, m.ci.Info.Id)]
	return giOK && ciOK && holds(gi) && holds(ci)
}
