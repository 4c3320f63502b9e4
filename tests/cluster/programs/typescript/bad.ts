// Compiled on its own to show that the schema's types reach TypeScript: each line below is an error tsc reports.
import * as gpu from "./sdk";

export const group: gpu.types.input.NodeGroupArgs = {
    name: "bad",
    gpu: { sharing: "Shared" },  // not a Sharing
};
export const cluster: gpu.types.input.ClusterArgs = {
    kubernetesVersion: "1.34",
    nodeSetupp: "daemonset",  // no such key
};
