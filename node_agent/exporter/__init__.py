"""GPU metrics under dcgm-exporter's names, read through NVML (``cluster.monitoring.exporter: agent``).

``fields`` (the DCGM fields this exporter serves, from which NVML call, and the ones it cannot),
``counters`` (dcgm-exporter's counters file format: which fields to serve), ``holders`` (which pod and
container hold each GPU, MIG device or shared replica, from kubelet's PodResources answer) and
``collector`` (one scrape: NVML read once per GPU, one series per GPU or MIG device, labelled as
dcgm-exporter labels them). The kubelet client and the serving process are ``node_agent.kubelet``'s.
"""
