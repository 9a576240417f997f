/*
 * Streams, events, modules, launches and graphs: the program-facing side of the execution
 * engine (common/engine.c). A launch validates like the driver, prices the grid
 * (sim_kernel_cost), then takes its interval on the device timeline; nothing runs on the host.
 * Times a program can observe (events, synchronisation, queries) come from that timeline.
 *
 * The launch path takes no lock and makes no system call except clock_gettime (vDSO): the
 * stream's counters and the device timeline are atomics. It only sleeps when the stream already
 * holds SIM_PUSH_BUFFER queued launches, as a launch blocks on a full push buffer on a GPU, so a
 * launch loop cannot queue unbounded future work.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_sim.h"

/* ---- streams ------------------------------------------------------------------------------ */

struct CUstream_st *sim_stream_new(struct CUctx_st *ctx, unsigned int flags)
{
    struct CUstream_st *stream = sim_cuda.free_streams;
    if (stream)
        sim_cuda.free_streams = stream->next;
    else if (!(stream = malloc(sizeof *stream)))
        return NULL;
    memset(stream, 0, sizeof *stream);
    stream->magic = SIM_STREAM_MAGIC;
    stream->flags = flags;
    stream->ctx = ctx;
    return stream;
}

/* Frees a graph (lock held): its registration, nodes and memory. Its allocation nodes' memory
 * lives on while an executable or the graph memory pool holds it (graph_memory.c). */
static void free_graph(struct CUgraph_st *graph)
{
    sim_map_take(&sim_cuda.handles, (uintptr_t)graph, NULL);
    if (graph->exec)
        graph->exec->graph = NULL;
    for (size_t i = 0; i < graph->count; i++) {
        if (graph->nodes[i]->block)
            sim_graph_block_release(graph->nodes[i]->block);
        graph->nodes[i]->magic = SIM_DEAD_MAGIC;
        free(graph->nodes[i]);
    }
    free(graph->nodes);
    free(graph);
}

/* Appends a node to a graph (lock held); 0 when out of memory. */
static int add_node(struct CUgraph_st *graph, struct CUgraphNode_st *node)
{
    if (graph->count == graph->capacity) {
        size_t capacity = graph->capacity ? graph->capacity * 2 : 16;
        struct CUgraphNode_st **nodes = realloc(graph->nodes, capacity * sizeof *nodes);
        if (nodes) {
            graph->nodes = nodes;
            graph->capacity = capacity;
        }
    }
    int stored = graph->count < graph->capacity;
    if (stored)
        graph->nodes[graph->count++] = node;
    return stored;
}

/* Streams are recycled, never freed: a handle used after destroy finds a dead magic (or a
 * newer stream), not freed memory. */
void sim_stream_retire(struct CUstream_st *stream)
{
    if (stream->capture)
        free_graph(stream->capture);
    stream->capture = NULL;
    stream->magic = SIM_DEAD_MAGIC;
    stream->next = sim_cuda.free_streams;
    sim_cuda.free_streams = stream;
}

CUresult sim_stream_resolve(CUstream handle, struct CUstream_st **stream)
{
    CUresult result = sim_ready();
    if (__builtin_expect(result != CUDA_SUCCESS, 0))
        return result;
    if (handle == NULL || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
        /* The per-thread default stream behaves as the legacy one: the device is serial anyway. */
        struct CUctx_st *ctx = sim_current();
        if (!ctx || !atomic_load_explicit(&ctx->active, memory_order_relaxed))
            return CUDA_ERROR_INVALID_CONTEXT;
        *stream = ctx->null_stream;
        return CUDA_SUCCESS;
    }
    if (handle->magic != SIM_STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!atomic_load_explicit(&handle->ctx->active, memory_order_relaxed))
        return CUDA_ERROR_INVALID_CONTEXT;
    *stream = handle;
    return CUDA_SUCCESS;
}

uint64_t sim_context_tail(struct CUctx_st *ctx)
{
    pthread_mutex_lock(&sim_cuda.lock);
    uint64_t tail = ctx->null_stream ? atomic_load(&ctx->null_stream->tail_ns) : 0;
    for (struct CUstream_st *stream = ctx->streams; stream; stream = stream->next) {
        uint64_t end = atomic_load(&stream->tail_ns);
        tail = end > tail ? end : tail;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return tail;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    return cuStreamCreateWithPriority(phStream, Flags, 0);
}

/* A priority outside the device's range is clamped to it, as the driver does. Priorities order
 * nothing here: the simulated device runs one kernel at a time in submission order. */
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int Flags, int priority)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, phStream && !(Flags & ~(unsigned int)CU_STREAM_NON_BLOCKING));
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&sim_cuda.lock);
    struct CUstream_st *stream = sim_stream_new(ctx, Flags);
    if (stream) {
        stream->priority = priority > 0                              ? 0
                           : priority < SIM_STREAM_GREATEST_PRIORITY ? SIM_STREAM_GREATEST_PRIORITY
                                                                     : priority;
        stream->next = ctx->streams;
        ctx->streams = stream;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    if (!stream)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phStream = stream;
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream hStream)
{
    CUresult result = sim_ready();
    if (result != CUDA_SUCCESS)
        return result;
    if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD ||
        hStream->magic != SIM_STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&sim_cuda.lock);
    struct CUstream_st **link = &hStream->ctx->streams;
    while (*link && *link != hStream)
        link = &(*link)->next;
    if (*link) {
        *link = hStream->next;
        sim_stream_retire(hStream); /* its queued work still runs out on the device */
    } else {
        result = CUDA_ERROR_INVALID_HANDLE;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    SIM_STREAM_OR_RETURN(hStream);
    if (stream->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    sim_sleep_until(atomic_load(&stream->tail_ns));
    sim_pools_synchronised();
    return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream hStream)
{
    SIM_STREAM_OR_RETURN(hStream);
    return atomic_load(&stream->tail_ns) > sim_now_ns() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

/* A stream's property read: the stream resolved, then `out`, where the value goes, checked. */
static CUresult resolve_for_query(CUstream hStream, const void *out, struct CUstream_st **stream)
{
    CUresult result = sim_stream_resolve(hStream, stream);
    return result == CUDA_SUCCESS && !out ? CUDA_ERROR_INVALID_VALUE : result;
}

/* The body of a stream property read: `value`, an expression of the resolved `stream`. */
#define STREAM_ANSWER(hStream, out, value)                                                                             \
    SIM_ANSWER(CUresult, struct CUstream_st, stream, resolve_for_query(hStream, out, &stream), out, value)

CUresult cuStreamGetPriority(CUstream hStream, int *priority)
{
    STREAM_ANSWER(hStream, priority, stream->priority);
}

CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
    STREAM_ANSWER(hStream, flags, stream->flags);
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    STREAM_ANSWER(hStream, pctx, stream->ctx);
}

/* No green contexts here: a stream belongs to an ordinary context. */
CUresult cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
    CUresult result = cuStreamGetCtx(hStream, pCtx);
    if (result == CUDA_SUCCESS && pGreenCtx)
        *pGreenCtx = NULL;
    return result;
}

CUresult cuStreamGetDevice(CUstream hStream, CUdevice *device)
{
    STREAM_ANSWER(hStream, device, stream->ctx->device->ordinal);
}

/* Unique while the stream lives: its address (streams are recycled, never freed). */
CUresult cuStreamGetId(CUstream hStream, unsigned long long *streamId)
{
    STREAM_ANSWER(hStream, streamId, (unsigned long long)(uintptr_t)stream);
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    STREAM_ANSWER(hStream, captureStatus,
                  stream->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE);
}

/* Work queued on the stream after this waits for the event's work: the stream's timeline moves
 * to the event's time. */
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    SIM_STREAM_OR_RETURN(hStream);
    if (!hEvent || hEvent->magic != SIM_EVENT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (Flags != CU_EVENT_WAIT_DEFAULT)
        return CUDA_ERROR_INVALID_VALUE;
    if (stream->capture || !atomic_load(&hEvent->recorded))
        return CUDA_SUCCESS;
    uint64_t after = atomic_load(&hEvent->time_ns), tail = atomic_load(&stream->tail_ns);
    while (tail < after && !atomic_compare_exchange_weak(&stream->tail_ns, &tail, after)) {
    }
    return CUDA_SUCCESS;
}

/* A host function runs once the work queued before it on the stream has: here, on the calling
 * thread after waiting for it, so work queued after it waits for it as the driver orders. A
 * host function that waits for something its caller does after queueing it would hang. */
static CUresult run_on_host_after(CUstream hStream, struct CUstream_st **stream)
{
    CUresult result = sim_stream_resolve(hStream, stream);
    if (result != CUDA_SUCCESS)
        return result;
    if ((*stream)->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* a host node: not modelled */
    sim_sleep_until(atomic_load(&(*stream)->tail_ns));
    return CUDA_SUCCESS;
}

CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    struct CUstream_st *stream;
    if (!fn)
        return sim_check(0);
    CUresult result = run_on_host_after(hStream, &stream);
    if (result == CUDA_SUCCESS)
        fn(userData);
    return result;
}

CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags)
{
    struct CUstream_st *stream;
    if (!callback || flags != 0)
        return sim_check(0);
    CUresult result = run_on_host_after(hStream, &stream);
    if (result == CUDA_SUCCESS)
        callback(hStream, CUDA_SUCCESS, userData);
    return result;
}

/* ---- events ------------------------------------------------------------------------------- */

static int valid_event(CUevent event)
{
    return event && event->magic == SIM_EVENT_MAGIC;
}

/* The ready check, then INVALID_HANDLE unless `event` is a live event. */
static CUresult check_event(CUevent event)
{
    CUresult result = sim_ready();
    return result == CUDA_SUCCESS && !valid_event(event) ? CUDA_ERROR_INVALID_HANDLE : result;
}

/* An interprocess event must be created without timing, as the driver requires. */
static int valid_event_flags(unsigned int flags)
{
    unsigned int known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    return !(flags & ~known) && (!(flags & CU_EVENT_INTERPROCESS) || (flags & CU_EVENT_DISABLE_TIMING));
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, phEvent && valid_event_flags(Flags));
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&sim_cuda.lock);
    struct CUevent_st *event = sim_cuda.free_events;
    if (event)
        sim_cuda.free_events = event->next_free;
    pthread_mutex_unlock(&sim_cuda.lock);
    if (!event && !(event = malloc(sizeof *event)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    memset(event, 0, sizeof *event);
    event->magic = SIM_EVENT_MAGIC;
    event->flags = Flags;
    *phEvent = event;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    CUresult result = check_event(hEvent);
    if (result != CUDA_SUCCESS)
        return result;
    hEvent->magic = SIM_DEAD_MAGIC;
    pthread_mutex_lock(&sim_cuda.lock);
    hEvent->next_free = sim_cuda.free_events;
    sim_cuda.free_events = hEvent;
    pthread_mutex_unlock(&sim_cuda.lock);
    return CUDA_SUCCESS;
}

/* An event completes when the work queued before it on its stream does (at once on an idle
 * stream). Recording into a capturing stream adds nothing to the graph: not modelled. */
CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    SIM_STREAM_OR_RETURN(hStream);
    if (!valid_event(hEvent))
        return CUDA_ERROR_INVALID_HANDLE;
    if (stream->capture)
        return CUDA_SUCCESS;
    uint64_t now = sim_now_ns(), tail = atomic_load(&stream->tail_ns);
    atomic_store(&hEvent->time_ns, tail > now ? tail : now);
    atomic_store(&hEvent->recorded, 1);
    return CUDA_SUCCESS;
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    /* CU_EVENT_RECORD_EXTERNAL (1) only matters inside a graph capture, which records nothing. */
    return flags > 1 ? sim_check(0) : cuEventRecord(hEvent, hStream);
}

CUresult cuEventQuery(CUevent hEvent)
{
    CUresult result = check_event(hEvent);
    if (result != CUDA_SUCCESS)
        return result;
    if (!atomic_load(&hEvent->recorded))
        return CUDA_SUCCESS; /* as the driver: an event never recorded has nothing to wait for */
    return atomic_load(&hEvent->time_ns) > sim_now_ns() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    CUresult result = check_event(hEvent);
    if (result == CUDA_SUCCESS && atomic_load(&hEvent->recorded))
        sim_sleep_until(atomic_load(&hEvent->time_ns));
    if (result == CUDA_SUCCESS)
        sim_pools_synchronised();
    return result;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    CUresult result = sim_check(pMilliseconds != NULL);
    if (result != CUDA_SUCCESS)
        return result;
    if (!valid_event(hStart) || !valid_event(hEnd) || !atomic_load(&hStart->recorded) ||
        !atomic_load(&hEnd->recorded) || ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t start = atomic_load(&hStart->time_ns), end = atomic_load(&hEnd->time_ns), now = sim_now_ns();
    if (start > now || end > now)
        return CUDA_ERROR_NOT_READY;
    *pMilliseconds = (float)(((double)end - (double)start) / 1e6);
    return CUDA_SUCCESS;
}

/* The CUDA 12.8 name: the same query (its difference, the timing of events recorded in graphs,
 * does not arise here). */
CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime(pMilliseconds, hStart, hEnd);
}

/* ---- modules ------------------------------------------------------------------------------ */

CUresult sim_module_load(int is_library, struct CUmod_st **module)
{
    struct CUmod_st *loaded = calloc(1, sizeof *loaded);
    if (!loaded)
        return CUDA_ERROR_OUT_OF_MEMORY;
    loaded->magic = SIM_MODULE_MAGIC;
    loaded->is_library = is_library;
    *module = loaded;
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, module && image);
    if (result != CUDA_SUCCESS)
        return result;
    /* Any image loads: the simulator never runs the code, only prices launches of it. */
    return sim_module_load(0, module);
}

/* Unloaded modules and their functions keep their memory, marked dead, so a stale handle is
 * refused (INVALID_HANDLE) instead of read after free. They are few and small. */
CUresult cuModuleUnload(CUmodule hmod)
{
    CUresult result = sim_ready_locked();
    if (result != CUDA_SUCCESS)
        return result;
    if (hmod && hmod->magic == SIM_MODULE_MAGIC) {
        hmod->magic = SIM_DEAD_MAGIC;
        for (struct CUfunc_st *function = hmod->functions; function; function = function->next)
            function->magic = SIM_DEAD_MAGIC;
    } else {
        result = CUDA_ERROR_INVALID_HANDLE;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    CUresult result = sim_check(hfunc && name);
    if (result != CUDA_SUCCESS)
        return result;
    if (!hmod || hmod->magic != SIM_MODULE_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUfunc_st *function = sim_module_function(hmod, name);
    if (!function)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *hfunc = function;
    return CUDA_SUCCESS;
}

struct CUfunc_st *sim_module_function(struct CUmod_st *module, const char *name)
{
    pthread_mutex_lock(&sim_cuda.lock);
    struct CUfunc_st *function = module->functions;
    while (function && strcmp(function->name, name) != 0)
        function = function->next;
    if (!function && (function = calloc(1, sizeof *function + strlen(name) + 1))) {
        function->magic = SIM_FUNCTION_MAGIC;
        function->module = module;
        strcpy(function->name, name);
        function->next = module->functions;
        module->functions = function;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return function;
}

/* ---- launches ------------------------------------------------------------------------------ */

/* Validates a launch as the driver does and prices it on a device. */
static CUresult price(const struct sim_launch *launch, const struct sim_device_spec *spec, struct sim_kernel_cost *cost)
{
    const unsigned int *grid = launch->grid, *block = launch->block;
    if (!grid[0] || !grid[1] || !grid[2] || !block[0] || !block[1] || !block[2] || block[0] > 1024 || block[1] > 1024 ||
        block[2] > 64 || grid[0] > INT_MAX || grid[1] > 65535 || grid[2] > 65535 ||
        launch->shared_bytes > SIM_MAX_SHARED_MEMORY_OPTIN)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t threads = (uint64_t)block[0] * block[1] * block[2];
    if (threads > SIM_MAX_THREADS_PER_BLOCK)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t blocks = (uint64_t)grid[0] * grid[1] * grid[2];
    sim_kernel_cost(spec, blocks, (uint32_t)threads, cost);
    if (launch->cooperative && blocks > cost->wave_blocks)
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE; /* every block must be resident at once */
    return CUDA_SUCCESS;
}

/* Queues a priced kernel on a stream: one interval on the device timeline. */
static void execute(struct CUstream_st *stream, const struct sim_kernel_cost *cost)
{
    struct sim_cuda_device *device = stream->ctx->device;
    uint64_t n = atomic_fetch_add_explicit(&stream->launches, 1, memory_order_relaxed);
    _Atomic uint64_t *pushed = &stream->ends[n % SIM_PUSH_BUFFER];
    uint64_t now = sim_now_ns();
    if (n >= SIM_PUSH_BUFFER) {
        /* The slot holds the end of the launch SIM_PUSH_BUFFER before this one. */
        uint64_t oldest_end = atomic_load_explicit(pushed, memory_order_relaxed);
        if (oldest_end > now) {
            sim_sleep_until(oldest_end);
            now = sim_now_ns();
        }
    }
    uint64_t start;
    uint64_t end = sim_device_execute(device->view, device->tag_base | cost->weight, now, cost->duration_ns, &start);
    atomic_store_explicit(pushed, end, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&stream->tail_ns, memory_order_relaxed);
    while (tail < end && !atomic_compare_exchange_weak_explicit(&stream->tail_ns, &tail, end, memory_order_release,
                                                                memory_order_relaxed)) {
    }
}

/* A launch into a capturing stream becomes a node of the graph instead of running. */
static CUresult capture(struct CUstream_st *stream, const struct sim_launch *launch)
{
    struct CUgraphNode_st *node = malloc(sizeof *node);
    if (!node)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *node = (struct CUgraphNode_st){.magic = SIM_GRAPH_NODE_MAGIC, .launch = *launch, .ctx = stream->ctx};
    pthread_mutex_lock(&sim_cuda.lock);
    int stored = add_node(stream->capture, node);
    pthread_mutex_unlock(&sim_cuda.lock);
    if (!stored)
        free(node);
    return stored ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult launch(CUfunction f, const struct sim_launch *launch, CUstream hStream, void **kernelParams,
                       void **extra)
{
    SIM_STREAM_OR_RETURN(hStream);
    if (!f || f->magic != SIM_FUNCTION_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (kernelParams && extra)
        return CUDA_ERROR_INVALID_VALUE;
    if (__builtin_expect(sim_cuda.fail_launches, 0))
        return CUDA_ERROR_LAUNCH_FAILED; /* VGPU_SIM_FAIL_LAUNCHES: no result may be trusted */
    struct sim_kernel_cost cost;
    result = price(launch, stream->ctx->device->view->spec, &cost);
    if (result != CUDA_SUCCESS)
        return result;
    if (__builtin_expect(stream->capture != NULL, 0))
        return capture(stream, launch);
    execute(stream, &cost);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    struct sim_launch shape = {f, {gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}, sharedMemBytes, 0};
    return launch(f, &shape, hStream, kernelParams, extra);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    return cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                          kernelParams, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    CUresult result = sim_check(config != NULL);
    if (result != CUDA_SUCCESS)
        return result;
    struct sim_launch shape = {f,
                               {config->gridDimX, config->gridDimY, config->gridDimZ},
                               {config->blockDimX, config->blockDimY, config->blockDimZ},
                               config->sharedMemBytes,
                               0};
    return launch(f, &shape, config->hStream, kernelParams, extra);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    return cuLaunchKernelEx(config, f, kernelParams, extra);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)
{
    struct sim_launch shape = {f, {gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}, sharedMemBytes, 1};
    return launch(f, &shape, hStream, kernelParams, NULL);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams)
{
    return cuLaunchCooperativeKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                                     hStream, kernelParams);
}

/* ---- graphs ------------------------------------------------------------------------------- */

/* A new empty graph, registered as a live handle; NULL out of memory. */
static struct CUgraph_st *new_graph(void)
{
    struct CUgraph_st *graph = calloc(1, sizeof *graph);
    if (graph && !sim_register_handle(graph, SIM_HANDLE_GRAPH)) {
        free(graph);
        graph = NULL;
    }
    return graph;
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
        return sim_ready() == CUDA_SUCCESS ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : sim_ready();
    SIM_STREAM_OR_RETURN(hStream);
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (stream->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    struct CUgraph_st *graph = new_graph();
    if (!graph)
        return CUDA_ERROR_OUT_OF_MEMORY;
    stream->capture = graph;
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    SIM_STREAM_OR_RETURN(hStream);
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    if (!stream->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    *phGraph = stream->capture;
    stream->capture = NULL;
    return CUDA_SUCCESS;
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    CUresult result = sim_check(phGraph && flags == 0);
    if (result != CUDA_SUCCESS)
        return result;
    struct CUgraph_st *graph = new_graph();
    if (!graph)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraph = graph;
    return CUDA_SUCCESS;
}

/* Whether a node list is one the driver takes: none, or that many live nodes. */
static int dependencies_valid(const CUgraphNode *dependencies, size_t count)
{
    if (count && !dependencies)
        return 0;
    for (size_t i = 0; i < count; i++)
        if (!dependencies[i] || dependencies[i]->magic != SIM_GRAPH_NODE_MAGIC)
            return 0;
    return 1;
}

/* Adds a memory node to a graph whose lock sim_lock_handle took; releases the lock. Nodes and
 * edges of a graph with memory nodes cannot change once it has an executable: refused. */
static CUresult add_memory_node(CUgraphNode *phGraphNode, CUgraph graph, struct CUgraphNode_st *node)
{
    CUresult result = CUDA_ERROR_OUT_OF_MEMORY;
    if (graph->exec)
        result = CUDA_ERROR_NOT_SUPPORTED;
    else if (node && add_node(graph, node))
        result = CUDA_SUCCESS;
    if (result == CUDA_SUCCESS) {
        graph->memory_nodes = 1;
        *phGraphNode = node;
    } else if (node) {
        if (node->block)
            sim_graph_block_release(node->block);
        free(node);
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

/* An allocation node: device memory on the pool's device, pinned, readable and writable there;
 * its address is fixed now and written to nodeParams->dptr (graph_memory.c). */
CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    CUresult result = sim_lock_handle(hGraph, SIM_HANDLE_GRAPH,
                                      phGraphNode && nodeParams && dependencies_valid(dependencies, numDependencies));
    if (result != CUDA_SUCCESS)
        return result;
    const CUmemPoolProps *props = &nodeParams->poolProps;
    struct sim_cuda_device *device = props->allocType == CU_MEM_ALLOCATION_TYPE_PINNED && nodeParams->bytesize
                                         ? sim_device_at(&props->location)
                                         : NULL;
    if (!device || props->handleTypes != CU_MEM_HANDLE_TYPE_NONE) {
        pthread_mutex_unlock(&sim_cuda.lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUgraphNode_st *node = calloc(1, sizeof *node);
    if (node) {
        *node = (struct CUgraphNode_st){.magic = SIM_GRAPH_NODE_MAGIC, .type = CU_GRAPH_NODE_TYPE_MEM_ALLOC};
        result = sim_graph_block_new(device, nodeParams->bytesize, &node->block);
        if (result != CUDA_SUCCESS) {
            free(node);
            pthread_mutex_unlock(&sim_cuda.lock);
            return result;
        }
    }
    result = add_memory_node(phGraphNode, hGraph, node);
    if (result == CUDA_SUCCESS)
        nodeParams->dptr = node->block->allocation.base;
    return result;
}

/* Whether `dptr` is the address of a graph allocation of this process (the lock is held). */
static int graph_allocation(CUdeviceptr dptr)
{
    for (int d = 0; d < sim_cuda.device_count; d++)
        for (const struct sim_graph_block *block = sim_cuda.devices[d].graph_blocks; block; block = block->next)
            if (block->allocation.base == dptr)
                return 1;
    return 0;
}

/* A free node: frees a graph allocation (of this graph or another) when a launch reaches it. */
CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                               size_t numDependencies, CUdeviceptr dptr)
{
    CUresult result =
        sim_lock_handle(hGraph, SIM_HANDLE_GRAPH, phGraphNode && dependencies_valid(dependencies, numDependencies));
    if (result != CUDA_SUCCESS)
        return result;
    if (!graph_allocation(dptr)) {
        pthread_mutex_unlock(&sim_cuda.lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUgraphNode_st *node = malloc(sizeof *node);
    if (node)
        *node =
            (struct CUgraphNode_st){.magic = SIM_GRAPH_NODE_MAGIC, .type = CU_GRAPH_NODE_TYPE_MEM_FREE, .freed = dptr};
    return add_memory_node(phGraphNode, hGraph, node);
}

static void free_exec(struct CUgraphExec_st *exec)
{
    for (size_t i = 0; i < exec->allocations; i++)
        sim_graph_block_release(exec->blocks[i]);
    if (exec->graph)
        exec->graph->exec = NULL;
    free(exec->blocks);
    free(exec->freed);
    free(exec);
}

/* Validates like the driver (no graph, or nowhere to put the executable: INVALID_VALUE), then
 * copies the graph's kernels and memory nodes into a new executable. A graph with memory nodes
 * has one executable at a time, as with the driver. Flags, an upload stream and the other
 * instantiation options change nothing in the simulator. */
static CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph)
{
    CUresult result = sim_lock_handle(hGraph, SIM_HANDLE_GRAPH, phGraphExec != NULL);
    if (result != CUDA_SUCCESS)
        return result;
    if (hGraph->exec) {
        pthread_mutex_unlock(&sim_cuda.lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t kernels = 0, allocations = 0, frees = 0;
    for (size_t i = 0; i < hGraph->count; i++) {
        CUgraphNodeType type = hGraph->nodes[i]->type;
        kernels += type == CU_GRAPH_NODE_TYPE_KERNEL;
        allocations += type == CU_GRAPH_NODE_TYPE_MEM_ALLOC;
        frees += type == CU_GRAPH_NODE_TYPE_MEM_FREE;
    }
    struct CUgraphExec_st *exec = calloc(1, sizeof *exec + kernels * sizeof exec->launches[0]);
    result = CUDA_ERROR_OUT_OF_MEMORY;
    if (exec && (!allocations || (exec->blocks = calloc(allocations, sizeof *exec->blocks))) &&
        (!frees || (exec->freed = calloc(frees, sizeof *exec->freed)))) {
        for (size_t i = 0; i < hGraph->count; i++) {
            struct CUgraphNode_st *node = hGraph->nodes[i];
            if (node->type == CU_GRAPH_NODE_TYPE_KERNEL)
                exec->launches[exec->count++] = node->launch;
            else if (node->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
                (exec->blocks[exec->allocations++] = node->block)->owners++;
            else
                exec->freed[exec->frees++] = node->freed;
        }
        if (sim_map_put(&sim_cuda.handles, (uintptr_t)exec, SIM_HANDLE_GRAPH_EXEC) == 0)
            result = CUDA_SUCCESS;
    }
    if (result == CUDA_SUCCESS && hGraph->memory_nodes) {
        exec->graph = hGraph;
        hGraph->exec = exec;
    }
    if (result != CUDA_SUCCESS && exec)
        free_exec(exec);
    pthread_mutex_unlock(&sim_cuda.lock);
    if (result != CUDA_SUCCESS)
        return result;
    *phGraphExec = exec;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    (void)flags;
    return instantiate(phGraphExec, hGraph);
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    CUresult result = sim_check(instantiateParams != NULL);
    if (result != CUDA_SUCCESS)
        return result;
    result = instantiate(phGraphExec, hGraph);
    /* No node is ever to blame: the simulator refuses only arguments. */
    instantiateParams->hErrNode_out = NULL;
    instantiateParams->result_out =
        result == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    return result;
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    return cuGraphInstantiateWithParams(phGraphExec, hGraph, instantiateParams);
}

/* CUDA 11's form: an error node and a log, both optional; neither ever has anything to say here. */
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                               size_t bufferSize)
{
    CUresult result = instantiate(phGraphExec, hGraph);
    if (phErrorNode)
        *phErrorNode = NULL;
    if (logBuffer && bufferSize)
        logBuffer[0] = '\0';
    return result;
}

/* Gives an executable the kernels of another graph of the same topology, as the driver updates
 * one in place: launches already queued keep the kernels they were queued with, later ones run
 * the new. Kernel nodes here lie on one chain, so the topology is the node count; an
 * update that would change it is refused and the executable left as it was. No node or edge is
 * singled out in `info`. */
static CUresult update(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *info)
{
    *info = (CUgraphExecUpdateResultInfo){.result = CU_GRAPH_EXEC_UPDATE_ERROR};
    CUresult result = sim_ready_locked();
    if (result != CUDA_SUCCESS)
        return result;
    result = CUDA_ERROR_INVALID_VALUE;
    if (sim_handle_is(hGraphExec, SIM_HANDLE_GRAPH_EXEC) && sim_handle_is(hGraph, SIM_HANDLE_GRAPH)) {
        /* Memory nodes cannot be updated here: an executable that has them, or a graph, is refused. */
        if (hGraph->count != hGraphExec->count || hGraph->memory_nodes || hGraphExec->allocations ||
            hGraphExec->frees) {
            result = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
            info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
        } else {
            for (size_t i = 0; i < hGraph->count; i++)
                hGraphExec->launches[i] = hGraph->nodes[i]->launch;
            result = CUDA_SUCCESS;
            info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
        }
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo)
{
    CUresult result = sim_check(resultInfo != NULL);
    return result != CUDA_SUCCESS ? result : update(hGraphExec, hGraph, resultInfo);
}

/* CUDA 11's form: the same outcome in two separate out parameters. */
CUresult cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out,
                           CUgraphExecUpdateResult *updateResult_out)
{
    CUresult result = sim_check(hErrorNode_out && updateResult_out);
    if (result != CUDA_SUCCESS)
        return result;
    CUgraphExecUpdateResultInfo info;
    result = update(hGraphExec, hGraph, &info);
    *hErrorNode_out = info.errorNode;
    *updateResult_out = info.result;
    return result;
}

/* Every kernel of the graph runs on the stream, one after another, through the same engine as
 * individual launches (the graph's dependencies cannot shorten a serial device's work). */
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    SIM_STREAM_OR_RETURN(hStream);
    pthread_mutex_lock(&sim_cuda.lock);
    int known = sim_handle_is(hGraphExec, SIM_HANDLE_GRAPH_EXEC);
    pthread_mutex_unlock(&sim_cuda.lock);
    if (!known)
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_cuda.fail_launches && !stream->capture)
        return CUDA_ERROR_LAUNCH_FAILED;
    if (hGraphExec->allocations || hGraphExec->frees) {
        if (stream->capture)
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* memory nodes are not inlined into a capture */
        result = sim_graph_memory_launch(hGraphExec);
        if (result != CUDA_SUCCESS)
            return result;
    }
    for (size_t i = 0; i < hGraphExec->count && result == CUDA_SUCCESS; i++) {
        struct sim_kernel_cost cost;
        result = price(&hGraphExec->launches[i], stream->ctx->device->view->spec, &cost);
        if (result == CUDA_SUCCESS && stream->capture)
            result = capture(stream, &hGraphExec->launches[i]);
        else if (result == CUDA_SUCCESS)
            execute(stream, &cost);
    }
    return result;
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    return cuGraphLaunch(hGraphExec, hStream);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    CUresult result = sim_ready_locked();
    if (result != CUDA_SUCCESS)
        return result;
    int known = sim_map_take(&sim_cuda.handles, (uintptr_t)hGraphExec, NULL) == 0;
    if (known)
        free_exec(hGraphExec); /* its allocations' memory stays in the graph pool until trimmed */
    pthread_mutex_unlock(&sim_cuda.lock);
    return known ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
    CUresult result = sim_lock_handle(hGraph, SIM_HANDLE_GRAPH, 1);
    if (result != CUDA_SUCCESS)
        return result;
    free_graph(hGraph);
    pthread_mutex_unlock(&sim_cuda.lock);
    return CUDA_SUCCESS;
}

/* ---- graph introspection (optional entry points) ------------------------------------------ */

/* A query of a node checked as the driver checks it: the ready check, then INVALID_VALUE unless
 * the node is live and there is somewhere to put the answer. */
static CUresult check_node(CUgraphNode node, const void *out)
{
    CUresult result = sim_ready();
    if (result == CUDA_SUCCESS && !(node && node->magic == SIM_GRAPH_NODE_MAGIC && out))
        return CUDA_ERROR_INVALID_VALUE;
    return result;
}

/* check_node, and the node is of `type` (a query of another type's parameters is invalid). */
static CUresult check_node_of_type(CUgraphNode node, const void *out, CUgraphNodeType type)
{
    CUresult result = check_node(node, out);
    return result == CUDA_SUCCESS && node->type != type ? CUDA_ERROR_INVALID_VALUE : result;
}

CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    CUresult result = sim_lock_handle(hGraph, SIM_HANDLE_GRAPH, numNodes != NULL);
    if (result != CUDA_SUCCESS)
        return result;
    if (nodes) {
        size_t filled = *numNodes < hGraph->count ? *numNodes : hGraph->count;
        for (size_t i = 0; i < *numNodes; i++)
            nodes[i] = i < filled ? hGraph->nodes[i] : NULL;
        *numNodes = filled;
    } else {
        *numNodes = hGraph->count;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

/* What an allocation node's parameters say: its memory's device, size and address. */
static CUDA_MEM_ALLOC_NODE_PARAMS alloc_node_params(const struct CUgraphNode_st *node)
{
    const struct sim_allocation *memory = &node->block->allocation;
    return (CUDA_MEM_ALLOC_NODE_PARAMS){
        .poolProps = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                      .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = memory->device->ordinal}},
        .bytesize = memory->size,
        .dptr = memory->base,
    };
}

/* What a kernel node's parameters say: its launch and context. */
static CUDA_KERNEL_NODE_PARAMS kernel_node_params(const struct CUgraphNode_st *node)
{
    const struct sim_launch *launch = &node->launch;
    return (CUDA_KERNEL_NODE_PARAMS){
        .func = launch->function,
        .gridDimX = launch->grid[0],
        .gridDimY = launch->grid[1],
        .gridDimZ = launch->grid[2],
        .blockDimX = launch->block[0],
        .blockDimY = launch->block[1],
        .blockDimZ = launch->block[2],
        .sharedMemBytes = launch->shared_bytes,
        .ctx = node->ctx,
    };
}

CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    SIM_CHECKED_ANSWER(CUresult, check_node(hNode, type), type, hNode->type);
}

CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out)
{
    SIM_CHECKED_ANSWER(CUresult, check_node_of_type(hNode, params_out, CU_GRAPH_NODE_TYPE_MEM_ALLOC), params_out,
                       alloc_node_params(hNode));
}

CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr_out)
{
    SIM_CHECKED_ANSWER(CUresult, check_node_of_type(hNode, dptr_out, CU_GRAPH_NODE_TYPE_MEM_FREE), dptr_out,
                       hNode->freed);
}

CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    SIM_CHECKED_ANSWER(CUresult, check_node_of_type(hNode, nodeParams, CU_GRAPH_NODE_TYPE_KERNEL), nodeParams,
                       kernel_node_params(hNode));
}

/* No node here is a child graph (a graph launched into a capture is inlined). */
CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph)
{
    CUresult result = check_node(hNode, phGraph);
    return result != CUDA_SUCCESS ? result : CUDA_ERROR_INVALID_VALUE;
}
