/*
 * Device memory, every family of it. Each allocation is charged to this process's slot on its
 * device before it exists (shared.c: capacity holds across processes) and uncharged when freed.
 *
 * Addresses. Linear allocations are ranges of one PROT_NONE arena (driver.c reserves it), so an
 * allocation costs no system call, and a 10 GiB allocation costs no RAM. A copy into or out of
 * an allocation first makes its pages readable and writable (once); freeing gives the pages
 * back (MADV_DONTNEED) and makes them PROT_NONE again. VMM reservations are their own PROT_NONE
 * mappings, VMM handles are memfds mapped into them, so the same physical memory can appear at
 * several addresses as with the real driver. Arrays have no address; they only hold memory.
 *
 * Sizes charged: cuMemAlloc* the bytes asked for; pitched allocations pitch * height with the
 * pitch rounded up to 512 bytes; cuMemCreate a multiple of the 2 MiB granularity (anything else
 * is refused, as by the driver); arrays width * max(1, height) * max(1, depth) * channels *
 * format bytes, summed over the levels of a mipmapped array.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_sim.h"

#define SIM_HOST_PAGE 4096ull

static uint64_t round_up(uint64_t value, uint64_t unit)
{
    return (value + unit - 1) / unit * unit;
}

/* ---- the arena (all with the lock held) ------------------------------------------------------ */

static uintptr_t arena_take(size_t length)
{
    struct sim_arena *arena = &sim_cuda.arena;
    for (size_t i = 0; i < arena->free_ranges.count; i++) {
        struct sim_map_entry *range = &arena->free_ranges.entries[i];
        if (range->value < length)
            continue;
        /* Take the range's tail, so its key (its offset) stays where it is in the map. */
        size_t rest = range->value - length;
        uint64_t offset = range->key;
        if (rest == 0)
            sim_map_take(&arena->free_ranges, offset, NULL);
        else
            range->value = rest;
        return arena->base + offset + rest;
    }
    if (arena->size - arena->top < length)
        return 0;
    uintptr_t address = arena->base + arena->top;
    arena->top += length;
    return address;
}

static void arena_give(uintptr_t address, size_t length)
{
    struct sim_arena *arena = &sim_cuda.arena;
    uint64_t offset = address - arena->base, end = offset + length;
    uintptr_t following;
    if (sim_map_take(&arena->free_ranges, end, &following) == 0)
        end += following;
    const struct sim_map_entry *before = sim_map_floor(&arena->free_ranges, offset);
    if (before && before->key + before->value == offset) {
        offset = before->key;
        sim_map_take(&arena->free_ranges, offset, NULL);
    }
    if (end == arena->top)
        arena->top = offset;
    else
        sim_map_put(&arena->free_ranges, offset, end - offset); /* out of memory: the range is lost, nothing else */
}

/* ---- linear allocations ------------------------------------------------------------------------ */

static CUresult allocate_linear(struct sim_cuda_device *device, struct CUctx_st *ctx, struct CUmemPoolHandle_st *pool,
                                uint64_t size, CUdeviceptr *dptr)
{
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (size > device->view->spec->memory)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_allocation *allocation = malloc(sizeof *allocation);
    if (!allocation)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* A pool's unused reserve serves first; only the rest is new device memory. */
    uint64_t reused = pool ? sim_pool_claim(pool, size) : 0, charged = size - reused;
    CUresult result = sim_charge(device, charged);
    if (result != CUDA_SUCCESS) {
        if (pool)
            sim_pool_unclaim(pool, reused);
        free(allocation);
        return result;
    }
    uint64_t span = round_up(size, SIM_HOST_PAGE);
    pthread_mutex_lock(&sim_cuda.lock);
    *allocation = sim_linear_take(device, size, span);
    allocation->ctx = ctx;
    allocation->pool = pool;
    uintptr_t address = allocation->base;
    if (address && sim_map_put(&sim_cuda.allocations, address, (uintptr_t)allocation) == 0) {
        if (pool)
            sim_pool_took(pool, charged);
        pthread_mutex_unlock(&sim_cuda.lock);
        *dptr = address;
        return CUDA_SUCCESS;
    }
    if (address)
        sim_address_give(address, span, allocation->in_arena);
    if (pool)
        pool->used -= reused;
    pthread_mutex_unlock(&sim_cuda.lock);
    sim_uncharge(device, charged);
    free(allocation);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

uintptr_t sim_address_take(uint64_t span, int *in_arena)
{
    uintptr_t address = arena_take(span);
    *in_arena = address != 0;
    if (!*in_arena) {
        void *mapping = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        address = mapping == MAP_FAILED ? 0 : (uintptr_t)mapping;
    }
    return address;
}

void sim_address_give(uintptr_t address, uint64_t span, int in_arena)
{
    if (in_arena)
        arena_give(address, span);
    else
        munmap((void *)address, span);
}

struct sim_allocation sim_linear_take(struct sim_cuda_device *device, uint64_t size, uint64_t span)
{
    int in_arena;
    uintptr_t address = sim_address_take(span, &in_arena);
    return (struct sim_allocation){
        .base = address,
        .size = size,
        .span = span,
        .kind = SIM_ALLOCATION_LINEAR,
        .device = device,
        .in_arena = in_arena,
    };
}

struct sim_allocation *sim_allocation_at(CUdeviceptr address)
{
    uintptr_t value;
    return sim_map_get(&sim_cuda.allocations, address, &value) == 0 ? (struct sim_allocation *)value : NULL;
}

void sim_linear_pages_drop(struct sim_allocation *allocation)
{
    if (allocation->host_access) {
        madvise((void *)allocation->base, allocation->span, MADV_DONTNEED);
        mprotect((void *)allocation->base, allocation->span, PROT_NONE);
        allocation->host_access = 0;
    }
    free(allocation->poisoned);
    allocation->poisoned = NULL;
}

/* Gives back an allocation already taken out of the map; the lock is held. Memory opened from
 * another process (ipc.c) was never charged here. */
void sim_release_linear(struct sim_allocation *allocation)
{
    int imported = allocation->share && allocation->share->imported;
    if (allocation->share)
        sim_ipc_share_drop(allocation);
    if (allocation->in_arena)
        sim_linear_pages_drop(allocation);
    sim_address_give(allocation->base, allocation->span, allocation->in_arena);
    /* Memory of a pool stays reserved by it (pool.c) until a trim or a synchronisation. */
    if (allocation->pool)
        sim_pool_gave(allocation->pool, allocation->size);
    else if (!imported)
        sim_uncharge(allocation->device, allocation->size);
    free(allocation->poisoned);
    free(allocation);
}

static CUresult free_linear(CUdeviceptr dptr)
{
    CUresult result = sim_ready_locked();
    if (result != CUDA_SUCCESS)
        return result;
    /* Not the start of a live allocation, or memory opened from another process (closed with
     * cuIpcCloseMemHandle): refused, never a crash. */
    result = CUDA_ERROR_INVALID_VALUE;
    struct sim_allocation *allocation = sim_allocation_at(dptr);
    if (allocation && allocation->kind == SIM_ALLOCATION_LINEAR &&
        !(allocation->share && allocation->share->imported)) {
        sim_map_take(&sim_cuda.allocations, dptr, NULL);
        if (allocation->graph)
            sim_graph_block_free(allocation->graph); /* back to the graph pool, still reserved */
        else
            sim_release_linear(allocation);
        result = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

static struct sim_array *array_of(uintptr_t handle)
{
    return &((struct CUarray_st *)handle)->array; /* both array structs begin with it */
}

void sim_free_context_memory(struct CUctx_st *ctx)
{
    for (size_t i = sim_cuda.allocations.count; i-- > 0;) {
        struct sim_allocation *allocation = (struct sim_allocation *)sim_cuda.allocations.entries[i].value;
        if (allocation->kind == SIM_ALLOCATION_LINEAR && allocation->ctx == ctx && !allocation->graph) {
            sim_map_take(&sim_cuda.allocations, allocation->base, NULL);
            /* A destroyed pool gives it back (and may go) by itself. */
            struct CUmemPoolHandle_st *kept_by =
                allocation->pool && !allocation->pool->destroyed ? allocation->pool : NULL;
            uint64_t size = allocation->size;
            sim_release_linear(allocation);
            if (kept_by)
                sim_pool_forget(kept_by, size); /* the context's memory goes with it, not to the pool */
        }
    }
    for (size_t i = sim_cuda.handles.count; i-- > 0;) {
        struct sim_map_entry entry = sim_cuda.handles.entries[i];
        if (entry.value != SIM_HANDLE_ARRAY && entry.value != SIM_HANDLE_MIPMAPPED_ARRAY)
            continue;
        struct sim_array *array = array_of(entry.key);
        if (array->ctx != ctx)
            continue;
        sim_map_take(&sim_cuda.handles, entry.key, NULL);
        sim_uncharge(array->device, array->bytes);
        free((void *)entry.key);
    }
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, 1);
    return result != CUDA_SUCCESS ? result : allocate_linear(ctx->device, ctx, NULL, bytesize, dptr);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    struct CUctx_st *ctx;
    int element_valid = ElementSizeBytes == 4 || ElementSizeBytes == 8 || ElementSizeBytes == 16;
    CUresult result = sim_current_context(&ctx, dptr && pPitch && WidthInBytes && Height && element_valid);
    if (result != CUDA_SUCCESS)
        return result;
    uint64_t pitch = round_up(WidthInBytes, SIM_PITCH_ALIGNMENT), bytes;
    if (__builtin_mul_overflow(pitch, (uint64_t)Height, &bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    result = allocate_linear(ctx->device, ctx, NULL, bytes, dptr);
    if (result == CUDA_SUCCESS)
        *pPitch = pitch;
    return result;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, flags == CU_MEM_ATTACH_GLOBAL || flags == CU_MEM_ATTACH_HOST);
    /* Counted on the device in full: the simulator has no migration, so managed memory is
     * resident where it was allocated. */
    if (result == CUDA_SUCCESS && (result = allocate_linear(ctx->device, ctx, NULL, bytesize, dptr)) == CUDA_SUCCESS) {
        pthread_mutex_lock(&sim_cuda.lock);
        struct sim_allocation *allocation = sim_allocation_at(*dptr);
        if (allocation)
            allocation->managed = 1;
        pthread_mutex_unlock(&sim_cuda.lock);
    }
    return result;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    return free_linear(dptr);
}

/* Stream-ordered allocations draw from a pool (pool.c): charged when asked for, less what the
 * pool's unused reserve serves; a free returns the memory to the pool, which keeps it reserved
 * (NVML still lists it) until a trim or a synchronisation gives it back. */
static CUresult allocate_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    SIM_STREAM_OR_RETURN(hStream);
    struct CUmemPoolHandle_st *from = sim_pool_to_draw(stream->ctx->device, pool);
    if (!from)
        return CUDA_ERROR_INVALID_VALUE;
    return allocate_linear(from->device, stream->ctx, from, bytesize, dptr);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return allocate_async(dptr, bytesize, NULL, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return allocate_async(dptr, bytesize, NULL, hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    return pool ? allocate_async(dptr, bytesize, pool, hStream) : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    return result != CUDA_SUCCESS ? result : free_linear(dptr);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return cuMemFreeAsync(dptr, hStream);
}

/* ---- virtual memory management ------------------------------------------------------------------- */

/* The device of a VMM allocation's properties, after the ready check; NULL if they are not
 * pinned device memory. */
static struct sim_cuda_device *allocation_device(const CUmemAllocationProp *prop)
{
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED ? sim_device_at(&prop->location) : NULL;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    CUresult result = sim_check(
        granularity && (option == CU_MEM_ALLOC_GRANULARITY_MINIMUM || option == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    if (result == CUDA_SUCCESS && !allocation_device(prop))
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS)
        *granularity = SIM_VMM_GRANULARITY;
    return result;
}

void sim_vmm_memfd_name(char *name, size_t size, const struct sim_cuda_device *device)
{
    snprintf(name, size, "%s%d", SIM_VMM_MEMFD_PREFIX, device->view->index);
}

int sim_vmm_register(struct sim_vmm_handle *handle)
{
    return sim_register_handle(handle, SIM_HANDLE_VMM);
}

static struct sim_vmm_handle *vmm_handle(CUmemGenericAllocationHandle handle)
{
    return sim_handle_is((void *)(uintptr_t)handle, SIM_HANDLE_VMM) ? (struct sim_vmm_handle *)(uintptr_t)handle : NULL;
}

void sim_vmm_destroy(struct sim_vmm_handle *handle)
{
    close(handle->fd);
    if (!handle->imported)
        sim_uncharge(handle->device, handle->size);
    free(handle);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    CUresult result = sim_check(handle && flags == 0 && size != 0 && size % SIM_VMM_GRANULARITY == 0);
    if (result != CUDA_SUCCESS)
        return result;
    struct sim_cuda_device *device = allocation_device(prop);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_vmm_handle *created = calloc(1, sizeof *created);
    if (!created)
        return CUDA_ERROR_OUT_OF_MEMORY;
    result = sim_charge(device, size);
    if (result != CUDA_SUCCESS) {
        free(created);
        return result;
    }
    char name[64];
    sim_vmm_memfd_name(name, sizeof name, device);
    *created = (struct sim_vmm_handle){
        .device = device, .size = size, .fd = memfd_create(name, MFD_CLOEXEC), .shareable = prop->requestedHandleTypes};
    if (created->fd < 0 || ftruncate(created->fd, (off_t)size) != 0) {
        if (created->fd >= 0)
            close(created->fd);
        sim_uncharge(device, size);
        free(created);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!sim_register_handle(created, SIM_HANDLE_VMM)) {
        sim_vmm_destroy(created);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (uintptr_t)created;
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult result = sim_lock_handle((void *)(uintptr_t)handle, SIM_HANDLE_VMM, 1);
    if (result != CUDA_SUCCESS)
        return result;
    struct sim_vmm_handle *released = (struct sim_vmm_handle *)(uintptr_t)handle;
    sim_map_take(&sim_cuda.handles, handle, NULL);
    /* Mapped memory lives on until its last mapping goes, as with the driver. */
    released->released = 1;
    if (released->mappings == 0)
        sim_vmm_destroy(released);
    pthread_mutex_unlock(&sim_cuda.lock);
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    CUresult result = sim_check(ptr && size != 0 && size % SIM_VMM_GRANULARITY == 0 && flags == 0 &&
                                (alignment & (alignment - 1)) == 0);
    if (result != CUDA_SUCCESS)
        return result;
    uint64_t align = alignment > SIM_VMM_GRANULARITY ? alignment : SIM_VMM_GRANULARITY;
    void *mapping =
        mmap((void *)(uintptr_t)addr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t start = round_up((uintptr_t)mapping, align), end = start + size;
    if (start > (uintptr_t)mapping)
        munmap(mapping, start - (uintptr_t)mapping);
    if ((uintptr_t)mapping + size + align > end)
        munmap((void *)end, (uintptr_t)mapping + size + align - end);
    pthread_mutex_lock(&sim_cuda.lock);
    int stored = sim_map_put(&sim_cuda.reservations, start, size) == 0;
    pthread_mutex_unlock(&sim_cuda.lock);
    if (!stored) {
        munmap((void *)start, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = start;
    return CUDA_SUCCESS;
}

/* The mappings that exactly tile [ptr, ptr + size): their count, or -1 if they do not. */
static int mappings_tiling(uint64_t ptr, uint64_t size, size_t *first)
{
    size_t at = sim_map_lower_bound(&sim_cuda.allocations, ptr);
    *first = at;
    uint64_t cursor = ptr;
    int count = 0;
    for (; at < sim_cuda.allocations.count && cursor < ptr + size; at++, count++) {
        struct sim_allocation *mapping = (struct sim_allocation *)sim_cuda.allocations.entries[at].value;
        if (mapping->base != cursor || mapping->kind != SIM_ALLOCATION_MAPPING)
            return -1;
        cursor += mapping->size;
    }
    return cursor == ptr + size && count > 0 ? count : -1;
}

/* Puts the reservation back where mappings were; the lock is held. */
static void unmap_mappings(size_t first, int count)
{
    for (int i = 0; i < count; i++) {
        struct sim_allocation *mapping = (struct sim_allocation *)sim_cuda.allocations.entries[first].value;
        mmap((void *)mapping->base, mapping->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
             -1, 0);
        sim_map_take(&sim_cuda.allocations, mapping->base, NULL);
        struct sim_vmm_handle *handle = mapping->handle;
        if (--handle->mappings == 0 && handle->released)
            sim_vmm_destroy(handle);
        free(mapping);
    }
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult result = sim_ready_locked();
    if (result != CUDA_SUCCESS)
        return result;
    uintptr_t reserved;
    result = CUDA_ERROR_INVALID_VALUE;
    if (sim_map_get(&sim_cuda.reservations, ptr, &reserved) == 0 && reserved == size) {
        /* Mappings left inside go with it. */
        size_t first = sim_map_lower_bound(&sim_cuda.allocations, ptr), last = first;
        while (last < sim_cuda.allocations.count && sim_cuda.allocations.entries[last].key < ptr + size)
            last++;
        unmap_mappings(first, (int)(last - first));
        munmap((void *)(uintptr_t)ptr, size);
        sim_map_take(&sim_cuda.reservations, ptr, NULL);
        result = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    CUresult result = sim_check(flags == 0 && size != 0 && size % SIM_VMM_GRANULARITY == 0 &&
                                offset % SIM_VMM_GRANULARITY == 0 && ptr % SIM_VMM_GRANULARITY == 0);
    if (result != CUDA_SUCCESS)
        return result;
    struct sim_allocation *mapping = calloc(1, sizeof *mapping);
    if (!mapping)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&sim_cuda.lock);
    result = CUDA_ERROR_INVALID_VALUE;
    struct sim_vmm_handle *physical = vmm_handle(handle);
    const struct sim_map_entry *reservation = sim_map_floor(&sim_cuda.reservations, ptr);
    const struct sim_map_entry *below = sim_map_floor(&sim_cuda.allocations, ptr + size - 1);
    int overlaps =
        below && ((struct sim_allocation *)below->value)->base + ((struct sim_allocation *)below->value)->span > ptr;
    if (physical && offset + size <= physical->size && reservation &&
        ptr + size <= reservation->key + reservation->value && !overlaps &&
        mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, physical->fd, (off_t)offset) !=
            MAP_FAILED) {
        *mapping = (struct sim_allocation){.base = ptr,
                                           .size = size,
                                           .span = size,
                                           .kind = SIM_ALLOCATION_MAPPING,
                                           .device = physical->device,
                                           .handle = physical};
        if (sim_map_put(&sim_cuda.allocations, ptr, (uintptr_t)mapping) == 0) {
            physical->mappings++;
            mapping = NULL;
            result = CUDA_SUCCESS;
        } else {
            mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
                 0);
            result = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    free(mapping);
    return result;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult result = sim_ready_locked();
    if (result != CUDA_SUCCESS)
        return result;
    size_t first;
    int count = mappings_tiling(ptr, size, &first);
    if (count > 0)
        unmap_mappings(first, count);
    pthread_mutex_unlock(&sim_cuda.lock);
    return count > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    CUresult result = sim_check(desc && count);
    if (result != CUDA_SUCCESS)
        return result;
    int access = 0; /* what the host side of the simulator may do: the widest access granted */
    for (size_t i = 0; i < count; i++) {
        if (!sim_device_at(&desc[i].location))
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            access = PROT_READ | PROT_WRITE;
        else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ)
            access |= PROT_READ;
        else if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE)
            return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_cuda.lock);
    size_t first;
    int mappings = mappings_tiling(ptr, size, &first);
    result = CUDA_ERROR_INVALID_VALUE;
    if (mappings > 0 && mprotect((void *)(uintptr_t)ptr, size, access) == 0) {
        for (int i = 0; i < mappings; i++)
            ((struct sim_allocation *)sim_cuda.allocations.entries[first + (size_t)i].value)->host_access = access;
        result = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

/* ---- arrays ----------------------------------------------------------------------------------------- */

static unsigned int format_bytes(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

static uint64_t at_least_one(uint64_t extent)
{
    return extent ? extent : 1;
}

/* Bytes of an array (levels = 1) or a mipmapped array: every level halves each extent that is
 * in use, down to 1. Returns CUDA_ERROR_INVALID_VALUE for a description the driver refuses. */
static CUresult array_bytes(const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels, uint64_t *bytes)
{
    unsigned int element = format_bytes(desc->Format);
    if (!element || desc->Width == 0 || (desc->Depth && !desc->Height) ||
        (desc->NumChannels != 1 && desc->NumChannels != 2 && desc->NumChannels != 4) || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t largest = desc->Width > desc->Height ? desc->Width : desc->Height;
    largest = largest > desc->Depth ? largest : desc->Depth;
    unsigned int possible = 1;
    while (largest >> possible)
        possible++;
    if (levels > possible)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0;
    for (unsigned int level = 0; level < levels; level++) {
        uint64_t width = at_least_one(desc->Width >> level);
        uint64_t height = desc->Height ? at_least_one(desc->Height >> level) : 1;
        uint64_t depth = desc->Depth ? at_least_one(desc->Depth >> level) : 1;
        uint64_t level_bytes;
        if (__builtin_mul_overflow(width, height, &level_bytes) ||
            __builtin_mul_overflow(level_bytes, depth, &level_bytes) ||
            __builtin_mul_overflow(level_bytes, (uint64_t)desc->NumChannels * element, &level_bytes) ||
            __builtin_add_overflow(total, level_bytes, &total))
            return CUDA_ERROR_INVALID_VALUE;
    }
    *bytes = total;
    return CUDA_SUCCESS;
}

_Static_assert(sizeof(struct CUarray_st) == sizeof(struct CUmipmappedArray_st), "one allocation serves both");

static CUresult create_array(const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels, enum sim_handle_kind kind,
                             void **handle)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, handle && desc);
    if (result != CUDA_SUCCESS)
        return result;
    uint64_t bytes;
    result = array_bytes(desc, levels, &bytes);
    if (result != CUDA_SUCCESS)
        return result;
    struct CUarray_st *created = calloc(1, sizeof *created);
    if (!created)
        return CUDA_ERROR_OUT_OF_MEMORY;
    created->array = (struct sim_array){.device = ctx->device, .ctx = ctx, .bytes = bytes};
    result = sim_charge(ctx->device, bytes);
    if (result != CUDA_SUCCESS) {
        free(created);
        return result;
    }
    if (!sim_register_handle(created, kind)) {
        sim_uncharge(ctx->device, bytes);
        free(created);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = created;
    return CUDA_SUCCESS;
}

static CUresult destroy_array(void *handle, enum sim_handle_kind kind)
{
    CUresult result = sim_ready_locked();
    if (result != CUDA_SUCCESS)
        return result;
    result = CUDA_ERROR_INVALID_HANDLE;
    if (sim_handle_is(handle, kind)) {
        sim_map_take(&sim_cuda.handles, (uintptr_t)handle, NULL);
        struct sim_array *array = array_of((uintptr_t)handle);
        sim_uncharge(array->device, array->bytes);
        free(handle);
        result = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    if (!pAllocateArray)
        return create_array(NULL, 1, SIM_HANDLE_ARRAY, (void **)pHandle);
    CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = pAllocateArray->Width,
                                    .Height = pAllocateArray->Height,
                                    .Format = pAllocateArray->Format,
                                    .NumChannels = pAllocateArray->NumChannels};
    return create_array(&desc, 1, SIM_HANDLE_ARRAY, (void **)pHandle);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    return create_array(pAllocateArray, 1, SIM_HANDLE_ARRAY, (void **)pHandle);
}

CUresult cuArrayDestroy(CUarray hArray)
{
    return destroy_array(hArray, SIM_HANDLE_ARRAY);
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels)
{
    return create_array(pMipmappedArrayDesc, numMipmapLevels, SIM_HANDLE_MIPMAPPED_ARRAY, (void **)pHandle);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    return destroy_array(hMipmappedArray, SIM_HANDLE_MIPMAPPED_ARRAY);
}

/* ---- copies ----------------------------------------------------------------------------------------- */

/* Fills the pieces of [from, to) of a linear allocation that no copy touched before with the
 * poison byte; the lock is held and the pages are accessible. */
static CUresult poison_untouched(struct sim_allocation *allocation, uint64_t from, uint64_t to)
{
    size_t chunks = (size_t)((allocation->size + SIM_POISON_CHUNK - 1) / SIM_POISON_CHUNK);
    if (!allocation->poisoned && !(allocation->poisoned = calloc((chunks + 63) / 64, sizeof(uint64_t))))
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t chunk = (size_t)((from - allocation->base) / SIM_POISON_CHUNK);
         chunk < chunks && allocation->base + chunk * SIM_POISON_CHUNK < to; chunk++) {
        uint64_t bit = 1ull << (chunk % 64);
        if (allocation->poisoned[chunk / 64] & bit)
            continue;
        uint64_t start = chunk * SIM_POISON_CHUNK, length = allocation->size - start;
        memset((void *)(uintptr_t)(allocation->base + start), SIM_POISON_BYTE,
               length < SIM_POISON_CHUNK ? length : SIM_POISON_CHUNK);
        allocation->poisoned[chunk / 64] |= bit;
    }
    return CUDA_SUCCESS;
}

/* Checks that [address, address + bytes) lies in device memory (one linear allocation, or
 * mappings end to end) the host side may touch as asked, making a linear allocation's pages
 * accessible on first use. The lock is held. */
static CUresult host_view(uint64_t address, uint64_t bytes, int access)
{
    uint64_t end;
    if (__builtin_add_overflow(address, bytes, &end))
        return CUDA_ERROR_INVALID_VALUE;
    for (uint64_t cursor = address; cursor < end;) {
        const struct sim_map_entry *entry = sim_map_floor(&sim_cuda.allocations, cursor);
        struct sim_allocation *allocation = entry ? (struct sim_allocation *)entry->value : NULL;
        if (!allocation || cursor >= allocation->base + allocation->size)
            return CUDA_ERROR_INVALID_VALUE;
        if (allocation->kind == SIM_ALLOCATION_LINEAR) {
            if (end > allocation->base + allocation->size)
                return CUDA_ERROR_INVALID_VALUE;
            if (!allocation->host_access) {
                if (mprotect((void *)allocation->base, allocation->span, PROT_READ | PROT_WRITE) != 0)
                    return CUDA_ERROR_OUT_OF_MEMORY;
                allocation->host_access = PROT_READ | PROT_WRITE;
            }
            /* Shared memory is another process's too: its bytes are never poisoned behind it. */
            CUresult poisoned = allocation->share ? CUDA_SUCCESS : poison_untouched(allocation, cursor, end);
            if (poisoned != CUDA_SUCCESS)
                return poisoned;
        } else if ((allocation->host_access & access) != access) {
            return CUDA_ERROR_INVALID_VALUE; /* mapped without cuMemSetAccess: the GPU would fault */
        }
        cursor = allocation->base + allocation->size;
    }
    return CUDA_SUCCESS;
}

/* Checks the device side of a copy or memset (the lock taken here). */
static CUresult device_side(uint64_t address, size_t bytes, int access)
{
    pthread_mutex_lock(&sim_cuda.lock);
    CUresult result = host_view(address, bytes, access);
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

/* A copy or memset on a stream (NULL: synchronous, on the current context's default stream).
 * Checks both sides; a synchronous one then waits for the context's queued kernels, as the
 * legacy default stream orders it. The bytes move at once and take no device time: no kernel
 * runs to read or write them meanwhile, so any order the program can observe is kept. A stream
 * being captured would record a copy node, which the simulator does not model. */
static CUresult prepare_copy(uint64_t destination, int destination_on_device, uint64_t source, int source_on_device,
                             size_t bytes, CUstream hStream, int asynchronous)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, 1);
    if (result != CUDA_SUCCESS)
        return result;
    struct CUstream_st *stream = NULL;
    if (asynchronous && (result = sim_stream_resolve(hStream, &stream)) != CUDA_SUCCESS)
        return result;
    if (stream && stream->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (bytes == 0)
        return CUDA_SUCCESS;
    if (!destination || !source)
        return CUDA_ERROR_INVALID_VALUE;
    /* Ended by the caller once its bytes are copied (sim_copy_end): a checkpoint must not take the
     * pages away mid-copy. */
    sim_copy_begin();
    if ((destination_on_device && (result = device_side(destination, bytes, PROT_WRITE)) != CUDA_SUCCESS) ||
        (source_on_device && (result = device_side(source, bytes, PROT_READ)) != CUDA_SUCCESS)) {
        sim_copy_end();
        return result;
    }
    if (!asynchronous)
        sim_sleep_until(sim_context_tail(ctx));
    return CUDA_SUCCESS;
}

/* Whether an address of a unified-addressing copy (cuMemcpy) is device memory of this process. */
static int on_device(uint64_t address)
{
    pthread_mutex_lock(&sim_cuda.lock);
    const struct sim_map_entry *entry = sim_map_floor(&sim_cuda.allocations, address);
    const struct sim_allocation *allocation = entry ? (const struct sim_allocation *)entry->value : NULL;
    int found = allocation && address < allocation->base + allocation->size;
    pthread_mutex_unlock(&sim_cuda.lock);
    return found;
}

static CUresult copy(uint64_t destination, int destination_on_device, uint64_t source, int source_on_device,
                     size_t bytes, CUstream hStream, int asynchronous)
{
    CUresult result =
        prepare_copy(destination, destination_on_device, source, source_on_device, bytes, hStream, asynchronous);
    if (result == CUDA_SUCCESS && bytes) {
        memmove((void *)(uintptr_t)destination, (const void *)(uintptr_t)source, bytes);
        sim_copy_end();
    }
    return result;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return copy(dstDevice, 1, (uintptr_t)srcHost, 0, ByteCount, NULL, 0);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return copy((uintptr_t)dstHost, 0, srcDevice, 1, ByteCount, NULL, 0);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    return copy(dstDevice, 1, srcDevice, 1, ByteCount, NULL, 0);
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    return copy(dst, on_device(dst), src, on_device(src), ByteCount, NULL, 0);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
    return copy(dstDevice, 1, (uintptr_t)srcHost, 0, ByteCount, hStream, 1);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    return copy((uintptr_t)dstHost, 0, srcDevice, 1, ByteCount, hStream, 1);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    return copy(dstDevice, 1, srcDevice, 1, ByteCount, hStream, 1);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    return copy(dst, on_device(dst), src, on_device(src), ByteCount, hStream, 1);
}

/* A memset of `count` elements of `width` bytes, each `value`. */
static CUresult memset_elements(CUdeviceptr destination, uint32_t value, size_t width, size_t count, CUstream hStream,
                                int asynchronous)
{
    size_t bytes;
    if (__builtin_mul_overflow(count, width, &bytes) || destination % width != 0)
        return sim_ready() == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : sim_ready();
    CUresult result = prepare_copy(destination, 1, 1, 0, bytes, hStream, asynchronous);
    if (result != CUDA_SUCCESS || bytes == 0)
        return result;
    unsigned char *bytes_out = (unsigned char *)(uintptr_t)destination;
    if (width == 1) {
        memset(bytes_out, (int)value, count);
    } else if (width == 2) {
        uint16_t element = (uint16_t)value;
        for (size_t i = 0; i < count; i++)
            memcpy(bytes_out + 2 * i, &element, 2);
    } else {
        for (size_t i = 0; i < count; i++)
            memcpy(bytes_out + 4 * i, &value, 4);
    }
    sim_copy_end();
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    return memset_elements(dstDevice, uc, 1, N, NULL, 0);
}

CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
    return memset_elements(dstDevice, us, 2, N, NULL, 0);
}

CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    return memset_elements(dstDevice, ui, 4, N, NULL, 0);
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    return memset_elements(dstDevice, uc, 1, N, hStream, 1);
}

CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream)
{
    return memset_elements(dstDevice, us, 2, N, hStream, 1);
}

CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
    return memset_elements(dstDevice, ui, 4, N, hStream, 1);
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, free && total);
    if (result != CUDA_SUCCESS)
        return result;
    sim_reap_now_and_then(ctx->device);
    uint64_t capacity = ctx->device->view->spec->memory, used = sim_device_used(ctx->device->view);
    *total = capacity;
    *free = used < capacity ? capacity - used : 0;
    return CUDA_SUCCESS;
}
