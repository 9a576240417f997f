/*
 * NVML: what nvidia-smi-like tools (pynvml, nvitop, frameworks' memory probes) see. For the
 * slice's device the memory figures are the slice's (total = cap, used = slice usage, free =
 * the rest); other devices, and slices without a cap, pass through untouched.
 */
#include "internal.h"

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    VGPU_HOOK_REAL(nvmlDeviceGetMemoryInfo);
    nvmlReturn_t result = real(device, memory);
    struct vgpu_slice_view view;
    if (result == NVML_SUCCESS && memory && vgpu_nvml_device_is_slice(device) &&
        vgpu_slice_view(memory->total, memory->free, &view)) {
        memory->total = view.total;
        memory->used = view.used;
        memory->free = view.free;
    }
    return result;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    VGPU_HOOK_REAL(nvmlDeviceGetMemoryInfo_v2);
    nvmlReturn_t result = real(device, memory);
    struct vgpu_slice_view view;
    if (result == NVML_SUCCESS && memory && vgpu_nvml_device_is_slice(device) &&
        vgpu_slice_view(memory->total, memory->free, &view)) {
        memory->total = view.total;
        memory->reserved = 0; /* the slice's driver memory is inside `used` */
        memory->used = view.used;
        memory->free = view.free;
    }
    return result;
}
