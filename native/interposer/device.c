/*
 * Which device is the slice's: the slice's figures replace the driver's only for it. A device
 * is asked for its UUID once, through CUDA (an ordinal) or NVML (a handle), and the verdict is
 * kept in one cache for both: a device's identity does not change while the process runs.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define V (vgpu_state.device)

enum { VERDICT_UNKNOWN = 0, VERDICT_SLICE = 1, VERDICT_OTHER = 2 };

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML writes a UUID. */
static void format_uuid(char *out, size_t size, const char *prefix, const CUuuid *uuid)
{
    const unsigned char *b = (const unsigned char *)uuid->bytes;
    snprintf(out, size, "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix, b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int ask_cuda(uintptr_t ordinal)
{
    const struct vgpu_limits_page *page = vgpu_limits_page();
    if (!page || !page->device_uuid[0])
        return 1;
    /* A MIG slice is named by its MIG UUID, which only the _v2 query returns. */
    int mig = strncmp(page->device_uuid, "MIG-", 4) == 0;
    vgpu_pfn_cuDeviceGetUuid get_uuid = mig ? VGPU_CALLED(cuDeviceGetUuid_v2) : VGPU_CALLED(cuDeviceGetUuid);
    CUuuid uuid;
    char text[64];
    if (!get_uuid || get_uuid(&uuid, (CUdevice)ordinal) != CUDA_SUCCESS)
        return 1;
    format_uuid(text, sizeof text, mig ? "MIG" : "GPU", &uuid);
    return vgpu_is_slice_uuid(text);
}

static int ask_nvml(uintptr_t handle)
{
    vgpu_pfn_nvmlDeviceGetUUID get_uuid = VGPU_CALLED(nvmlDeviceGetUUID);
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (!get_uuid || get_uuid((nvmlDevice_t)handle, uuid, sizeof uuid) != NVML_SUCCESS)
        return 1;
    return vgpu_is_slice_uuid(uuid);
}

/* The verdict on a device, asked once: a cell is claimed for the device, then its verdict
 * published. A thread that finds a cell claimed but its verdict not yet published asks itself
 * rather than wait. `library` tells a CUDA ordinal from an NVML handle of the same value. */
static int device_is_slice(enum vgpu_library library, uintptr_t device, int (*ask)(uintptr_t))
{
    uintptr_t key = (device << 1 | (uintptr_t)library) + 1; /* never 0, the free cell */
    for (int index = 0; index < VGPU_VERDICT_CACHE; index++) {
        uintptr_t cell = atomic_load_explicit(&V.key[index], memory_order_acquire);
        if (cell == key) {
            uint8_t verdict = atomic_load_explicit(&V.verdict[index], memory_order_acquire);
            return verdict == VERDICT_UNKNOWN ? ask(device) : verdict == VERDICT_SLICE;
        }
        if (cell)
            continue;
        uintptr_t expected = 0;
        if (!atomic_compare_exchange_strong_explicit(&V.key[index], &expected, key, memory_order_acq_rel,
                                                     memory_order_acquire)) {
            index--; /* another thread took this cell: look at it again */
            continue;
        }
        int is_slice = ask(device);
        atomic_store_explicit(&V.verdict[index], is_slice ? VERDICT_SLICE : VERDICT_OTHER, memory_order_release);
        return is_slice;
    }
    return ask(device);
}

int vgpu_cuda_device_is_slice(CUdevice device)
{
    if (device < 0)
        return ask_cuda((uintptr_t)device); /* no such device: the driver says so */
    return device_is_slice(VGPU_LIB_CUDA, (uintptr_t)device, ask_cuda);
}

int vgpu_nvml_device_is_slice(nvmlDevice_t device)
{
    return device_is_slice(VGPU_LIB_NVML, (uintptr_t)device, ask_nvml);
}

/* With a single visible device (the usual case: CUDA_VISIBLE_DEVICES names the slice's) there
 * is no need to ask which device the current context is on. */
int vgpu_current_cuda_device_is_slice(void)
{
    int count = atomic_load_explicit(&V.cuda_device_count, memory_order_relaxed);
    if (count == 0) {
        vgpu_pfn_cuDeviceGetCount get_count = VGPU_CALLED(cuDeviceGetCount);
        if (!get_count || get_count(&count) != CUDA_SUCCESS || count < 1)
            count = -1;
        atomic_store_explicit(&V.cuda_device_count, count, memory_order_relaxed);
    }
    if (count == 1)
        return vgpu_cuda_device_is_slice(0);
    vgpu_pfn_cuCtxGetDevice get_device = VGPU_CALLED(cuCtxGetDevice);
    CUdevice device;
    if (!get_device || get_device(&device) != CUDA_SUCCESS)
        return 1;
    return vgpu_cuda_device_is_slice(device);
}
