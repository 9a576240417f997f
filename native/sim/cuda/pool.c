/*
 * Stream-ordered memory pools: each device's default pool and its current pool (the one
 * cuMemAllocAsync draws from), pools a program creates, and their attributes. An allocation
 * from a pool is a linear allocation (memory.c) that names its pool; this file keeps the pool's
 * figures as its allocations come and go.
 *
 * A pool keeps what is freed into it, as the driver's does (CUDA Programming Guide, "Stream
 * Ordered Memory Allocator"): memory freed with cuMemFreeAsync (or cuMemFree) stays reserved by
 * the process (charged to its slot: NVML lists it, other processes cannot take it) until
 *   - a synchronisation (cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize) gives back
 *     what the pool holds beyond its CU_MEMPOOL_ATTR_RELEASE_THRESHOLD (default 0: all of what
 *     is unused), or
 *   - cuMemPoolTrimTo(pool, keep) gives back unused memory until the pool holds at most `keep`
 *     (or only what is in use), or
 *   - the pool is destroyed (its unused memory at once, the rest with its last allocation).
 * A later allocation from the pool takes its unused reserve first and charges only the rest.
 * RESERVED_MEM_* is what the pool holds, USED_MEM_* what its live allocations take.
 *
 * Simplifications: the reserve is a byte count, not blocks (a real pool's reuse depends on the
 * sizes of its blocks and on its reuse policies, which are kept and read back but steer
 * nothing); every pool of the process is released at any synchronisation, whichever stream.
 */
#include <stdlib.h>

#include "cuda_sim.h"

struct CUmemPoolHandle_st *sim_pool_new(struct sim_cuda_device *device)
{
    struct CUmemPoolHandle_st *pool = calloc(1, sizeof *pool);
    if (pool)
        *pool = (struct CUmemPoolHandle_st){
            .device = device,
            .reuse_follow_event_dependencies = 1,
            .reuse_allow_opportunistic = 1,
            .reuse_allow_internal_dependencies = 1,
        };
    return pool;
}

/* Whether `pool` is a live pool of this process (one it created, or a default pool); the lock
 * is held. Looked up, never read through: a destroyed pool's memory may be gone. */
static int known(CUmemoryPool pool)
{
    return sim_handle_is(pool, SIM_HANDLE_POOL);
}

/* Checks a call on a pool as the driver does (initialised, the arguments, a live pool) and
 * takes the lock; the caller releases it on success. */
static CUresult lock_pool(CUmemoryPool pool, int arguments_valid)
{
    return sim_lock_handle(pool, SIM_HANDLE_POOL, arguments_valid);
}

struct CUmemPoolHandle_st *sim_pool_to_draw(struct sim_cuda_device *device, CUmemoryPool asked)
{
    pthread_mutex_lock(&sim_cuda.lock);
    struct CUmemPoolHandle_st *pool = asked ? (known(asked) ? asked : NULL) : device->current_pool;
    pthread_mutex_unlock(&sim_cuda.lock);
    return pool;
}

uint64_t sim_pool_claim(struct CUmemPoolHandle_st *pool, uint64_t bytes)
{
    pthread_mutex_lock(&sim_cuda.lock);
    uint64_t unused = pool->reserved - pool->used, reused = bytes < unused ? bytes : unused;
    pool->used += reused; /* held for the allocation until it is made or given up */
    pthread_mutex_unlock(&sim_cuda.lock);
    return reused;
}

void sim_pool_unclaim(struct CUmemPoolHandle_st *pool, uint64_t reused)
{
    pthread_mutex_lock(&sim_cuda.lock);
    pool->used -= reused;
    pthread_mutex_unlock(&sim_cuda.lock);
}

void sim_pool_took(struct CUmemPoolHandle_st *pool, uint64_t charged)
{
    pool->used += charged;
    pool->reserved += charged;
    if (pool->used > pool->used_high)
        pool->used_high = pool->used;
    if (pool->reserved > pool->reserved_high)
        pool->reserved_high = pool->reserved;
}

/* Gives back unused memory until the pool holds at most `keep` bytes (never what is in use);
 * the lock is held. Returns the bytes given back. */
static uint64_t shrink(struct CUmemPoolHandle_st *pool, uint64_t keep)
{
    uint64_t target = keep > pool->used ? keep : pool->used;
    if (pool->reserved <= target)
        return 0;
    uint64_t given = pool->reserved - target;
    pool->reserved = target;
    sim_uncharge(pool->device, given);
    return given;
}

void sim_pool_gave(struct CUmemPoolHandle_st *pool, uint64_t bytes)
{
    pool->used -= bytes;
    if (!pool->destroyed)
        return; /* kept reserved */
    shrink(pool, 0);
    if (pool->used == 0)
        free(pool);
}

void sim_pool_forget(struct CUmemPoolHandle_st *pool, uint64_t bytes)
{
    uint64_t unused = pool->reserved - pool->used, given = bytes < unused ? bytes : unused;
    pool->reserved -= given;
    sim_uncharge(pool->device, given);
}

void sim_pools_synchronised(void)
{
    pthread_mutex_lock(&sim_cuda.lock);
    for (size_t i = 0; i < sim_cuda.handles.count; i++) {
        struct sim_map_entry entry = sim_cuda.handles.entries[i];
        if (entry.value != SIM_HANDLE_POOL)
            continue;
        struct CUmemPoolHandle_st *pool = (struct CUmemPoolHandle_st *)entry.key;
        shrink(pool, pool->release_threshold);
    }
    pthread_mutex_unlock(&sim_cuda.lock);
}

/* ---- a device's pools ---------------------------------------------------------------------- */

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    DEVICE_ANSWER(dev, pool_out, device->default_pool);
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, pool != NULL);
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&sim_cuda.lock);
    *pool = device->current_pool;
    pthread_mutex_unlock(&sim_cuda.lock);
    return CUDA_SUCCESS;
}

/* The pool must be local to the device, as the driver requires. */
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, 1);
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&sim_cuda.lock);
    result = CUDA_ERROR_INVALID_VALUE;
    if (known(pool) && pool->device == device) {
        device->current_pool = pool;
        result = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

/* ---- pools a program makes ------------------------------------------------------------------ */

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    CUresult result = sim_check(pool && poolProps);
    if (result != CUDA_SUCCESS)
        return result;
    struct sim_cuda_device *device =
        poolProps->allocType == CU_MEM_ALLOCATION_TYPE_PINNED ? sim_device_at(&poolProps->location) : NULL;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmemPoolHandle_st *created = sim_pool_new(device);
    if (!created)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!sim_register_handle(created, SIM_HANDLE_POOL)) {
        free(created);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pool = created;
    return CUDA_SUCCESS;
}

/* A device whose current pool is destroyed draws from its default pool again, as with the driver. */
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CUresult result = lock_pool(pool, 1);
    if (result != CUDA_SUCCESS)
        return result;
    if (pool->is_default) {
        result = CUDA_ERROR_INVALID_VALUE;
    } else {
        sim_map_take(&sim_cuda.handles, (uintptr_t)pool, NULL);
        if (pool->device->current_pool == pool)
            pool->device->current_pool = pool->device->default_pool;
        shrink(pool, 0);
        /* Outstanding allocations stay valid; the pool goes with the last of them. */
        if (pool->used == 0)
            free(pool);
        else
            pool->destroyed = 1;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

/* Unused memory goes back to the device until the pool holds at most minBytesToKeep. */
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    CUresult result = lock_pool(pool, 1);
    if (result == CUDA_SUCCESS) {
        shrink(pool, minBytesToKeep);
        pthread_mutex_unlock(&sim_cuda.lock);
    }
    return result;
}

/* ---- attributes ------------------------------------------------------------------------------ */

/* The int that holds a reuse policy, or NULL for any other attribute. */
static int *reuse_policy(struct CUmemPoolHandle_st *pool, CUmemPool_attribute attr)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: return &pool->reuse_follow_event_dependencies;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: return &pool->reuse_allow_opportunistic;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: return &pool->reuse_allow_internal_dependencies;
    default: return NULL;
    }
}

/* A cuuint64_t figure of a pool; INVALID_VALUE for an attribute that is not one. */
static CUresult read_figure(const struct CUmemPoolHandle_st *pool, CUmemPool_attribute attr, cuuint64_t *figure)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *figure = pool->release_threshold; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *figure = pool->reserved; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *figure = pool->reserved_high; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *figure = pool->used; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *figure = pool->used_high; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

/* A high-water mark can only be reset, by writing 0; it then starts again from the current figure. */
static CUresult reset_high(uint64_t *high, uint64_t current, cuuint64_t figure)
{
    if (figure != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *high = current;
    return CUDA_SUCCESS;
}

/* The current figures are read-only. */
static CUresult write_figure(struct CUmemPoolHandle_st *pool, CUmemPool_attribute attr, const cuuint64_t *figure)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: pool->release_threshold = *figure; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: return reset_high(&pool->reserved_high, pool->reserved, *figure);
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: return reset_high(&pool->used_high, pool->used, *figure);
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

/* Reads or writes (`write`) an attribute: a reuse policy is an int, any other a cuuint64_t. */
static CUresult pool_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value, int write)
{
    CUresult result = lock_pool(pool, value != NULL);
    if (result != CUDA_SUCCESS)
        return result;
    int *policy = reuse_policy(pool, attr);
    if (policy && write)
        *policy = *(const int *)value != 0;
    else if (policy)
        *(int *)value = *policy;
    else
        result = write ? write_figure(pool, attr, value) : read_figure(pool, attr, value);
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    return pool_attribute(pool, attr, value, 0);
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    return pool_attribute(pool, attr, value, 1);
}
