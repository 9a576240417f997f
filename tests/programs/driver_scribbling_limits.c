/*
 * A tiny stand-in libcuda.so.1 whose pitched allocation scribbles over the slice's published
 * limits (VGPU_REGION) while it runs, and chooses a 4 KiB pitch, wider than the interposer
 * expects. Built as a shared library (soname libcuda.so.1) by the tests, to prove that when the
 * interposer grows a charge to the pitch the driver chose, limits it cannot read then refuse the
 * extra bytes (fail closed) instead of counting as "no cap".
 */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vgpu/cuda_abi.h"
#include "vgpu/region.h"

#define EXPORT __attribute__((visibility("default")))
#define PITCH_ALIGNMENT 4096u

static unsigned long long next_pointer = 0x100000000ULL;

EXPORT CUresult cuInit(unsigned int flags)
{
    (void)flags;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    if (!dptr || !bytesize)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = __atomic_fetch_add(&next_pointer, (bytesize + 0xfffff) & ~0xfffffULL, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    (void)dptr;
    return CUDA_SUCCESS;
}

/* The active copy's check stops matching its fields: to a reader, the region is corrupt. */
static void scribble_limits(void)
{
    const char *path = getenv("VGPU_REGION");
    int fd = path ? open(path, O_RDWR | O_CLOEXEC) : -1;
    if (fd < 0)
        return;
    struct vgpu_region *region = mmap(NULL, sizeof *region, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (region == MAP_FAILED)
        return;
    uint64_t active = __atomic_load_n(&region->active_limits, __ATOMIC_ACQUIRE) & 1;
    __atomic_fetch_xor(&region->limits[active].check, 1, __ATOMIC_SEQ_CST);
    munmap(region, sizeof *region);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                   unsigned int ElementSizeBytes)
{
    (void)ElementSizeBytes;
    if (!pPitch || !WidthInBytes || !Height)
        return CUDA_ERROR_INVALID_VALUE;
    scribble_limits();
    *pPitch = (WidthInBytes + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT;
    return cuMemAlloc_v2(dptr, *pPitch * Height);
}
