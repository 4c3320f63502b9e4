/* What a CUDA workload needs from the driver, checked from inside the container: libcuda and NVML
 * resolve by soname, NVML initialises and counts the GPUs, and the device nodes and nvidia-smi are there.
 * Prints one JSON object. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int in_ld_cache(const char *name) {
    FILE *f = fopen("/etc/ld.so.cache", "rb");
    if (!f) return 0;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    for (size_t i = 0; i + strlen(name) <= n; i++)
        if (memcmp(buf + i, name, strlen(name)) == 0) return 1;
    return 0;
}

int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    void *ml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    int init = -1, count_rc = -1;
    unsigned count = 0;
    if (ml) {
        int (*nvml_init)(void) = (int (*)(void))dlsym(ml, "nvmlInit_v2");
        int (*nvml_count)(unsigned *) = (int (*)(unsigned *))dlsym(ml, "nvmlDeviceGetCount_v2");
        if (nvml_init) init = nvml_init();
        if (nvml_count) count_rc = nvml_count(&count);
    }
    printf("{\"libcuda\": %s, \"libnvidia_ml\": %s, \"nvml_init\": %d, \"device_count_rc\": %d, \"device_count\": %u, "
           "\"dev_nvidia0\": %s, \"dev_nvidiactl\": %s, \"nvidia_smi\": %s, \"ld_cache_libcuda\": %s, "
           "\"libcuda_dev_link\": %s}\n",
           cuda ? "true" : "false", ml ? "true" : "false", init, count_rc, count,
           access("/dev/nvidia0", F_OK) == 0 ? "true" : "false", access("/dev/nvidiactl", F_OK) == 0 ? "true" : "false",
           access("/usr/bin/nvidia-smi", X_OK) == 0 ? "true" : "false", in_ld_cache("libcuda.so.1") ? "true" : "false",
           access("/usr/lib/x86_64-linux-gnu/libcuda.so", F_OK) == 0 ? "true" : "false");
    return cuda && ml && init == 0 ? 0 : 1;
}
