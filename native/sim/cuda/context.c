/*
 * Contexts: primary (retained, released, reset) and created ones, the per-thread stack of
 * current contexts, and the device memory a context holds: each active context charges the
 * device's context_memory once, as the driver's own allocations for a context do on a real GPU.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_sim.h"

#define LIBRARY "libcuda (jupyter-vgpu simulated GPU)"

CUresult sim_current_context(struct CUctx_st **ctx)
{
    CUresult result = sim_ready();
    if (result != CUDA_SUCCESS)
        return result;
    struct CUctx_st *current = sim_current();
    if (!current || !atomic_load_explicit(&current->active, memory_order_relaxed))
        return CUDA_ERROR_INVALID_CONTEXT;
    *ctx = current;
    return CUDA_SUCCESS;
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
    CUresult result = sim_device_ready(dev, &device);
    if (result == CUDA_SUCCESS && !pctx)
        result = CUDA_ERROR_INVALID_VALUE;
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

static int valid_context(CUcontext ctx)
{
    return ctx && ctx->magic == SIM_CTX_MAGIC;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CUresult result = sim_ready();
    if (result != CUDA_SUCCESS)
        return result;
    if (!valid_context(ctx) || ctx->is_primary || !atomic_load(&ctx->active))
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

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device);
    if (result == CUDA_SUCCESS && !pctx)
        result = CUDA_ERROR_INVALID_VALUE;
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&sim_cuda.lock);
    struct CUctx_st *ctx = device->primary;
    if (!atomic_load(&ctx->active))
        result = activate(ctx);
    if (result == CUDA_SUCCESS)
        ctx->retains++;
    pthread_mutex_unlock(&sim_cuda.lock);
    if (result == CUDA_SUCCESS)
        *pctx = ctx;
    return result;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device);
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&sim_cuda.lock);
    struct CUctx_st *ctx = device->primary;
    if (ctx->retains == 0)
        result = CUDA_ERROR_INVALID_CONTEXT;
    else if (--ctx->retains == 0)
        deactivate(ctx);
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device);
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&sim_cuda.lock);
    deactivate(device->primary);
    pthread_mutex_unlock(&sim_cuda.lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device);
    if (result != CUDA_SUCCESS)
        return result;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = device->primary->flags;
    *active = atomic_load(&device->primary->active);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device);
    if (result != CUDA_SUCCESS)
        return result;
    device->primary->flags = flags;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult result = sim_ready();
    if (result != CUDA_SUCCESS)
        return result;
    if (!ctx) {
        if (sim_thread.depth > 0)
            sim_thread.depth--;
        return CUDA_SUCCESS;
    }
    if (!valid_context(ctx) || !atomic_load(&ctx->active))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (sim_thread.depth == 0)
        push_current(ctx);
    else
        sim_thread.stack[sim_thread.depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult result = sim_ready();
    if (result != CUDA_SUCCESS)
        return result;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = sim_current();
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CUresult result = sim_ready();
    if (result != CUDA_SUCCESS)
        return result;
    if (!valid_context(ctx) || !atomic_load(&ctx->active))
        return CUDA_ERROR_INVALID_CONTEXT;
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

CUresult cuCtxGetDevice(CUdevice *device)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx);
    if (result != CUDA_SUCCESS)
        return result;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = ctx->device->ordinal;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx);
    if (result != CUDA_SUCCESS)
        return result;
    sim_sleep_until(sim_context_tail(ctx));
    return CUDA_SUCCESS;
}
