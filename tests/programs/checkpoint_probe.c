/*
 * The two sides of the driver's checkpoint API as separate processes (tests/sim/test_sim_checkpoint.py,
 * tests/holders/test_checkpoint.py). Prints "key value" lines, line-buffered, so a test can wait
 * for each.
 *
 *   checkpoint_probe target BYTES   cuInit, allocate BYTES, write a pattern into them with
 *                                   cuMemcpyHtoD, print "ready PTR", then obey stdin lines:
 *       verify         read the allocation back (cuMemcpyDtoH): "intact 1" if the pattern is there
 *       call           from another thread (one with the target's context current): print
 *                      "call-thread TID", call cuMemGetInfo_v2, then print "call-returned RESULT"
 *       busy MS        queue one kernel that keeps the device busy for about MS ms: "queued"
 *       alloc BYTES    cuMemAlloc_v2: "alloc RESULT"
 *       managed BYTES  cuMemAllocManaged: "managed RESULT"
 *       ping           "pong" (no CUDA call: the program's own threads run while it is locked)
 *       pooled BYTES   the default pool set to keep what is freed into it (release threshold:
 *                      all), BYTES allocated from it (cuMemAllocAsync) and freed (cuMemFreeAsync),
 *                      then a synchronisation: the pool keeps them reserved; "pooled RESULT"
 *     and exits when stdin closes.
 *   checkpoint_probe [--no-init] control OPERATION PID [TIMEOUT_MS]
 *                                   one call on process PID: "result N", then "state S" (its
 *                                   state afterwards); OPERATION is state, tid, lock,
 *                                   checkpoint, restore or unlock; --no-init skips cuInit.
 *                                   "tid" also prints "tid N".
 */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "probe_common.h"

static CUcontext target_context;
static CUdeviceptr target_memory;
static size_t target_bytes;

static unsigned char pattern_byte(size_t i)
{
    return (unsigned char)(i * 131 + (i >> 12) * 7 + 3);
}

/* A thread with the target's context current, making one cuMemGetInfo_v2 (a hooked call) per
 * "call" command. It makes the context current before the target says "ready" (caller_ready):
 * made later, that call itself could come after a test locked the process, and block there. */
static sem_t call_wanted, caller_ready;

static void *caller(void *argument)
{
    (void)argument;
    CHECK(cuCtxSetCurrent(target_context));
    sem_post(&caller_ready);
    for (;;) {
        while (sem_wait(&call_wanted) != 0) {
        }
        printf("call-thread %ld\n", (long)syscall(SYS_gettid));
        size_t free_bytes, total;
        printf("call-returned %d\n", cuMemGetInfo_v2(&free_bytes, &total));
    }
    return NULL;
}

static int command_target(const char *size)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    target_context = require_primary_context(0);
    CUfunction noop = load_noop();
    target_bytes = parse_bytes(size);
    CHECK(cuMemAlloc_v2(&target_memory, target_bytes));
    unsigned char *host = malloc(target_bytes);
    if (!host)
        return 4;
    for (size_t i = 0; i < target_bytes; i++)
        host[i] = pattern_byte(i);
    CHECK(cuMemcpyHtoD_v2(target_memory, host, target_bytes));
    pthread_t thread;
    sem_init(&call_wanted, 0, 0);
    sem_init(&caller_ready, 0, 0);
    pthread_create(&thread, NULL, caller, NULL);
    while (sem_wait(&caller_ready) != 0) {
    }
    printf("ready %llu\n", (unsigned long long)target_memory);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "verify", 6) == 0) {
            memset(host, 0, target_bytes);
            CUresult result = cuMemcpyDtoH_v2(host, target_memory, target_bytes);
            int intact = result == CUDA_SUCCESS;
            for (size_t i = 0; intact && i < target_bytes; i++)
                intact = host[i] == pattern_byte(i);
            printf("intact %d\n", intact);
        } else if (strncmp(line, "call", 4) == 0) {
            sem_post(&call_wanted);
        } else if (strncmp(line, "busy ", 5) == 0) {
            /* 256 threads a block: 8 blocks an SM, so every 8 * SMs blocks are one
             * wave of block_ns. */
            int sms;
            CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
            long long ms = atoll(line + 5), block_ns = 10000; /* the default device's */
            unsigned long long blocks = (unsigned long long)(ms * 1000000 / block_ns) * 8 * (unsigned)sms;
            CHECK(cuLaunchKernel(noop, (unsigned)blocks, 1, 1, 256, 1, 1, 0, NULL, NULL, NULL));
            printf("queued\n");
        } else if (strncmp(line, "alloc ", 6) == 0) {
            CUdeviceptr extra;
            printf("alloc %d\n", cuMemAlloc_v2(&extra, parse_bytes(line + 6)));
        } else if (strncmp(line, "managed ", 8) == 0) {
            CUdeviceptr managed;
            printf("managed %d\n", cuMemAllocManaged(&managed, parse_bytes(line + 8), 1 /* CU_MEM_ATTACH_GLOBAL */));
        } else if (strncmp(line, "pooled ", 7) == 0) {
            CUmemoryPool pool;
            cuuint64_t keep_all = ~0ull;
            CUdeviceptr freed;
            CUresult result = cuDeviceGetDefaultMemPool(&pool, 0);
            if (result == CUDA_SUCCESS)
                result = cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all);
            if (result == CUDA_SUCCESS)
                result = cuMemAllocAsync(&freed, parse_bytes(line + 7), NULL);
            if (result == CUDA_SUCCESS)
                result = cuMemFreeAsync(freed, NULL);
            if (result == CUDA_SUCCESS)
                result = cuCtxSynchronize();
            printf("pooled %d\n", result);
        } else if (strncmp(line, "ping", 4) == 0) {
            printf("pong\n");
        }
    }
    return 0;
}

static int command_control(int initialise, const char *operation, int pid, unsigned int timeout_ms)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (initialise)
        CHECK(cuInit(0));
    CUresult result;
    if (strcmp(operation, "state") == 0) {
        CUprocessState state;
        result = cuCheckpointProcessGetState(pid, &state);
    } else if (strcmp(operation, "tid") == 0) {
        int tid = 0;
        result = cuCheckpointProcessGetRestoreThreadId(pid, &tid);
        printf("tid %d\n", tid);
    } else if (strcmp(operation, "lock") == 0) {
        CUcheckpointLockArgs args;
        memset(&args, 0, sizeof args);
        args.timeoutMs = timeout_ms;
        result = cuCheckpointProcessLock(pid, &args);
    } else if (strcmp(operation, "checkpoint") == 0) {
        result = cuCheckpointProcessCheckpoint(pid, NULL);
    } else if (strcmp(operation, "restore") == 0) {
        result = cuCheckpointProcessRestore(pid, NULL);
    } else if (strcmp(operation, "unlock") == 0) {
        result = cuCheckpointProcessUnlock(pid, NULL);
    } else {
        fprintf(stderr, "unknown operation %s\n", operation);
        return 2;
    }
    printf("result %d\n", result);
    CUprocessState state;
    if (cuCheckpointProcessGetState(pid, &state) == CUDA_SUCCESS)
        printf("state %d\n", state);
    else
        printf("state none\n");
    return 0;
}

int main(int argc, char **argv)
{
    int first = 1, initialise = 1;
    if (argc > 1 && strcmp(argv[1], "--no-init") == 0) {
        initialise = 0;
        first = 2;
    }
    if (argc > first + 1 && strcmp(argv[first], "target") == 0)
        return command_target(argv[first + 1]);
    if (argc > first + 2 && strcmp(argv[first], "control") == 0)
        return command_control(initialise, argv[first + 1], atoi(argv[first + 2]),
                               argc > first + 3 ? (unsigned)atoi(argv[first + 3]) : 0);
    fprintf(stderr, "usage: checkpoint_probe target BYTES | checkpoint_probe "
                    "[--no-init] control OP PID [TIMEOUT_MS]\n");
    return 2;
}
