/*
 * Single-process checks of the simulated driver, written against the driver API exactly as a
 * program would use a real GPU. Each command prints "key value" lines for tests/sim to read:
 *
 *   sim_probe init                  what cuInit and NVML see: devices, names, UUIDs, sizes
 *   sim_probe sizes                 bytes each allocation family charges (pitch, VMM, arrays, ...)
 *   sim_probe memory                copies, memset, frees of unknown pointers
 *   sim_probe duration GX GY GZ BX BY BZ   a kernel's duration measured with events
 *   sim_probe launches              launch validation, cooperative limits, graphs
 *   sim_probe graph-update          the other ways to instantiate a graph, updating an executable
 *   sim_probe push-buffer N         wall time of a loop queuing N launches without waiting
 *   sim_probe proc-address          cuGetProcAddress resolution
 *   sim_probe contexts              context memory, primary retain/release, cuCtxCreate/Destroy
 *   sim_probe fork                  a forked child starts with no driver state and holds its own memory
 *   sim_probe exec                  allocate, then exec this program again ("after-exec" reports)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe_common.h"
#include "vgpu/nvml_abi.h"

static int command_init(void)
{
    CUresult init = cuInit(0);
    printf("cuInit %d\n", init);
    if (init == CUDA_SUCCESS) {
        int count;
        CHECK(cuDeviceGetCount(&count));
        printf("count %d\n", count);
        for (int i = 0; i < count; i++) {
            CUdevice device;
            char name[128];
            CUuuid uuid;
            size_t total;
            int sms, major, minor, warp, threads, threads_sm, blocks_sm, bus;
            CHECK(cuDeviceGet(&device, i));
            CHECK(cuDeviceGetName(name, sizeof name, device));
            CHECK(cuDeviceGetUuid_v2(&uuid, device));
            CHECK(cuDeviceTotalMem_v2(&total, device));
            CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device));
            CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device));
            CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device));
            CHECK(cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, device));
            CHECK(cuDeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, device));
            CHECK(cuDeviceGetAttribute(&threads_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, device));
            CHECK(cuDeviceGetAttribute(&blocks_sm, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, device));
            CHECK(cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, device));
            const unsigned char *b = (const unsigned char *)uuid.bytes;
            printf("name_%d %s\n", i, name);
            printf("uuid_%d GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", i, b[0], b[1],
                   b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
            printf("memory_%d %zu\nsms_%d %d\ncc_%d %d.%d\nwarp_%d %d\n", i, total, i, sms, i, major, minor, i, warp);
            printf("threads_per_block_%d %d\nthreads_per_sm_%d %d\nblocks_per_sm_%d %d\nbus_%d %d\n", i, threads, i,
                   threads_sm, i, blocks_sm, i, bus);
        }
    }
    nvmlReturn_t nvml = nvmlInit_v2();
    printf("nvmlInit %d\n", nvml);
    if (nvml == NVML_SUCCESS) {
        unsigned int count;
        nvmlDeviceGetCount_v2(&count);
        printf("nvml_count %u\n", count);
        for (unsigned int i = 0; i < count; i++) {
            nvmlDevice_t device;
            char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
            nvmlPciInfo_t pci;
            nvmlDeviceGetHandleByIndex_v2(i, &device);
            nvmlDeviceGetUUID(device, uuid, sizeof uuid);
            nvmlDeviceGetPciInfo_v3(device, &pci);
            printf("nvml_uuid_%u %s\nnvml_bus_%u %u\n", i, uuid, i, pci.bus);
        }
        nvmlShutdown();
    }
    return 0;
}

static int command_sizes(void)
{
    require_primary_context(0);
    long long base = used_bytes();
    CUdeviceptr p;
    size_t pitch;

    CHECK(cuMemAllocPitch_v2(&p, &pitch, 1000, 3, 4));
    printf("pitch %zu\npitch_charged %lld\n", pitch, used_bytes() - base);
    CHECK(cuMemFree_v2(p));

    CHECK(cuMemAlloc_v2(&p, 12345));
    printf("alloc_charged %lld\n", used_bytes() - base);
    CHECK(cuMemFree_v2(p));

    CHECK(cuMemAllocManaged(&p, 1 << 20, CU_MEM_ATTACH_GLOBAL));
    printf("managed_charged %lld\n", used_bytes() - base);
    CHECK(cuMemFree_v2(p));

    CHECK(cuMemAllocAsync(&p, 3 << 20, NULL));
    printf("async_charged %lld\n", used_bytes() - base);
    CHECK(cuMemFreeAsync(p, NULL));
    printf("async_freed %lld\n", used_bytes() - base); /* kept by the pool ... */
    CHECK(cuCtxSynchronize());                          /* ... until a synchronisation */
    printf("async_synchronised %lld\n", used_bytes() - base);

    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    CUmemoryPool pool, default_pool;
    CHECK(cuMemPoolCreate(&pool, &props));
    CHECK(cuMemAllocFromPoolAsync(&p, 5 << 20, pool, NULL));
    printf("pool_charged %lld\n", used_bytes() - base);
    CHECK(cuMemPoolDestroy(pool)); /* outstanding allocations stay valid */
    CHECK(cuMemFreeAsync(p, NULL));
    printf("pool_freed %lld\n", used_bytes() - base);
    CHECK(cuDeviceGetDefaultMemPool(&default_pool, 0));
    printf("default_pool_destroy %d\n", cuMemPoolDestroy(default_pool));

    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    size_t granularity;
    CUmemGenericAllocationHandle handle;
    CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    printf("vmm_granularity %zu\n", granularity);
    printf("vmm_unaligned %d\n", cuMemCreate(&handle, granularity + 4096, &prop, 0));
    CHECK(cuMemCreate(&handle, 2 * granularity, &prop, 0));
    printf("vmm_charged %lld\n", used_bytes() - base);
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, 4 * granularity, 0, 0, 0));
    CHECK(cuMemMap(va + granularity, 2 * granularity, 0, handle, 0));
    printf("vmm_copy_before_access %d\n", cuMemcpyHtoD_v2(va + granularity, "x", 1));
    CUmemAccessDesc access = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(cuMemSetAccess(va + granularity, 2 * granularity, &access, 1));
    /* A copy that straddles the middle of the mapping, and one that leaves it. */
    char out[8] = {0};
    CHECK(cuMemcpyHtoD_v2(va + 2 * granularity - 3, "vmmdata", 7));
    CHECK(cuMemcpyDtoH_v2(out, va + 2 * granularity - 3, 7));
    printf("vmm_roundtrip %s\n", out);
    printf("vmm_copy_outside %d\n", cuMemcpyHtoD_v2(va + 3 * granularity - 2, "abcd", 4));
    CHECK(cuMemRelease(handle)); /* still mapped: the memory stays */
    printf("vmm_released_mapped %lld\n", used_bytes() - base);
    CHECK(cuMemUnmap(va + granularity, 2 * granularity));
    printf("vmm_unmapped %lld\n", used_bytes() - base);
    printf("vmm_release_again %d\n", cuMemRelease(handle));
    CHECK(cuMemAddressFree(va, 4 * granularity));

    CUarray array;
    CUDA_ARRAY_DESCRIPTOR a2 = {.Width = 100, .Height = 10, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    CHECK(cuArrayCreate_v2(&array, &a2));
    printf("array2d_charged %lld\n", used_bytes() - base);
    CHECK(cuArrayDestroy(array));
    CUDA_ARRAY_DESCRIPTOR a1 = {.Width = 1000, .Height = 0, .Format = CU_AD_FORMAT_HALF, .NumChannels = 2};
    CHECK(cuArrayCreate_v2(&array, &a1));
    printf("array1d_charged %lld\n", used_bytes() - base);
    CHECK(cuArrayDestroy(array));
    CUDA_ARRAY3D_DESCRIPTOR a3 = {.Width = 64, .Height = 32, .Depth = 16, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
    CHECK(cuArray3DCreate_v2(&array, &a3));
    printf("array3d_charged %lld\n", used_bytes() - base);
    CHECK(cuArrayDestroy(array));
    printf("array_destroy_twice %d\n", cuArrayDestroy(array));
    CUmipmappedArray mipmap;
    CUDA_ARRAY3D_DESCRIPTOR m = {.Width = 64, .Height = 32, .Depth = 0, .Format = CU_AD_FORMAT_UNSIGNED_INT16, .NumChannels = 1};
    CHECK(cuMipmappedArrayCreate(&mipmap, &m, 3));
    printf("mipmap_charged %lld\n", used_bytes() - base);
    CHECK(cuMipmappedArrayDestroy(mipmap));
    printf("mipmap_too_many_levels %d\n", cuMipmappedArrayCreate(&mipmap, &m, 8));
    printf("final_charged %lld\n", used_bytes() - base);
    return 0;
}

static int command_memory(void)
{
    require_primary_context(0);
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 10ull << 30)); /* 10 GiB costs no RAM until touched */
    CHECK(cuMemsetD8_v2(p + 4096, 0x5a, 100));
    CHECK(cuMemcpyHtoD_v2(p + 4096 + 10, "hello", 5));
    unsigned char out[100];
    CHECK(cuMemcpyDtoH_v2(out, p + 4096, sizeof out));
    printf("roundtrip %s\n", memcmp(out + 10, "hello", 5) == 0 && out[0] == 0x5a && out[99] == 0x5a ? "ok" : "bad");
    printf("copy_past_end %d\n", cuMemcpyHtoD_v2(p + (10ull << 30) - 2, "abcd", 4));
    printf("copy_unknown %d\n", cuMemcpyHtoD_v2(0x1000, "abcd", 4));
    printf("free_unknown %d\n", cuMemFree_v2(0xdead0000));
    printf("free_interior %d\n", cuMemFree_v2(p + 4096));
    printf("free_zero %d\n", cuMemFree_v2(0));
    printf("free_ok %d\n", cuMemFree_v2(p));
    printf("free_twice %d\n", cuMemFree_v2(p));
    printf("free_async_unknown %d\n", cuMemFreeAsync(0xdead0000, NULL));
    printf("alloc_zero %d\n", cuMemAlloc_v2(&p, 0));
    printf("alloc_too_big %d\n", cuMemAlloc_v2(&p, 1ull << 50));
    return 0;
}

/* What launch_between_events times: a launch of `graph`, or where there is none, one launch of
 * `kernel` with `grid` and `block`. */
struct timed_work {
    CUgraphExec graph;
    CUfunction kernel;
    unsigned int grid[3], block[3];
};

/* Queues `work` between the two events of `timed`: both must sit between kernels on a busy
 * stream, so that no host time falls between them. Queues filler kernels first, and tries again
 * (a descheduled probe) until the first event had not completed when the work was queued;
 * returns whether that happened. */
static int launch_between_events(CUfunction filler, const struct timed_work *work,
                                 const struct timed_stream *timed)
{
    int attempts = 0, busy = 0;
    while (!busy && attempts++ < 100) {
        CHECK(cuStreamSynchronize(timed->stream));
        for (int i = 0; i < 20; i++)
            CHECK(cuLaunchKernel(filler, 1, 1, 1, 1024, 1, 1, 0, timed->stream, NULL, NULL));
        CHECK(cuEventRecord(timed->before, timed->stream));
        if (work->graph)
            CHECK(cuGraphLaunch(work->graph, timed->stream));
        else
            CHECK(cuLaunchKernel(work->kernel, work->grid[0], work->grid[1], work->grid[2], work->block[0],
                                 work->block[1], work->block[2], 0, timed->stream, NULL, NULL));
        CHECK(cuEventRecord(timed->after, timed->stream));
        busy = cuEventQuery(timed->before) == CUDA_ERROR_NOT_READY;
    }
    return busy;
}

/* The time between the two events, once the second has completed. */
static double elapsed_ns(const struct timed_stream *timed)
{
    float ms;
    CHECK(cuEventSynchronize(timed->after));
    CHECK(cuEventElapsedTime(&ms, timed->before, timed->after));
    return (double)ms * 1e6;
}

static int command_duration(char **argv)
{
    require_primary_context(0);
    struct timed_work work = {.kernel = load_noop()};
    for (int i = 0; i < 3; i++) {
        work.grid[i] = (unsigned int)strtoul(argv[i], NULL, 10);
        work.block[i] = (unsigned int)strtoul(argv[i + 3], NULL, 10);
    }
    struct timed_stream timed = new_timed_stream(CU_STREAM_NON_BLOCKING);
    printf("stream_was_busy %d\n", launch_between_events(work.kernel, &work, &timed));
    printf("query_before %d\n", cuEventQuery(timed.after));
    float ms;
    printf("elapsed_before %d\n", cuEventElapsedTime(&ms, timed.before, timed.after));
    double elapsed = elapsed_ns(&timed);
    printf("query_after %d\n", cuEventQuery(timed.after));
    printf("elapsed_ns %.0f\n", elapsed);
    return 0;
}

/* A graph of `kernels` launches of `blocks` blocks of 256 threads, captured on `stream`. */
static CUgraph capture(CUfunction f, CUstream stream, int kernels, unsigned int blocks)
{
    CUgraph graph;
    CHECK(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < kernels; i++)
        CHECK(cuLaunchKernel(f, blocks, 1, 1, 256, 1, 1, 0, stream, NULL, NULL));
    CHECK(cuStreamEndCapture(stream, &graph));
    return graph;
}

/* Prints "<name>_busy" and "<name>_elapsed_ns": how long a launch of `exec` lasts on the device. */
static void print_graph_duration(const char *name, CUfunction filler, CUgraphExec exec,
                                 const struct timed_stream *timed)
{
    printf("%s_busy %d\n", name, launch_between_events(filler, &(struct timed_work){.graph = exec}, timed));
    printf("%s_elapsed_ns %.0f\n", name, elapsed_ns(timed));
}

static int command_launches(void)
{
    require_primary_context(0);
    CUfunction f = load_noop();
    printf("zero_grid %d\n", cuLaunchKernel(f, 0, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    printf("zero_block %d\n", cuLaunchKernel(f, 1, 1, 1, 32, 0, 1, 0, NULL, NULL, NULL));
    printf("block_1025 %d\n", cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, NULL, NULL, NULL));
    printf("block_2d_too_many %d\n", cuLaunchKernel(f, 1, 1, 1, 64, 32, 1, 0, NULL, NULL, NULL));
    printf("block_z_65 %d\n", cuLaunchKernel(f, 1, 1, 1, 1, 1, 65, 0, NULL, NULL, NULL));
    printf("grid_y_65536 %d\n", cuLaunchKernel(f, 1, 65536, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    printf("block_1024 %d\n", cuLaunchKernel(f, 1, 1, 1, 1024, 1, 1, 0, NULL, NULL, NULL));
    void *params[1] = {NULL}, *extra[1] = {NULL};
    printf("params_and_extra %d\n", cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, extra));
    printf("null_function %d\n", cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    int sms;
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
    /* 1024-thread blocks: 2 per SM, so one wave holds 2 * sms blocks. */
    printf("cooperative_fits %d\n", cuLaunchCooperativeKernel(f, (unsigned)(2 * sms), 1, 1, 1024, 1, 1, 0, NULL, NULL));
    printf("cooperative_too_large %d\n",
           cuLaunchCooperativeKernel(f, (unsigned)(2 * sms + 1), 1, 1, 1024, 1, 1, 0, NULL, NULL));
    CUlaunchConfig config = {.gridDimX = 4, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 128, .blockDimY = 1, .blockDimZ = 1};
    printf("launch_ex %d\n", cuLaunchKernelEx(&config, f, NULL, NULL));
    config.blockDimX = 2048;
    printf("launch_ex_invalid %d\n", cuLaunchKernelEx(&config, f, NULL, NULL));
    CHECK(cuCtxSynchronize());

    /* Graphs: a capture records, it does not run; each launch of the exec runs every kernel. */
    struct timed_stream timed = new_timed_stream(0);
    CUgraphExec exec;
    printf("capture_null_stream %d\n", cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUgraph graph = capture(f, timed.stream, 5, 1);
    printf("capture_ran %d\n", cuStreamQuery(timed.stream) == CUDA_ERROR_NOT_READY);
    size_t nodes = 0;
    CHECK(cuGraphGetNodes(graph, NULL, &nodes));
    printf("graph_nodes %zu\n", nodes);
    CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    printf("graph_stream_was_busy %d\n", launch_between_events(f, &(struct timed_work){.graph = exec}, &timed));
    printf("graph_query %d\n", cuStreamQuery(timed.stream));
    printf("graph_elapsed_ns %.0f\n", elapsed_ns(&timed));
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));
    printf("graph_destroy_twice %d\n", cuGraphExecDestroy(exec) != CUDA_SUCCESS);
    return 0;
}

/* The CUDA 11 and 12 ways to instantiate a graph, and to update an executable from another graph:
 * an update in place takes the new graph's kernels (the launch after it lasts as long as they
 * do), one that changes the topology is refused and leaves the executable as it was. */
static int command_graph_update(void)
{
    require_primary_context(0);
    CUfunction f = load_noop();
    struct timed_stream timed = new_timed_stream(0);
    CUgraph small = capture(f, timed.stream, 3, 1), large = capture(f, timed.stream, 3, 2400),
           longer = capture(f, timed.stream, 4, 1);
    CUgraphExec exec, other;
    CUgraphNode error_node;
    char log[16];

    CUDA_GRAPH_INSTANTIATE_PARAMS params = {.hErrNode_out = (CUgraphNode)&params, .result_out = -1};
    printf("params_null_exec %d\n", cuGraphInstantiateWithParams(NULL, small, &params));
    printf("params_null_exec_result %d\n", params.result_out);
    printf("params_null_graph %d\n", cuGraphInstantiateWithParams(&exec, NULL, &params));
    printf("params_null_params %d\n", cuGraphInstantiateWithParams(&exec, small, NULL));
    params = (CUDA_GRAPH_INSTANTIATE_PARAMS){.hErrNode_out = (CUgraphNode)&params, .result_out = -1};
    printf("params %d\n", cuGraphInstantiateWithParams(&exec, small, &params));
    printf("params_result %d\nparams_error_node_null %d\n", params.result_out, params.hErrNode_out == NULL);
    printf("v2_null_exec %d\n", cuGraphInstantiate_v2(NULL, small, &error_node, log, sizeof log));
    printf("v2_null_graph %d\n", cuGraphInstantiate_v2(&other, NULL, &error_node, log, sizeof log));
    error_node = (CUgraphNode)&error_node;
    strcpy(log, "unset");
    printf("v2 %d\n", cuGraphInstantiate_v2(&other, small, &error_node, log, sizeof log));
    printf("v2_error_node_null %d\nv2_log_empty %d\n", error_node == NULL, log[0] == '\0');
    CHECK(cuGraphExecDestroy(other));
    printf("v2_without_outputs %d\n", cuGraphInstantiate_v2(&other, small, NULL, NULL, 0));
    CHECK(cuGraphExecDestroy(other));

    print_graph_duration("small", f, exec, &timed);
    CUgraphExecUpdateResultInfo info = {.result = -1};
    printf("update %d\n", cuGraphExecUpdate_v2(exec, large, &info));
    printf("update_result %d\n", info.result);
    print_graph_duration("updated", f, exec, &timed);

    CUgraphNode unset = (CUgraphNode)&info;
    info = (CUgraphExecUpdateResultInfo){.result = -1, .errorNode = unset, .errorFromNode = unset};
    printf("update_topology %d\n", cuGraphExecUpdate_v2(exec, longer, &info));
    printf("update_topology_result %d\n", info.result);
    printf("update_topology_nodes_null %d\n", info.errorNode == NULL && info.errorFromNode == NULL);
    print_graph_duration("refused", f, exec, &timed);

    CUgraphExecUpdateResult outcome = -1;
    error_node = (CUgraphNode)&error_node;
    printf("update_v1_topology %d\n", cuGraphExecUpdate(exec, longer, &error_node, &outcome));
    printf("update_v1_topology_result %d\nupdate_v1_error_node_null %d\n", outcome, error_node == NULL);
    printf("update_v1 %d\n", cuGraphExecUpdate(exec, small, &error_node, &outcome));
    printf("update_v1_result %d\n", outcome);
    print_graph_duration("update_v1", f, exec, &timed);

    printf("update_null_info %d\n", cuGraphExecUpdate_v2(exec, small, NULL));
    printf("update_v1_null_result %d\n", cuGraphExecUpdate(exec, small, &error_node, NULL));
    printf("update_null_exec %d\n", cuGraphExecUpdate_v2(NULL, small, &info));
    printf("update_null_graph %d\n", cuGraphExecUpdate_v2(exec, NULL, &info));
    CHECK(cuGraphExecDestroy(exec));
    printf("update_destroyed %d\n", cuGraphExecUpdate_v2(exec, small, &info));
    CHECK(cuGraphDestroy(small));
    CHECK(cuGraphDestroy(large));
    CHECK(cuGraphDestroy(longer));
    return 0;
}

static int command_push_buffer(long launches)
{
    require_primary_context(0);
    CUfunction f = load_noop();
    CUstream stream;
    CHECK(cuStreamCreate(&stream, 0));
    long long start = now_ns();
    for (long i = 0; i < launches; i++)
        CHECK(cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, stream, NULL, NULL));
    long long loop = now_ns() - start;
    CHECK(cuStreamSynchronize(stream));
    printf("loop_ns %lld\ntotal_ns %lld\n", loop, now_ns() - start);
    return 0;
}

static int command_proc_address(void)
{
    void *fn;
    CUdriverProcAddressQueryResult status;
    printf("before_init %d\n", cuGetProcAddress_v2("cuInit", &fn, 12000, 0, &status));
    printf("cuInit %d\n", fn == (void *)cuInit);
    /* Lookups as runtimes make them, each printed as "KEY 1" when it finds the variant expected. */
    const cuuint64_t ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    const struct {
        const char *key, *symbol;
        int version;
        cuuint64_t flags;
        void *expected;
    } lookups[] = {
        {"cuMemAlloc", "cuMemAlloc", 12000, 0, (void *)cuMemAlloc_v2},
        {"cuCtxCreate_12080", "cuCtxCreate", 12080, 0, (void *)cuCtxCreate_v4},
        {"cuCtxCreate_12000", "cuCtxCreate", 12000, 0, (void *)cuCtxCreate_v3},
        {"cuCtxCreate_11000", "cuCtxCreate", 11000, 0, (void *)cuCtxCreate_v2},
        {"cuLaunchKernel_ptds", "cuLaunchKernel", 12000, ptds, (void *)cuLaunchKernel_ptsz},
        {"cuMemAlloc_ptds", "cuMemAlloc", 12000, ptds, (void *)cuMemAlloc_v2},
        {"cuGetProcAddress", "cuGetProcAddress", 12000, 0, (void *)cuGetProcAddress_v2},
        {"cuDeviceGetUuid_11000", "cuDeviceGetUuid", 11000, 0, (void *)cuDeviceGetUuid},
        {"cuGraphInstantiate_12000", "cuGraphInstantiate", 12000, 0, (void *)cuGraphInstantiateWithFlags},
        {"cuGraphInstantiate_11040", "cuGraphInstantiate", 11040, 0, (void *)cuGraphInstantiate_v2},
        {"cuGraphInstantiateWithFlags_11040", "cuGraphInstantiateWithFlags", 11040, 0,
         (void *)cuGraphInstantiateWithFlags},
        {"cuGraphExecUpdate_12000", "cuGraphExecUpdate", 12000, 0, (void *)cuGraphExecUpdate_v2},
        {"cuGraphExecUpdate_11000", "cuGraphExecUpdate", 11000, 0, (void *)cuGraphExecUpdate},
    };
    for (size_t i = 0; i < sizeof lookups / sizeof lookups[0]; i++) {
        CHECK(cuGetProcAddress_v2(lookups[i].symbol, &fn, lookups[i].version, lookups[i].flags, &status));
        printf("%s %d\n", lookups[i].key, fn == lookups[i].expected);
    }
    printf("unknown %d\n", cuGetProcAddress_v2("cuNoSuchCall", &fn, 12000, 0, &status));
    printf("unknown_status %d\nunknown_fn %d\n", status, fn == NULL);
    printf("too_new %d\n", cuGetProcAddress_v2("cuMemAllocAsync", &fn, 11000, 0, &status)); /* from 11.2 */
    printf("too_new_status %d\n", status);
    const char *text;
    CHECK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &text));
    printf("error_name %s\n", text);
    CHECK(cuGetErrorString(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, &text));
    printf("error_string %s\n", text);
    printf("error_unknown %d\n", cuGetErrorName((CUresult)12345, &text));
    return 0;
}

static int command_contexts(void)
{
    CUdevice device;
    CUcontext primary_ctx, created, current;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    size_t free_bytes, total;
    printf("no_context %d\n", cuMemGetInfo_v2(&free_bytes, &total));
    CHECK(cuDevicePrimaryCtxRetain(&primary_ctx, device));
    CHECK(cuCtxSetCurrent(primary_ctx));
    printf("after_primary %lld\n", used_bytes());
    CUcontext again;
    CHECK(cuDevicePrimaryCtxRetain(&again, device));
    printf("primary_same %d\nafter_second_retain %lld\n", again == primary_ctx, used_bytes());
    CHECK(cuCtxCreate_v2(&created, 0, device));
    CHECK(cuCtxGetCurrent(&current));
    printf("created_is_current %d\nafter_create %lld\n", current == created, used_bytes());
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 1 << 20));
    printf("after_alloc_in_created %lld\n", used_bytes());
    CHECK(cuCtxDestroy_v2(created)); /* frees what it allocated, too */
    CHECK(cuCtxGetCurrent(&current));
    printf("popped_to_primary %d\n", current == primary_ctx);
    printf("after_destroy %lld\n", used_bytes());
    printf("destroy_twice %d\n", cuCtxDestroy_v2(created));
    printf("use_destroyed %d\n", cuCtxSetCurrent(created));
    int active;
    unsigned int flags;
    CHECK(cuDevicePrimaryCtxRelease_v2(device));
    CHECK(cuDevicePrimaryCtxGetState(device, &flags, &active));
    printf("active_after_one_release %d\n", active);
    CHECK(cuDevicePrimaryCtxRelease_v2(device));
    CHECK(cuDevicePrimaryCtxGetState(device, &flags, &active));
    printf("active_after_last_release %d\n", active);
    printf("release_unretained %d\n", cuDevicePrimaryCtxRelease_v2(device));
    printf("alloc_in_released %d\n", cuMemAlloc_v2(&p, 1 << 20));
    CHECK(cuDevicePrimaryCtxRetain(&primary_ctx, device));
    CHECK(cuCtxSetCurrent(primary_ctx));
    CHECK(cuMemAlloc_v2(&p, 1 << 20));
    printf("before_reset %lld\n", used_bytes());
    CHECK(cuDevicePrimaryCtxReset_v2(device));
    CHECK(cuDevicePrimaryCtxRetain(&primary_ctx, device));
    CHECK(cuCtxSetCurrent(primary_ctx));
    printf("after_reset %lld\n", used_bytes());
    return 0;
}

static int command_fork(void)
{
    require_primary_context(0);
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 64 << 20));
    pid_t child = fork();
    if (child == 0) {
        CUdeviceptr q;
        printf("child_before_init %d\n", cuMemAlloc_v2(&q, 1 << 20));
        require_primary_context(0);
        CHECK(cuMemAlloc_v2(&q, 32 << 20));
        printf("child_sees %lld\n", used_bytes());
        exit(0); /* as a normal exit: its memory goes back */
    }
    int status;
    waitpid(child, &status, 0);
    printf("child_status %d\nparent_after_child %lld\n", status, used_bytes());
    return 0;
}

static int command_exec(void)
{
    require_primary_context(0);
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 100 << 20));
    printf("before_exec %lld\n", used_bytes());
    fflush(stdout);
    execl("/proc/self/exe", "/proc/self/exe", "after-exec", (char *)NULL);
    return 4;
}

/* The same pid and start time as before the exec: what that image held is gone. */
static int command_after_exec(void)
{
    require_primary_context(0);
    printf("after_exec %lld\n", used_bytes());
    return 0;
}

/* The commands that take no argument, by name. */
static const struct {
    const char *name;
    int (*run)(void);
} PLAIN_COMMANDS[] = {
    {"init", command_init},
    {"sizes", command_sizes},
    {"memory", command_memory},
    {"launches", command_launches},
    {"graph-update", command_graph_update},
    {"proc-address", command_proc_address},
    {"contexts", command_contexts},
    {"fork", command_fork},
    {"exec", command_exec},
    {"after-exec", command_after_exec},
};

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 8 && strcmp(argv[1], "duration") == 0)
        return command_duration(argv + 2);
    if (argc == 3 && strcmp(argv[1], "push-buffer") == 0)
        return command_push_buffer(atol(argv[2]));
    for (size_t i = 0; argc >= 2 && i < sizeof PLAIN_COMMANDS / sizeof PLAIN_COMMANDS[0]; i++)
        if (strcmp(argv[1], PLAIN_COMMANDS[i].name) == 0)
            return PLAIN_COMMANDS[i].run();
    fprintf(stderr, "usage: see the comment at the top of sim_probe.c\n");
    return 2;
}
