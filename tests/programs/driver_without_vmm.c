/*
 * A tiny stand-in libcuda.so.1 that lacks the VMM entry points (cuMemCreate, cuMemRelease),
 * as an older driver does. Built as a shared library (soname libcuda.so.1) by the tests, to
 * prove that libvgpu.so reports a hooked name the driver lacks as missing on every path. Its
 * pitched allocations use a 4 KiB pitch alignment, wider than any the interposer expects, to
 * prove that a pitch is charged as the driver chose it.
 */
#include <stdint.h>
#include <string.h>

#include "stand_in_driver.h"

/* Nothing to do first: what sets this stand-in apart is what it does not export. */
static void before_pitched_allocation(void)
{
}

/* By base name, as the real driver: the newest variant of each. */
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *symbolStatus)
{
    (void)cudaVersion;
    (void)flags;
    static const struct {
        const char *base;
        void *entry;
    } table[] = {
        {"cuInit", (void *)cuInit},
        {"cuMemAlloc", (void *)cuMemAlloc_v2},
        {"cuMemFree", (void *)cuMemFree_v2},
        {"cuGetProcAddress", (void *)cuGetProcAddress_v2},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].base, symbol) == 0) {
            *pfn = table[i].entry;
            if (symbolStatus)
                *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
    *pfn = NULL;
    if (symbolStatus)
        *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}
