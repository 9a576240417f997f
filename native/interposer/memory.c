/*
 * Allocation and free hooks: every allocation family is charged (charge.c) before the driver
 * makes it and given back when it is freed. What each family takes is estimated here from its
 * arguments; where the driver decides (a pitch), the charge follows what it chose.
 */
#include "internal.h"

/* Set while this thread is inside the driver's allocation or free: a driver that implements
 * one entry point by calling another exported one (cuMemAllocFromPoolAsync_ptsz calling
 * cuMemAllocFromPoolAsync) reaches our hook again through the dynamic linker, and that inner
 * call must pass straight through or the request would be charged twice. Thread-local by
 * nature, so it lives outside vgpu_state. */
static __thread int inside_driver __attribute__((tls_model("initial-exec")));

#define CALL_DRIVER(result, call)                                                                                      \
    do {                                                                                                               \
        inside_driver = 1;                                                                                             \
        (result) = (call);                                                                                             \
        inside_driver = 0;                                                                                             \
    } while (0)

/* Hooks `name` (binds `real`); a call the driver makes from inside one of our hooks passes
 * straight through to it with `...`, uncharged. Not a do-while: `real` must stay in scope. */
#define HOOK_OUTSIDE_DRIVER(name, ...)                                                                                 \
    VGPU_HOOK_REAL(name);                                                                                              \
    if (inside_driver) {                                                                                               \
        return real(__VA_ARGS__);                                                                                      \
    }                                                                                                                  \
    (void)0

/* Charges `bytes` before the driver's `real(...)` (bound by the caller's hook) makes something,
 * and settles the charge after it: kept as (kind, key_when_made) when made, given back when not. */
#define CHARGED_ALLOCATION(name, bytes, kind, key_when_made, family, ...)                                              \
    do {                                                                                                               \
        struct vgpu_charge c;                                                                                          \
        CUresult result = vgpu_charge_making_room(&c, #name, (bytes));                                                 \
        if (result != CUDA_SUCCESS)                                                                                    \
            return result;                                                                                             \
        CALL_DRIVER(result, real(__VA_ARGS__));                                                                        \
        return vgpu_settle_charge(&c, result, (kind), result == CUDA_SUCCESS ? (uint64_t)(key_when_made) : 0,          \
                                  (family));                                                                           \
    } while (0)

/* An allocation that returns a device pointer through `dptr` and takes `bytes`. */
#define CHARGED_DEVICE_ALLOCATION(name, family, bytes, ...)                                                            \
    do {                                                                                                               \
        HOOK_OUTSIDE_DRIVER(name, __VA_ARGS__);                                                                        \
        CHARGED_ALLOCATION(name, bytes, VGPU_KIND_DEVICE_POINTER, *dptr, family, __VA_ARGS__);                         \
    } while (0)

/* A free of something the table may know as (kind, key). */
#define RELEASE(name, kind, key, ...)                                                                                  \
    do {                                                                                                               \
        HOOK_OUTSIDE_DRIVER(name, __VA_ARGS__);                                                                        \
        struct vgpu_alloc_entry entry;                                                                                 \
        int known = vgpu_table_take((kind), (uint64_t)(key), &entry);                                                  \
        CUresult result;                                                                                               \
        CALL_DRIVER(result, real(__VA_ARGS__));                                                                        \
        vgpu_release_settle(known, &entry, result);                                                                    \
        return result;                                                                                                 \
    } while (0)

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CHARGED_DEVICE_ALLOCATION(cuMemAlloc_v2, VGPU_FAMILY_ALLOC, bytesize, dptr, bytesize);
}

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    CHARGED_DEVICE_ALLOCATION(cuMemAllocManaged, VGPU_FAMILY_MANAGED, bytesize, dptr, bytesize, flags);
}

/* A stream-ordered allocation from `asked` (NULL: the device's current pool): charged what the
 * pool's unused reserve cannot serve; after it, the pools' charge follows what they reserve
 * (pool_memory.c). */
#define POOL_ALLOCATION(name, family, asked, ...)                                                                      \
    do {                                                                                                               \
        HOOK_OUTSIDE_DRIVER(name, __VA_ARGS__);                                                                        \
        CUmemoryPool drawn = vgpu_pool_drawn(asked);                                                                   \
        uint64_t claimed = vgpu_pool_claim(drawn, bytesize);                                                           \
        struct vgpu_charge c;                                                                                          \
        CUresult result = vgpu_charge(&c, #name, bytesize - claimed);                                                  \
        if (result == CUDA_SUCCESS)                                                                                    \
            CALL_DRIVER(result, real(__VA_ARGS__));                                                                    \
        else                                                                                                           \
            c = (struct vgpu_charge){NULL, 0};                                                                         \
        return vgpu_pool_allocation_settle(&c, result, drawn, claimed, result == CUDA_SUCCESS ? *dptr : 0, (family));  \
    } while (0)

VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    POOL_ALLOCATION(cuMemAllocAsync, VGPU_FAMILY_ASYNC, NULL, dptr, bytesize, hStream);
}

VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    POOL_ALLOCATION(cuMemAllocAsync_ptsz, VGPU_FAMILY_ASYNC, NULL, dptr, bytesize, hStream);
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    POOL_ALLOCATION(cuMemAllocFromPoolAsync, VGPU_FAMILY_POOL, pool, dptr, bytesize, pool, hStream);
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                  CUstream hStream)
{
    POOL_ALLOCATION(cuMemAllocFromPoolAsync_ptsz, VGPU_FAMILY_POOL, pool, dptr, bytesize, pool, hStream);
}

static uint64_t saturating_multiply(uint64_t a, uint64_t b)
{
    uint64_t product;
    return __builtin_mul_overflow(a, b, &product) ? UINT64_MAX : product;
}

/* Pitch the driver is expected to choose; vgpu_recharge() corrects to what it did choose. */
#define PITCH_ALIGNMENT 512u

VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                        unsigned int ElementSizeBytes)
{
    HOOK_OUTSIDE_DRIVER(cuMemAllocPitch_v2, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t pitch_estimate = WidthInBytes > UINT64_MAX - PITCH_ALIGNMENT
                                  ? UINT64_MAX
                                  : (WidthInBytes + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT;
    struct vgpu_charge c;
    CUresult result = vgpu_charge_making_room(&c, "cuMemAllocPitch_v2", saturating_multiply(pitch_estimate, Height));
    if (result != CUDA_SUCCESS)
        return result;
    CALL_DRIVER(result, real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
    if (result == CUDA_SUCCESS && pPitch) {
        CUresult recharged = vgpu_recharge(&c, "cuMemAllocPitch_v2", saturating_multiply(*pPitch, Height));
        if (recharged != CUDA_SUCCESS) {
            /* The driver's pitch pushed the slice over its cap: undo the allocation. */
            vgpu_pfn_cuMemFree_v2 release = VGPU_REAL(cuMemFree_v2);
            if (release)
                CALL_DRIVER(result, release(*dptr));
            vgpu_uncharge(&c);
            return recharged;
        }
    }
    return vgpu_settle_charge(&c, result, VGPU_KIND_DEVICE_POINTER, result == CUDA_SUCCESS ? *dptr : 0,
                              VGPU_FAMILY_PITCH);
}

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    RELEASE(cuMemFree_v2, VGPU_KIND_DEVICE_POINTER, dptr, dptr);
}

VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    RELEASE(cuMemFreeAsync, VGPU_KIND_DEVICE_POINTER, dptr, dptr, hStream);
}

VGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    RELEASE(cuMemFreeAsync_ptsz, VGPU_KIND_DEVICE_POINTER, dptr, dptr, hStream);
}

/* VMM: physical memory is what cuMemCreate makes; mapping it (cuMemMap) adds none. Memory
 * placed on the host (CUDA 12.2+ host locations) is not GPU memory and is not charged. */
VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags)
{
    VGPU_HOOK_REAL(cuMemCreate);
    if (inside_driver || (prop && prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE &&
                          prop->location.type != CU_MEM_LOCATION_TYPE_INVALID))
        return real(handle, size, prop, flags);
    struct vgpu_charge c;
    CUresult result = vgpu_charge_making_room(&c, "cuMemCreate", size);
    if (result != CUDA_SUCCESS)
        return result;
    CALL_DRIVER(result, real(handle, size, prop, flags));
    return vgpu_settle_charge(&c, result, VGPU_KIND_VMM_HANDLE, result == CUDA_SUCCESS ? *handle : 0, VGPU_FAMILY_VMM);
}

VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    RELEASE(cuMemRelease, VGPU_KIND_VMM_HANDLE, handle, handle);
}

/* Bytes of one element of an array: exact for the plain formats, 4 bytes per channel (the
 * widest plain format) for the packed and compressed ones, which are no larger. */
static uint64_t array_element_bytes(CUarray_format format, unsigned int channels)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return channels;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2ull * channels;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4ull * channels;
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1: return 1;
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2:
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1: return 2;
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2: return 4;
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4: return 8;
    default: return 4ull * (channels ? channels : 4);
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
    VGPU_HOOK_REAL(cuArrayCreate_v2);
    if (inside_driver || !pAllocateArray)
        return real(pHandle, pAllocateArray);
    const CUDA_ARRAY_DESCRIPTOR *d = pAllocateArray;
    CHARGED_ALLOCATION(cuArrayCreate_v2, array_bytes(d->Width, d->Height, 0, 0, d->Format, d->NumChannels, 1),
                       VGPU_KIND_ARRAY, (uintptr_t)*pHandle, VGPU_FAMILY_ARRAY, pHandle, pAllocateArray);
}

VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    VGPU_HOOK_REAL(cuArray3DCreate_v2);
    if (inside_driver || !pAllocateArray)
        return real(pHandle, pAllocateArray);
    const CUDA_ARRAY3D_DESCRIPTOR *d = pAllocateArray;
    CHARGED_ALLOCATION(cuArray3DCreate_v2,
                       array_bytes(d->Width, d->Height, d->Depth, d->Flags, d->Format, d->NumChannels, 1),
                       VGPU_KIND_ARRAY, (uintptr_t)*pHandle, VGPU_FAMILY_ARRAY, pHandle, pAllocateArray);
}

VGPU_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    RELEASE(cuArrayDestroy, VGPU_KIND_ARRAY, (uintptr_t)hArray, hArray);
}

VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                            const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                            unsigned int numMipmapLevels)
{
    VGPU_HOOK_REAL(cuMipmappedArrayCreate);
    if (inside_driver || !pMipmappedArrayDesc)
        return real(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    const CUDA_ARRAY3D_DESCRIPTOR *d = pMipmappedArrayDesc;
    CHARGED_ALLOCATION(cuMipmappedArrayCreate,
                       array_bytes(d->Width, d->Height, d->Depth, d->Flags, d->Format, d->NumChannels, numMipmapLevels),
                       VGPU_KIND_MIPMAPPED_ARRAY, (uintptr_t)*pHandle, VGPU_FAMILY_MIPMAPPED_ARRAY, pHandle,
                       pMipmappedArrayDesc, numMipmapLevels);
}

VGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    RELEASE(cuMipmappedArrayDestroy, VGPU_KIND_MIPMAPPED_ARRAY, (uintptr_t)hMipmappedArray, hMipmappedArray);
}

/* Graph memory stays in the driver's graph pool from a launch until a trim gives back what no
 * live allocation uses: the slice's charge follows what the pool still reserves (charge.c). */
VGPU_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    VGPU_HOOK_REAL(cuDeviceGraphMemTrim);
    CUresult result = real(device);
    if (result == CUDA_SUCCESS && vgpu_cuda_device_is_slice(device)) {
        vgpu_graph_pool_trimmed();
        vgpu_graph_memory_settle(NULL, 0, device);
    }
    return result;
}
