/*
 * Launch hooks: each computes what the launch costs and asks the limiter (pacing.c) to admit
 * it before forwarding. Kept thin and alike; the pacing logic lives in one place.
 */
#include "internal.h"

static uint64_t launch_cost(unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                            unsigned int by, unsigned int bz)
{
    uint64_t blocks = (uint64_t)gx * gy * gz;
    uint64_t threads = (uint64_t)bx * by * bz;
    return blocks * ((threads + 31) / 32);
}

#define LAUNCH_HOOK(name)                                                                          \
    VGPU_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,     \
                              unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm, \
                              CUstream stream, void **params, void **extra)                        \
    {                                                                                              \
        vgpu_launch_admit(launch_cost(gx, gy, gz, bx, by, bz));                                    \
        VGPU_FORWARD_CUDA(name, f, gx, gy, gz, bx, by, bz, shm, stream, params, extra);            \
    }
LAUNCH_HOOK(cuLaunchKernel)
LAUNCH_HOOK(cuLaunchKernel_ptsz)

#define COOPERATIVE_LAUNCH_HOOK(name)                                                              \
    VGPU_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,     \
                              unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm, \
                              CUstream stream, void **params)                                      \
    {                                                                                              \
        vgpu_launch_admit(launch_cost(gx, gy, gz, bx, by, bz));                                    \
        VGPU_FORWARD_CUDA(name, f, gx, gy, gz, bx, by, bz, shm, stream, params);                   \
    }
COOPERATIVE_LAUNCH_HOOK(cuLaunchCooperativeKernel)
COOPERATIVE_LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz)

#define LAUNCH_EX_HOOK(name)                                                                       \
    VGPU_EXPORT CUresult name(const CUlaunchConfig *config, CUfunction f, void **params,           \
                              void **extra)                                                        \
    {                                                                                              \
        if (config)                                                                                \
            vgpu_launch_admit(launch_cost(config->gridDimX, config->gridDimY, config->gridDimZ,    \
                                          config->blockDimX, config->blockDimY,                    \
                                          config->blockDimZ));                                     \
        VGPU_FORWARD_CUDA(name, config, f, params, extra);                                         \
    }
LAUNCH_EX_HOOK(cuLaunchKernelEx)
LAUNCH_EX_HOOK(cuLaunchKernelEx_ptsz)

/* Graphs: pacing.c owns their cost (TODO agent: replace these pass-throughs). */
VGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags)
{
    VGPU_FORWARD_CUDA(cuGraphInstantiateWithFlags, exec, graph, flags);
}
VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    VGPU_FORWARD_CUDA(cuGraphLaunch, exec, stream);
}
VGPU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
    VGPU_FORWARD_CUDA(cuGraphLaunch_ptsz, exec, stream);
}
VGPU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    VGPU_FORWARD_CUDA(cuGraphExecDestroy, exec);
}
