// A TypeScript program using the nvidia-gpu package through its generated SDK (`pulumi package gen-sdk`,
// in ./sdk): a Kubernetes provider, the platform and two node groups. It runs as an Automation API inline
// program (`node bin/index.js up|destroy`): the real CLI and engine, with this process as the language runtime,
// since the Node.js language host cannot be built offline (tests/cluster/test_component_sdks.py says why).
import * as pulumi from "@pulumi/pulumi";
import { LocalWorkspace } from "@pulumi/pulumi/automation";
import * as k8s from "@pulumi/kubernetes";
import * as gpu from "./sdk";

const POOL = "example.com/gpu-pool";

// The settings objects are typed by the schema: a misspelled key or an unknown sharing mode does not compile.
const cluster: gpu.types.input.ClusterArgs = {
    kubernetesVersion: "1.34",
    namespace: "ts-gpu",
    nodeSetup: gpu.NodeSetupBackend.Daemonset,
    agentImage: { repository: "registry.example.com/platform/nvidia-gpu-agent", tag: "0.1.0" },
    runtimeClass: { create: false },
};
const groups: gpu.types.input.NodeGroupArgs[] = [
    {
        name: "l4-shared",
        nodeSelector: { matchLabels: { [POOL]: "ts-l4" } },
        gpu: { model: "L4", sharing: gpu.Sharing.TimeSlicing, timeSlicing: { partitionCount: 4 } },
    },
    {
        name: "a100",
        nodeSelector: { matchLabels: { [POOL]: "ts-a100" } },
        gpu: { model: "A100-80GB", sharing: gpu.Sharing.Exclusive },
        extraTaints: [{ key: "example.com/team", value: "ml", effect: gpu.TaintEffect.NoSchedule }],
    },
];

async function program() {
    const provider = new k8s.Provider("k8s", { enableServerSideApply: true });
    const platform = new gpu.GpuPlatform("gpu", {
        cluster,
        extraLabels: { team: "ts" },
        nodeTaintKeys: ["example.com/team"],
    }, { providers: [provider] });
    const nodeGroups = groups.map(group => new gpu.GpuNodeGroup(group.name, {
        cluster,
        group,
        extraLabels: { team: "ts" },
    }, { providers: [provider], dependsOn: [platform] }));
    return {
        namespace: platform.namespace,
        nodeLabels: pulumi.all(nodeGroups.map(g => g.nodeLabels)),
    };
}

async function main(command: string) {
    const stack = await LocalWorkspace.createOrSelectStack(
        { stackName: "dev", projectName: "gpu-ts", program },
        { workDir: process.cwd() },
    );
    const onOutput = (out: string) => process.stdout.write(out);
    if (command === "preview") {
        await stack.preview({ onOutput });
    } else if (command === "up") {
        const result = await stack.up({ onOutput });
        const outputs = Object.fromEntries(Object.entries(result.outputs).map(([k, v]) => [k, v.value]));
        console.log(`OUTPUTS ${JSON.stringify(outputs)}`);
    } else if (command === "destroy") {
        await stack.destroy({ onOutput });
    } else {
        throw new Error(`usage: node bin/index.js preview|up|destroy (got ${command})`);
    }
}

main(process.argv[2]).catch(err => {
    console.error(err);
    process.exit(1);
});
