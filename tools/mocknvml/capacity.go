package main

// The capacity rules NVML enforces on MIG and go-nvml's mock does not.
//
// Why: the mock creates any number of GPU instances, all at placement {0,0} when none is given, and
// any number of compute instances in one GPU instance. Programs rely on the driver's refusals:
// mig-parted, for one, fills a GPU instance with compute instances until NVML says
// NVML_ERROR_INSUFFICIENT_RESOURCES, then makes the next GPU instance; against the bare mock it puts
// seven 1c compute instances into one 1g GPU instance. These rules are nvml.h's, applied to the
// profiles and placements the mock itself holds (nothing here is a number the mock does not have):
//   - no GPU or compute instance while MIG mode is off (NVML_ERROR_NOT_SUPPORTED);
//   - a GPU instance takes one of its profile's possible placements, which must not overlap an
//     existing instance's memory slices; without a placement the first free one is taken, in the
//     order the mock lists them; none free, or more instances of the profile than its
//     instanceCount, is NVML_ERROR_INSUFFICIENT_RESOURCES; a placement that is not one of the
//     profile's is NVML_ERROR_INVALID_ARGUMENT;
//   - a compute instance needs its profile's slices free among the GPU instance's (sliceCount),
//     and no more of one profile than its instanceCount (NVML_ERROR_INSUFFICIENT_RESOURCES).

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

func migEnabled(d nvml.Device) bool {
	mode, _, ret := d.GetMigMode()
	return ret == nvml.SUCCESS && mode == nvml.DEVICE_MIG_ENABLE
}

// gpuInstanceSpace is what a new instance of profile p could take: the profile's placements that are free,
// and how many more instances its instanceCount allows.
func gpuInstanceSpace(d nvml.Device, p nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement,
	[]nvml.GpuInstancePlacement, uint32, nvml.Return) {
	if !migEnabled(d) {
		return nil, nil, 0, nvml.ERROR_NOT_SUPPORTED
	}
	dev, ok := d.(*server.Device)
	if !ok {
		return nil, nil, 0, nvml.ERROR_NOT_SUPPORTED
	}
	possible, ret := d.GetGpuInstancePossiblePlacements(&p)
	if ret != nvml.SUCCESS {
		return nil, nil, 0, ret
	}
	dev.RLock()
	var used []nvml.GpuInstancePlacement
	same := uint32(0)
	for gi := range dev.GpuInstances {
		used = append(used, gi.Info.Placement)
		if gi.Info.ProfileId == p.Id {
			same++
		}
	}
	dev.RUnlock()
	var free []nvml.GpuInstancePlacement
	for _, c := range possible {
		if !overlaps(c, used) {
			free = append(free, c)
		}
	}
	left := uint32(0)
	if same < p.InstanceCount {
		left = p.InstanceCount - same
	}
	return possible, free, left, nvml.SUCCESS
}

func overlaps(c nvml.GpuInstancePlacement, used []nvml.GpuInstancePlacement) bool {
	for _, u := range used {
		if c.Start < u.Start+u.Size && u.Start < c.Start+c.Size {
			return true
		}
	}
	return false
}

// placeGpuInstance is the placement a new instance of profile p gets (want nil: the first free one).
func placeGpuInstance(d nvml.Device, p nvml.GpuInstanceProfileInfo, want *nvml.GpuInstancePlacement) (
	nvml.GpuInstancePlacement, nvml.Return) {
	possible, free, left, ret := gpuInstanceSpace(d, p)
	if ret != nvml.SUCCESS {
		return nvml.GpuInstancePlacement{}, ret
	}
	if want != nil {
		known := false
		for _, c := range possible {
			known = known || c == *want
		}
		if !known {
			return nvml.GpuInstancePlacement{}, nvml.ERROR_INVALID_ARGUMENT
		}
		isFree := false
		for _, c := range free {
			isFree = isFree || c == *want
		}
		if !isFree {
			return nvml.GpuInstancePlacement{}, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		free = []nvml.GpuInstancePlacement{*want}
	}
	if left == 0 || len(free) == 0 {
		return nvml.GpuInstancePlacement{}, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return free[0], nvml.SUCCESS
}

// gpuInstanceRoom is how many more instances of profile p fit (nvmlDeviceGetGpuInstanceRemainingCapacity):
// free placements taken first to last without overlap, at most what instanceCount leaves.
func gpuInstanceRoom(d nvml.Device, p nvml.GpuInstanceProfileInfo) (uint32, nvml.Return) {
	_, free, left, ret := gpuInstanceSpace(d, p)
	if ret != nvml.SUCCESS {
		return 0, ret
	}
	var taken []nvml.GpuInstancePlacement
	for _, c := range free {
		if uint32(len(taken)) < left && !overlaps(c, taken) {
			taken = append(taken, c)
		}
	}
	return uint32(len(taken)), nvml.SUCCESS
}

// computeInstanceRoom is how many more compute instances of profile p the GPU instance holds: no more of
// one profile than its instanceCount, and no more slices than the GPU instance has.
func computeInstanceRoom(gi nvml.GpuInstance, p nvml.ComputeInstanceProfileInfo) (uint32, nvml.Return) {
	g, ok := gi.(*server.GpuInstance)
	if !ok {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	dev, ok := g.Info.Device.(*server.Device)
	if !ok || !migEnabled(dev) {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	giProfile, ret := dev.GetGpuInstanceProfileInfo(int(g.Info.ProfileId))
	if ret != nvml.SUCCESS {
		return 0, ret
	}
	slices, same := uint32(0), uint32(0)
	g.RLock()
	for ci := range g.ComputeInstances {
		if ci.Info.ProfileId == p.Id {
			same++
		}
		if info, ret := g.GetComputeInstanceProfileInfo(int(ci.Info.ProfileId),
			nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED); ret == nvml.SUCCESS {
			slices += info.SliceCount
		}
	}
	g.RUnlock()
	if same >= p.InstanceCount || slices >= giProfile.SliceCount || p.SliceCount == 0 {
		return 0, nvml.SUCCESS
	}
	return min(p.InstanceCount-same, (giProfile.SliceCount-slices)/p.SliceCount), nvml.SUCCESS
}

// roomForComputeInstance says whether the GPU instance can hold one more compute instance of profile p.
func roomForComputeInstance(gi nvml.GpuInstance, p nvml.ComputeInstanceProfileInfo) nvml.Return {
	n, ret := computeInstanceRoom(gi, p)
	if ret != nvml.SUCCESS {
		return ret
	}
	if n == 0 {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}
