/*
 * Contexts: primary (retained, released, reset) and created ones, the per-thread stack of
 * current contexts, and the device memory a context holds: each active context charges the
 * device's context_memory once, as the driver's own allocations for a context do on a real GPU.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_sim.h"

#define LIBRARY "libcuda (jupyter-vgpu simulated GPU)"

CUresult sim_current_context(struct CUctx_st **ctx, int arguments_valid)
{
    CUresult result = sim_ready();
    if (result != CUDA_SUCCESS)
        return result;
    struct CUctx_st *current = sim_current();
    if (!current || !atomic_load_explicit(&current->active, memory_order_relaxed))
        return CUDA_ERROR_INVALID_CONTEXT;
    *ctx = current;
    return arguments_valid ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult sim_attach_locked(struct sim_cuda_device *device)
{
    if (atomic_load(&device->slot) >= 0)
        return CUDA_SUCCESS;
    int slot = sim_slot_claim(device->view, sim_cuda.identity);
    if (slot < 0) {
        fprintf(stderr, "%s: device %d already serves %d live processes, the most the simulator tracks\n", LIBRARY,
                device->ordinal, SIM_MAX_PROCS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    device->tag_base = SIM_TAG(0, slot, sim_slot_generation(device->view, slot));
    atomic_store(&device->slot, slot);
    return CUDA_SUCCESS;
}

CUresult sim_attach(struct sim_cuda_device *device)
{
    if (atomic_load(&device->slot) >= 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&sim_cuda.lock);
    CUresult result = sim_attach_locked(device);
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

CUresult sim_charge(struct sim_cuda_device *device, uint64_t bytes)
{
    CUresult result = sim_attach(device);
    if (result != CUDA_SUCCESS)
        return result;
    return sim_memory_charge(device->view, atomic_load(&device->slot), bytes) == 0 ? CUDA_SUCCESS
                                                                                   : CUDA_ERROR_OUT_OF_MEMORY;
}

void sim_uncharge(struct sim_cuda_device *device, uint64_t bytes)
{
    sim_memory_uncharge(device->view, atomic_load(&device->slot), bytes);
}

/* Makes a context usable: the device memory the driver keeps for it, and a context NVML can
 * see. The lock is held. */
static CUresult activate(struct CUctx_st *ctx)
{
    struct sim_cuda_device *device = ctx->device;
    CUresult result = sim_attach_locked(device);
    if (result != CUDA_SUCCESS)
        return result;
    uint64_t context_memory = device->view->spec->context_memory;
    int slot = atomic_load(&device->slot);
    if (context_memory && sim_memory_charge(device->view, slot, context_memory) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    sim_slot_add_contexts(device->view, slot, 1);
    atomic_store(&ctx->active, 1);
    return CUDA_SUCCESS;
}

/* Ends a context: what it allocated is freed and its memory returns to the device. */
static void deactivate(struct CUctx_st *ctx)
{
    if (!atomic_exchange(&ctx->active, 0))
        return;
    sim_free_context_memory(ctx);
    while (ctx->streams) {
        struct CUstream_st *stream = ctx->streams;
        ctx->streams = stream->next;
        sim_stream_retire(stream);
    }
    struct sim_cuda_device *device = ctx->device;
    int slot = atomic_load(&device->slot);
    if (device->view->spec->context_memory)
        sim_memory_uncharge(device->view, slot, device->view->spec->context_memory);
    sim_slot_add_contexts(device->view, slot, -1);
}

static void push_current(struct CUctx_st *ctx)
{
    sim_thread.stack[sim_thread.depth++] = ctx;
}

/* Takes a context off this thread's stack wherever it is. */
static void forget_current(struct CUctx_st *ctx)
{
    int kept = 0;
    for (int i = 0; i < sim_thread.depth; i++)
        if (sim_thread.stack[i] != ctx)
            sim_thread.stack[kept++] = sim_thread.stack[i];
    sim_thread.depth = kept;
}

static CUresult create_context(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, pctx != NULL);
    if (result != CUDA_SUCCESS)
        return result;
    if (sim_thread.depth == SIM_CTX_STACK_DEPTH)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx->magic = SIM_CTX_MAGIC;
    ctx->device = device;
    ctx->flags = flags;
    pthread_mutex_lock(&sim_cuda.lock);
    ctx->null_stream = sim_stream_new(ctx, 0);
    result = ctx->null_stream ? activate(ctx) : CUDA_ERROR_OUT_OF_MEMORY;
    if (result != CUDA_SUCCESS && ctx->null_stream)
        sim_stream_retire(ctx->null_stream);
    pthread_mutex_unlock(&sim_cuda.lock);
    if (result != CUDA_SUCCESS) {
        free(ctx);
        return result;
    }
    push_current(ctx);
    *pctx = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return create_context(pctx, flags, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev)
{
    (void)ctxCreateParams; /* execution affinity and shared-memory carve-outs are not modelled */
    return create_context(pctx, flags, dev);
}

/* CUDA 12.0 to 12.4's cuCtxCreate: execution affinity (an SM count for the context) is not
 * modelled; a context asking for none is an ordinary one. */
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev)
{
    if (numParams != 0 || paramsArray != NULL)
        return sim_ready() == CUDA_SUCCESS ? CUDA_ERROR_NOT_SUPPORTED : sim_ready();
    return create_context(pctx, flags, dev);
}

/* The ready check, then INVALID_CONTEXT unless `ctx` names a context still in use. */
static CUresult check_context(CUcontext ctx)
{
    CUresult result = sim_ready();
    if (result == CUDA_SUCCESS && !(ctx && ctx->magic == SIM_CTX_MAGIC && atomic_load(&ctx->active)))
        return CUDA_ERROR_INVALID_CONTEXT;
    return result;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CUresult result = check_context(ctx);
    if (result != CUDA_SUCCESS)
        return result;
    if (ctx->is_primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&sim_cuda.lock);
    deactivate(ctx);
    sim_stream_retire(ctx->null_stream);
    ctx->null_stream = NULL;
    pthread_mutex_unlock(&sim_cuda.lock);
    forget_current(ctx);
    /* The struct stays: other threads may still name it, and get INVALID_CONTEXT. */
    return CUDA_SUCCESS;
}

/* Checks a call on device `dev`'s primary context as the driver does (sim_device_ready) and
 * takes the lock; the caller releases it on success. */
static CUresult lock_primary(CUdevice dev, int arguments_valid, struct CUctx_st **primary)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, arguments_valid);
    if (result == CUDA_SUCCESS) {
        pthread_mutex_lock(&sim_cuda.lock);
        *primary = device->primary;
    }
    return result;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    struct CUctx_st *ctx;
    CUresult result = lock_primary(dev, pctx != NULL, &ctx);
    if (result != CUDA_SUCCESS)
        return result;
    if (!atomic_load(&ctx->active))
        result = activate(ctx);
    if (result == CUDA_SUCCESS)
        ctx->retains++;
    pthread_mutex_unlock(&sim_cuda.lock);
    if (result == CUDA_SUCCESS)
        *pctx = ctx;
    return result;
}

/* A release deactivates the primary context with its last retain (releasing one never retained
 * is refused); a reset deactivates it whatever its retains. */
static CUresult release_primary(CUdevice dev, int reset)
{
    struct CUctx_st *ctx;
    CUresult result = lock_primary(dev, 1, &ctx);
    if (result != CUDA_SUCCESS)
        return result;
    if (reset)
        deactivate(ctx);
    else if (ctx->retains == 0)
        result = CUDA_ERROR_INVALID_CONTEXT;
    else if (--ctx->retains == 0)
        deactivate(ctx);
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return release_primary(dev, 0);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return release_primary(dev, 1);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, flags && active);
    if (result == CUDA_SUCCESS) {
        *flags = device->primary->flags;
        *active = atomic_load(&device->primary->active);
    }
    return result;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, 1);
    if (result == CUDA_SUCCESS)
        device->primary->flags = flags;
    return result;
}

/* NULL takes the current context off this thread's stack. */
CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult result = ctx ? check_context(ctx) : sim_ready();
    if (result != CUDA_SUCCESS)
        return result;
    if (!ctx) {
        if (sim_thread.depth > 0)
            sim_thread.depth--;
    } else if (sim_thread.depth == 0) {
        push_current(ctx);
    } else {
        sim_thread.stack[sim_thread.depth - 1] = ctx;
    }
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult result = sim_check(pctx != NULL);
    if (result == CUDA_SUCCESS)
        *pctx = sim_current();
    return result;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CUresult result = check_context(ctx);
    if (result != CUDA_SUCCESS)
        return result;
    if (sim_thread.depth == SIM_CTX_STACK_DEPTH)
        return CUDA_ERROR_INVALID_VALUE;
    push_current(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CUresult result = sim_ready();
    if (result != CUDA_SUCCESS)
        return result;
    if (sim_thread.depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *ctx = sim_thread.stack[--sim_thread.depth];
    if (pctx)
        *pctx = ctx;
    return CUDA_SUCCESS;
}

/* The CUDA 12 forms are the CUDA 13 ones for the current context (-Bsymbolic keeps these calls
 * inside the library). */
CUresult cuCtxGetDevice(CUdevice *device)
{
    return cuCtxGetDevice_v2(device, NULL);
}

CUresult cuCtxSynchronize(void)
{
    return cuCtxSynchronize_v2(NULL);
}

/* The CUDA 13 forms name the context; NULL means the current one. */
static CUresult named_or_current(CUcontext ctx, struct CUctx_st **found, int arguments_valid)
{
    if (!ctx)
        return sim_current_context(found, arguments_valid);
    CUresult result = check_context(ctx);
    if (result == CUDA_SUCCESS && !arguments_valid)
        result = CUDA_ERROR_INVALID_VALUE;
    *found = ctx;
    return result;
}

/* The body of a context query: `value`, an expression of the context `ctx` names (`found`; NULL:
 * the current context). */
#define CONTEXT_ANSWER(ctx, out, value)                                                                                \
    SIM_ANSWER(CUresult, struct CUctx_st, found, named_or_current(ctx, &found, (out) != NULL), out, value)

CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    CONTEXT_ANSWER(ctx, device, found->device->ordinal);
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    struct CUctx_st *found;
    CUresult result = named_or_current(ctx, &found, 1);
    if (result == CUDA_SUCCESS) {
        sim_sleep_until(sim_context_tail(found));
        sim_pools_synchronised();
    }
    return result;
}

CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    CONTEXT_ANSWER(ctx, version, 3020); /* what every context made by a driver since CUDA 3.2 answers */
}

CUresult cuCtxGetFlags(unsigned int *flags)
{
    CONTEXT_ANSWER(NULL, flags, found->flags);
}

/* Unique while the process lives: contexts are never freed, only marked destroyed. */
CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
    CONTEXT_ANSWER(ctx, ctxId, (unsigned long long)(uintptr_t)found);
}

CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, 1);
    if (result == CUDA_SUCCESS) {
        if (leastPriority)
            *leastPriority = 0;
        if (greatestPriority)
            *greatestPriority = SIM_STREAM_GREATEST_PRIORITY;
    }
    return result;
}

/* A Hopper part's defaults: stack, printf FIFO, malloc heap, sync depth, pending launches, L2
 * fetch granularity, persisting L2. */
static const size_t default_limits[SIM_LIMIT_COUNT] = {1024, 1 << 20, 8 << 20, 2, 2048, 64, 0};

CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, pvalue != NULL);
    if (result != CUDA_SUCCESS)
        return result;
    if (limit < 0 || limit >= SIM_LIMIT_COUNT)
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    *pvalue = ctx->limits[limit] ? ctx->limits[limit] : default_limits[limit];
    return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, 1);
    if (result != CUDA_SUCCESS)
        return result;
    if (limit < 0 || limit >= SIM_LIMIT_COUNT)
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    ctx->limits[limit] = value;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCacheConfig(CUfunc_cache *pconfig)
{
    CONTEXT_ANSWER(NULL, pconfig, found->cache_config);
}

CUresult cuCtxSetCacheConfig(CUfunc_cache config)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, config >= 0 && config <= 3);
    if (result == CUDA_SUCCESS)
        ctx->cache_config = config;
    return result;
}

/* The simulated devices have no peer-to-peer path (no NVLink, no shared PCIe switch): a peer
 * query says no and enabling peer access is refused, as a real driver does for such a pair. */
CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, Flags == 0);
    if (result == CUDA_SUCCESS && (result = check_context(peerContext)) == CUDA_SUCCESS)
        result = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    return result;
}

CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, 1);
    if (result == CUDA_SUCCESS && (result = check_context(peerContext)) == CUDA_SUCCESS)
        result = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    return result;
}
