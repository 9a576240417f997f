/* The environment the simulated machine reads, in one place for both libraries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

static const char *non_empty(const char *value)
{
    return value && *value ? value : NULL;
}

void sim_env_read(struct sim_env *env)
{
    env->devices = non_empty(getenv("VGPU_SIM_DEVICES"));
    env->state_path = non_empty(getenv("VGPU_SIM_STATE"));
    /* Set but empty is meaningful here: the real driver then shows no device. */
    env->visible_devices = getenv("CUDA_VISIBLE_DEVICES");
    env->runtime_dir = non_empty(getenv("XDG_RUNTIME_DIR"));
    env->driver_version = non_empty(getenv("VGPU_SIM_DRIVER_VERSION"));
    const char *fail = non_empty(getenv("VGPU_SIM_FAIL_LAUNCHES"));
    env->fail_launches = fail && strcmp(fail, "0") != 0;
    env->checkpoint_bandwidth = non_empty(getenv("VGPU_SIM_CHECKPOINT_BANDWIDTH"));
    env->restore_oom_fails = non_empty(getenv("VGPU_SIM_RESTORE_OOM_FAILS"));
}

int sim_driver_version_parse(const char *text, int *version, char *error, size_t error_size)
{
    if (!text) {
        *version = SIM_DEFAULT_DRIVER_VERSION;
        return 0;
    }
    unsigned major, minor;
    char end;
    if (sscanf(text, "%u.%u%c", &major, &minor, &end) == 2 && (major == 12 || major == 13) && minor <= 9) {
        *version = (int)(major * 1000 + minor * 10);
        return 0;
    }
    snprintf(error, error_size,
             "VGPU_SIM_DRIVER_VERSION is '%s'; it accepts a CUDA version 12.0 to 13.9, such as 12.8 or 13.0", text);
    return -1;
}

int sim_driver_version(void)
{
    /* Read once per process, as a real driver's version is fixed: cuGetProcAddress asks on every
     * call, and reading the environment each time made every call's cost grow with the length of
     * the environment (an interposer's own variables then read as its overhead). */
    static _Atomic int known;
    int version = atomic_load_explicit(&known, memory_order_relaxed);
    if (version)
        return version;
    char error[160];
    /* Malformed, cuInit fails and says why (sim_machine_open); until then the default stands. */
    if (sim_driver_version_parse(non_empty(getenv("VGPU_SIM_DRIVER_VERSION")), &version, error, sizeof error) != 0)
        version = SIM_DEFAULT_DRIVER_VERSION;
    atomic_store_explicit(&known, version, memory_order_relaxed);
    return version;
}

const char *sim_proc_root(void)
{
    const char *root = non_empty(getenv("VGPU_SIM_PROC"));
    return root ? root : "/proc";
}
