/*
 * The simulated libcuda.so.1: its state, initialisation, fork and exit, versions, error strings,
 * symbol lookup (cuGetProcAddress), the registry of live handles and device queries.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_sim.h"

struct sim_cuda sim_cuda = {.lock = PTHREAD_MUTEX_INITIALIZER};
_Thread_local struct sim_thread sim_thread;

/* ---- initialisation, fork, exit ------------------------------------------------------------ */

/* Address space for linear allocations: room for every visible device to fill up several
 * times over despite fragmentation. Only reserved, never committed. */
static void reserve_arena(void)
{
    uint64_t capacity = 0;
    for (int i = 0; i < sim_cuda.device_count; i++)
        capacity += sim_cuda.devices[i].view->spec->memory;
    uint64_t size = capacity * 4;
    if (size > (32ull << 40))
        size = 32ull << 40;
    for (; size >= (1ull << 30); size /= 2) {
        void *base = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base != MAP_FAILED) {
            sim_cuda.arena.base = (uintptr_t)base;
            sim_cuda.arena.size = size;
            return;
        }
    }
    /* No arena (a tight RLIMIT_AS): every allocation gets its own mapping instead. */
}

static struct CUctx_st *new_primary_context(struct sim_cuda_device *device)
{
    struct CUctx_st *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return NULL;
    ctx->magic = SIM_CTX_MAGIC;
    ctx->device = device;
    ctx->is_primary = 1;
    ctx->null_stream = sim_stream_new(ctx, 0);
    if (!ctx->null_stream) {
        free(ctx);
        return NULL;
    }
    return ctx;
}

/* Everything the child of a fork inherited describes the parent's contexts and memory; like
 * the real driver, the child starts over and must call cuInit itself. */
static void forget_parent_after_fork(void)
{
    if (sim_cuda.arena.size)
        munmap((void *)sim_cuda.arena.base, sim_cuda.arena.size);
    free(sim_cuda.arena.free_ranges.entries);
    free(sim_cuda.allocations.entries);
    free(sim_cuda.reservations.entries);
    free(sim_cuda.handles.entries);
    free(sim_cuda.host_buffers.entries);
    sim_machine_close(&sim_cuda.machine);
    int handler_installed = sim_cuda.fork_handler_installed;
    memset(&sim_cuda, 0, sizeof sim_cuda);
    pthread_mutex_init(&sim_cuda.lock, NULL);
    sim_cuda.fork_handler_installed = handler_installed;
    sim_thread.depth = 0;
}

static CUresult initialise(void)
{
    if (!sim_cuda.fork_handler_installed)
        sim_cuda.fork_handler_installed = pthread_atfork(NULL, NULL, forget_parent_after_fork) == 0;
    struct sim_env env;
    sim_env_read(&env);
    if (sim_machine_open(&sim_cuda.machine, &env, "libcuda (jupyter-vgpu simulated GPU)") != 0)
        return CUDA_ERROR_NO_DEVICE;
    int order[SIM_MAX_DEVICES];
    sim_cuda.device_count = sim_visible_devices(env.visible_devices, &sim_cuda.machine.spec, order);
    if (sim_cuda.device_count == 0)
        return CUDA_ERROR_NO_DEVICE; /* CUDA_VISIBLE_DEVICES hides them all */
    sim_cuda.identity = sim_identity(sim_driver_pid());
    sim_cuda.fail_launches = env.fail_launches;
    for (int i = 0; i < sim_cuda.machine.spec.count; i++)
        sim_reap_dead(&sim_cuda.machine.devices[i]);
    for (int ordinal = 0; ordinal < sim_cuda.device_count; ordinal++) {
        struct sim_cuda_device *device = &sim_cuda.devices[ordinal];
        device->ordinal = ordinal;
        device->view = &sim_cuda.machine.devices[order[ordinal]];
        device->slot = -1;
        device->primary = new_primary_context(device);
        device->default_pool = sim_pool_new(device);
        if (!device->primary || !device->default_pool)
            return CUDA_ERROR_OUT_OF_MEMORY;
        device->default_pool->is_default = 1;
        device->current_pool = device->default_pool;
        if (sim_map_put(&sim_cuda.handles, (uintptr_t)device->default_pool, SIM_HANDLE_POOL) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    reserve_arena();
    sim_checkpoint_start(&env);
    return CUDA_SUCCESS;
}

CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int state = atomic_load(&sim_cuda.state);
    if (state == SIM_READY)
        return CUDA_SUCCESS;
    if (state == SIM_DEINITIALISED)
        return CUDA_ERROR_DEINITIALIZED;
    pthread_mutex_lock(&sim_cuda.lock);
    if (atomic_load(&sim_cuda.state) == SIM_UNINITIALISED) {
        sim_cuda.init_result = initialise();
        atomic_store(&sim_cuda.state, sim_cuda.init_result == CUDA_SUCCESS ? SIM_READY : SIM_INIT_FAILED);
    }
    CUresult result = sim_cuda.init_result;
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

/* At exit (or unload) the process's device memory returns to the device at once, as when the
 * real driver's file descriptors close; later calls report the driver as shut down. */
__attribute__((destructor)) static void release_at_exit(void)
{
    if (atomic_load(&sim_cuda.state) != SIM_READY)
        return;
    atomic_store(&sim_cuda.state, SIM_DEINITIALISED);
    for (int i = 0; i < sim_cuda.device_count; i++) {
        struct sim_cuda_device *device = &sim_cuda.devices[i];
        if (device->slot >= 0)
            sim_slot_release(device->view, device->slot, sim_cuda.identity);
    }
}

struct sim_cuda_device *sim_device(CUdevice ordinal)
{
    return ordinal >= 0 && ordinal < sim_cuda.device_count ? &sim_cuda.devices[ordinal] : NULL;
}

void sim_reap_now_and_then(struct sim_cuda_device *device)
{
    uint64_t now = sim_now_ns();
    uint64_t due = atomic_load_explicit(&device->next_reap_ns, memory_order_relaxed);
    if (now >= due && atomic_compare_exchange_strong(&device->next_reap_ns, &due, now + SIM_REAP_INTERVAL_NS))
        sim_reap_dead(device->view);
}

CUresult cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = sim_driver_version();
    return CUDA_SUCCESS;
}

/* ---- error strings ------------------------------------------------------------------------- */

static const struct {
    CUresult code;
    const char *name;
    const char *description;
} errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {5, "CUDA_ERROR_PROFILER_DISABLED", "profiler disabled"},
    {6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED", "profiler not initialized"},
    {7, "CUDA_ERROR_PROFILER_ALREADY_STARTED", "profiler already started"},
    {8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED", "profiler already stopped"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "stub library"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", "call requires newer driver"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "device unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {102, "CUDA_ERROR_DEVICE_NOT_LICENSED", "device not licensed"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "invalid image"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
    {205, "CUDA_ERROR_MAP_FAILED", "map failed"},
    {206, "CUDA_ERROR_UNMAP_FAILED", "unmap failed"},
    {207, "CUDA_ERROR_ARRAY_IS_MAPPED", "array is mapped"},
    {208, "CUDA_ERROR_ALREADY_MAPPED", "already mapped"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no binary for gpu"},
    {210, "CUDA_ERROR_ALREADY_ACQUIRED", "already acquired"},
    {211, "CUDA_ERROR_NOT_MAPPED", "not mapped"},
    {212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", "not mapped as array"},
    {213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER", "not mapped as pointer"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE", "ecc uncorrectable"},
    {215, "CUDA_ERROR_UNSUPPORTED_LIMIT", "unsupported limit"},
    {216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "context already in use"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access unsupported"},
    {218, "CUDA_ERROR_INVALID_PTX", "invalid ptx"},
    {219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", "invalid graphics context"},
    {220, "CUDA_ERROR_NVLINK_UNCORRECTABLE", "nvlink uncorrectable"},
    {221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "jit compiler not found"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "unsupported ptx version"},
    {223, "CUDA_ERROR_JIT_COMPILATION_DISABLED", "jit compilation disabled"},
    {224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", "unsupported exec affinity"},
    {225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", "unsupported devside sync"},
    {226, "CUDA_ERROR_CONTAINED", "contained"},
    {300, "CUDA_ERROR_INVALID_SOURCE", "invalid source"},
    {301, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", "shared object symbol not found"},
    {303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "shared object init failed"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "operating system"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {402, "CUDA_ERROR_LOSSY_QUERY", "lossy query"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT", "launch timeout"},
    {703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", "launch incompatible texturing"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access already enabled"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access not enabled"},
    {708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {710, "CUDA_ERROR_ASSERT", "assert"},
    {711, "CUDA_ERROR_TOO_MANY_PEERS", "too many peers"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "host memory already registered"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "host memory not registered"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "illegal instruction"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {717, "CUDA_ERROR_INVALID_ADDRESS_SPACE", "invalid address space"},
    {718, "CUDA_ERROR_INVALID_PC", "invalid pc"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "launch failed"},
    {720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "too many blocks in cooperative launch"},
    {721, "CUDA_ERROR_TENSOR_MEMORY_LEAK", "tensor memory leak"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not ready"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system driver mismatch"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "compat not supported on device"},
    {805, "CUDA_ERROR_MPS_CONNECTION_FAILED", "mps connection failed"},
    {806, "CUDA_ERROR_MPS_RPC_FAILURE", "mps rpc failure"},
    {807, "CUDA_ERROR_MPS_SERVER_NOT_READY", "mps server not ready"},
    {808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", "mps max clients reached"},
    {809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", "mps max connections reached"},
    {810, "CUDA_ERROR_MPS_CLIENT_TERMINATED", "mps client terminated"},
    {811, "CUDA_ERROR_CDP_NOT_SUPPORTED", "cdp not supported"},
    {812, "CUDA_ERROR_CDP_VERSION_MISMATCH", "cdp version mismatch"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "stream capture invalidated"},
    {902, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "stream capture merge"},
    {903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "stream capture unmatched"},
    {904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "stream capture unjoined"},
    {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "stream capture isolation"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "stream capture implicit"},
    {907, "CUDA_ERROR_CAPTURED_EVENT", "captured event"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "stream capture wrong thread"},
    {909, "CUDA_ERROR_TIMEOUT", "timeout"},
    {910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "graph exec update failure"},
    {911, "CUDA_ERROR_EXTERNAL_DEVICE", "external device"},
    {912, "CUDA_ERROR_INVALID_CLUSTER_SIZE", "invalid cluster size"},
    {913, "CUDA_ERROR_FUNCTION_NOT_LOADED", "function not loaded"},
    {914, "CUDA_ERROR_INVALID_RESOURCE_TYPE", "invalid resource type"},
    {915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION", "invalid resource configuration"},
    {916, "CUDA_ERROR_KEY_ROTATION", "key rotation"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

/* The name or the description of an error; an unknown code gets NULL and INVALID_VALUE. */
static CUresult describe_error(CUresult error, const char **pStr, int want_name)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        if (errors[i].code == error) {
            *pStr = want_name ? errors[i].name : errors[i].description;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    return describe_error(error, pStr, 0);
}

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    return describe_error(error, pStr, 1);
}

CUresult sim_not_modelled(const char *name, _Atomic int *said)
{
    if (!atomic_exchange(said, 1))
        fprintf(stderr,
                "libcuda (jupyter-vgpu simulated GPU): %s is not modelled by the simulated GPU; it answers "
                "CUDA_ERROR_NOT_SUPPORTED\n",
                name);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- cuGetProcAddress ---------------------------------------------------------------------- */

/* The first entry asked for by `symbol` (sim_entry_point_count if none): a binary search. */
static size_t first_entry_for(const char *symbol)
{
    size_t low = 0, high = sim_entry_point_count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (strcmp(sim_entry_points[middle].base, symbol) < 0)
            low = middle + 1;
        else
            high = middle;
    }
    return low;
}

/* As the real driver: the newest variant of a name that both the caller's version and the
 * driver's version allow; with the per-thread-default-stream flag a per-thread variant where
 * there is one. A variant newer than the driver does not exist; one newer than the caller's
 * version exists but is not handed out (VERSION_NOT_SUFFICIENT). An exported name asked for as
 * it is ("cuMemAlloc_v2") is found too, as the runtimes of CUDA 11 asked. */
static CUresult get_proc_address(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int driver_version = sim_driver_version();
    int want_per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct sim_entry_point *found = NULL;
    int too_new = 0;
    size_t first = first_entry_for(symbol);
    for (int pass = want_per_thread; pass >= 0 && !found; pass--) {
        for (size_t i = first; i < sim_entry_point_count && strcmp(sim_entry_points[i].base, symbol) == 0; i++) {
            const struct sim_entry_point *entry = &sim_entry_points[i];
            if (entry->per_thread != pass || entry->version > driver_version)
                continue;
            if (entry->version > cudaVersion)
                too_new = 1;
            else if (!found || entry->version > found->version)
                found = entry;
        }
    }
    for (size_t i = 0; !found && !too_new && i < sim_entry_point_count; i++)
        if (strcmp(sim_entry_points[i].name, symbol) == 0 && sim_entry_points[i].version <= driver_version)
            found = &sim_entry_points[i];
    if (!found) {
        if (status)
            *status = too_new ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = found->function;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return get_proc_address(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    return get_proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* ---- handles -------------------------------------------------------------------------------- */

int sim_register_handle(const void *handle, enum sim_handle_kind kind)
{
    pthread_mutex_lock(&sim_cuda.lock);
    int stored = sim_map_put(&sim_cuda.handles, (uintptr_t)handle, kind) == 0;
    pthread_mutex_unlock(&sim_cuda.lock);
    return stored;
}

int sim_handle_is(const void *handle, enum sim_handle_kind kind)
{
    uintptr_t found;
    return handle && sim_map_get(&sim_cuda.handles, (uintptr_t)handle, &found) == 0 && found == (uintptr_t)kind;
}

CUresult sim_lock_handle(const void *handle, enum sim_handle_kind kind, int arguments_valid)
{
    CUresult result = sim_check(arguments_valid);
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&sim_cuda.lock);
    if (sim_handle_is(handle, kind))
        return CUDA_SUCCESS;
    pthread_mutex_unlock(&sim_cuda.lock);
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- devices ------------------------------------------------------------------------------- */

CUresult sim_device_ready(CUdevice ordinal, struct sim_cuda_device **device, int arguments_valid)
{
    CUresult result = sim_ready();
    if (result != CUDA_SUCCESS)
        return result;
    *device = sim_device(ordinal);
    if (!*device)
        return CUDA_ERROR_INVALID_DEVICE;
    return arguments_valid ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult result = sim_check(device != NULL);
    if (result != CUDA_SUCCESS)
        return result;
    if (!sim_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    CUresult result = sim_check(count != NULL);
    if (result == CUDA_SUCCESS)
        *count = sim_cuda.device_count;
    return result;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, name && len > 0);
    if (result == CUDA_SUCCESS)
        snprintf(name, (size_t)len, "%s", device->view->spec->name);
    return result;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, uuid != NULL);
    if (result == CUDA_SUCCESS)
        memcpy(uuid->bytes, device->view->spec->uuid_bytes, sizeof uuid->bytes);
    return result;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid(uuid, dev);
}

/* Attributes of a Hopper-class part with the spec's SM count; any other valid attribute
 * number reads 0 (a capability the simulator does not have) rather than failing, so runtimes
 * that read every attribute at start-up work. */
static int attribute_value(const struct sim_cuda_device *device, CUdevice_attribute attribute, int *value)
{
    const struct sim_device_spec *spec = device->view->spec;
    switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = SIM_MAX_THREADS_PER_BLOCK; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *value = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *value = INT_MAX; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *value = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *value = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *value = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = SIM_WARP_SIZE; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *value = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *value = 1980000; break; /* kHz */
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = (int)spec->sms; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *value = 0; break; /* default: shared by processes */
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *value = SIM_PCI_BUS(device->view->index); break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *value = 2619000; break; /* kHz */
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *value = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *value = 50 << 20; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *value = SIM_MAX_THREADS_PER_SM; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *value = 3; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = SIM_CC_MAJOR; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = SIM_CC_MINOR; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *value = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *value = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = SIM_MAX_SHARED_MEMORY_OPTIN; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *value = SIM_MAX_BLOCKS_PER_SM; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *value = 1; break;
    default:
        if (attribute < 1 || attribute > 200)
            return -1;
        *value = 0;
    }
    return 0;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, pi != NULL);
    if (result == CUDA_SUCCESS && attribute_value(device, attrib, pi) != 0)
        result = CUDA_ERROR_INVALID_VALUE;
    return result;
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, major && minor);
    if (result == CUDA_SUCCESS) {
        *major = SIM_CC_MAJOR;
        *minor = SIM_CC_MINOR;
    }
    return result;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    DEVICE_ANSWER(dev, bytes, device->view->spec->memory);
}

/* ---- peers and the PCI bus ----------------------------------------------------------------- */

CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    struct sim_cuda_device *device, *peer;
    CUresult result = sim_device_ready(dev, &device, canAccessPeer != NULL);
    if (result == CUDA_SUCCESS && (result = sim_device_ready(peerDev, &peer, 1)) == CUDA_SUCCESS)
        *canAccessPeer = 0; /* no peer-to-peer path between simulated devices (context.c) */
    return result;
}

CUresult cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attrib, CUdevice srcDevice, CUdevice dstDevice)
{
    struct sim_cuda_device *source, *destination;
    CUresult result = sim_device_ready(srcDevice, &source, value && attrib >= 1 && attrib <= 5);
    if (result == CUDA_SUCCESS &&
        (result = sim_device_ready(dstDevice, &destination, srcDevice != dstDevice)) == CUDA_SUCCESS)
        *value = 0;
    return result;
}

/* "0000:18:00.0": domain, bus, device, function, as NVML reports the same device. */
CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, pciBusId && len > 0);
    if (result == CUDA_SUCCESS)
        snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", SIM_PCI_BUS(device->view->index));
    return result;
}

/* Accepts the forms the driver does: [domain:]bus:device[.function], hexadecimal. */
CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
    CUresult result = sim_check(dev && pciBusId);
    if (result != CUDA_SUCCESS)
        return result;
    unsigned int domain = 0, bus, slot, function = 0;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &domain, &bus, &slot, &function) < 3 &&
        (domain = 0, sscanf(pciBusId, "%x:%x.%x", &bus, &slot, &function) < 2))
        return CUDA_ERROR_INVALID_VALUE;
    for (int ordinal = 0; ordinal < sim_cuda.device_count; ordinal++) {
        if (domain == 0 && slot == 0 && function == 0 &&
            bus == (unsigned int)SIM_PCI_BUS(sim_cuda.devices[ordinal].view->index)) {
            *dev = ordinal;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}
