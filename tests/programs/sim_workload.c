/*
 * Workloads for the multi-process tests of the simulated GPU. Each prints "key value" lines
 * (line-buffered, so a test can wait for one):
 *
 *   sim_workload hold BYTES...                 allocate each size, print "alloc SIZE RESULT", then
 *                                              print "ready" and hold everything until stdin closes
 *   sim_workload busy SECONDS GRID BLOCK       launch kernels back to back for SECONDS
 *   sim_workload duty SECONDS PERIOD_NS GRID BLOCK
 *                                              launch one kernel at the start of every period
 *                                              (both print "done" once their kernels have ended,
 *                                              then keep their context until stdin closes)
 *   sim_workload serial COUNT START_AT_NS GRID BLOCK
 *                                              at START_AT_NS (CLOCK_MONOTONIC) launch COUNT kernels
 *                                              on one stream, then report their span
 *   sim_workload race START_AT_NS BYTES COUNT  at START_AT_NS, allocate BYTES COUNT times as fast as
 *                                              possible; print "granted N", then hold until stdin closes
 *   sim_workload churn                         allocate, copy, launch and free in a loop forever
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "probe_common.h"

static void sleep_until(long long deadline)
{
    struct timespec until = {deadline / 1000000000LL, deadline % 1000000000LL};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) != 0) {
    }
}

static CUfunction setup(void)
{
    require_primary_context(0);
    return load_noop();
}

static void wait_for_stdin_to_close(void)
{
    char buffer[64];
    while (read(0, buffer, sizeof buffer) > 0) {
    }
}

/* How busy and duty end: "done" once their kernels have ended, holding the context until stdin
 * closes. */
static int finish(void)
{
    CHECK(cuCtxSynchronize());
    printf("done %lld\n", now_ns());
    wait_for_stdin_to_close();
    return 0;
}

static int hold(int count, char **sizes)
{
    setup();
    for (int i = 0; i < count; i++) {
        CUdeviceptr p;
        unsigned long long bytes = strtoull(sizes[i], NULL, 10);
        printf("alloc %llu %d\n", bytes, cuMemAlloc_v2(&p, bytes));
    }
    printf("ready\n");
    wait_for_stdin_to_close();
    return 0;
}

static int busy(double seconds, unsigned int grid, unsigned int block)
{
    CUfunction f = setup();
    long long end = now_ns() + (long long)(seconds * 1e9);
    CHECK(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, NULL, NULL, NULL));
    printf("started %lld\n", now_ns());
    /* The push buffer keeps this loop from queuing more than 1024 kernels ahead. */
    while (now_ns() < end)
        CHECK(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, NULL, NULL, NULL));
    return finish();
}

static int duty(double seconds, long long period, unsigned int grid, unsigned int block)
{
    CUfunction f = setup();
    long long start = now_ns();
    long periods = (long)(seconds * 1e9 / (double)period);
    printf("started %lld\n", start);
    for (long k = 0; k < periods; k++) {
        sleep_until(start + k * period);
        CHECK(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, NULL, NULL, NULL));
    }
    return finish();
}

static int serial(long count, long long start_at, unsigned int grid, unsigned int block)
{
    CUfunction f = setup();
    struct timed_stream timed = new_timed_stream(0);
    printf("waiting\n");
    sleep_until(start_at);
    long long begin = now_ns();
    CHECK(cuEventRecord(timed.before, timed.stream));
    for (long i = 0; i < count; i++)
        CHECK(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, timed.stream, NULL, NULL));
    CHECK(cuEventRecord(timed.after, timed.stream));
    CHECK(cuEventSynchronize(timed.after));
    long long end = now_ns();
    float ms;
    CHECK(cuEventElapsedTime(&ms, timed.before, timed.after));
    printf("begin_ns %lld\nend_ns %lld\nelapsed_ns %.0f\n", begin, end, (double)ms * 1e6);
    return 0;
}

static int race(long long start_at, unsigned long long bytes, int count)
{
    setup();
    printf("waiting\n");
    sleep_until(start_at);
    int granted = 0;
    for (int i = 0; i < count; i++) {
        CUdeviceptr p;
        granted += cuMemAlloc_v2(&p, bytes) == CUDA_SUCCESS;
    }
    printf("granted %d\n", granted);
    wait_for_stdin_to_close();
    return 0;
}

static int churn(void)
{
    CUfunction f = setup();
    CUdeviceptr held[8] = {0};
    unsigned int seed = (unsigned int)getpid();
    for (long i = 0;; i++) {
        int slot = rand_r(&seed) % 8;
        if (held[slot]) {
            CHECK(cuMemFree_v2(held[slot]));
            held[slot] = 0;
        }
        size_t bytes = ((size_t)rand_r(&seed) % 64 + 1) << 20;
        if (cuMemAlloc_v2(&held[slot], bytes) == CUDA_SUCCESS)
            CHECK(cuMemsetD8_v2(held[slot], 1, 64));
        else
            held[slot] = 0;
        CHECK(cuLaunchKernel(f, 8, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL));
        if (i == 100)
            printf("running\n");
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && strcmp(argv[1], "hold") == 0)
        return hold(argc - 2, argv + 2);
    if (argc == 5 && strcmp(argv[1], "busy") == 0)
        return busy(atof(argv[2]), (unsigned)atoi(argv[3]), (unsigned)atoi(argv[4]));
    if (argc == 6 && strcmp(argv[1], "duty") == 0)
        return duty(atof(argv[2]), atoll(argv[3]), (unsigned)atoi(argv[4]), (unsigned)atoi(argv[5]));
    if (argc == 6 && strcmp(argv[1], "serial") == 0)
        return serial(atol(argv[2]), atoll(argv[3]), (unsigned)atoi(argv[4]), (unsigned)atoi(argv[5]));
    if (argc == 5 && strcmp(argv[1], "race") == 0)
        return race(atoll(argv[2]), strtoull(argv[3], NULL, 10), atoi(argv[4]));
    if (argc == 2 && strcmp(argv[1], "churn") == 0)
        return churn();
    fprintf(stderr, "usage: see the comment at the top of sim_workload.c\n");
    return 2;
}
