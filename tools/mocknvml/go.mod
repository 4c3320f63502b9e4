// NVIDIA's go-nvml mock machines behind NVML's C ABI: libnvidia-ml.so.1 for the agent's NVML tests.
module nvidia-gpu/tools/mocknvml

go 1.26.0

require (
	github.com/NVIDIA/go-nvlib v0.11.0
	github.com/NVIDIA/go-nvml v0.13.4-1
)

require github.com/google/uuid v1.6.0 // indirect
