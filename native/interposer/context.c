/*
 * Context hooks. A context holds driver memory from the moment it exists, so creating one counts
 * it at once (driver_memory.c); a context that goes takes its allocations with it, without a
 * free for each, so they stop counting then, and so does its driver memory.
 */
#include "internal.h"

#define C (vgpu_state.context)

/* A new context holds driver memory from the start: count it now, not half a second later. */
static CUresult after_context(CUresult result, const CUcontext *made)
{
    if (result == CUDA_SUCCESS && made && vgpu_gpu_slot())
        vgpu_driver_memory_context_created(*made);
    return result;
}

/* A context that goes takes its allocations (and arrays) with it: they stop counting, and so
 * does the driver memory of the context itself. */
static void context_gone(CUcontext context)
{
    if (!context)
        return;
    uint64_t bytes = vgpu_release_context(context);
    vgpu_driver_memory_context_gone(context);
    VGPU_LOG(VGPU_LOG_INFO, "context %p is gone with %llu bytes of allocations", (void *)context,
             (unsigned long long)bytes);
}

static CUcontext primary_context_of(CUdevice dev)
{
    return dev >= 0 && dev < VGPU_CUDA_DEVICE_CACHE
               ? atomic_load_explicit(&C.primary_context[dev], memory_order_acquire)
               : NULL;
}

VGPU_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    VGPU_HOOK_REAL(cuCtxCreate_v2);
    return after_context(real(pctx, flags, dev), pctx);
}

VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                    CUdevice dev)
{
    VGPU_HOOK_REAL(cuCtxCreate_v4);
    return after_context(real(pctx, ctxCreateParams, flags, dev), pctx);
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    VGPU_HOOK_REAL(cuDevicePrimaryCtxRetain);
    CUresult result = real(pctx, dev);
    if (result == CUDA_SUCCESS && dev >= 0 && dev < VGPU_CUDA_DEVICE_CACHE)
        atomic_store_explicit(&C.primary_context[dev], *pctx, memory_order_release);
    return after_context(result, pctx);
}

VGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    VGPU_HOOK_REAL(cuCtxDestroy_v2);
    CUresult result = real(ctx);
    if (result == CUDA_SUCCESS)
        context_gone(ctx);
    return result;
}

/* The primary context goes when its last retain is released. */
VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    VGPU_HOOK_REAL(cuDevicePrimaryCtxRelease_v2);
    CUresult result = real(dev);
    vgpu_pfn_cuDevicePrimaryCtxGetState get_state = VGPU_CALLED(cuDevicePrimaryCtxGetState);
    unsigned int flags;
    int active = 1;
    if (result == CUDA_SUCCESS && get_state && get_state(dev, &flags, &active) == CUDA_SUCCESS && !active)
        context_gone(primary_context_of(dev));
    return result;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    VGPU_HOOK_REAL(cuDevicePrimaryCtxReset_v2);
    CUresult result = real(dev);
    if (result == CUDA_SUCCESS)
        context_gone(primary_context_of(dev));
    return result;
}
