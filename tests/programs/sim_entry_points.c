/*
 * Checks of the simulated driver's entry points as third-party code reaches them. Each command
 * prints "key value" lines for tests/sim to read:
 *
 *   sim_entry_points versions   each query under each name a real driver exports it by (a _v2
 *                               and its base name, a _ptsz variant and its default-stream one,
 *                               NVML's v1, v2 and v3 process lists), and what cuGetProcAddress
 *                               returns; run alone and under tests/programs/foreign_interposer.c
 *   sim_entry_points pools      stream-ordered memory pools: the current pool of a device and
 *                               pool attributes against the memory the process holds
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "probe_common.h"
#include "vgpu/nvml_abi.h"

#define MIB (1ull << 20)

/* What NVML lists for this process, through the v1 layout and through the v2 one (v2 and v3 name
 * the same query). A v1 entry is shorter: a library writing v2 entries into a v1 array would
 * overwrite the sentinel after the last entry. */
static void nvml_processes(nvmlDevice_t device)
{
    nvmlProcessInfo_v1_t v1[4];
    memset(v1, 0xab, sizeof v1);
    unsigned int count_v1 = 3;
    CHECK(nvmlDeviceGetComputeRunningProcesses(device, &count_v1, v1));
    unsigned char sentinel[sizeof v1[0]];
    memset(sentinel, 0xab, sizeof sentinel);
    printf("processes_v1 %u\n", count_v1);
    printf("processes_v1_past_end_untouched %d\n", memcmp(&v1[count_v1], sentinel, sizeof sentinel) == 0);
    for (unsigned int i = 0; i < count_v1; i++)
        if (v1[i].pid == (unsigned int)getpid())
            printf("processes_v1_self %llu\n", v1[i].usedGpuMemory);

    nvmlProcessInfo_t v2[4], v3[4];
    unsigned int count_v2 = 4, count_v3 = 4;
    CHECK(nvmlDeviceGetComputeRunningProcesses_v2(device, &count_v2, v2));
    CHECK(nvmlDeviceGetComputeRunningProcesses_v3(device, &count_v3, v3));
    printf("processes_v2 %u\nprocesses_v3 %u\n", count_v2, count_v3);
    for (unsigned int i = 0; i < count_v3; i++)
        if (v3[i].pid == (unsigned int)getpid())
            printf("processes_v3_self %llu\n", v3[i].usedGpuMemory);

    unsigned int none = 0;
    printf("processes_v1_no_room %d\n", nvmlDeviceGetComputeRunningProcesses(device, &none, NULL));
    printf("processes_v1_room_needed %u\n", none);
}

static void nvml_versions(void)
{
    CHECK(nvmlInit_v2());
    CHECK(nvmlInit());
    CHECK(nvmlInitWithFlags(0));
    unsigned int count, count_v2;
    CHECK(nvmlDeviceGetCount(&count));
    CHECK(nvmlDeviceGetCount_v2(&count_v2));
    printf("nvml_count %u\nnvml_count_v2 %u\n", count, count_v2);
    int version, version_v2;
    CHECK(nvmlSystemGetCudaDriverVersion(&version));
    CHECK(nvmlSystemGetCudaDriverVersion_v2(&version_v2));
    printf("nvml_cuda_version %d\nnvml_cuda_version_v2 %d\n", version, version_v2);
    nvmlDevice_t device, device_v2;
    CHECK(nvmlDeviceGetHandleByIndex(0, &device));
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &device_v2));
    printf("nvml_same_handle %d\n", device == device_v2);
    nvmlMemory_t memory;
    nvmlMemory_v2_t memory_v2 = {.version = nvmlMemory_v2};
    CHECK(nvmlDeviceGetMemoryInfo(device, &memory));
    CHECK(nvmlDeviceGetMemoryInfo_v2(device, &memory_v2));
    printf("nvml_total %llu\nnvml_used %llu\nnvml_used_v2 %llu\n", memory.total, memory.used, memory_v2.used);
    nvml_processes(device);
    for (int i = 0; i < 3; i++)
        CHECK(nvmlShutdown());
    printf("nvml_shutdown_once_more %d\n", nvmlShutdown());
}

/* One kernel through each launch entry point, and a captured graph through the _ptsz ones. */
static void launch_versions(void)
{
    CUfunction f = load_noop();
    printf("launch %d\n", cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    printf("launch_ptsz %d\n", cuLaunchKernel_ptsz(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CUlaunchConfig config = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1};
    printf("launch_ex %d\n", cuLaunchKernelEx(&config, f, NULL, NULL));
    printf("launch_ex_ptsz %d\n", cuLaunchKernelEx_ptsz(&config, f, NULL, NULL));
    printf("launch_cooperative %d\n", cuLaunchCooperativeKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL));
    printf("launch_cooperative_ptsz %d\n", cuLaunchCooperativeKernel_ptsz(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL));

    CUstream stream;
    CUgraph graph;
    CUgraphExec exec, exec_ptsz;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
    CHECK(cuStreamEndCapture(stream, &graph));
    CUDA_GRAPH_INSTANTIATE_PARAMS params = {0};
    printf("instantiate %d\n", cuGraphInstantiateWithParams(&exec, graph, &params));
    printf("instantiate_ptsz %d\n", cuGraphInstantiateWithParams_ptsz(&exec_ptsz, graph, &params));
    printf("graph_launch %d\n", cuGraphLaunch(exec, stream));
    printf("graph_launch_ptsz %d\n", cuGraphLaunch_ptsz(exec_ptsz, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuCtxSynchronize());
}

/* cuGetProcAddress hands out the driver's own functions, as a real driver does, not whatever a
 * preloaded library defines under the same name. */
static void proc_address(void)
{
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    void *found = NULL;
    CUdriverProcAddressQueryResult status;
    CHECK(cuGetProcAddress_v2("cuMemAlloc", &found, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    printf("proc_address_is_the_drivers %d\n", driver && found == dlsym(driver, "cuMemAlloc_v2"));
    CHECK(cuGetProcAddress_v2("cuMemPoolGetAttribute", &found, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    printf("proc_address_pool_attribute %d\n", driver && found == dlsym(driver, "cuMemPoolGetAttribute"));
}

static int command_versions(void)
{
    require_primary_context(0);
    CUuuid uuid, uuid_v2;
    CHECK(cuDeviceGetUuid(&uuid, 0));
    CHECK(cuDeviceGetUuid_v2(&uuid_v2, 0));
    printf("same_uuid %d\n", memcmp(&uuid, &uuid_v2, sizeof uuid) == 0);
    size_t total;
    CHECK(cuDeviceTotalMem_v2(&total, 0));
    printf("total %zu\n", total);

    CUdeviceptr held, async, async_ptsz, pooled, pooled_ptsz;
    CUmemoryPool pool;
    CHECK(cuMemAlloc_v2(&held, 5 * MIB));
    printf("used_after_alloc %lld\n", used_bytes());
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0));
    printf("alloc_async %d\n", cuMemAllocAsync(&async, MIB, NULL));
    printf("alloc_async_ptsz %d\n", cuMemAllocAsync_ptsz(&async_ptsz, MIB, NULL));
    printf("alloc_from_pool %d\n", cuMemAllocFromPoolAsync(&pooled, 2 * MIB, pool, NULL));
    printf("alloc_from_pool_ptsz %d\n", cuMemAllocFromPoolAsync_ptsz(&pooled_ptsz, 2 * MIB, pool, NULL));
    printf("used_with_async %lld\n", used_bytes());
    printf("free_async %d\n", cuMemFreeAsync(async, NULL));
    printf("free_async_ptsz %d\n", cuMemFreeAsync_ptsz(async_ptsz, NULL));
    printf("free_pooled %d\n", cuMemFreeAsync(pooled, NULL));
    printf("free_pooled_ptsz %d\n", cuMemFreeAsync_ptsz(pooled_ptsz, NULL));
    printf("used_after_async %lld\n", used_bytes()); /* the pool keeps what was freed into it */
    CHECK(cuCtxSynchronize());                      /* ... until a synchronisation */
    printf("used_after_sync %lld\n", used_bytes());

    nvml_versions(); /* while the 5 MiB are held */
    launch_versions();
    proc_address();
    CHECK(cuMemFree_v2(held));
    printf("used_at_end %lld\n", used_bytes());
    return 0;
}

static unsigned long long figure(CUmemoryPool pool, CUmemPool_attribute attr)
{
    cuuint64_t value;
    CHECK(cuMemPoolGetAttribute(pool, attr, &value));
    return value;
}

static int policy(CUmemoryPool pool, CUmemPool_attribute attr)
{
    int value;
    CHECK(cuMemPoolGetAttribute(pool, attr, &value));
    return value;
}

static void print_pool(const char *when, CUmemoryPool pool)
{
    printf("%s_used %llu\n", when, figure(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
    printf("%s_used_high %llu\n", when, figure(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH));
    printf("%s_reserved %llu\n", when, figure(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    printf("%s_reserved_high %llu\n", when, figure(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH));
}

/* Settings a pool keeps and reads back, and the writes it refuses. */
static void pool_settings(CUmemoryPool pool)
{
    printf("reuse_defaults %d%d%d\n", policy(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES),
           policy(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC),
           policy(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES));
    printf("release_threshold_default %llu\n", figure(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD));
    cuuint64_t threshold = 64 * MIB, zero = 0, one = 1;
    int off = 0;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &off));
    printf("release_threshold_set %llu\n", figure(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD));
    printf("opportunistic_set %d\n", policy(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC));
    printf("set_used_current %d\n", cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero));
    printf("set_high_nonzero %d\n", cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &one));
    printf("get_unknown_attribute %d\n", cuMemPoolGetAttribute(pool, (CUmemPool_attribute)99, &threshold));
    printf("set_unknown_attribute %d\n", cuMemPoolSetAttribute(pool, (CUmemPool_attribute)99, &threshold));
    printf("get_without_value %d\n", cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, NULL));
    printf("get_unknown_pool %d\n",
           cuMemPoolGetAttribute((CUmemoryPool)&threshold, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &threshold));
}

static int command_pools(void)
{
    CUmemoryPool pool;
    printf("get_pool_before_init %d\n", cuDeviceGetMemPool(&pool, 0));
    require_primary_context(0);
    CUmemoryPool default_pool, current, created;
    CHECK(cuDeviceGetDefaultMemPool(&default_pool, 0));
    CHECK(cuDeviceGetMemPool(&current, 0));
    printf("current_is_default %d\n", current == default_pool);
    print_pool("fresh", default_pool);
    pool_settings(default_pool);

    CUdeviceptr three, one, two;
    CHECK(cuMemAllocAsync(&three, 3 * MIB, NULL));
    CHECK(cuMemAllocAsync(&one, MIB, NULL));
    print_pool("two_allocations", default_pool);
    CHECK(cuMemFreeAsync(three, NULL));
    print_pool("one_freed", default_pool);
    cuuint64_t zero = 0;
    CHECK(cuMemPoolSetAttribute(default_pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
    print_pool("used_high_reset", default_pool);
    printf("trim %d\n", cuMemPoolTrimTo(default_pool, 0));
    print_pool("trimmed", default_pool);
    printf("device_used %lld\n", used_bytes());

    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    CHECK(cuMemPoolCreate(&created, &props));
    printf("set_current %d\n", cuDeviceSetMemPool(0, created));
    CHECK(cuDeviceGetMemPool(&current, 0));
    printf("current_is_created %d\n", current == created);
    CHECK(cuMemAllocAsync(&two, 2 * MIB, NULL)); /* from the current pool, now the created one */
    printf("created_used %llu\n", figure(created, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
    printf("default_used_meanwhile %llu\n", figure(default_pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
    printf("destroy_current %d\n", cuMemPoolDestroy(created));
    CHECK(cuDeviceGetMemPool(&current, 0));
    printf("current_after_destroy_is_default %d\n", current == default_pool);
    printf("free_from_destroyed %d\n", cuMemFreeAsync(two, NULL));
    printf("set_destroyed %d\n", cuDeviceSetMemPool(0, created));
    printf("set_unknown %d\n", cuDeviceSetMemPool(0, (CUmemoryPool)&props));
    printf("set_invalid_device %d\n", cuDeviceSetMemPool(7, default_pool));
    int devices;
    CHECK(cuDeviceGetCount(&devices));
    if (devices > 1) {
        CUmemoryPool other;
        CHECK(cuDeviceGetDefaultMemPool(&other, 1));
        printf("set_other_devices_pool %d\n", cuDeviceSetMemPool(0, other));
    }
    CHECK(cuMemFreeAsync(one, NULL));
    CHECK(cuCtxSynchronize());
    print_pool("all_freed", default_pool);
    printf("device_used_at_end %lld\n", used_bytes());
    return 0;
}

/* What a pool keeps of the memory freed into it, and what gives it back: a synchronisation beyond
 * the release threshold, a trim. */
static int command_pool_reserve(void)
{
    require_primary_context(0);
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0));
    CUdeviceptr first, second;
    CUevent event;
    CHECK(cuEventCreate(&event, 0));
    CHECK(cuMemAllocAsync(&first, 64 * MIB, NULL));
    CHECK(cuMemFreeAsync(first, NULL));
    printf("freed_device %lld\n", used_bytes());
    print_pool("freed", pool);
    CHECK(cuMemAllocAsync(&second, 16 * MIB, NULL)); /* served by the reserve */
    printf("reused_device %lld\n", used_bytes());
    print_pool("reused", pool);
    CHECK(cuMemFreeAsync(second, NULL));
    CHECK(cuStreamSynchronize(NULL)); /* threshold 0: everything unused goes back */
    printf("stream_synchronised_device %lld\n", used_bytes());
    print_pool("stream_synchronised", pool);

    CHECK(cuMemAllocAsync(&first, 8 * MIB, NULL));
    CHECK(cuMemFreeAsync(first, NULL));
    CHECK(cuEventRecord(event, NULL));
    CHECK(cuEventSynchronize(event));
    printf("event_synchronised_device %lld\n", used_bytes());

    cuuint64_t keep_all = ~0ull;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    CHECK(cuMemAllocAsync(&first, 64 * MIB, NULL));
    CHECK(cuMemAllocAsync(&second, 32 * MIB, NULL));
    CHECK(cuMemFreeAsync(first, NULL));
    CHECK(cuCtxSynchronize());
    printf("kept_device %lld\n", used_bytes());
    print_pool("kept", pool);
    printf("ready 1\n");
    char line[16];
    if (!fgets(line, sizeof line, stdin)) /* the test reads NVML meanwhile */
        return 1;
    CHECK(cuMemPoolTrimTo(pool, 48 * MIB)); /* keeps 48 MiB reserved, 32 of them in use */
    print_pool("trimmed_to_48", pool);
    CHECK(cuMemPoolTrimTo(pool, 0));
    printf("trimmed_device %lld\n", used_bytes());
    print_pool("trimmed", pool);
    CHECK(cuMemFreeAsync(second, NULL));
    CHECK(cuMemPoolTrimTo(pool, 0));
    printf("end_device %lld\n", used_bytes());
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && strcmp(argv[1], "versions") == 0)
        return command_versions();
    if (argc >= 2 && strcmp(argv[1], "pool_reserve") == 0)
        return command_pool_reserve();
    if (argc >= 2 && strcmp(argv[1], "pools") == 0)
        return command_pools();
    fprintf(stderr, "usage: see the comment at the top of sim_entry_points.c\n");
    return 2;
}
