/*
 * Times driver calls as a program makes them; run once straight on the driver and once under
 * libvgpu.so, the difference is the interposer's added cost per call.
 *
 *   bench_calls CALL ITERATIONS THREADS     prints "<wall ns per call> <CPU ns per call>"
 *   CALL: launch | alloc_free | mem_get_info | get_proc_address | gated
 *   (gated: cuCtxGetCurrent, an entry point libvgpu.so does not hook: its gate's trampoline)
 *
 * Wall: elapsed time per call as each thread sees it (threads run side by side). CPU: the CPU
 * time of the whole process (every thread: the program's and the interposer's own, such as
 * its limiter's controller) per call made, over the same interval. On a machine whose CPUs are
 * busy with other programs the wall figure counts the time they ran instead; the CPU figure
 * counts only work this process did.
 *
 * Thread t works on device t mod (number of devices), each device in its own context.
 *
 * Works on the simulated GPU and on a real one (the kernel is a real, empty PTX kernel).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/programs/probe_common.h"

#define MAX_THREADS 64

/* One thread's work: the call, how often, and the device's context and kernel. */
struct bench {
    const char *call;
    long iterations;
    CUcontext context;
    CUfunction noop;
};

static void *run(void *arg)
{
    struct bench *b = arg;
    CHECK(cuCtxSetCurrent(b->context));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    if (strcmp(b->call, "launch") == 0) {
        for (long i = 0; i < b->iterations; i++) {
            CHECK(cuLaunchKernel(b->noop, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
            if ((i & 255) == 255)
                CHECK(cuStreamSynchronize(stream));
        }
    } else if (strcmp(b->call, "alloc_free") == 0) {
        for (long i = 0; i < b->iterations; i++) {
            CUdeviceptr p;
            CHECK(cuMemAlloc_v2(&p, 1 << 20));
            CHECK(cuMemFree_v2(p));
        }
    } else if (strcmp(b->call, "mem_get_info") == 0) {
        for (long i = 0; i < b->iterations; i++) {
            size_t free_bytes, total;
            CHECK(cuMemGetInfo_v2(&free_bytes, &total));
        }
    } else if (strcmp(b->call, "get_proc_address") == 0) {
        for (long i = 0; i < b->iterations; i++) {
            void *fn;
            CUdriverProcAddressQueryResult status;
            CHECK(cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, &status));
        }
    } else if (strcmp(b->call, "gated") == 0) {
        for (long i = 0; i < b->iterations; i++) {
            CUcontext current;
            CHECK(cuCtxGetCurrent(&current));
        }
    } else {
        fprintf(stderr, "unknown call %s\n", b->call);
        exit(2);
    }
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuStreamDestroy_v2(stream));
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s CALL ITERATIONS THREADS\n", argv[0]);
        return 2;
    }
    long iterations = atol(argv[2]);
    int threads = atoi(argv[3]);
    if (iterations <= 0 || threads < 1 || threads > MAX_THREADS) {
        fprintf(stderr, "ITERATIONS must be > 0 and THREADS 1..%d\n", MAX_THREADS);
        return 2;
    }
    int devices;
    CHECK(cuInit(0));
    CHECK(cuDeviceGetCount(&devices));
    struct bench work[MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        work[t] = (struct bench){.call = argv[1], .iterations = iterations};
        if (t >= devices) {
            work[t].context = work[t % devices].context;
            work[t].noop = work[t % devices].noop;
            continue;
        }
        work[t].context = require_primary_context(t);
        work[t].noop = load_noop();
    }

    /* Warm up: first calls resolve symbols and attach the region. */
    struct bench warm = work[0];
    warm.iterations = iterations / 10 + 1;
    run(&warm);

    pthread_t ids[MAX_THREADS];
    struct timespec cpu_start, cpu_end;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_start);
    long long start = now_ns();
    for (int t = 0; t < threads; t++)
        pthread_create(&ids[t], NULL, run, &work[t]);
    for (int t = 0; t < threads; t++)
        pthread_join(ids[t], NULL);
    double elapsed = (double)(now_ns() - start);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_end);
    double cpu = (double)(cpu_end.tv_sec - cpu_start.tv_sec) * 1e9 + (double)(cpu_end.tv_nsec - cpu_start.tv_nsec);
    printf("%.2f %.2f\n", elapsed / iterations, cpu / ((double)iterations * threads));
    return 0;
}
