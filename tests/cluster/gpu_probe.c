/* What a CUDA workload needs from the driver, checked from inside the container: libcuda and NVML
 * resolve by soname, NVML initialises and counts the GPUs, and the device nodes and nvidia-smi are there.
 * Prints one JSON object; "gpus" lists the GPUs NVML shows the container (UUID and minor, what
 * `nvidia-smi -L` names), which on a node are exactly the ones whose device node it was given, each with
 * the MIG devices NVML lists under it ("mig": their UUIDs, as `nvidia-smi -L` lists "MIG ... Device <n>"). */
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
    static char gpus[16384] = "";
    size_t used = 0;
    if (ml) {
        int (*nvml_init)(void) = (int (*)(void))dlsym(ml, "nvmlInit_v2");
        int (*nvml_count)(unsigned *) = (int (*)(unsigned *))dlsym(ml, "nvmlDeviceGetCount_v2");
        int (*by_index)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(ml, "nvmlDeviceGetHandleByIndex_v2");
        int (*get_uuid)(void *, char *, unsigned) = (int (*)(void *, char *, unsigned))dlsym(ml, "nvmlDeviceGetUUID");
        int (*get_minor)(void *, unsigned *) = (int (*)(void *, unsigned *))dlsym(ml, "nvmlDeviceGetMinorNumber");
        int (*max_mig)(void *, unsigned *) = (int (*)(void *, unsigned *))dlsym(ml, "nvmlDeviceGetMaxMigDeviceCount");
        int (*mig_by_index)(void *, unsigned, void **) =
            (int (*)(void *, unsigned, void **))dlsym(ml, "nvmlDeviceGetMigDeviceHandleByIndex");
        if (nvml_init) init = nvml_init();
        if (nvml_count) count_rc = nvml_count(&count);
        for (unsigned i = 0; init == 0 && count_rc == 0 && by_index && get_uuid && get_minor && i < count; i++) {
            void *dev = NULL;
            char uuid[96] = "";
            unsigned minor = 0;
            if (by_index(i, &dev) != 0 || get_uuid(dev, uuid, sizeof uuid) != 0 || get_minor(dev, &minor) != 0) continue;
            used += (size_t)snprintf(gpus + used, sizeof gpus - used, "%s{\"uuid\": \"%s\", \"minor\": %u, \"mig\": [",
                                     used ? ", " : "", uuid, minor);
            unsigned max = 0, listed = 0;
            /* Every index up to the GPU's maximum: NVML answers NOT_FOUND where it lists no MIG device. */
            for (unsigned m = 0; max_mig && mig_by_index && max_mig(dev, &max) == 0 && m < max && used < sizeof gpus; m++) {
                void *mig = NULL;
                char mig_uuid[96] = "";
                if (mig_by_index(dev, m, &mig) != 0 || get_uuid(mig, mig_uuid, sizeof mig_uuid) != 0) continue;
                used += (size_t)snprintf(gpus + used, sizeof gpus - used, "%s\"%s\"", listed++ ? ", " : "", mig_uuid);
            }
            if (used < sizeof gpus) used += (size_t)snprintf(gpus + used, sizeof gpus - used, "]}");
            if (used >= sizeof gpus) break;
        }
    }
    printf("{\"libcuda\": %s, \"libnvidia_ml\": %s, \"nvml_init\": %d, \"device_count_rc\": %d, \"device_count\": %u, "
           "\"dev_nvidia0\": %s, \"dev_nvidiactl\": %s, \"nvidia_smi\": %s, \"ld_cache_libcuda\": %s, "
           "\"libcuda_dev_link\": %s, \"gpus\": [%s]}\n",
           cuda ? "true" : "false", ml ? "true" : "false", init, count_rc, count,
           access("/dev/nvidia0", F_OK) == 0 ? "true" : "false", access("/dev/nvidiactl", F_OK) == 0 ? "true" : "false",
           access("/usr/bin/nvidia-smi", X_OK) == 0 ? "true" : "false", in_ld_cache("libcuda.so.1") ? "true" : "false",
           access("/usr/lib/x86_64-linux-gnu/libcuda.so", F_OK) == 0 ? "true" : "false", gpus);
    return cuda && ml && init == 0 ? 0 : 1;
}
