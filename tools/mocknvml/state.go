package main

// MIG state that outlives the process, as a GPU's does.
//
// Why: on a real node the MIG layout belongs to the GPU, not to the program that made it, so
// `nvidia-mig-parted apply` in one process and `nvidia-mig-parted assert`, GFD or a device plugin in
// the next all see the same instances. go-nvml's mock keeps MIG mode and instances in the process, so
// without this every program starts on a machine with MIG off, and nothing that reads a layout made by
// another program (the side-by-side comparison's whole point) can be checked.
//
// With MOCK_NVML_STATE=<file> the bridge reads the machine's MIG state from the file when NVML is
// initialised (the first nvmlInit of a process, and again after the last nvmlShutdown) and writes it
// back, atomically (temporary file, rename), after every change it passes to the mock: MIG mode, and
// GPU and compute instances created or destroyed. The file records what the mock models and nothing
// more: per GPU index the MIG mode, and each instance's ID, profile ID and placement, plus the mock's
// ID counters so new instances get the IDs the same mock would have given. A file for another machine,
// or one that does not parse, fails nvmlInit with NVML_ERROR_UNKNOWN and says why on stderr, rather
// than silently starting from a clean machine. Processes take turns (an exclusive flock around each
// read-modify-write), but one that holds NVML open does not see another's later change until it
// initialises again: programs compared here run one after the other.
//
// A simulated node's library has the path linked in (-X main.linkedStatePath, build.sh): the state of
// the node's GPUs, which every process and container on the node shares as it shares the GPUs. Where
// that file sits read-only (an unprivileged container's view of the node, localcluster/kernelview.py)
// the state is still read (the lock taken on a read-only descriptor); a change there has already been
// refused (permission.go).

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

const stateVersion = 1

type stateFile struct {
	Version int        `json:"version"`
	Machine string     `json:"machine"`
	BootID  string     `json:"bootId,omitempty"` // the boot that wrote it ("" in files written by hand)
	GPUs    []gpuState `json:"gpus"`
}

type gpuState struct {
	Index        int       `json:"index"`
	MigMode      int       `json:"migMode"`
	NextGIID     uint32    `json:"nextGpuInstanceId"`
	GpuInstances []giState `json:"gpuInstances"`
}

type giState struct {
	ID               uint32    `json:"id"`
	ProfileID        uint32    `json:"profileId"`
	Start            uint32    `json:"placementStart"`
	Size             uint32    `json:"placementSize"`
	NextCIID         uint32    `json:"nextComputeInstanceId"`
	ComputeInstances []ciState `json:"computeInstances"`
}

type ciState struct {
	ID        uint32 `json:"id"`
	ProfileID uint32 `json:"profileId"`
	Start     uint32 `json:"placementStart"`
	Size      uint32 `json:"placementSize"`
}

// linkedStatePath is a simulated node's state file (see the file comment).
var linkedStatePath = ""

// statePath is MOCK_NVML_STATE, else the path linked in ("" when MIG state lives only as long as the
// process).
func statePath() string {
	if p, ok := os.LookupEnv("MOCK_NVML_STATE"); ok {
		return p
	}
	return linkedStatePath
}

// withStateLock runs fn holding an exclusive flock on <state>.lock (flock needs no write access: a
// reader whose view is read-only opens the lock file read-only).
func withStateLock(path string, fn func() error) error {
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		if lock, err = os.Open(path + ".lock"); err != nil {
			return err
		}
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck
	return fn()
}

// snapshot is the machine's MIG state as recorded in the file (instances sorted by ID).
func snapshot() stateFile {
	out := stateFile{Version: stateVersion, Machine: machine, BootID: bootID()}
	for _, d := range srv.Devices {
		dev, ok := d.(*server.Device)
		if !ok {
			continue
		}
		dev.RLock()
		g := gpuState{Index: dev.Index, MigMode: dev.MigMode, NextGIID: dev.GpuInstanceCounter,
			GpuInstances: []giState{}}
		for gi := range dev.GpuInstances {
			gi.RLock()
			s := giState{ID: gi.Info.Id, ProfileID: gi.Info.ProfileId, Start: gi.Info.Placement.Start,
				Size: gi.Info.Placement.Size, NextCIID: gi.ComputeInstanceCounter, ComputeInstances: []ciState{}}
			for ci := range gi.ComputeInstances {
				s.ComputeInstances = append(s.ComputeInstances, ciState{ID: ci.Info.Id, ProfileID: ci.Info.ProfileId,
					Start: ci.Info.Placement.Start, Size: ci.Info.Placement.Size})
			}
			gi.RUnlock()
			sort.Slice(s.ComputeInstances, func(i, j int) bool { return s.ComputeInstances[i].ID < s.ComputeInstances[j].ID })
			g.GpuInstances = append(g.GpuInstances, s)
		}
		dev.RUnlock()
		sort.Slice(g.GpuInstances, func(i, j int) bool { return g.GpuInstances[i].ID < g.GpuInstances[j].ID })
		out.GPUs = append(out.GPUs, g)
	}
	return out
}

// bootPath is the kernel's boot ID: a simulated node binds its own there, for the node and its containers.
const bootPath = "/proc/sys/kernel/random/boot_id"

// bootID is this boot's ID ("" when it cannot be read).
func bootID() string {
	raw, err := os.ReadFile(bootPath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(raw))
}

// afterReboot is a state written on an earlier boot, as the GPUs come back from a reboot: MIG mode is kept
// (it is the GPU's setting, "persistent across reboots"), GPU and compute instances are gone ("MIG devices
// are not persistent across system reboots": NVIDIA's MIG user guide, "Getting Started with MIG").
func afterReboot(st stateFile) stateFile {
	for i := range st.GPUs {
		st.GPUs[i].GpuInstances, st.GPUs[i].NextGIID = []giState{}, 0
	}
	return st
}

// restore replaces the mock's MIG state with the file's. Handles to the instances it replaces are
// forgotten (NVML_ERROR_INVALID_ARGUMENT from then on, like a destroyed instance's).
func restore(st stateFile) error {
	if st.Version != stateVersion {
		return fmt.Errorf("version %d, want %d", st.Version, stateVersion)
	}
	if st.Machine != machine {
		return fmt.Errorf("written for machine %q, this is %q (MOCK_NVML_MACHINE)", st.Machine, machine)
	}
	byIndex := map[int]*server.Device{}
	for _, d := range srv.Devices {
		if dev, ok := d.(*server.Device); ok {
			byIndex[dev.Index] = dev
		}
	}
	for _, g := range st.GPUs {
		if _, ok := byIndex[g.Index]; !ok {
			return fmt.Errorf("GPU index %d: the machine has no such GPU", g.Index)
		}
	}
	for _, g := range st.GPUs {
		dev := byIndex[g.Index]
		dev.Lock()
		for gi := range dev.GpuInstances {
			for ci := range gi.ComputeInstances {
				forgetMigDevice(ci)
				forget(ci)
			}
			forget(gi)
		}
		dev.MigMode, dev.GpuInstanceCounter = g.MigMode, g.NextGIID
		dev.GpuInstances = map[*server.GpuInstance]struct{}{}
		for _, s := range g.GpuInstances {
			gi := server.NewGpuInstanceFromInfo(nvml.GpuInstanceInfo{Device: dev, Id: s.ID, ProfileId: s.ProfileID,
				Placement: nvml.GpuInstancePlacement{Start: s.Start, Size: s.Size}}, dev.Config.MIGProfiles)
			gi.ComputeInstanceCounter = s.NextCIID
			for _, c := range s.ComputeInstances {
				ci := server.NewComputeInstanceFromInfo(nvml.ComputeInstanceInfo{Device: dev, GpuInstance: gi, Id: c.ID,
					ProfileId: c.ProfileID, Placement: nvml.ComputeInstancePlacement{Start: c.Start, Size: c.Size}})
				gi.ComputeInstances[ci] = struct{}{}
			}
			dev.GpuInstances[gi] = struct{}{}
		}
		dev.Unlock()
	}
	return nil
}

// loadState reads MOCK_NVML_STATE into the mock; a missing file is a machine nobody changed yet.
func loadState() error {
	path := statePath()
	if path == "" {
		return nil
	}
	if _, err := os.Stat(path); os.IsNotExist(err) {
		return nil // nobody changed the machine yet (and a read-only view may have no lock file either)
	}
	return withStateLock(path, func() error {
		raw, err := os.ReadFile(path)
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		var st stateFile
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if st.BootID != "" && st.BootID != bootID() {
			st = afterReboot(st)
		}
		if err := restore(st); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		return nil
	})
}

// saveState writes the mock's MIG state to MOCK_NVML_STATE after a change (no-op without it).
func saveState() error {
	path := statePath()
	if path == "" {
		return nil
	}
	raw, err := json.MarshalIndent(snapshot(), "", "  ")
	if err != nil {
		return err
	}
	return withStateLock(path, func() error {
		tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
		if err != nil {
			return err
		}
		defer os.Remove(tmp.Name()) //nolint:errcheck
		if _, err := tmp.Write(append(raw, '\n')); err != nil {
			tmp.Close()
			return err
		}
		if err := tmp.Close(); err != nil {
			return err
		}
		return os.Rename(tmp.Name(), path)
	})
}

// changed is what a mutating call returns: the mock's answer, after the new state is written. A state
// that cannot be written is NVML_ERROR_UNKNOWN, so a test never goes on believing a change persisted.
func changed(ret nvml.Return) nvml.Return {
	if ret != nvml.SUCCESS {
		return ret
	}
	if err := saveState(); err != nil {
		fmt.Fprintf(os.Stderr, "mocknvml: MOCK_NVML_STATE: %v\n", err)
		return nvml.ERROR_UNKNOWN
	}
	return ret
}
