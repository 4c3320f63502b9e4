module github.com/nvidia-gpu/tools/cdi

go 1.26

require (
	github.com/NVIDIA/nvidia-container-toolkit v1.17.8
	github.com/opencontainers/runtime-spec v1.3.0
	tags.cncf.io/container-device-interface v1.1.2
)

require (
	github.com/NVIDIA/go-nvlib v0.7.2 // indirect
	github.com/NVIDIA/go-nvml v0.12.4-1 // indirect
	github.com/cpuguy83/go-md2man/v2 v2.0.5 // indirect
	github.com/cyphar/filepath-securejoin v0.5.1 // indirect
	github.com/fsnotify/fsnotify v1.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/moby/sys/reexec v0.1.0 // indirect
	github.com/moby/sys/symlink v0.3.0 // indirect
	github.com/opencontainers/runc v1.2.6 // indirect
	github.com/pelletier/go-toml v1.9.5 // indirect
	github.com/russross/blackfriday/v2 v2.1.0 // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
	github.com/urfave/cli/v2 v2.27.5 // indirect
	github.com/xrash/smetrics v0.0.0-20240521201337-686a1a2994c1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/mod v0.20.0 // indirect
	golang.org/x/sys v0.30.0 // indirect
	tags.cncf.io/container-device-interface/specs-go v1.1.1 // indirect
)
