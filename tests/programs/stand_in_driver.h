/*
 * What the tiny stand-in libcuda.so.1 libraries of the tests (driver_*.c) have in common: cuInit,
 * and allocations that hand out addresses from a counter with nothing behind them (cuMemAlloc_v2,
 * cuMemAllocPitch_v2, cuMemFree_v2). Pitched
 * allocations use a 4 KiB pitch alignment, wider than any the interposer expects, to prove that a
 * pitch is charged as the driver chose it. Each stand-in includes this once and adds what makes it
 * differ from a driver.
 */
#ifndef VGPU_STAND_IN_DRIVER_H
#define VGPU_STAND_IN_DRIVER_H

#include "vgpu/cuda_abi.h"

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

/* What a stand-in does in a valid pitched allocation before it allocates; each defines it. */
static void before_pitched_allocation(void);

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                   unsigned int ElementSizeBytes)
{
    (void)ElementSizeBytes;
    if (!pPitch || !WidthInBytes || !Height)
        return CUDA_ERROR_INVALID_VALUE;
    before_pitched_allocation();
    *pPitch = (WidthInBytes + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT;
    return cuMemAlloc_v2(dptr, *pPitch * Height);
}

#endif /* VGPU_STAND_IN_DRIVER_H */
