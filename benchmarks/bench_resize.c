/*
 * Resize latency: polls cuMemGetInfo_v2 and prints "<CLOCK_MONOTONIC ns> <total>" each time the
 * total it sees changes; the parent publishes new limits and reads when they were seen.
 * Exits when the total equals argv[1].
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "vgpu/cuda_abi.h"

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    size_t stop_total = strtoull(argv[1], NULL, 10), last = 0;
    CUdevice device;
    CUcontext context;
    if (cuInit(0) || cuDeviceGet(&device, 0) || cuDevicePrimaryCtxRetain(&context, device) ||
        cuCtxSetCurrent(context))
        return 1;
    for (;;) {
        size_t free_bytes, total;
        if (cuMemGetInfo_v2(&free_bytes, &total) != CUDA_SUCCESS)
            return 1;
        if (total != last) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            printf("%lld %zu\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, total);
            fflush(stdout);
            last = total;
            if (total == stop_total)
                return 0;
        }
    }
}
