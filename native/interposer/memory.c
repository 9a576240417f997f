/*
 * GPU memory: every allocation family is charged to this process's slot and capped, every
 * free gives back exactly what its allocation was charged, and what the program is told about
 * memory (cuMemGetInfo, cuDeviceTotalMem) is the slice, not the device.
 *
 * The cap check takes no lock, across threads and processes: a request is first added to this
 * process's `allocated` (an atomic add), then the live slots are summed; over the cap, the
 * request is taken back and refused. Two racing requests therefore both see each other's add
 * at least from one side: near the cap both may be refused, but never both granted over it.
 *
 * Live allocations are kept in a table (key -> bytes charged), sharded by key with one lock per
 * shard, so a free subtracts what its allocation added. A free of something the table does not
 * know (allocated before the library loaded, or by the parent before a fork) goes to the driver
 * untouched and returns the driver's answer: RMM and others rely on that.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define M (vgpu_state.memory)

enum vgpu_alloc_kind {
    KIND_EMPTY = 0,
    KIND_DEVICE_POINTER, /* cuMemAlloc*, cuMemAllocPitch, cuMemAllocManaged, async and pool allocations */
    KIND_VMM_HANDLE,     /* cuMemCreate */
    KIND_ARRAY,          /* cuArrayCreate, cuArray3DCreate */
    KIND_MIPMAPPED_ARRAY,/* cuMipmappedArrayCreate */
    KIND_DELETED = 0xff,
};

enum vgpu_alloc_family {
    FAMILY_ALLOC,
    FAMILY_PITCH,
    FAMILY_MANAGED,
    FAMILY_ASYNC,
    FAMILY_POOL,
    FAMILY_VMM,
    FAMILY_ARRAY,
    FAMILY_MIPMAPPED_ARRAY,
};

/* For debug logs: which kind of allocation an entry came from. */
static const char *const family_names[] = {
    [FAMILY_ALLOC] = "cuMemAlloc",          [FAMILY_PITCH] = "cuMemAllocPitch",
    [FAMILY_MANAGED] = "cuMemAllocManaged", [FAMILY_ASYNC] = "cuMemAllocAsync",
    [FAMILY_POOL] = "cuMemAllocFromPoolAsync", [FAMILY_VMM] = "cuMemCreate",
    [FAMILY_ARRAY] = "cuArrayCreate",       [FAMILY_MIPMAPPED_ARRAY] = "cuMipmappedArrayCreate",
};

/* ---- the allocation table ------------------------------------------------------------- */

#define TABLE_MIN_CAPACITY 64

static uint64_t mix64(uint64_t value)
{
    value ^= value >> 33;
    value *= 0xff51afd7ed558ccdULL;
    value ^= value >> 33;
    value *= 0xc4ceb9fe1a85ec53ULL;
    value ^= value >> 33;
    return value;
}

static uint64_t entry_hash(uint8_t kind, uint64_t key)
{
    return mix64(key ^ ((uint64_t)kind << 58));
}

static struct vgpu_alloc_shard *shard_of(uint64_t hash)
{
    _Static_assert((VGPU_ALLOC_SHARDS & (VGPU_ALLOC_SHARDS - 1)) == 0, "shards are a power of two");
    return &M.shards[hash >> 58 & (VGPU_ALLOC_SHARDS - 1)];
}

/* The slot of (kind, key) in the shard, or of the first free place for it; NULL if full. */
static struct vgpu_alloc_entry *shard_probe(struct vgpu_alloc_shard *shard, uint64_t hash, uint8_t kind,
                                            uint64_t key, int for_insert)
{
    if (!shard->capacity)
        return NULL;
    uint32_t mask = shard->capacity - 1;
    struct vgpu_alloc_entry *reusable = NULL;
    for (uint32_t step = 0, index = (uint32_t)hash & mask; step < shard->capacity; step++, index = (index + 1) & mask) {
        struct vgpu_alloc_entry *entry = &shard->entries[index];
        if (entry->kind == KIND_EMPTY)
            return for_insert ? (reusable ? reusable : entry) : NULL;
        if (entry->kind == KIND_DELETED) {
            if (!reusable)
                reusable = entry;
        } else if (entry->kind == kind && entry->key == key) {
            return entry;
        }
    }
    return for_insert ? reusable : NULL;
}

/* Rebuilds the shard's array at a size that keeps probing short and drops deleted entries. */
static int shard_grow(struct vgpu_alloc_shard *shard)
{
    uint32_t capacity = TABLE_MIN_CAPACITY;
    while (capacity < shard->live * 4u)
        capacity *= 2;
    struct vgpu_alloc_entry *entries = calloc(capacity, sizeof *entries);
    if (!entries)
        return -1;
    struct vgpu_alloc_entry *old = shard->entries;
    uint32_t old_capacity = shard->capacity;
    shard->entries = entries;
    shard->capacity = capacity;
    shard->used = shard->live;
    for (uint32_t index = 0; index < old_capacity; index++) {
        struct vgpu_alloc_entry *entry = &old[index];
        if (entry->kind != KIND_EMPTY && entry->kind != KIND_DELETED)
            *shard_probe(shard, entry_hash(entry->kind, entry->key), entry->kind, entry->key, 1) = *entry;
    }
    free(old);
    return 0;
}

/* Records an allocation. If the key is already there, the driver handed out again something
 * we thought live (freed behind our back, e.g. with its context): returns the bytes that old
 * entry held, so the caller gives them back. Returns -1 when out of host memory. */
static int64_t table_insert(const struct vgpu_alloc_entry *new_entry)
{
    uint64_t hash = entry_hash(new_entry->kind, new_entry->key);
    struct vgpu_alloc_shard *shard = shard_of(hash);
    int64_t replaced = 0;
    pthread_mutex_lock(&shard->lock);
    if ((shard->used + 1) * 2 > shard->capacity && shard_grow(shard) != 0) {
        pthread_mutex_unlock(&shard->lock);
        return -1;
    }
    struct vgpu_alloc_entry *entry = shard_probe(shard, hash, new_entry->kind, new_entry->key, 1);
    if (entry->kind == new_entry->kind && entry->key == new_entry->key) {
        replaced = (int64_t)entry->size;
    } else {
        if (entry->kind == KIND_EMPTY)
            shard->used++;
        shard->live++;
    }
    *entry = *new_entry;
    pthread_mutex_unlock(&shard->lock);
    return replaced;
}

/* Takes every entry owned by `context` out of the table; returns the bytes they held. */
static uint64_t table_take_context(uint64_t context)
{
    uint64_t bytes = 0;
    for (int index = 0; index < VGPU_ALLOC_SHARDS; index++) {
        struct vgpu_alloc_shard *shard = &M.shards[index];
        pthread_mutex_lock(&shard->lock);
        for (uint32_t slot = 0; slot < shard->capacity; slot++) {
            struct vgpu_alloc_entry *entry = &shard->entries[slot];
            if (entry->kind != KIND_EMPTY && entry->kind != KIND_DELETED && entry->context == context) {
                bytes += entry->size;
                entry->kind = KIND_DELETED;
                shard->live--;
            }
        }
        pthread_mutex_unlock(&shard->lock);
    }
    return bytes;
}

/* Takes (kind, key) out of the table; returns 1 and the entry if it was there. Taken out
 * before the driver frees it, so that an allocation reusing the address right after the free
 * can never be mistaken for the old one. */
static int table_take(uint8_t kind, uint64_t key, struct vgpu_alloc_entry *out)
{
    uint64_t hash = entry_hash(kind, key);
    struct vgpu_alloc_shard *shard = shard_of(hash);
    pthread_mutex_lock(&shard->lock);
    struct vgpu_alloc_entry *entry = shard_probe(shard, hash, kind, key, 0);
    int found = entry != NULL;
    if (found) {
        *out = *entry;
        entry->kind = KIND_DELETED;
        shard->live--;
    }
    pthread_mutex_unlock(&shard->lock);
    return found;
}

void vgpu_memory_forget_after_fork(void)
{
    for (int index = 0; index < VGPU_ALLOC_SHARDS; index++) {
        struct vgpu_alloc_shard *shard = &M.shards[index];
        pthread_mutex_init(&shard->lock, NULL);
        free(shard->entries);
        shard->entries = NULL;
        shard->capacity = shard->used = shard->live = 0;
    }
    pthread_mutex_init(&M.nvml_lock, NULL);
    atomic_store_explicit(&M.nvml_ready, 0, memory_order_relaxed);
    M.previous_valid = 0; /* the parent's sample says nothing of the child's allocations */
}

/* ---- charging -------------------------------------------------------------------------- */

struct charge {
    struct vgpu_proc_slot *slot;
    uint64_t bytes;
};

static void slot_add(struct vgpu_proc_slot *slot, uint64_t bytes)
{
    __atomic_fetch_add(&slot->allocated, bytes, __ATOMIC_SEQ_CST);
    atomic_fetch_add_explicit(&M.accounting_changes, 1, memory_order_relaxed);
}

static void slot_subtract(struct vgpu_proc_slot *slot, uint64_t bytes)
{
    if (!slot || !bytes)
        return;
    __atomic_fetch_sub(&slot->allocated, bytes, __ATOMIC_SEQ_CST);
    atomic_fetch_add_explicit(&M.accounting_changes, 1, memory_order_relaxed);
}

static CUresult refuse(struct vgpu_proc_slot *slot, const char *call, uint64_t request, uint64_t usage,
                       uint64_t limit)
{
    __atomic_fetch_add(&slot->oom_refusals, 1, __ATOMIC_RELAXED);
    vgpu_report_oom(call, request, usage, limit);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Adds `bytes` to the slot and checks the slice against the cap; over it, takes them back and
 * refuses. `request` is the whole allocation the OOM line names (more than `bytes` when part
 * of it was charged before). */
static CUresult add_within_cap(struct vgpu_proc_slot *slot, const char *call, uint64_t bytes, uint64_t request,
                               uint64_t limit)
{
    if (limit && bytes > limit) {
        uint64_t usage = vgpu_slice_usage(), charged_before = request - bytes;
        return refuse(slot, call, request, usage > charged_before ? usage - charged_before : 0, limit);
    }
    slot_add(slot, bytes);
    if (limit) {
        uint64_t usage = vgpu_slice_usage();
        if (usage > limit) {
            slot_subtract(slot, bytes);
            return refuse(slot, call, request, usage > request ? usage - request : 0, limit);
        }
    }
    return CUDA_SUCCESS;
}

/* Charges `bytes` to this process's slot if the slice has room for them (see the top of the
 * file). On CUDA_SUCCESS the caller calls the driver and then settle_charge(). */
static CUresult charge(struct charge *charge_out, const char *call, uint64_t bytes)
{
    struct vgpu_limits_snapshot limits;
    struct vgpu_proc_slot *slot = NULL;
    if (vgpu_read_limits(&limits) != 0 || (!(slot = vgpu_self_slot()) && !vgpu_slot_released())) {
        vgpu_report_fail_closed();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!slot) { /* exiting, slot given back: the driver frees everything in a moment */
        *charge_out = (struct charge){NULL, 0};
        return CUDA_SUCCESS;
    }
    CUresult result = add_within_cap(slot, call, bytes, bytes, limits.memory_limit);
    if (result == CUDA_SUCCESS)
        *charge_out = (struct charge){slot, bytes};
    return result;
}

/* Moves a charge to `actual` bytes once the driver said what it really took. Growing it is
 * checked against the cap (the limits of this instant) like a new request, and refused like
 * one when the limits cannot be read: unreadable limits are no cap to check against, not a
 * cap of "none". */
static CUresult recharge(struct charge *c, const char *call, uint64_t actual)
{
    if (actual > c->bytes && c->slot) {
        struct vgpu_limits_snapshot limits;
        if (vgpu_read_limits(&limits) != 0) {
            vgpu_report_fail_closed();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        CUresult result = add_within_cap(c->slot, call, actual - c->bytes, actual, limits.memory_limit);
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
    if (kind == KIND_VMM_HANDLE || !get_current || get_current(&context) != CUDA_SUCCESS)
        return 0;
    return (uint64_t)(uintptr_t)context;
}

static void record(const struct charge *c, uint8_t kind, uint64_t key, uint8_t family)
{
    struct vgpu_alloc_entry entry = {
        .key = key, .size = c->bytes, .context = owning_context(kind), .kind = kind, .family = family};
    int64_t replaced = table_insert(&entry);
    vgpu_log(VGPU_LOG_DEBUG, "%s %#llx: %llu bytes charged", family_names[family], (unsigned long long)key,
             (unsigned long long)c->bytes);
    if (replaced > 0) {
        vgpu_log(VGPU_LOG_DEBUG, "allocation %#llx was freed behind our back; its %lld bytes are given back",
                 (unsigned long long)key, (long long)replaced);
        slot_subtract(c->slot, (uint64_t)replaced);
    } else if (replaced < 0) {
        /* Kept charged (the safe side) though no free will find it. */
        vgpu_log(VGPU_LOG_ERROR, "out of host memory recording allocation %#llx", (unsigned long long)key);
    }
}

/* After the driver answered an allocation: keep the charge and record it, or give it back. */
static CUresult settle_charge(const struct charge *c, CUresult result, uint8_t kind, uint64_t key, uint8_t family)
{
    if (result == CUDA_SUCCESS)
        record(c, kind, key, family);
    else
        slot_subtract(c->slot, c->bytes);
    return result;
}

/* After the driver answered a free of an entry taken from the table: give its bytes back, or
 * put it back if the driver refused the free. */
static void settle_release(int known, const struct vgpu_alloc_entry *entry, CUresult result)
{
    if (!known)
        return;
    vgpu_log(VGPU_LOG_DEBUG, "%s %#llx freed (%d): %llu bytes %s", family_names[entry->family],
             (unsigned long long)entry->key, result, (unsigned long long)entry->size,
             result == CUDA_SUCCESS ? "given back" : "still held");
    if (result == CUDA_SUCCESS)
        slot_subtract(vgpu_claimed_slot(), entry->size);
    else
        table_insert(entry);
}

/* ---- allocation hooks ------------------------------------------------------------------ */

/* Set while this thread is inside the driver's allocation or free: a driver that implements
 * one entry point by calling another exported one (cuMemAllocFromPoolAsync_ptsz calling
 * cuMemAllocFromPoolAsync) reaches our hook again through the dynamic linker, and that inner
 * call must pass straight through or the request would be charged twice. Thread-local by
 * nature, so it lives outside vgpu_state. */
static __thread int inside_driver __attribute__((tls_model("initial-exec")));

#define CALL_DRIVER(result, call)                                                                  \
    do {                                                                                           \
        inside_driver = 1;                                                                         \
        (result) = (call);                                                                         \
        inside_driver = 0;                                                                         \
    } while (0)

/* An allocation that returns a device pointer through `dptr` and takes `bytes`. */
#define CHARGED_DEVICE_ALLOCATION(name, family, bytes, ...)                                        \
    do {                                                                                           \
        vgpu_pfn_##name real = VGPU_REAL(name);                                                    \
        if (!real)                                                                                 \
            return CUDA_ERROR_NOT_FOUND;                                                           \
        if (inside_driver)                                                                         \
            return real(__VA_ARGS__);                                                              \
        struct charge c;                                                                           \
        CUresult result = charge(&c, #name, (bytes));                                              \
        if (result != CUDA_SUCCESS)                                                                \
            return result;                                                                         \
        CALL_DRIVER(result, real(__VA_ARGS__));                                                    \
        return settle_charge(&c, result, KIND_DEVICE_POINTER, result == CUDA_SUCCESS ? *dptr : 0, family); \
    } while (0)

/* A free of something the table may know as (kind, key). */
#define RELEASE(name, kind, key, ...)                                                              \
    do {                                                                                           \
        vgpu_pfn_##name real = VGPU_REAL(name);                                                    \
        if (!real)                                                                                 \
            return CUDA_ERROR_NOT_FOUND;                                                           \
        if (inside_driver)                                                                         \
            return real(__VA_ARGS__);                                                              \
        struct vgpu_alloc_entry entry;                                                             \
        int known = table_take((kind), (uint64_t)(key), &entry);                                   \
        CUresult result;                                                                           \
        CALL_DRIVER(result, real(__VA_ARGS__));                                                    \
        settle_release(known, &entry, result);                                                     \
        return result;                                                                             \
    } while (0)

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CHARGED_DEVICE_ALLOCATION(cuMemAlloc_v2, FAMILY_ALLOC, bytesize, dptr, bytesize);
}

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    CHARGED_DEVICE_ALLOCATION(cuMemAllocManaged, FAMILY_MANAGED, bytesize, dptr, bytesize, flags);
}

VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    CHARGED_DEVICE_ALLOCATION(cuMemAllocAsync, FAMILY_ASYNC, bytesize, dptr, bytesize, hStream);
}

VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    CHARGED_DEVICE_ALLOCATION(cuMemAllocAsync_ptsz, FAMILY_ASYNC, bytesize, dptr, bytesize, hStream);
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                             CUstream hStream)
{
    CHARGED_DEVICE_ALLOCATION(cuMemAllocFromPoolAsync, FAMILY_POOL, bytesize, dptr, bytesize, pool, hStream);
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                  CUstream hStream)
{
    CHARGED_DEVICE_ALLOCATION(cuMemAllocFromPoolAsync_ptsz, FAMILY_POOL, bytesize, dptr, bytesize, pool, hStream);
}

static uint64_t saturating_multiply(uint64_t a, uint64_t b)
{
    uint64_t product;
    return __builtin_mul_overflow(a, b, &product) ? UINT64_MAX : product;
}

/* Pitch the driver is expected to choose; recharge() corrects to what it did choose. */
#define PITCH_ALIGNMENT 512u

VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                        unsigned int ElementSizeBytes)
{
    vgpu_pfn_cuMemAllocPitch_v2 real = VGPU_REAL(cuMemAllocPitch_v2);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    if (inside_driver)
        return real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t pitch_estimate = WidthInBytes > UINT64_MAX - PITCH_ALIGNMENT
                                  ? UINT64_MAX
                                  : (WidthInBytes + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT;
    struct charge c;
    CUresult result = charge(&c, "cuMemAllocPitch_v2", saturating_multiply(pitch_estimate, Height));
    if (result != CUDA_SUCCESS)
        return result;
    CALL_DRIVER(result, real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
    if (result == CUDA_SUCCESS && pPitch) {
        CUresult recharged = recharge(&c, "cuMemAllocPitch_v2", saturating_multiply(*pPitch, Height));
        if (recharged != CUDA_SUCCESS) {
            /* The driver's pitch pushed the slice over its cap: undo the allocation. */
            vgpu_pfn_cuMemFree_v2 release = VGPU_REAL(cuMemFree_v2);
            if (release)
                CALL_DRIVER(result, release(*dptr));
            slot_subtract(c.slot, c.bytes);
            return recharged;
        }
    }
    return settle_charge(&c, result, KIND_DEVICE_POINTER, result == CUDA_SUCCESS ? *dptr : 0, FAMILY_PITCH);
}

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    RELEASE(cuMemFree_v2, KIND_DEVICE_POINTER, dptr, dptr);
}

VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    RELEASE(cuMemFreeAsync, KIND_DEVICE_POINTER, dptr, dptr, hStream);
}

VGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    RELEASE(cuMemFreeAsync_ptsz, KIND_DEVICE_POINTER, dptr, dptr, hStream);
}

/* VMM: physical memory is what cuMemCreate makes; mapping it (cuMemMap) adds none. Memory
 * placed on the host (CUDA 12.2+ host locations) is not GPU memory and is not charged. */
VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags)
{
    vgpu_pfn_cuMemCreate real = VGPU_REAL(cuMemCreate);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    if (inside_driver ||
        (prop && prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE && prop->location.type != CU_MEM_LOCATION_TYPE_INVALID))
        return real(handle, size, prop, flags);
    struct charge c;
    CUresult result = charge(&c, "cuMemCreate", size);
    if (result != CUDA_SUCCESS)
        return result;
    CALL_DRIVER(result, real(handle, size, prop, flags));
    return settle_charge(&c, result, KIND_VMM_HANDLE, result == CUDA_SUCCESS ? *handle : 0, FAMILY_VMM);
}

VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    RELEASE(cuMemRelease, KIND_VMM_HANDLE, handle, handle);
}

/* Bytes of one element of an array: exact for the plain formats, 4 bytes per channel (the
 * widest plain format) for the packed and compressed ones, which are no larger. */
static uint64_t array_element_bytes(CUarray_format format, unsigned int channels)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return channels;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2ull * channels;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4ull * channels;
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1:
        return 1;
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2:
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1:
        return 2;
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2:
        return 4;
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4:
        return 8;
    default:
        return 4ull * (channels ? channels : 4);
    }
}

static uint64_t at_least_one(uint64_t extent)
{
    return extent ? extent : 1;
}

/* Bytes of a (mipmapped) array: the sum over its levels, each half the size of the one above
 * in every dimension that mipmaps (layers and cube faces do not). Sparse and deferred-mapping
 * arrays get their memory later through cuMemCreate + cuMemMap, which is charged there. */
static uint64_t array_bytes(size_t width, size_t height, size_t depth, unsigned int flags, CUarray_format format,
                            unsigned int channels, unsigned int levels)
{
    if (flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING))
        return 0;
    uint64_t element = array_element_bytes(format, channels);
    int depth_mipmaps = !(flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP));
    uint64_t total = 0;
    if (levels < 1)
        levels = 1;
    if (levels > 64)
        levels = 64;
    for (unsigned int level = 0; level < levels; level++) {
        uint64_t w = at_least_one(level < 64 ? width >> level : 0);
        uint64_t h = height ? at_least_one(height >> level) : 1;
        uint64_t d = depth ? (depth_mipmaps ? at_least_one(depth >> level) : depth) : 1;
        uint64_t bytes = saturating_multiply(saturating_multiply(saturating_multiply(w, h), d), element);
        total = total > UINT64_MAX - bytes ? UINT64_MAX : total + bytes;
        if (w == 1 && h == 1 && (d == 1 || !depth_mipmaps))
            break; /* smaller levels do not exist */
    }
    return total;
}

VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    vgpu_pfn_cuArrayCreate_v2 real = VGPU_REAL(cuArrayCreate_v2);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    if (inside_driver || !pAllocateArray)
        return real(pHandle, pAllocateArray);
    const CUDA_ARRAY_DESCRIPTOR *d = pAllocateArray;
    struct charge c;
    CUresult result = charge(&c, "cuArrayCreate_v2", array_bytes(d->Width, d->Height, 0, 0, d->Format, d->NumChannels, 1));
    if (result != CUDA_SUCCESS)
        return result;
    CALL_DRIVER(result, real(pHandle, pAllocateArray));
    return settle_charge(&c, result, KIND_ARRAY, result == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0,
                         FAMILY_ARRAY);
}

VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    vgpu_pfn_cuArray3DCreate_v2 real = VGPU_REAL(cuArray3DCreate_v2);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    if (inside_driver || !pAllocateArray)
        return real(pHandle, pAllocateArray);
    const CUDA_ARRAY3D_DESCRIPTOR *d = pAllocateArray;
    struct charge c;
    CUresult result = charge(&c, "cuArray3DCreate_v2",
                             array_bytes(d->Width, d->Height, d->Depth, d->Flags, d->Format, d->NumChannels, 1));
    if (result != CUDA_SUCCESS)
        return result;
    CALL_DRIVER(result, real(pHandle, pAllocateArray));
    return settle_charge(&c, result, KIND_ARRAY, result == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0,
                         FAMILY_ARRAY);
}

VGPU_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    RELEASE(cuArrayDestroy, KIND_ARRAY, (uintptr_t)hArray, hArray);
}

VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                            unsigned int numMipmapLevels)
{
    vgpu_pfn_cuMipmappedArrayCreate real = VGPU_REAL(cuMipmappedArrayCreate);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    if (inside_driver || !pMipmappedArrayDesc)
        return real(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    const CUDA_ARRAY3D_DESCRIPTOR *d = pMipmappedArrayDesc;
    struct charge c;
    CUresult result = charge(&c, "cuMipmappedArrayCreate",
                             array_bytes(d->Width, d->Height, d->Depth, d->Flags, d->Format, d->NumChannels,
                                         numMipmapLevels));
    if (result != CUDA_SUCCESS)
        return result;
    CALL_DRIVER(result, real(pHandle, pMipmappedArrayDesc, numMipmapLevels));
    return settle_charge(&c, result, KIND_MIPMAPPED_ARRAY,
                         result == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0, FAMILY_MIPMAPPED_ARRAY);
}

VGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    RELEASE(cuMipmappedArrayDestroy, KIND_MIPMAPPED_ARRAY, (uintptr_t)hMipmappedArray, hMipmappedArray);
}

/* ---- driver memory beyond allocations (contexts) ------------------------------------------ */

/* Finding this process's NVML pid by its allocations: a move of at least this much, matched
 * within this much (the driver rounds allocations up to its pages). */
#define NVML_PID_SIGNATURE_MIN ((int64_t)4 << 20)
#define NVML_PID_SIGNATURE_SLACK ((int64_t)2 << 20)

/* NVML's handle of the slice's device, initialising NVML on first use. Under nvml_lock. */
static nvmlDevice_t slice_nvml_device(void)
{
    int ready = atomic_load_explicit(&M.nvml_ready, memory_order_acquire);
    if (ready)
        return ready > 0 ? M.nvml_slice_device : NULL;
    vgpu_pfn_nvmlInit_v2 init = VGPU_CALLED(nvmlInit_v2);
    vgpu_pfn_nvmlDeviceGetHandleByUUID by_uuid = VGPU_CALLED(nvmlDeviceGetHandleByUUID);
    vgpu_pfn_nvmlDeviceGetHandleByIndex_v2 by_index = VGPU_CALLED(nvmlDeviceGetHandleByIndex_v2);
    struct vgpu_region *region = vgpu_region();
    nvmlDevice_t device = NULL;
    if (region && init && init() == NVML_SUCCESS) {
        char uuid[VGPU_DEVICE_UUID_SIZE];
        memcpy(uuid, region->device_uuid, sizeof uuid);
        uuid[sizeof uuid - 1] = '\0';
        if (!(uuid[0] && by_uuid && by_uuid(uuid, &device) == NVML_SUCCESS) &&
            !(by_index && region->device_index >= 0 &&
              by_index((unsigned int)region->device_index, &device) == NVML_SUCCESS))
            device = NULL;
    }
    M.nvml_slice_device = device;
    atomic_store_explicit(&M.nvml_ready, device ? 1 : -1, memory_order_release);
    if (!device)
        vgpu_log(VGPU_LOG_WARN, "NVML cannot find the slice's device: driver memory of contexts is not counted");
    return device;
}

/* NVML's list of the device's processes and the memory each uses, into `sample` (the first
 * VGPU_NVML_SAMPLE of them). Returns 0 when NVML cannot list them. */
static int nvml_sample(nvmlDevice_t device, struct vgpu_nvml_sample *sample)
{
    vgpu_pfn_nvmlDeviceGetComputeRunningProcesses_v3 list = VGPU_CALLED(nvmlDeviceGetComputeRunningProcesses_v3);
    if (!list)
        return 0;
    nvmlProcessInfo_t on_stack[VGPU_NVML_SAMPLE], *infos = on_stack;
    unsigned int count = VGPU_NVML_SAMPLE;
    nvmlReturn_t result = list(device, &count, infos);
    if (result == NVML_ERROR_INSUFFICIENT_SIZE) {
        count += 16; /* room for processes starting meanwhile */
        infos = malloc(count * sizeof *infos);
        result = infos ? list(device, &count, infos) : NVML_ERROR_UNKNOWN;
    }
    sample->count = 0;
    for (unsigned int index = 0; result == NVML_SUCCESS && index < count && sample->count < VGPU_NVML_SAMPLE; index++) {
        sample->pid[sample->count] = infos[index].pid;
        sample->used[sample->count++] = infos[index].usedGpuMemory;
    }
    if (infos != on_stack)
        free(infos);
    return result == NVML_SUCCESS;
}

#define NOT_LISTED (-1)
#define NOT_AVAILABLE (-2) /* listed, without a figure (NVML_VALUE_NOT_AVAILABLE) */

/* The memory NVML shows for `pid`, NOT_LISTED or NOT_AVAILABLE. */
static int64_t sampled_use(const struct vgpu_nvml_sample *sample, unsigned int pid)
{
    for (unsigned int i = 0; i < sample->count; i++)
        if (sample->pid[i] == pid)
            return sample->used[i] == ~0ULL ? NOT_AVAILABLE : (int64_t)sample->used[i];
    return NOT_LISTED;
}

static int claimed_by_another_slot(const struct vgpu_proc_slot *self, unsigned int pid)
{
    struct vgpu_region *region = vgpu_region();
    uint32_t slots = region ? vgpu_slots_in_use(region) : 0;
    for (uint32_t i = 0; i < slots; i++) {
        const struct vgpu_proc_slot *slot = &region->procs[i];
        if (slot != self && __atomic_load_n(&slot->pid, __ATOMIC_ACQUIRE) > 0 &&
            (unsigned int)__atomic_load_n(&slot->nvml_pid, __ATOMIC_ACQUIRE) == pid)
            return 1;
    }
    return 0;
}

/* The pid NVML lists this process under. Its own pid, unless it runs in a PID namespace (a
 * container) while NVML reports the host's pids: then the one process, among those no other
 * process of the slice has claimed, whose memory moved between two samples by what this
 * process's own allocations moved (which this process knows to the byte). 0 while unknown. */
static unsigned int find_nvml_pid(const struct vgpu_proc_slot *self, const struct vgpu_nvml_sample *now,
                                  uint64_t allocated)
{
    unsigned int own = (unsigned int)getpid();
    if (sampled_use(now, own) != NOT_LISTED)
        return own;
    if (!M.previous_valid)
        return 0;
    int64_t moved = (int64_t)(allocated - M.previous_allocated);
    if (moved > -NVML_PID_SIGNATURE_MIN && moved < NVML_PID_SIGNATURE_MIN)
        return 0; /* too small a change to tell processes apart */
    unsigned int found = 0;
    for (unsigned int i = 0; i < now->count; i++) {
        int64_t before = sampled_use(&M.previous, now->pid[i]), after = sampled_use(now, now->pid[i]);
        if (before < 0 || after < 0)
            continue;
        int64_t their_move = after - before;
        if (their_move - moved > NVML_PID_SIGNATURE_SLACK || moved - their_move > NVML_PID_SIGNATURE_SLACK ||
            claimed_by_another_slot(self, now->pid[i]))
            continue;
        if (found)
            return 0; /* two moved alike: wait for a move that tells them apart */
        found = now->pid[i];
    }
    return found;
}

void vgpu_refresh_driver_reserved(void)
{
    struct vgpu_proc_slot *slot = vgpu_claimed_slot();
    if (!slot || pthread_mutex_trylock(&M.nvml_lock) != 0)
        return; /* no GPU use yet, or a refresh is already under way */
    nvmlDevice_t device = slice_nvml_device();
    struct vgpu_nvml_sample sample;
    /* Allocations are charged before the driver makes them and given back after it freed them,
     * so while none moved during the query, NVML's figure minus `allocated` never over-states
     * the driver's own memory. If some moved, try again next period. */
    uint64_t changes = atomic_load_explicit(&M.accounting_changes, memory_order_seq_cst);
    uint64_t allocated = __atomic_load_n(&slot->allocated, __ATOMIC_SEQ_CST);
    int steady = device && nvml_sample(device, &sample) &&
                 atomic_load_explicit(&M.accounting_changes, memory_order_seq_cst) == changes;
    if (steady) {
        unsigned int pid = (unsigned int)__atomic_load_n(&slot->nvml_pid, __ATOMIC_ACQUIRE);
        if (!pid && (pid = find_nvml_pid(slot, &sample, allocated)) != 0) {
            __atomic_store_n(&slot->nvml_pid, (int32_t)pid, __ATOMIC_RELEASE);
            if (pid != (unsigned int)getpid())
                vgpu_log(VGPU_LOG_INFO, "NVML lists this process (pid %d here) as pid %u", (int)getpid(), pid);
        }
        /* Not listed: no context on the device yet, so no driver memory either. */
        int64_t used = pid ? sampled_use(&sample, pid) : NOT_LISTED;
        uint64_t reserved = used > 0 && (uint64_t)used > allocated ? (uint64_t)used - allocated : 0;
        if (used != NOT_AVAILABLE)
            __atomic_store_n(&slot->driver_reserved, reserved, __ATOMIC_SEQ_CST);
        M.previous = sample;
        M.previous_allocated = allocated;
    }
    M.previous_valid = steady;
    pthread_mutex_unlock(&M.nvml_lock);
}

/* A new context holds driver memory from the start: count it now, not half a second later. */
static CUresult after_context(CUresult result)
{
    if (result == CUDA_SUCCESS && vgpu_self_slot())
        vgpu_refresh_driver_reserved();
    return result;
}

/* A context that goes takes its allocations (and arrays) with it, without a free for each:
 * they stop counting, and so does the driver memory of the context itself. */
static void context_gone(CUcontext context)
{
    if (!context)
        return;
    uint64_t bytes = table_take_context((uint64_t)(uintptr_t)context);
    struct vgpu_proc_slot *slot = vgpu_claimed_slot();
    slot_subtract(slot, bytes);
    if (slot)
        vgpu_refresh_driver_reserved();
    vgpu_log(VGPU_LOG_INFO, "context %p is gone with %llu bytes of allocations", (void *)context,
             (unsigned long long)bytes);
}

static CUcontext primary_context_of(CUdevice dev)
{
    return dev >= 0 && dev < VGPU_CUDA_DEVICE_CACHE
               ? atomic_load_explicit(&M.primary_context[dev], memory_order_acquire)
               : NULL;
}

VGPU_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    vgpu_pfn_cuCtxCreate_v2 real = VGPU_REAL(cuCtxCreate_v2);
    return real ? after_context(real(pctx, flags, dev)) : CUDA_ERROR_NOT_FOUND;
}

VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                    CUdevice dev)
{
    vgpu_pfn_cuCtxCreate_v4 real = VGPU_REAL(cuCtxCreate_v4);
    return real ? after_context(real(pctx, ctxCreateParams, flags, dev)) : CUDA_ERROR_NOT_FOUND;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    vgpu_pfn_cuDevicePrimaryCtxRetain real = VGPU_REAL(cuDevicePrimaryCtxRetain);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult result = real(pctx, dev);
    if (result == CUDA_SUCCESS && dev >= 0 && dev < VGPU_CUDA_DEVICE_CACHE)
        atomic_store_explicit(&M.primary_context[dev], *pctx, memory_order_release);
    return after_context(result);
}

VGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    vgpu_pfn_cuCtxDestroy_v2 real = VGPU_REAL(cuCtxDestroy_v2);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult result = real(ctx);
    if (result == CUDA_SUCCESS)
        context_gone(ctx);
    return result;
}

/* The primary context goes when its last retain is released. */
VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    vgpu_pfn_cuDevicePrimaryCtxRelease_v2 real = VGPU_REAL(cuDevicePrimaryCtxRelease_v2);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
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
    vgpu_pfn_cuDevicePrimaryCtxReset_v2 real = VGPU_REAL(cuDevicePrimaryCtxReset_v2);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult result = real(dev);
    if (result == CUDA_SUCCESS)
        context_gone(primary_context_of(dev));
    return result;
}

/* ---- what the program sees --------------------------------------------------------------- */

int vgpu_slice_view(uint64_t real_total, uint64_t real_free, struct vgpu_slice_view *view)
{
    struct vgpu_limits_snapshot limits;
    if (vgpu_read_limits(&limits) != 0) {
        *view = (struct vgpu_slice_view){.total = real_total, .used = real_total, .free = 0};
        return 1;
    }
    if (!limits.memory_limit)
        return 0;
    uint64_t total = limits.memory_limit < real_total ? limits.memory_limit : real_total;
    uint64_t used = vgpu_slice_usage();
    uint64_t free_bytes = used < total ? total - used : 0;
    *view = (struct vgpu_slice_view){
        .total = total,
        .used = used,
        .free = free_bytes < real_free ? free_bytes : real_free,
    };
    return 1;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML writes a UUID. */
static void format_uuid(char *out, size_t size, const char *prefix, const CUuuid *uuid)
{
    const unsigned char *b = (const unsigned char *)uuid->bytes;
    snprintf(out, size,
             "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix, b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

enum { VERDICT_UNKNOWN = 0, VERDICT_SLICE = 1, VERDICT_OTHER = 2 };

/* Whether CUDA device `device` is the slice's. When the driver cannot say, it is: a process
 * of a slice sees its slice rather than the whole device. */
static int cuda_device_is_slice(CUdevice device)
{
    int cached = device >= 0 && device < VGPU_CUDA_DEVICE_CACHE;
    if (cached) {
        uint8_t verdict = atomic_load_explicit(&M.cuda_device_verdict[device], memory_order_relaxed);
        if (verdict != VERDICT_UNKNOWN)
            return verdict == VERDICT_SLICE;
    }
    struct vgpu_region *region = vgpu_region();
    int is_slice = 1;
    if (region && region->device_uuid[0]) {
        /* A MIG slice is named by its MIG UUID, which only the _v2 query returns. */
        int mig = strncmp(region->device_uuid, "MIG-", 4) == 0;
        vgpu_pfn_cuDeviceGetUuid get_uuid = mig ? VGPU_CALLED(cuDeviceGetUuid_v2) : VGPU_CALLED(cuDeviceGetUuid);
        CUuuid uuid;
        char text[64];
        if (get_uuid && get_uuid(&uuid, device) == CUDA_SUCCESS) {
            format_uuid(text, sizeof text, mig ? "MIG" : "GPU", &uuid);
            is_slice = vgpu_is_slice_uuid(text);
        }
    }
    if (cached)
        atomic_store_explicit(&M.cuda_device_verdict[device], is_slice ? VERDICT_SLICE : VERDICT_OTHER,
                              memory_order_relaxed);
    return is_slice;
}

/* Whether the current context's device is the slice's. With a single visible device (the
 * usual case: CUDA_VISIBLE_DEVICES names the slice's) there is nothing to ask. */
static int current_device_is_slice(void)
{
    int count = atomic_load_explicit(&M.cuda_device_count, memory_order_relaxed);
    if (count == 0) {
        vgpu_pfn_cuDeviceGetCount get_count = VGPU_CALLED(cuDeviceGetCount);
        if (!get_count || get_count(&count) != CUDA_SUCCESS || count < 1)
            count = -1;
        atomic_store_explicit(&M.cuda_device_count, count, memory_order_relaxed);
    }
    if (count == 1)
        return cuda_device_is_slice(0);
    vgpu_pfn_cuCtxGetDevice get_device = VGPU_CALLED(cuCtxGetDevice);
    CUdevice device;
    if (!get_device || get_device(&device) != CUDA_SUCCESS)
        return 1;
    return cuda_device_is_slice(device);
}

VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    vgpu_pfn_cuMemGetInfo_v2 real = VGPU_REAL(cuMemGetInfo_v2);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult result = real(free, total);
    if (result != CUDA_SUCCESS || !free || !total || !current_device_is_slice())
        return result;
    struct vgpu_slice_view view;
    if (vgpu_slice_view(*total, *free, &view)) {
        *total = view.total;
        *free = view.free;
    }
    return result;
}

VGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    vgpu_pfn_cuDeviceTotalMem_v2 real = VGPU_REAL(cuDeviceTotalMem_v2);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult result = real(bytes, dev);
    if (result != CUDA_SUCCESS || !bytes || !cuda_device_is_slice(dev))
        return result;
    struct vgpu_slice_view view;
    if (vgpu_slice_view(*bytes, *bytes, &view))
        *bytes = view.total;
    return result;
}
