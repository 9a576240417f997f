/*
 * NVML: what nvidia-smi-like tools (pynvml, nvitop, frameworks' memory probes) see. For the
 * slice's device the memory figures are the slice's (total = cap, used = slice usage, free =
 * the rest); other devices, and slices without a cap, pass through untouched.
 */
#include "internal.h"

/* Puts the slice's figures in place of the device's where `device` is the slice's and the slice
 * has a cap; returns whether it did. The two nvmlMemory structs order their fields differently, so
 * the fields come as pointers. */
static int show_slice_memory(nvmlDevice_t device, unsigned long long *total, unsigned long long *used,
                             unsigned long long *free)
{
    struct vgpu_slice_view view;
    if (!vgpu_nvml_device_is_slice(device) || !vgpu_slice_view(*total, *free, &view))
        return 0;
    *total = view.total;
    *used = view.used;
    *free = view.free;
    return 1;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    VGPU_HOOK_REAL(nvmlDeviceGetMemoryInfo);
    nvmlReturn_t result = real(device, memory);
    if (result == NVML_SUCCESS && memory)
        show_slice_memory(device, &memory->total, &memory->used, &memory->free);
    return result;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    VGPU_HOOK_REAL(nvmlDeviceGetMemoryInfo_v2);
    nvmlReturn_t result = real(device, memory);
    if (result == NVML_SUCCESS && memory && show_slice_memory(device, &memory->total, &memory->used, &memory->free))
        memory->reserved = 0; /* the slice's driver memory is inside `used` */
    return result;
}
