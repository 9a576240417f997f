/*
 * NVML: what nvidia-smi-like tools (pynvml, nvitop, frameworks' memory probes) see. For the
 * slice's device the memory figures are the slice's (total = cap, used = slice usage, free =
 * the rest); other devices, and slices without a cap, pass through untouched.
 */
#include <stddef.h>

#include "internal.h"

#define N (vgpu_state.nvml)

enum { VERDICT_UNKNOWN = 0, VERDICT_SLICE = 1, VERDICT_OTHER = 2 };

static int ask_is_slice(nvmlDevice_t device)
{
    vgpu_pfn_nvmlDeviceGetUUID get_uuid = VGPU_CALLED(nvmlDeviceGetUUID);
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (!get_uuid || get_uuid(device, uuid, sizeof uuid) != NVML_SUCCESS)
        return 1; /* cannot tell: a process of a slice sees its slice */
    return vgpu_is_slice_uuid(uuid);
}

/* Whether `device` is the slice's device; handles are stable for the life of the process, so
 * the answer is cached per handle (a lock-free list: claim a cell, then publish its verdict). */
static int device_is_slice(nvmlDevice_t device)
{
    for (int index = 0; index < VGPU_NVML_HANDLE_CACHE; index++) {
        nvmlDevice_t cell = atomic_load_explicit(&N.handle[index], memory_order_acquire);
        if (cell == device) {
            uint8_t verdict = atomic_load_explicit(&N.verdict[index], memory_order_acquire);
            return verdict == VERDICT_UNKNOWN ? ask_is_slice(device) : verdict == VERDICT_SLICE;
        }
        if (cell)
            continue;
        nvmlDevice_t expected = NULL;
        if (!atomic_compare_exchange_strong_explicit(&N.handle[index], &expected, device, memory_order_acq_rel,
                                                     memory_order_acquire)) {
            index--; /* another thread took this cell: look at it again */
            continue;
        }
        int is_slice = ask_is_slice(device);
        atomic_store_explicit(&N.verdict[index], is_slice ? VERDICT_SLICE : VERDICT_OTHER, memory_order_release);
        return is_slice;
    }
    return ask_is_slice(device);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    vgpu_pfn_nvmlDeviceGetMemoryInfo real = VGPU_REAL(nvmlDeviceGetMemoryInfo);
    if (!real)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t result = real(device, memory);
    struct vgpu_slice_view view;
    if (result == NVML_SUCCESS && memory && device_is_slice(device) &&
        vgpu_slice_view(memory->total, memory->free, &view)) {
        memory->total = view.total;
        memory->used = view.used;
        memory->free = view.free;
    }
    return result;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    vgpu_pfn_nvmlDeviceGetMemoryInfo_v2 real = VGPU_REAL(nvmlDeviceGetMemoryInfo_v2);
    if (!real)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t result = real(device, memory);
    struct vgpu_slice_view view;
    if (result == NVML_SUCCESS && memory && device_is_slice(device) &&
        vgpu_slice_view(memory->total, memory->free, &view)) {
        memory->total = view.total;
        memory->reserved = 0; /* the slice's driver memory is inside `used` */
        memory->used = view.used;
        memory->free = view.free;
    }
    return result;
}
