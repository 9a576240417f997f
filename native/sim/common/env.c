/* The environment the simulated machine reads, in one place for both libraries. */
#include <stdlib.h>

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
    env->checkpoint_bandwidth = non_empty(getenv("VGPU_SIM_CHECKPOINT_BANDWIDTH"));
    env->restore_oom_fails = non_empty(getenv("VGPU_SIM_RESTORE_OOM_FAILS"));
}

const char *sim_proc_root(void)
{
    const char *root = non_empty(getenv("VGPU_SIM_PROC"));
    return root ? root : "/proc";
}
