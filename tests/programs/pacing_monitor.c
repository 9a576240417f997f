/*
 * Watches SM utilisation per process the way an operator's tool does: through NVML's
 * nvmlDeviceGetProcessUtilization (run without the interposer, so it sees the device).
 *
 *   pacing_monitor since SINCE_US
 *       one query: utilisation of each process over [SINCE_US, now] (NVML looks back 1 s at most)
 *   pacing_monitor watch INTERVAL_MS DURATION_MS WINDOW_MS
 *       a query every INTERVAL_MS for DURATION_MS, each over the last WINDOW_MS
 *
 * Prints for each query "q <now_us> <since_us>", then "s <pid> <smUtil>" per process sampled,
 * line-buffered so that a test can read the series while it runs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vgpu/nvml_abi.h"

static unsigned long long realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

static void query(nvmlDevice_t device, unsigned long long since_us)
{
    nvmlProcessUtilizationSample_t samples[256];
    unsigned int count = 256;
    unsigned long long now = realtime_us();
    nvmlReturn_t result = nvmlDeviceGetProcessUtilization(device, samples, &count, since_us);
    if (result == NVML_ERROR_NOT_FOUND) {
        count = 0;
    } else if (result != NVML_SUCCESS) {
        fprintf(stderr, "pacing_monitor: nvmlDeviceGetProcessUtilization: %s\n", nvmlErrorString(result));
        exit(1);
    }
    printf("q %llu %llu\n", now, since_us);
    for (unsigned int i = 0; i < count; i++)
        printf("s %u %u\n", samples[i].pid, samples[i].smUtil);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    nvmlDevice_t device;
    if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(0, &device) != NVML_SUCCESS) {
        fprintf(stderr, "pacing_monitor: NVML has no device 0\n");
        return 1;
    }
    if (argc == 3 && strcmp(argv[1], "since") == 0) {
        query(device, strtoull(argv[2], NULL, 10));
    } else if (argc == 5 && strcmp(argv[1], "watch") == 0) {
        long interval_ms = atol(argv[2]), duration_ms = atol(argv[3]), window_ms = atol(argv[4]);
        struct timespec next;
        clock_gettime(CLOCK_MONOTONIC, &next);
        for (long elapsed = 0; elapsed <= duration_ms; elapsed += interval_ms) {
            query(device, realtime_us() - (unsigned long long)window_ms * 1000ULL);
            next.tv_nsec += interval_ms * 1000000L;
            while (next.tv_nsec >= 1000000000L) {
                next.tv_sec++;
                next.tv_nsec -= 1000000000L;
            }
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        }
    } else {
        fprintf(stderr, "usage: pacing_monitor since SINCE_US | watch INTERVAL_MS DURATION_MS WINDOW_MS\n");
        return 2;
    }
    nvmlShutdown();
    return 0;
}
