/*
 * The driver's stream-ordered memory pools (cuMemAllocAsync, cuMemAllocFromPoolAsync). A pool
 * keeps what is freed into it reserved for the process (the device counts it, NVML lists it)
 * until a synchronisation gives back what is beyond its release threshold or cuMemPoolTrimTo
 * trims it, and serves its next allocations from that reserve first. So the slot's charge for
 * pool memory follows what the pools the process drew from reserve (RESERVED_MEM_CURRENT), as
 * graph memory follows the graph pool (charge.c):
 *   - an allocation is charged, before the driver makes it, what the pool's unused reserve
 *     cannot serve (less what other threads' allocations in flight claimed of it), and refused
 *     like any allocation over the cap; after it, the pools' charge is set to what they
 *     reserve, the allocation's charge included;
 *   - a free (its table entry holds no bytes of its own) and a trim set it again;
 *   - what a synchronisation gave back is seen by the monitor within a period (until then the
 *     slot counts more than the process holds: the safe side for the cap).
 *
 * An allocation the pools do not serve (cuMemAlloc, cuMemCreate, an array) that the cap would
 * refuse while the process's pools keep unused reserve trims them first and is counted again
 * (vgpu_charge_making_room): the driver would not give that reserve up for it (it releases it at a
 * synchronisation past the release threshold or a trim, never because another allocation fails;
 * docs/limits.md), and the program freed it. Only what a trim can release goes: on a real GPU, a
 * free whose completion the host has not seen yet still counts as in use.
 *
 * Before a suspend the publisher asks (the limits page's `release_request`): the monitor trims
 * every pool the process drew from, and each device's default and current pool, to 0 (only
 * unused memory goes: never what the program still holds), and answers in its slot with the
 * bytes given back. Where the kernel's Python side watches too (`frameworks_watching`), the trim
 * waits for its answer for up to RELEASE_WAIT_PERIODS monitor periods, so what the frameworks
 * freed into a pool (CuPy's async allocator) goes too.
 */
#include "internal.h"

#define C (vgpu_state.charge)
#define RELEASE_WAIT_PERIODS 2

/* What `pool` reserves, or -1 when the driver cannot say (a pool destroyed since). */
static int64_t reserved(CUmemoryPool pool, CUmemPool_attribute attribute)
{
    vgpu_pfn_cuMemPoolGetAttribute get = VGPU_CALLED(cuMemPoolGetAttribute);
    cuuint64_t value = 0;
    if (!get || get(pool, attribute, &value) != CUDA_SUCCESS)
        return -1;
    return (int64_t)value;
}

CUmemoryPool vgpu_pool_drawn(CUmemoryPool asked)
{
    if (asked)
        return asked;
    vgpu_pfn_cuCtxGetDevice get_device = VGPU_CALLED(cuCtxGetDevice);
    vgpu_pfn_cuDeviceGetMemPool get_pool = VGPU_CALLED(cuDeviceGetMemPool);
    CUdevice device;
    CUmemoryPool pool = NULL;
    if (!get_device || !get_pool || get_device(&device) != CUDA_SUCCESS || get_pool(&pool, device) != CUDA_SUCCESS)
        return NULL;
    return pool;
}

uint64_t vgpu_pool_claim(CUmemoryPool pool, uint64_t bytes)
{
    if (!pool)
        return 0;
    pthread_mutex_lock(&C.pool_lock);
    int64_t held = reserved(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    int64_t used = reserved(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    uint64_t unused = held > used && used >= 0 ? (uint64_t)(held - used) : 0;
    /* What other threads' allocations in flight took of it is not there for this one. */
    unused = unused > C.pool_claimed ? unused - C.pool_claimed : 0;
    uint64_t claimed = bytes < unused ? bytes : unused;
    C.pool_claimed += claimed;
    pthread_mutex_unlock(&C.pool_lock);
    return claimed;
}

/* Adds a pool to those the process drew from; pool_lock held. */
static void remember(CUmemoryPool pool)
{
    if (!pool)
        return;
    for (int i = 0; i < C.pool_count; i++)
        if (C.pools[i] == pool)
            return;
    if (C.pool_count < VGPU_POOLS_TRACKED)
        C.pools[C.pool_count++] = pool;
    else
        VGPU_LOG(VGPU_LOG_WARN, "more than %d memory pools: the memory of the others is counted as the driver's",
                 VGPU_POOLS_TRACKED);
}

/* Sets the pools' charge to what they reserve, with `pending` bytes charged for an allocation
 * meanwhile; pool_lock held. A pool the driver no longer knows is forgotten. */
static void settle_locked(struct vgpu_proc_slot *slot, uint64_t pending)
{
    uint64_t target = 0;
    for (int i = 0; i < C.pool_count;) {
        int64_t held = reserved(C.pools[i], CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        if (held < 0) {
            C.pools[i] = C.pools[--C.pool_count];
            continue;
        }
        target += (uint64_t)held;
        i++;
    }
    uint64_t held = C.pool_charged + pending;
    if (slot && target > held)
        vgpu_slot_add(slot, target - held);
    else if (slot)
        vgpu_slot_subtract(slot, held - target);
    C.pool_charged = target;
}

CUresult vgpu_pool_allocation_settle(const struct vgpu_charge *c, CUresult result, CUmemoryPool pool, uint64_t claimed,
                                     CUdeviceptr address, uint8_t family)
{
    if (result != CUDA_SUCCESS) {
        pthread_mutex_lock(&C.pool_lock);
        C.pool_claimed -= claimed;
        pthread_mutex_unlock(&C.pool_lock);
        vgpu_uncharge(c);
        return result;
    }
    /* Known to the table, so that its free settles the pools again; its bytes are the pool's. */
    struct vgpu_charge none = {c->slot, 0};
    vgpu_settle_charge(&none, result, VGPU_KIND_DEVICE_POINTER, address, family);
    pthread_mutex_lock(&C.pool_lock);
    C.pool_claimed -= claimed;
    remember(pool);
    settle_locked(c->slot, c->bytes);
    pthread_mutex_unlock(&C.pool_lock);
    return result;
}

void vgpu_pool_memory_settle(void)
{
    pthread_mutex_lock(&C.pool_lock);
    if (C.pool_count || C.pool_charged)
        settle_locked(vgpu_claimed_slot(), 0);
    pthread_mutex_unlock(&C.pool_lock);
}

/* Trims `pool` to 0; returns the bytes it gave back. */
static uint64_t trim(CUmemoryPool pool)
{
    vgpu_pfn_cuMemPoolTrimTo trim_to = VGPU_REAL(cuMemPoolTrimTo);
    int64_t before = reserved(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    if (!trim_to || before < 0 || trim_to(pool, 0) != CUDA_SUCCESS)
        return 0;
    int64_t after = reserved(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    return after >= 0 && after < before ? (uint64_t)(before - after) : 0;
}

CUresult vgpu_pool_charge_trimming(struct vgpu_charge *charge, const char *call, uint64_t bytes)
{
    CUresult result = vgpu_charge_try(charge, call, bytes, 0);
    if (result != CUDA_ERROR_OUT_OF_MEMORY)
        return result;
    uint64_t released = 0;
    pthread_mutex_lock(&C.pool_lock);
    for (int i = 0; i < C.pool_count; i++)
        released += trim(C.pools[i]);
    settle_locked(vgpu_claimed_slot(), 0);
    pthread_mutex_unlock(&C.pool_lock);
    VGPU_LOG(VGPU_LOG_INFO, "%s: trimmed the memory pools' unused reserve (%llu bytes) before the cap's answer", call,
             (unsigned long long)released);
    return vgpu_charge(charge, call, bytes);
}

/* Every device's default and current pool joins those the process drew from; pool_lock held. */
static void remember_devices_pools(void)
{
    vgpu_pfn_cuDeviceGetCount count = VGPU_CALLED(cuDeviceGetCount);
    vgpu_pfn_cuDeviceGetDefaultMemPool get_default = VGPU_CALLED(cuDeviceGetDefaultMemPool);
    vgpu_pfn_cuDeviceGetMemPool get_current = VGPU_CALLED(cuDeviceGetMemPool);
    int devices = 0;
    if (!count || count(&devices) != CUDA_SUCCESS)
        return;
    for (CUdevice device = 0; device < devices; device++) {
        CUmemoryPool pool;
        if (get_default && get_default(&pool, device) == CUDA_SUCCESS)
            remember(pool);
        if (get_current && get_current(&pool, device) == CUDA_SUCCESS)
            remember(pool);
    }
}

void vgpu_answer_release_request(void)
{
    const struct vgpu_limits_page *page = vgpu_limits_page();
    struct vgpu_proc_slot *slot = vgpu_claimed_slot();
    if (!page || !slot)
        return;
    uint32_t request = __atomic_load_n(&page->release_request, __ATOMIC_ACQUIRE);
    if (request == __atomic_load_n(&slot->pools_answered, __ATOMIC_RELAXED)) {
        C.release_waited = 0;
        return;
    }
    /* The frameworks' caches first, where the kernel's Python side empties them. */
    if (__atomic_load_n(&slot->frameworks_watching, __ATOMIC_ACQUIRE) &&
        __atomic_load_n(&slot->frameworks_answered, __ATOMIC_ACQUIRE) != request &&
        C.release_waited++ < RELEASE_WAIT_PERIODS)
        return;
    C.release_waited = 0;
    uint64_t released = 0;
    pthread_mutex_lock(&C.pool_lock);
    remember_devices_pools();
    for (int i = 0; i < C.pool_count; i++)
        released += trim(C.pools[i]);
    settle_locked(slot, 0);
    pthread_mutex_unlock(&C.pool_lock);
    VGPU_LOG(VGPU_LOG_DEBUG, "release request %u: the memory pools gave back %llu bytes", request,
             (unsigned long long)released);
    __atomic_store_n(&slot->pools_released, released, __ATOMIC_RELAXED);
    __atomic_store_n(&slot->pools_answered, request, __ATOMIC_RELEASE);
}

/* A program's own trim gives memory back at once: the charge follows. */
VGPU_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    VGPU_HOOK_REAL(cuMemPoolTrimTo);
    CUresult result = real(pool, minBytesToKeep);
    if (result == CUDA_SUCCESS)
        vgpu_pool_memory_settle();
    return result;
}
