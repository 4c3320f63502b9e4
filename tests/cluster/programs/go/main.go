// A Go program using the nvidia-gpu package through its generated SDK (`pulumi package gen-sdk`): the platform
// and two node groups on the default Kubernetes provider. It runs as an Automation API inline program
// (`gpu-go up|destroy`): the real CLI and engine, with this process as the language runtime, since Pulumi's
// Go language host cannot be built offline (tests/cluster/test_component_sdks.py says why).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/pulumi/pulumi/sdk/v3/go/auto"
	"github.com/pulumi/pulumi/sdk/v3/go/auto/optdestroy"
	"github.com/pulumi/pulumi/sdk/v3/go/auto/optpreview"
	"github.com/pulumi/pulumi/sdk/v3/go/auto/optup"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	// The generated SDK, in ./sdk with a go.mod of its own (the test writes it; `replace` in go.mod): its
	// import path is codegen/go's default for a package whose schema names no repository.
	gpu "example.com/pulumi-nvidia-gpu/sdk/go/nvidia-gpu"
)

const pool = "example.com/gpu-pool"

func program(ctx *pulumi.Context) error {
	// The settings objects are typed by the schema: a misspelled key or an unknown sharing mode does not compile.
	daemonset, timeSlicing, exclusive := gpu.NodeSetupBackendDaemonset, gpu.SharingTimeSlicing, gpu.SharingExclusive
	cluster := gpu.ClusterArgs{
		KubernetesVersion: "1.34",
		Namespace:         pulumi.StringRef("go-gpu"),
		NodeSetup:         &daemonset,
		AgentImage:        gpu.AgentImageArgs{Repository: "registry.example.com/platform/nvidia-gpu-agent", Tag: pulumi.StringRef("0.1.0")},
		RuntimeClass:      &gpu.RuntimeClassSettingsArgs{Create: pulumi.BoolRef(false)},
	}
	groups := []gpu.NodeGroupArgs{
		{
			Name:         "l4-shared",
			NodeSelector: &gpu.NodeSelectorArgs{MatchLabels: map[string]string{pool: "go-l4"}},
			Gpu: &gpu.GpuArgs{Model: pulumi.StringRef("L4"), Sharing: &timeSlicing,
				TimeSlicing: &gpu.TimeSlicingArgs{PartitionCount: pulumi.IntRef(4)}},
		},
		{
			Name:         "a100",
			NodeSelector: &gpu.NodeSelectorArgs{MatchLabels: map[string]string{pool: "go-a100"}},
			Gpu:          &gpu.GpuArgs{Model: pulumi.StringRef("A100-80GB"), Sharing: &exclusive},
		},
	}
	platform, err := gpu.NewGpuPlatform(ctx, "gpu", &gpu.GpuPlatformArgs{
		Cluster:     cluster,
		ExtraLabels: pulumi.StringMap{"team": pulumi.String("go")},
	})
	if err != nil {
		return err
	}
	labels := pulumi.Array{}
	for _, group := range groups {
		ng, err := gpu.NewGpuNodeGroup(ctx, group.Name, &gpu.GpuNodeGroupArgs{
			Cluster:     cluster,
			Group:       group,
			ExtraLabels: pulumi.StringMap{"team": pulumi.String("go")},
		}, pulumi.DependsOn([]pulumi.Resource{platform}))
		if err != nil {
			return err
		}
		labels = append(labels, ng.NodeLabels)
	}
	ctx.Export("namespace", platform.Namespace)
	ctx.Export("nodeLabels", labels)
	return nil
}

func run(command string) error {
	ctx := context.Background()
	workDir, err := os.Getwd()
	if err != nil {
		return err
	}
	stack, err := auto.UpsertStackInlineSource(ctx, "dev", "gpu-go", program, auto.WorkDir(workDir))
	if err != nil {
		return err
	}
	switch command {
	case "preview":
		_, err = stack.Preview(ctx, optpreview.ProgressStreams(os.Stdout))
	case "up":
		var result auto.UpResult
		result, err = stack.Up(ctx, optup.ProgressStreams(os.Stdout))
		if err == nil {
			outputs := map[string]interface{}{}
			for k, v := range result.Outputs {
				outputs[k] = v.Value
			}
			text, _ := json.Marshal(outputs)
			fmt.Printf("OUTPUTS %s\n", text)
		}
	case "destroy":
		_, err = stack.Destroy(ctx, optdestroy.ProgressStreams(os.Stdout))
	default:
		err = fmt.Errorf("usage: gpu-go preview|up|destroy (got %q)", command)
	}
	return err
}

func main() {
	command := ""
	if len(os.Args) > 1 {
		command = os.Args[1]
	}
	if err := run(command); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
