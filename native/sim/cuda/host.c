/*
 * Pinned host memory and what a pointer is: cuMemHostAlloc and friends, cuPointerGetAttribute(s),
 * cuMemGetAddressRange. Pinned memory is host memory: it is never charged to a device, as a real
 * driver's page-locked buffers take none of the GPU's memory. With unified addressing its device
 * address is its host address.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cuda_sim.h"

/* A pinned host buffer: allocated here (cuMemHostAlloc) or registered (cuMemHostRegister). */
struct sim_host_buffer {
    uint64_t size;
    unsigned int flags;
    int registered;
    struct CUctx_st *ctx;
};

/* The pinned buffer holding `address`, its start in *base; the lock is held. */
static struct sim_host_buffer *host_buffer_at(uint64_t address, uint64_t *base)
{
    const struct sim_map_entry *entry = sim_map_floor(&sim_cuda.host_buffers, address);
    if (!entry)
        return NULL;
    struct sim_host_buffer *buffer = (struct sim_host_buffer *)entry->value;
    if (address >= entry->key + buffer->size)
        return NULL;
    *base = entry->key;
    return buffer;
}

static CUresult add_host_buffer(void *p, size_t bytesize, unsigned int flags, int registered, struct CUctx_st *ctx)
{
    struct sim_host_buffer *buffer = malloc(sizeof *buffer);
    if (!buffer)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *buffer = (struct sim_host_buffer){.size = bytesize, .flags = flags, .registered = registered, .ctx = ctx};
    pthread_mutex_lock(&sim_cuda.lock);
    uint64_t base;
    CUresult result = CUDA_SUCCESS;
    if (host_buffer_at((uintptr_t)p, &base) || host_buffer_at((uintptr_t)p + bytesize - 1, &base))
        result = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    else if (sim_map_put(&sim_cuda.host_buffers, (uintptr_t)p, (uintptr_t)buffer) != 0)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&sim_cuda.lock);
    if (result != CUDA_SUCCESS)
        free(buffer);
    return result;
}

/* Takes the buffer starting at `p` out of the map if it is of the kind asked for. */
static CUresult remove_host_buffer(void *p, int registered, struct sim_host_buffer **removed)
{
    CUresult result = sim_check(p != NULL);
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&sim_cuda.lock);
    uintptr_t value;
    result = registered ? CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED : CUDA_ERROR_INVALID_VALUE;
    if (sim_map_get(&sim_cuda.host_buffers, (uintptr_t)p, &value) == 0 &&
        ((struct sim_host_buffer *)value)->registered == registered) {
        sim_map_take(&sim_cuda.host_buffers, (uintptr_t)p, NULL);
        *removed = (struct sim_host_buffer *)value;
        result = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    struct CUctx_st *ctx;
    unsigned int known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    CUresult result = sim_current_context(&ctx, pp && bytesize && !(Flags & ~known));
    if (result != CUDA_SUCCESS)
        return result;
    void *memory = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    result = add_host_buffer(memory, bytesize, Flags, 0, ctx);
    if (result != CUDA_SUCCESS) {
        munmap(memory, bytesize);
        return result;
    }
    *pp = memory;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return cuMemHostAlloc(pp, bytesize, 0);
}

CUresult cuMemFreeHost(void *p)
{
    struct sim_host_buffer *buffer;
    CUresult result = remove_host_buffer(p, 0, &buffer);
    if (result == CUDA_SUCCESS) {
        munmap(p, buffer->size);
        free(buffer);
    }
    return result;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    struct CUctx_st *ctx;
    unsigned int known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY |
                         CU_MEMHOSTREGISTER_READ_ONLY;
    CUresult result = sim_current_context(&ctx, p && bytesize && !(Flags & ~known));
    if (result != CUDA_SUCCESS)
        return result;
    return add_host_buffer(p, bytesize, Flags, 1, ctx);
}

CUresult cuMemHostUnregister(void *p)
{
    struct sim_host_buffer *buffer;
    CUresult result = remove_host_buffer(p, 1, &buffer);
    if (result == CUDA_SUCCESS)
        free(buffer);
    return result;
}

/* Looks up a pinned buffer holding `p` (the lock taken here); 0 if there is none. */
static int find_host_buffer(const void *p, struct sim_host_buffer *copy, uint64_t *base)
{
    pthread_mutex_lock(&sim_cuda.lock);
    struct sim_host_buffer *buffer = host_buffer_at((uintptr_t)p, base);
    if (buffer)
        *copy = *buffer;
    pthread_mutex_unlock(&sim_cuda.lock);
    return buffer != NULL;
}

/* The pinned buffer a query about `p` names, once its arguments are found valid. */
static CUresult queried_host_buffer(int arguments_valid, const void *p, struct sim_host_buffer *buffer)
{
    CUresult result = sim_check(arguments_valid);
    if (result != CUDA_SUCCESS)
        return result;
    uint64_t base;
    return find_host_buffer(p, buffer, &base) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    struct sim_host_buffer buffer;
    CUresult result = queried_host_buffer(pdptr && p && Flags == 0, p, &buffer);
    if (result == CUDA_SUCCESS)
        *pdptr = (uintptr_t)p; /* unified addressing: the same address on both sides */
    return result;
}

CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p)
{
    struct sim_host_buffer buffer;
    CUresult result = queried_host_buffer(pFlags && p, p, &buffer);
    if (result == CUDA_SUCCESS)
        *pFlags = buffer.flags;
    return result;
}

/* ---- what a pointer is ---------------------------------------------------------------------- */

/* What the driver knows of an address: device memory of this process or a pinned host buffer. */
struct sim_pointer {
    int memory_type; /* 0: unknown to the driver */
    uint64_t base, size;
    struct CUctx_st *ctx;
    struct sim_cuda_device *device;
    int managed;
    struct CUmemPoolHandle_st *pool;
};

static void describe_pointer(CUdeviceptr ptr, struct sim_pointer *found)
{
    memset(found, 0, sizeof *found);
    pthread_mutex_lock(&sim_cuda.lock);
    const struct sim_map_entry *entry = sim_map_floor(&sim_cuda.allocations, ptr);
    const struct sim_allocation *allocation = entry ? (const struct sim_allocation *)entry->value : NULL;
    uint64_t base;
    struct sim_host_buffer *buffer;
    if (allocation && ptr < allocation->base + allocation->size) {
        *found = (struct sim_pointer){
            .memory_type = CU_MEMORYTYPE_DEVICE,
            .base = allocation->base,
            .size = allocation->size,
            .ctx = allocation->ctx ? allocation->ctx : allocation->device->primary,
            .device = allocation->device,
            .managed = allocation->managed,
            .pool = allocation->pool,
        };
    } else if ((buffer = host_buffer_at(ptr, &base))) {
        *found = (struct sim_pointer){
            .memory_type = CU_MEMORYTYPE_HOST,
            .base = base,
            .size = buffer->size,
            .ctx = buffer->ctx,
            .device = buffer->ctx->device,
        };
    }
    pthread_mutex_unlock(&sim_cuda.lock);
}

/* One attribute of a described pointer into `data`; INVALID_VALUE for an unknown attribute,
 * NOT_SUPPORTED for one the simulator does not model. */
static CUresult pointer_attribute(const struct sim_pointer *pointer, CUpointer_attribute attribute, CUdeviceptr ptr,
                                  void *data)
{
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = pointer->ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = (unsigned int)pointer->memory_type; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (pointer->memory_type != CU_MEMORYTYPE_HOST && !pointer->managed)
            return CUDA_ERROR_INVALID_VALUE; /* device memory has no host address */
        *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = pointer->base; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = pointer->managed; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = pointer->device->ordinal; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(int *)data = pointer->memory_type == CU_MEMORYTYPE_DEVICE && !pointer->managed && !pointer->pool;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = pointer->base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = pointer->size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = 1; break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: *(unsigned long long *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: *(unsigned int *)data = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(CUmemoryPool *)data = pointer->pool; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t *)data = pointer->size; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(void **)data = (void *)(uintptr_t)pointer->base; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: *(unsigned long long *)data = pointer->base; break;
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: *(int *)data = 0; break;
    default: return attribute == 5 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE; /* P2P tokens */
    }
    return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    CUresult result = sim_check(data && ptr);
    if (result != CUDA_SUCCESS)
        return result;
    struct sim_pointer pointer;
    describe_pointer(ptr, &pointer);
    if (!pointer.memory_type)
        return CUDA_ERROR_INVALID_VALUE; /* memory the driver does not know */
    return pointer_attribute(&pointer, attribute, ptr, data);
}

/* As the driver: for memory it does not know, the memory type reads 0 and the rest is left
 * as is, without an error (how a runtime asks "is this device memory?"). */
CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                CUdeviceptr ptr)
{
    CUresult result = sim_check(numAttributes && attributes && data);
    if (result != CUDA_SUCCESS)
        return result;
    struct sim_pointer pointer;
    describe_pointer(ptr, &pointer);
    for (unsigned int i = 0; i < numAttributes; i++) {
        if (!data[i])
            continue;
        if (!pointer.memory_type) {
            if (attributes[i] == CU_POINTER_ATTRIBUTE_MEMORY_TYPE || attributes[i] == CU_POINTER_ATTRIBUTE_IS_MANAGED)
                *(unsigned int *)data[i] = 0;
            else if (attributes[i] == CU_POINTER_ATTRIBUTE_CONTEXT)
                *(CUcontext *)data[i] = NULL;
            continue;
        }
        result = pointer_attribute(&pointer, attributes[i], ptr, data[i]);
        if (result != CUDA_SUCCESS)
            return result;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    CUresult result = sim_check(1);
    if (result != CUDA_SUCCESS)
        return result;
    struct sim_pointer pointer;
    describe_pointer(dptr, &pointer);
    if (pointer.memory_type != CU_MEMORYTYPE_DEVICE)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = pointer.base;
    if (psize)
        *psize = pointer.size;
    return CUDA_SUCCESS;
}
