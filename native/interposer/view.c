/*
 * What the program is shown of memory: for the slice's device, the slice (total = the cap,
 * free = what the slice has left); other devices, and slices without a cap, as the driver says.
 * NVML's figures (nvml.c) come from the same view.
 */
#include "internal.h"

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

VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    VGPU_HOOK_REAL(cuMemGetInfo_v2);
    CUresult result = real(free, total);
    if (result != CUDA_SUCCESS || !free || !total || !vgpu_current_cuda_device_is_slice())
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
    VGPU_HOOK_REAL(cuDeviceTotalMem_v2);
    CUresult result = real(bytes, dev);
    if (result != CUDA_SUCCESS || !bytes || !vgpu_cuda_device_is_slice(dev))
        return result;
    struct vgpu_slice_view view;
    if (vgpu_slice_view(*bytes, *bytes, &view))
        *bytes = view.total;
    return result;
}
