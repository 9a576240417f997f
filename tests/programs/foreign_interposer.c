/*
 * An interposer written for tests/sim/test_sim_under_a_foreign_interposer.py and independent of
 * libvgpu.so: it wraps entry points of libcuda.so.1 and libnvidia-ml.so.1 the way third-party
 * interposers do (HAMi-core's libvgpu.so, profilers), each wrapper forwarding to the next
 * definition, found with dlsym(RTLD_NEXT). A driver that calls its own exported entry points
 * through the symbol table (nvmlDeviceGetCount_v2 calling nvmlDeviceGetCount) re-enters such a
 * library from inside a forwarded call; HAMi-core, whose wrappers forward to another version of
 * the same call, then recursed until its stack ran out. These wrappers forward each call to its
 * own name, so a re-entry is seen and reported instead.
 *
 * Reports go to the file named by $FOREIGN_INTERPOSER_LOG (stderr without it): a line
 * "nested OUTER INNER" whenever a wrapper is entered while another runs on the same thread, and
 * at exit "calls NAME N" for every wrapper, so a test can tell "never re-entered" from "never
 * called". An entry point missing from the driver aborts the program, as it does HAMi-core.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "vgpu/cuda_abi.h"
#include "vgpu/nvml_abi.h"

#define LAUNCH_PARAMS                                                                              \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
     unsigned int bz, unsigned int shared, CUstream stream, void **params, void **extra)
#define LAUNCH_ARGS (f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
#define COOPERATIVE_PARAMS                                                                         \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
     unsigned int bz, unsigned int shared, CUstream stream, void **params)
#define COOPERATIVE_ARGS (f, gx, gy, gz, bx, by, bz, shared, stream, params)

/* Every wrapped entry point: X(return type, name, parameters, arguments). Each versioned or
 * per-thread-stream name comes with its sibling, and the pool and v1 NVML entry points that
 * HAMi-core resolves are here too. */
#define WRAPPED(X)                                                                                 \
    X(nvmlReturn_t, nvmlInit, (void), ())                                                          \
    X(nvmlReturn_t, nvmlInit_v2, (void), ())                                                       \
    X(nvmlReturn_t, nvmlInitWithFlags, (unsigned int flags), (flags))                              \
    X(nvmlReturn_t, nvmlShutdown, (void), ())                                                      \
    X(nvmlReturn_t, nvmlSystemGetCudaDriverVersion, (int *version), (version))                     \
    X(nvmlReturn_t, nvmlSystemGetCudaDriverVersion_v2, (int *version), (version))                  \
    X(nvmlReturn_t, nvmlDeviceGetCount, (unsigned int *count), (count))                            \
    X(nvmlReturn_t, nvmlDeviceGetCount_v2, (unsigned int *count), (count))                         \
    X(nvmlReturn_t, nvmlDeviceGetHandleByIndex, (unsigned int index, nvmlDevice_t *device), (index, device)) \
    X(nvmlReturn_t, nvmlDeviceGetHandleByIndex_v2, (unsigned int index, nvmlDevice_t *device), (index, device)) \
    X(nvmlReturn_t, nvmlDeviceGetMemoryInfo, (nvmlDevice_t device, nvmlMemory_t *memory), (device, memory)) \
    X(nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t device, nvmlMemory_v2_t *memory), (device, memory)) \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses,                                          \
      (nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_v1_t *infos), (device, count, infos)) \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses_v2,                                       \
      (nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos), (device, count, infos)) \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses_v3,                                       \
      (nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos), (device, count, infos)) \
    X(CUresult, cuInit, (unsigned int flags), (flags))                                             \
    X(CUresult, cuDeviceGetUuid, (CUuuid *uuid, CUdevice device), (uuid, device))                  \
    X(CUresult, cuDeviceGetUuid_v2, (CUuuid *uuid, CUdevice device), (uuid, device))               \
    X(CUresult, cuDeviceTotalMem_v2, (size_t *bytes, CUdevice device), (bytes, device))            \
    X(CUresult, cuMemGetInfo_v2, (size_t *free, size_t *total), (free, total))                     \
    X(CUresult, cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytes), (dptr, bytes))                   \
    X(CUresult, cuMemFree_v2, (CUdeviceptr dptr), (dptr))                                          \
    X(CUresult, cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytes, CUstream stream), (dptr, bytes, stream)) \
    X(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytes, CUstream stream), (dptr, bytes, stream)) \
    X(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream), \
      (dptr, bytes, pool, stream))                                                                 \
    X(CUresult, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream), \
      (dptr, bytes, pool, stream))                                                                 \
    X(CUresult, cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream), (dptr, stream))               \
    X(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream), (dptr, stream))          \
    X(CUresult, cuLaunchKernel, LAUNCH_PARAMS, LAUNCH_ARGS)                                        \
    X(CUresult, cuLaunchKernel_ptsz, LAUNCH_PARAMS, LAUNCH_ARGS)                                   \
    X(CUresult, cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **params, void **extra), \
      (config, f, params, extra))                                                                  \
    X(CUresult, cuLaunchKernelEx_ptsz, (const CUlaunchConfig *config, CUfunction f, void **params, void **extra), \
      (config, f, params, extra))                                                                  \
    X(CUresult, cuLaunchCooperativeKernel, COOPERATIVE_PARAMS, COOPERATIVE_ARGS)                   \
    X(CUresult, cuLaunchCooperativeKernel_ptsz, COOPERATIVE_PARAMS, COOPERATIVE_ARGS)              \
    X(CUresult, cuGraphInstantiateWithParams,                                                      \
      (CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params), (exec, graph, params)) \
    X(CUresult, cuGraphInstantiateWithParams_ptsz,                                                 \
      (CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params), (exec, graph, params)) \
    X(CUresult, cuGraphLaunch, (CUgraphExec exec, CUstream stream), (exec, stream))                \
    X(CUresult, cuGraphLaunch_ptsz, (CUgraphExec exec, CUstream stream), (exec, stream))           \
    X(CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool *pool, CUdevice device), (pool, device))  \
    X(CUresult, cuDeviceGetMemPool, (CUmemoryPool *pool, CUdevice device), (pool, device))         \
    X(CUresult, cuDeviceSetMemPool, (CUdevice device, CUmemoryPool pool), (device, pool))          \
    X(CUresult, cuMemPoolGetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value), \
      (pool, attr, value))                                                                         \
    X(CUresult, cuMemPoolSetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value), \
      (pool, attr, value))

enum wrapper {
#define WRAPPER_ID(ret, name, params, args) W_##name,
    WRAPPED(WRAPPER_ID)
#undef WRAPPER_ID
    WRAPPER_COUNT
};

static const char *const names[WRAPPER_COUNT] = {
#define WRAPPER_NAME(ret, name, params, args) #name,
    WRAPPED(WRAPPER_NAME)
#undef WRAPPER_NAME
};

static int report = 2; /* where reports go */
static void *_Atomic next_of[WRAPPER_COUNT];
static atomic_ulong calls[WRAPPER_COUNT];
static _Thread_local int running = -1; /* the wrapper this thread is inside, or -1 */

__attribute__((constructor)) static void open_report(void)
{
    const char *path = getenv("FOREIGN_INTERPOSER_LOG");
    int fd = path ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
    if (fd >= 0)
        report = fd;
}

__attribute__((destructor)) static void report_calls(void)
{
    for (int i = 0; i < WRAPPER_COUNT; i++)
        dprintf(report, "calls %s %lu\n", names[i], atomic_load(&calls[i]));
}

static void *next(enum wrapper id)
{
    void *found = atomic_load(&next_of[id]);
    if (!found) {
        found = dlsym(RTLD_NEXT, names[id]);
        if (!found) {
            dprintf(report, "missing %s\n", names[id]);
            abort();
        }
        atomic_store(&next_of[id], found);
    }
    return found;
}

/* Counts the call and notes a re-entry; returns the wrapper to go back to when it returns. */
static int enter(enum wrapper id)
{
    atomic_fetch_add(&calls[id], 1);
    if (running >= 0)
        dprintf(report, "nested %s %s\n", names[running], names[id]);
    int outer = running;
    running = (int)id;
    return outer;
}

#define DEFINE_WRAPPER(ret, name, params, args)                                                    \
    __attribute__((visibility("default"))) ret name params                                          \
    {                                                                                              \
        ret(*forward) params = (ret(*) params)next(W_##name);                                      \
        int outer = enter(W_##name);                                                               \
        ret result = forward args;                                                                 \
        running = outer;                                                                           \
        return result;                                                                             \
    }
WRAPPED(DEFINE_WRAPPER)
