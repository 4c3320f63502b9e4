"""The agent against NVIDIA's NVML model: go-nvml's mock DGX machines behind NVML's C ABI (tools/mocknvml)."""
