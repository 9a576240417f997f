/*
 * Charging GPU memory to this process's slot: every allocation family is charged before the
 * driver makes it and capped, and every free gives back exactly what its allocation was
 * charged (the allocation table remembers it).
 *
 * The cap check takes no lock, across threads and processes: a request is first added to this
 * process's `allocated` (an atomic add), then the live slots are summed; over the cap, the
 * request is taken back and refused. Two racing requests therefore both see each other's add
 * at least from one side: near the cap both may be refused, but never both granted over it.
 *
 * A free of something the table does not know (allocated before the library loaded, or by the
 * parent before a fork) goes to the driver untouched and returns the driver's answer: RMM and
 * others rely on that.
 */
#include "internal.h"

/* For debug logs: which kind of allocation an entry came from. */
static const char *const family_names[] = {
    [VGPU_FAMILY_ALLOC] = "cuMemAlloc",
    [VGPU_FAMILY_PITCH] = "cuMemAllocPitch",
    [VGPU_FAMILY_MANAGED] = "cuMemAllocManaged",
    [VGPU_FAMILY_ASYNC] = "cuMemAllocAsync",
    [VGPU_FAMILY_POOL] = "cuMemAllocFromPoolAsync",
    [VGPU_FAMILY_VMM] = "cuMemCreate",
    [VGPU_FAMILY_ARRAY] = "cuArrayCreate",
    [VGPU_FAMILY_MIPMAPPED_ARRAY] = "cuMipmappedArrayCreate",
};

static void slot_add(struct vgpu_proc_slot *slot, uint64_t bytes)
{
    __atomic_fetch_add(&slot->allocated, bytes, __ATOMIC_SEQ_CST);
    vgpu_note_allocated_change();
}

static void slot_subtract(struct vgpu_proc_slot *slot, uint64_t bytes)
{
    if (!slot || !bytes)
        return;
    __atomic_fetch_sub(&slot->allocated, bytes, __ATOMIC_SEQ_CST);
    vgpu_note_allocated_change();
}

void vgpu_slot_add(struct vgpu_proc_slot *slot, uint64_t bytes)
{
    if (slot && bytes)
        slot_add(slot, bytes);
}

void vgpu_slot_subtract(struct vgpu_proc_slot *slot, uint64_t bytes)
{
    slot_subtract(slot, bytes);
}

/* Whether a refusal of `request` bytes, with `usage` held by the slice, starts a new burst
 * (vgpu_charge_state), noting it. */
static int new_refusal_burst(uint64_t request, uint64_t usage)
{
    struct vgpu_charge_state *state = &vgpu_state.charge;
    uint64_t now = vgpu_now_ns();
    uint64_t previous_ns = atomic_exchange(&state->refused_ns, now);
    uint64_t previous_bytes = atomic_exchange(&state->refused_bytes, request);
    uint64_t previous_usage = atomic_exchange(&state->refused_usage, usage);
    return !(previous_ns && now - previous_ns < VGPU_OOM_BURST_NS && previous_bytes == request &&
             usage <= previous_usage);
}

static CUresult refuse(struct vgpu_proc_slot *slot, const char *call, uint64_t request, uint64_t usage, uint64_t limit,
                       int report)
{
    if (!report)
        return CUDA_ERROR_OUT_OF_MEMORY; /* a first try: the caller makes room and tries again */
    __atomic_fetch_add(&slot->oom_refusals, 1, __ATOMIC_RELAXED);
    if (new_refusal_burst(request, usage))
        vgpu_report_oom(call, request, usage, limit);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Adds `bytes` to the slot and checks the slice against the cap; over it, takes them back and
 * refuses (with `report`, counted and said; without, silently). `request` is the whole
 * allocation the OOM line names (more than `bytes` when part of it was charged before). */
static CUresult add_within_cap(struct vgpu_proc_slot *slot, const char *call, uint64_t bytes, uint64_t request,
                               uint64_t limit, int report)
{
    if (limit && bytes > limit) {
        uint64_t usage = vgpu_slice_usage(), charged_before = request - bytes;
        return refuse(slot, call, request, usage > charged_before ? usage - charged_before : 0, limit, report);
    }
    /* A context counted at the slice's recorded size is measured before a decision it could
     * change (were it twice that size), and before this charge, which NVML cannot see yet. */
    uint64_t estimated = vgpu_estimated_driver_memory();
    if (__builtin_expect(estimated != 0, 0) && limit && vgpu_slice_usage() + bytes + estimated > limit)
        vgpu_measure_driver_memory();
    slot_add(slot, bytes);
    if (limit) {
        uint64_t usage = vgpu_slice_usage();
        if (usage > limit) {
            slot_subtract(slot, bytes);
            return refuse(slot, call, request, usage > request ? usage - request : 0, limit, report);
        }
    }
    return CUDA_SUCCESS;
}

CUresult vgpu_charge_try(struct vgpu_charge *charge_out, const char *call, uint64_t bytes, int report)
{
    struct vgpu_limits_snapshot limits;
    struct vgpu_proc_slot *slot = NULL;
    if (vgpu_read_limits(&limits) != 0 || (!(slot = vgpu_gpu_slot()) && !vgpu_slot_released())) {
        vgpu_report_fail_closed();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!slot) { /* exiting, slot given back: the driver frees everything in a moment */
        *charge_out = (struct vgpu_charge){NULL, 0};
        return CUDA_SUCCESS;
    }
    CUresult result = add_within_cap(slot, call, bytes, bytes, limits.memory_limit, report);
    if (result == CUDA_SUCCESS)
        *charge_out = (struct vgpu_charge){slot, bytes};
    return result;
}

/* Moves a charge to `actual` bytes once the driver said what it really took. Growing it is
 * checked against the cap (the limits of this instant) like a new request, and refused like
 * one when the limits cannot be read: unreadable limits are no cap to check against, not a
 * cap of "none". */
CUresult vgpu_recharge(struct vgpu_charge *c, const char *call, uint64_t actual)
{
    if (actual > c->bytes && c->slot) {
        struct vgpu_limits_snapshot limits;
        if (vgpu_read_limits(&limits) != 0) {
            vgpu_report_fail_closed();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        CUresult result = add_within_cap(c->slot, call, actual - c->bytes, actual, limits.memory_limit, 1);
        if (result != CUDA_SUCCESS)
            return result;
    } else if (actual < c->bytes) {
        slot_subtract(c->slot, c->bytes - actual);
    }
    c->bytes = actual;
    return CUDA_SUCCESS;
}

/* The context an allocation made now belongs to. VMM memory belongs to no context: it lives
 * until cuMemRelease. */
static uint64_t owning_context(uint8_t kind)
{
    vgpu_pfn_cuCtxGetCurrent get_current = VGPU_CALLED(cuCtxGetCurrent);
    CUcontext context = NULL;
    if (kind == VGPU_KIND_VMM_HANDLE || !get_current || get_current(&context) != CUDA_SUCCESS)
        return 0;
    return (uint64_t)(uintptr_t)context;
}

static void record(const struct vgpu_charge *c, uint8_t kind, uint64_t key, uint8_t family)
{
    struct vgpu_alloc_entry entry = {
        .key = key, .size = c->bytes, .context = owning_context(kind), .kind = kind, .family = family};
    int64_t replaced = vgpu_table_insert(&entry);
    VGPU_LOG(VGPU_LOG_DEBUG, "%s %#llx: %llu bytes charged", family_names[family], (unsigned long long)key,
             (unsigned long long)c->bytes);
    if (replaced > 0) {
        VGPU_LOG(VGPU_LOG_DEBUG, "allocation %#llx was freed behind our back; its %lld bytes are given back",
                 (unsigned long long)key, (long long)replaced);
        slot_subtract(c->slot, (uint64_t)replaced);
    } else if (replaced < 0) {
        /* Kept charged (the safe side) though no free will find it. */
        VGPU_LOG(VGPU_LOG_ERROR, "out of host memory recording allocation %#llx", (unsigned long long)key);
    }
}

CUresult vgpu_settle_charge(const struct vgpu_charge *c, CUresult result, uint8_t kind, uint64_t key, uint8_t family)
{
    if (result == CUDA_SUCCESS)
        record(c, kind, key, family);
    else
        slot_subtract(c->slot, c->bytes);
    if (result == CUDA_SUCCESS && family == VGPU_FAMILY_MANAGED && c->slot)
        __atomic_add_fetch(&c->slot->managed_allocations, 1, __ATOMIC_RELAXED);
    return result;
}

void vgpu_uncharge(const struct vgpu_charge *c)
{
    slot_subtract(c->slot, c->bytes);
}

void vgpu_release_settle(int known, const struct vgpu_alloc_entry *entry, CUresult result)
{
    if (!known)
        return;
    VGPU_LOG(VGPU_LOG_DEBUG, "%s %#llx freed (%d): %llu bytes %s", family_names[entry->family],
             (unsigned long long)entry->key, result, (unsigned long long)entry->size,
             result == CUDA_SUCCESS ? "given back" : "still held");
    if (result == CUDA_SUCCESS)
        slot_subtract(vgpu_claimed_slot(), entry->size);
    else
        vgpu_table_insert(entry);
    /* Freed into its pool, which may keep it: the charge follows what the pools reserve. */
    if (result == CUDA_SUCCESS && (entry->family == VGPU_FAMILY_ASYNC || entry->family == VGPU_FAMILY_POOL))
        vgpu_pool_memory_settle();
}

uint64_t vgpu_release_context(CUcontext context)
{
    uint64_t bytes = vgpu_table_take_context((uint64_t)(uintptr_t)context);
    slot_subtract(vgpu_claimed_slot(), bytes);
    vgpu_pool_memory_settle(); /* its stream-ordered allocations went from their pools too */
    return bytes;
}

/* ---- graph memory ---------------------------------------------------------------------- */

/* What the driver's graph memory pool on `device` reserves now, or -1 when it cannot say. */
static int64_t graph_pool_reserved(CUdevice device)
{
    vgpu_pfn_cuDeviceGetGraphMemAttribute get = VGPU_CALLED(cuDeviceGetGraphMemAttribute);
    cuuint64_t reserved = 0;
    if (!get || get(device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS)
        return -1;
    return (int64_t)reserved;
}

void vgpu_graph_memory_settle(const struct vgpu_charge *c, int launched, CUdevice device)
{
    struct vgpu_charge_state *state = &vgpu_state.charge;
    struct vgpu_proc_slot *slot = c ? c->slot : vgpu_claimed_slot();
    uint64_t pending = c && c->slot ? c->bytes : 0;
    if (!slot)
        return;
    pthread_mutex_lock(&state->graph_lock);
    int64_t reserved = graph_pool_reserved(device);
    uint64_t held = state->graph_charged + pending;
    uint64_t target = reserved >= 0 ? (uint64_t)reserved : state->graph_charged + (launched ? pending : 0);
    /* The pool holds that memory already: counted whatever the cap says. */
    if (target > held)
        slot_add(slot, target - held);
    else
        slot_subtract(slot, held - target);
    state->graph_charged = target;
    pthread_mutex_unlock(&state->graph_lock);
    VGPU_LOG(VGPU_LOG_DEBUG, "graph memory pool: %llu bytes charged", (unsigned long long)target);
}
