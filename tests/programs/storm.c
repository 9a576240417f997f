/*
 * Many threads allocating and freeing at random, across allocation families, to prove the
 * slice's accounting exact under contention.
 *
 *   storm THREADS ITERATIONS SEED MAX_CHUNKS
 *
 * Each thread repeats ITERATIONS times: allocate (1..MAX_CHUNKS) x 2 MiB with cuMemAlloc_v2,
 * cuMemAllocAsync or cuMemCreate, or free one of its live allocations, at random. A refusal
 * (CUDA_ERROR_OUT_OF_MEMORY) is counted, anything else unexpected exits 1. At the end the
 * program trims the default pool (what cuMemFreeAsync left reserved in it goes back), prints
 * "held BYTES REFUSALS GRANTS" (what its threads still hold), then "ready", and
 * waits for a line on stdin before exiting (holding the memory until then).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "probe_common.h"

#define CHUNK (2ULL << 20)
#define MAX_HELD 32

enum family { F_ALLOC, F_ASYNC, F_VMM, F_COUNT };

struct allocation {
    enum family family;
    unsigned long long handle;
    unsigned long long bytes;
};

struct worker {
    pthread_t thread;
    CUcontext context;
    unsigned int seed;
    long iterations;
    unsigned int max_chunks;
    struct allocation held[MAX_HELD];
    int held_count;
    unsigned long long held_bytes;
    long refusals, grants;
};

static void fail(const char *what, CUresult result)
{
    fprintf(stderr, "storm: %s failed: %d\n", what, result);
    exit(1);
}

static CUresult allocate(enum family family, unsigned long long bytes, unsigned long long *handle)
{
    switch (family) {
    case F_ALLOC: return cuMemAlloc_v2((CUdeviceptr *)handle, bytes);
    case F_ASYNC: return cuMemAllocAsync((CUdeviceptr *)handle, bytes, NULL);
    default: {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        return cuMemCreate((CUmemGenericAllocationHandle *)handle, bytes, &prop, 0);
    }
    }
}

static CUresult release(const struct allocation *a)
{
    switch (a->family) {
    case F_ALLOC: return cuMemFree_v2(a->handle);
    case F_ASYNC: return cuMemFreeAsync(a->handle, NULL);
    default: return cuMemRelease(a->handle);
    }
}

static void *work(void *arg)
{
    struct worker *w = arg;
    CUresult result = cuCtxSetCurrent(w->context);
    if (result != CUDA_SUCCESS)
        fail("cuCtxSetCurrent", result);
    for (long i = 0; i < w->iterations; i++) {
        int grow = w->held_count == 0 || (w->held_count < MAX_HELD && rand_r(&w->seed) % 2);
        if (grow) {
            struct allocation a = {.family = (enum family)(rand_r(&w->seed) % F_COUNT),
                                   .bytes = (1 + rand_r(&w->seed) % w->max_chunks) * CHUNK};
            result = allocate(a.family, a.bytes, &a.handle);
            if (result == CUDA_ERROR_OUT_OF_MEMORY) {
                w->refusals++;
            } else if (result != CUDA_SUCCESS) {
                fail("allocation", result);
            } else {
                w->grants++;
                w->held[w->held_count++] = a;
                w->held_bytes += a.bytes;
            }
        } else {
            int index = rand_r(&w->seed) % w->held_count;
            struct allocation a = w->held[index];
            w->held[index] = w->held[--w->held_count];
            result = release(&a);
            if (result != CUDA_SUCCESS)
                fail("free", result);
            w->held_bytes -= a.bytes;
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: storm THREADS ITERATIONS SEED MAX_CHUNKS\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    long iterations = atol(argv[2]);
    unsigned int seed = (unsigned int)strtoul(argv[3], NULL, 10);
    unsigned int max_chunks = (unsigned int)strtoul(argv[4], NULL, 10);
    if (threads < 1 || threads > 256 || max_chunks < 1)
        return 2;
    CUcontext context;
    CUresult result = use_primary_context(0, &context);
    if (result != CUDA_SUCCESS)
        fail("context set-up", result);
    struct worker *workers = calloc((size_t)threads, sizeof *workers);
    for (int t = 0; t < threads; t++) {
        workers[t] = (struct worker){.context = context, .seed = seed * 7919u + (unsigned)t,
                                     .iterations = iterations, .max_chunks = max_chunks};
        if (pthread_create(&workers[t].thread, NULL, work, &workers[t]) != 0)
            fail("pthread_create", CUDA_ERROR_UNKNOWN);
    }
    unsigned long long held = 0;
    long refusals = 0, grants = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(workers[t].thread, NULL);
        held += workers[t].held_bytes;
        refusals += workers[t].refusals;
        grants += workers[t].grants;
    }
    CUmemoryPool pool;
    CUresult trimmed = cuDeviceGetDefaultMemPool(&pool, 0);
    if (trimmed == CUDA_SUCCESS)
        trimmed = cuMemPoolTrimTo(pool, 0);
    if (trimmed != CUDA_SUCCESS)
        fail("cuMemPoolTrimTo", trimmed);
    printf("held %llu %ld %ld\nready\n", held, refusals, grants);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 0;
    return 0;
}
