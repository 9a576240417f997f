/*
 * A GPU load for the pacing tests: launches kernels in a loop for a while, as a training loop
 * does, keeping the device fed (up to --inflight batches queued: record an event after each
 * batch, wait for the oldest) so that without a limiter the device stays busy even when this
 * process waits a few milliseconds for a CPU.
 *
 *   pacing_load [--seconds S] [--threads T] [--batch K] [--inflight N] [--grid-per-sm G]
 *               [--block B] [--graph | --mixed-ms M | --update-ms M] [--instantiate flags|params|v2]
 *               [--busy-ms X --idle-ms Y] [--buffer-mib N]
 *
 *   --graph     capture the K launches of a batch into a CUDA graph once, then launch the graph
 *   --mixed-ms  alternate every M ms between launching that graph and launching the K kernels
 *   --update-ms launch that graph, and every M ms re-capture the batch with the other of two grids
 *               (G blocks per SM, then half as many: half the work per kernel) and apply it to the
 *               graph's executable with cuGraphExecUpdate_v2 instead of instantiating it again
 *   --instantiate  the entry point that makes the graph's executable: cuGraphInstantiateWithFlags
 *               (flags, the default), cuGraphInstantiateWithParams (params) or cuGraphInstantiate_v2
 *               (v2, what CUDA 11 runtimes call)
 *   --busy-ms/--idle-ms   alternate busy and idle phases instead of running flat out; phases and
 *               --seconds count from the first launch (start_us), so a reader of start_us knows
 *               when each busy phase begins
 *   --buffer-mib  hold N MiB of device memory (cuMemAlloc_v2 before the first launch), as a
 *               framework holds its weights
 *
 * Prints (line-buffered): "pid <pid>", then "start_us <CLOCK_REALTIME us>" just before the
 * first launch, then "done launches=<kernels launched>" at the end.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vgpu/cuda_abi.h"

static const char SPIN_PTX[] = ".version 7.0\n.target sm_50\n.address_size 64\n"
                               ".visible .entry spin()\n{\n\tret;\n}\n";

struct options {
    double seconds;
    int threads;
    int batch;
    int inflight;
    unsigned int grid_per_sm;
    unsigned int block;
    int graph;
    double mixed_ms;
    double update_ms;
    enum { INSTANTIATE_FLAGS, INSTANTIATE_PARAMS, INSTANTIATE_V2 } instantiate;
    double busy_ms, idle_ms;
    size_t buffer_mib;
};

struct shared {
    struct options options;
    CUcontext context;
    CUfunction spin;
    unsigned int grid;
    double started; /* CLOCK_MONOTONIC seconds of the first launch: phases count from it */
    atomic_int announced; /* 0, 1 while the first thread to launch sets `started`, then 2 */
    atomic_long launches;
};

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "pacing_load: %s failed: %d\n", #call, r_);                            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The first thread to get here sets the clock every thread's phases follow and prints it;
 * the others wait for it (a few microseconds, once). */
static void announce_start(struct shared *s)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&s->announced, &expected, 1)) {
        struct timespec ts;
        s->started = monotonic_s();
        clock_gettime(CLOCK_REALTIME, &ts);
        printf("start_us %lld\n", (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000);
        fflush(stdout);
        atomic_store(&s->announced, 2);
    }
    while (atomic_load(&s->announced) != 2)
        sched_yield();
}

static void launch_batch(struct shared *s, CUstream stream, CUgraphExec exec)
{
    if (exec) {
        CHECK(cuGraphLaunch(exec, stream));
    } else {
        for (int k = 0; k < s->options.batch; k++)
            CHECK(cuLaunchKernel(s->spin, s->grid, 1, 1, s->options.block, 1, 1, 0, stream, NULL, NULL));
    }
    atomic_fetch_add(&s->launches, s->options.batch);
}

/* The K launches of a batch, of `grid` blocks each, captured into a graph on `stream`. */
static CUgraph capture_batch(const struct shared *s, CUstream stream, unsigned int grid)
{
    CUgraph graph;
    CHECK(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int k = 0; k < s->options.batch; k++)
        CHECK(cuLaunchKernel(s->spin, grid, 1, 1, s->options.block, 1, 1, 0, stream, NULL, NULL));
    CHECK(cuStreamEndCapture(stream, &graph));
    return graph;
}

static CUgraphExec instantiate(const struct options *o, CUgraph graph)
{
    CUgraphExec exec;
    switch (o->instantiate) {
    case INSTANTIATE_PARAMS: {
        CUDA_GRAPH_INSTANTIATE_PARAMS params = {.flags = 0};
        CHECK(cuGraphInstantiateWithParams(&exec, graph, &params));
        break;
    }
    case INSTANTIATE_V2:
        CHECK(cuGraphInstantiate_v2(&exec, graph, NULL, NULL, 0));
        break;
    default:
        CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
        break;
    }
    return exec;
}

/* Gives `exec` the batch re-captured with `grid` blocks per kernel, in place, as a training loop
 * whose shapes change updates its graph; returns the new graph, the old one destroyed. */
static CUgraph update_batch(const struct shared *s, CUstream stream, CUgraphExec exec, CUgraph old, unsigned int grid)
{
    CUgraph graph = capture_batch(s, stream, grid);
    CUgraphExecUpdateResultInfo info;
    CHECK(cuGraphExecUpdate_v2(exec, graph, &info));
    CHECK(cuGraphDestroy(old));
    return graph;
}

/* Whether the busy/idle pattern is in an idle phase at `elapsed` seconds; sleeps through it. */
static void sit_out_idle_phase(const struct options *o, double elapsed)
{
    if (o->idle_ms <= 0)
        return;
    double cycle = (o->busy_ms + o->idle_ms) / 1e3;
    double into = elapsed - cycle * (long)(elapsed / cycle);
    if (into < o->busy_ms / 1e3)
        return;
    double rest = cycle - into;
    struct timespec ts = {(time_t)rest, (long)((rest - (time_t)rest) * 1e9)};
    nanosleep(&ts, NULL);
}

static void *run(void *arg)
{
    struct shared *s = arg;
    const struct options *o = &s->options;
    CHECK(cuCtxSetCurrent(s->context));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    enum { MAX_INFLIGHT = 64 };
    CUevent events[MAX_INFLIGHT];
    const int ring = o->inflight;
    for (int i = 0; i < ring; i++)
        CHECK(cuEventCreate(&events[i], CU_EVENT_DISABLE_TIMING));
    CUgraphExec exec = NULL;
    CUgraph graph = NULL;
    if (o->graph || o->mixed_ms > 0 || o->update_ms > 0) {
        graph = capture_batch(s, stream, s->grid);
        exec = instantiate(o, graph);
    }
    long update_phase = 0;
    announce_start(s);
    for (long i = 0;; i++) {
        double elapsed = monotonic_s() - s->started;
        if (elapsed >= o->seconds)
            break;
        sit_out_idle_phase(o, elapsed);
        long phase = o->update_ms > 0 ? (long)(elapsed * 1e3 / o->update_ms) : 0;
        if (phase != update_phase) {
            update_phase = phase;
            graph = update_batch(s, stream, exec, graph, phase % 2 ? (s->grid + 1) / 2 : s->grid);
        }
        int graph_phase = o->mixed_ms <= 0 || (long)(elapsed * 1e3 / o->mixed_ms) % 2 == 0;
        launch_batch(s, stream, graph_phase ? exec : NULL);
        CHECK(cuEventRecord(events[i % ring], stream));
        if (i >= ring - 1)
            CHECK(cuEventSynchronize(events[(i + 1) % ring])); /* the oldest batch in flight */
    }
    CHECK(cuStreamSynchronize(stream));
    if (exec) {
        CHECK(cuGraphExecDestroy(exec));
        CHECK(cuGraphDestroy(graph));
    }
    for (int i = 0; i < ring; i++)
        CHECK(cuEventDestroy_v2(events[i]));
    CHECK(cuStreamDestroy_v2(stream));
    return NULL;
}

static int parse_instantiate(const char *value)
{
    static const char *const names[] = {[INSTANTIATE_FLAGS] = "flags", [INSTANTIATE_PARAMS] = "params",
                                        [INSTANTIATE_V2] = "v2"};
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (strcmp(value, names[i]) == 0)
            return i;
    fprintf(stderr, "pacing_load: --instantiate takes flags, params or v2\n");
    exit(2);
}

static void parse(int argc, char **argv, struct options *o)
{
    *o = (struct options){.seconds = 3.0, .threads = 1, .batch = 4, .inflight = 8, .grid_per_sm = 16, .block = 256};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(flag, "--graph") == 0) {
            o->graph = 1;
            continue;
        }
        if (!value) {
            fprintf(stderr, "pacing_load: %s needs a value\n", flag);
            exit(2);
        }
        i++;
        if (strcmp(flag, "--seconds") == 0)
            o->seconds = atof(value);
        else if (strcmp(flag, "--threads") == 0)
            o->threads = atoi(value);
        else if (strcmp(flag, "--batch") == 0)
            o->batch = atoi(value);
        else if (strcmp(flag, "--inflight") == 0)
            o->inflight = atoi(value);
        else if (strcmp(flag, "--grid-per-sm") == 0)
            o->grid_per_sm = (unsigned int)atoi(value);
        else if (strcmp(flag, "--block") == 0)
            o->block = (unsigned int)atoi(value);
        else if (strcmp(flag, "--mixed-ms") == 0)
            o->mixed_ms = atof(value);
        else if (strcmp(flag, "--update-ms") == 0)
            o->update_ms = atof(value);
        else if (strcmp(flag, "--instantiate") == 0)
            o->instantiate = parse_instantiate(value);
        else if (strcmp(flag, "--busy-ms") == 0)
            o->busy_ms = atof(value);
        else if (strcmp(flag, "--idle-ms") == 0)
            o->idle_ms = atof(value);
        else if (strcmp(flag, "--buffer-mib") == 0)
            o->buffer_mib = (size_t)atol(value);
        else {
            fprintf(stderr, "pacing_load: unknown option %s\n", flag);
            exit(2);
        }
    }
    if (o->threads < 1 || o->threads > 64 || o->batch < 1 || o->inflight < 2 || o->inflight > 64) {
        fprintf(stderr, "pacing_load: bad --threads, --batch or --inflight\n");
        exit(2);
    }
}

int main(int argc, char **argv)
{
    static struct shared s;
    parse(argc, argv, &s.options);
    printf("pid %d\n", (int)getpid());
    fflush(stdout);

    CUdevice device;
    CUmodule module;
    int sms;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device));
    CHECK(cuDevicePrimaryCtxRetain(&s.context, device));
    CHECK(cuCtxSetCurrent(s.context));
    CHECK(cuModuleLoadData(&module, SPIN_PTX));
    CHECK(cuModuleGetFunction(&s.spin, module, "spin"));
    s.grid = s.options.grid_per_sm * (unsigned int)sms;
    CUdeviceptr buffer = 0;
    if (s.options.buffer_mib)
        CHECK(cuMemAlloc_v2(&buffer, s.options.buffer_mib << 20));

    pthread_t threads[64];
    for (int t = 0; t < s.options.threads; t++)
        pthread_create(&threads[t], NULL, run, &s);
    for (int t = 0; t < s.options.threads; t++)
        pthread_join(threads[t], NULL);
    if (buffer)
        CHECK(cuMemFree_v2(buffer));
    printf("done launches=%ld\n", atomic_load(&s.launches));
    fflush(stdout);
    return 0;
}
