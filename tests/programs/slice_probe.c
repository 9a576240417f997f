/*
 * Drives the driver API the way a program in a slice does, one command per argument, through
 * one of the three ways a program reaches the driver, and prints one line per command so a
 * test can check what the slice allowed and what it reported.
 *
 *   slice_probe [--path=direct|dlsym|procaddr|procaddr_ptsz] COMMAND...
 *
 * --path: how the memory entry points are obtained: linked directly (default); dlopen +
 * dlsym of the exact names; cuGetProcAddress_v2 by base name (as CUDA 12 runtimes do), with
 * the per-thread-default-stream flag for procaddr_ptsz. Context set-up always links directly.
 *
 * Commands (BYTES takes K/M/G suffixes, binary):
 *   init                  cuInit, primary context of device 0, made current  -> "init RC"
 *   ctx                   cuCtxCreate_v2 on device 0, made current           -> "ctx RC"
 *   ctx-destroy           cuCtxDestroy_v2 of that context, primary made current -> "ctx-destroy RC"
 *   primary-reset         cuDevicePrimaryCtxReset_v2 of device 0, then retained and made current
 *                                                                            -> "primary-reset RC"
 *   alloc:BYTES managed:BYTES async:BYTES pool:BYTES vmm:BYTES
 *   pitch:WIDTH:HEIGHT array:WIDTH:HEIGHT array3d:WIDTH:HEIGHT:DEPTH mipmap:WIDTH:HEIGHT:LEVELS
 *                         allocate; -> "KIND RC INDEX" (INDEX names it for free:, -1 if refused)
 *                         pitch prints "pitch RC INDEX PITCH"
 *   free:INDEX            free with the call matching its family             -> "free RC"
 *   sync                  cuCtxSynchronize (pools give back what is beyond their threshold) -> "sync RC"
 *   keep-pool             the default pool's release threshold set to keep everything -> "keep-pool RC"
 *   trim                  cuMemPoolTrimTo(default pool of device 0, 0)       -> "trim RC"
 *   free-unknown          cuMemFree_v2 of a pointer nobody allocated         -> "free-unknown RC"
 *   info                  cuMemGetInfo_v2                                    -> "info RC FREE TOTAL"
 *   total                 cuDeviceTotalMem_v2 of device 0                    -> "total RC BYTES"
 *   ptsz-variant          whether cuMemAllocAsync/cuMemFreeAsync obtained are the _ptsz hooks
 *                                                                            -> "ptsz-variant A F"
 *   wait                  prints "wait", then reads one line from stdin
 *   exec                  replaces this program with a fresh one running the remaining commands
 *                         (same pid, new image)                              -> "exec"
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "probe_common.h"

#define DECLARE_PFN(ret, name, params) typedef ret(*pfn_##name) params;
VGPU_CUDA_ENTRY_POINTS(DECLARE_PFN)
#undef DECLARE_PFN

/* The memory entry points, as the chosen path obtained them. */
#define PROBED_ENTRY_POINTS(X)                                                                     \
    X(cuMemAlloc_v2, "cuMemAlloc")                                                                 \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch")                                                       \
    X(cuMemAllocManaged, "cuMemAllocManaged")                                                      \
    X(cuMemAllocAsync, "cuMemAllocAsync")                                                          \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync")                                          \
    X(cuMemFree_v2, "cuMemFree")                                                                   \
    X(cuMemFreeAsync, "cuMemFreeAsync")                                                            \
    X(cuMemCreate, "cuMemCreate")                                                                  \
    X(cuMemRelease, "cuMemRelease")                                                                \
    X(cuArrayCreate_v2, "cuArrayCreate")                                                           \
    X(cuArray3DCreate_v2, "cuArray3DCreate")                                                       \
    X(cuArrayDestroy, "cuArrayDestroy")                                                            \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate")                                            \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy")                                          \
    X(cuMemGetInfo_v2, "cuMemGetInfo")                                                             \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem")

static struct api {
#define FIELD(name, base) pfn_##name name;
    PROBED_ENTRY_POINTS(FIELD)
#undef FIELD
} api;

enum family { F_DEVICE, F_ASYNC, F_VMM, F_ARRAY, F_MIPMAP };
struct held {
    enum family family;
    unsigned long long handle;
};
static struct held held[4096];
static int held_count;
static CUcontext created_context;

static void *driver_handle(void)
{
    void *handle = dlopen("libcuda.so.1", RTLD_NOW);
    if (!handle) {
        fprintf(stderr, "slice_probe: dlopen libcuda.so.1: %s\n", dlerror());
        exit(3);
    }
    return handle;
}

static void resolve(const char *path)
{
    if (strcmp(path, "direct") == 0) {
#define DIRECT(name, base) api.name = name;
        PROBED_ENTRY_POINTS(DIRECT)
#undef DIRECT
        return;
    }
    void *handle = driver_handle();
    if (strcmp(path, "dlsym") == 0) {
#define BY_DLSYM(name, base) api.name = (pfn_##name)dlsym(handle, #name);
        PROBED_ENTRY_POINTS(BY_DLSYM)
#undef BY_DLSYM
        return;
    }
    int ptsz = strcmp(path, "procaddr_ptsz") == 0;
    if (!ptsz && strcmp(path, "procaddr") != 0) {
        fprintf(stderr, "slice_probe: unknown path %s\n", path);
        exit(2);
    }
    /* As a CUDA 12 runtime: cuGetProcAddress_v2 by name, then everything through the
     * cuGetProcAddress it returns for itself. */
    pfn_cuGetProcAddress_v2 first = (pfn_cuGetProcAddress_v2)dlsym(handle, "cuGetProcAddress_v2");
    pfn_cuGetProcAddress_v2 get = NULL;
    CUdriverProcAddressQueryResult status;
    if (!first || first("cuGetProcAddress", (void **)&get, CUDA_VERSION_SUPPORTED, 0, &status) != CUDA_SUCCESS || !get) {
        fprintf(stderr, "slice_probe: no cuGetProcAddress\n");
        exit(3);
    }
    cuuint64_t flags = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
#define BY_PROCADDR(name, base)                                                                    \
    if (get(base, (void **)&api.name, CUDA_VERSION_SUPPORTED, flags, &status) != CUDA_SUCCESS)      \
        api.name = NULL;
    PROBED_ENTRY_POINTS(BY_PROCADDR)
#undef BY_PROCADDR
}

/* The numeric fields after "name:" in a command. */
static int fields(const char *command, unsigned long long *out, int max)
{
    int count = 0;
    for (const char *p = strchr(command, ':'); p && count < max; p = strchr(p + 1, ':'))
        out[count++] = parse_bytes(p + 1);
    return count;
}

static int keep(enum family family, unsigned long long handle)
{
    if (held_count == (int)(sizeof held / sizeof held[0]))
        exit(4);
    held[held_count] = (struct held){family, handle};
    return held_count++;
}

static void report_allocation(const char *kind, CUresult result, enum family family, unsigned long long handle)
{
    printf("%s %d %d\n", kind, result, result == CUDA_SUCCESS ? keep(family, handle) : -1);
}

#define STARTS(command, prefix) (strncmp(command, prefix ":", sizeof prefix) == 0)

static CUresult release(struct held *h)
{
    switch (h->family) {
    case F_DEVICE: return api.cuMemFree_v2(h->handle);
    case F_ASYNC: return api.cuMemFreeAsync(h->handle, NULL);
    case F_VMM: return api.cuMemRelease(h->handle);
    case F_ARRAY: return api.cuArrayDestroy((CUarray)(uintptr_t)h->handle);
    case F_MIPMAP: return api.cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)h->handle);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static void run(const char *command)
{
    unsigned long long f[3] = {0, 0, 0};
    fields(command, f, 3);
    CUcontext primary;
    if (strcmp(command, "init") == 0) {
        printf("init %d\n", use_primary_context(0, &primary));
    } else if (strcmp(command, "ctx") == 0) {
        CUresult result = cuCtxCreate_v2(&created_context, 0, 0);
        if (result == CUDA_SUCCESS)
            result = cuCtxSetCurrent(created_context);
        printf("ctx %d\n", result);
    } else if (strcmp(command, "ctx-destroy") == 0) {
        CUresult result = cuCtxDestroy_v2(created_context);
        printf("ctx-destroy %d\n", result == CUDA_SUCCESS ? use_primary_context(0, &primary) : result);
    } else if (strcmp(command, "primary-reset") == 0) {
        CUresult result = cuDevicePrimaryCtxReset_v2(0);
        printf("primary-reset %d\n", result == CUDA_SUCCESS ? use_primary_context(0, &primary) : result);
    } else if (STARTS(command, "alloc")) {
        CUdeviceptr p = 0;
        CUresult result = api.cuMemAlloc_v2(&p, f[0]);
        report_allocation("alloc", result, F_DEVICE, p);
    } else if (STARTS(command, "managed")) {
        CUdeviceptr p = 0;
        CUresult result = api.cuMemAllocManaged(&p, f[0], CU_MEM_ATTACH_GLOBAL);
        report_allocation("managed", result, F_DEVICE, p);
    } else if (STARTS(command, "async")) {
        CUdeviceptr p = 0;
        CUresult result = api.cuMemAllocAsync(&p, f[0], NULL);
        report_allocation("async", result, F_ASYNC, p);
    } else if (STARTS(command, "pool")) {
        CUdeviceptr p = 0;
        CUmemoryPool pool = NULL;
        CUresult result = cuDeviceGetDefaultMemPool(&pool, 0);
        if (result == CUDA_SUCCESS)
            result = api.cuMemAllocFromPoolAsync(&p, f[0], pool, NULL);
        report_allocation("pool", result, F_ASYNC, p);
    } else if (STARTS(command, "vmm")) {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        CUmemGenericAllocationHandle handle = 0;
        CUresult result = api.cuMemCreate(&handle, f[0], &prop, 0);
        report_allocation("vmm", result, F_VMM, handle);
    } else if (STARTS(command, "pitch")) {
        CUdeviceptr p = 0;
        size_t pitch = 0;
        CUresult result = api.cuMemAllocPitch_v2(&p, &pitch, f[0], f[1], 4);
        int index = result == CUDA_SUCCESS ? keep(F_DEVICE, p) : -1;
        printf("pitch %d %d %zu\n", result, index, pitch);
    } else if (STARTS(command, "array")) {
        CUDA_ARRAY_DESCRIPTOR d = {.Width = f[0], .Height = f[1], .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUarray array = NULL;
        CUresult result = api.cuArrayCreate_v2(&array, &d);
        report_allocation("array", result, F_ARRAY, (uintptr_t)array);
    } else if (STARTS(command, "array3d")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = f[0], .Height = f[1], .Depth = f[2], .Format = CU_AD_FORMAT_FLOAT,
                                     .NumChannels = 1};
        CUarray array = NULL;
        CUresult result = api.cuArray3DCreate_v2(&array, &d);
        report_allocation("array3d", result, F_ARRAY, (uintptr_t)array);
    } else if (STARTS(command, "mipmap")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = f[0], .Height = f[1], .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUmipmappedArray array = NULL;
        CUresult result = api.cuMipmappedArrayCreate(&array, &d, (unsigned int)f[2]);
        report_allocation("mipmap", result, F_MIPMAP, (uintptr_t)array);
    } else if (STARTS(command, "free")) {
        int index = (int)f[0];
        printf("free %d\n", index < held_count ? release(&held[index]) : CUDA_ERROR_INVALID_VALUE);
    } else if (strcmp(command, "sync") == 0) {
        printf("sync %d\n", cuCtxSynchronize());
    } else if (strcmp(command, "keep-pool") == 0) {
        CUmemoryPool pool = NULL;
        cuuint64_t keep_all = ~0ull;
        CUresult result = cuDeviceGetDefaultMemPool(&pool, 0);
        if (result == CUDA_SUCCESS)
            result = cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all);
        printf("keep-pool %d\n", result);
    } else if (strcmp(command, "trim") == 0) {
        CUmemoryPool pool = NULL;
        CUresult result = cuDeviceGetDefaultMemPool(&pool, 0);
        printf("trim %d\n", result == CUDA_SUCCESS ? cuMemPoolTrimTo(pool, 0) : result);
    } else if (strcmp(command, "free-unknown") == 0) {
        printf("free-unknown %d\n", api.cuMemFree_v2((CUdeviceptr)0xdead0000ULL));
    } else if (strcmp(command, "info") == 0) {
        size_t free_bytes = 0, total = 0;
        CUresult result = api.cuMemGetInfo_v2(&free_bytes, &total);
        printf("info %d %zu %zu\n", result, free_bytes, total);
    } else if (strcmp(command, "total") == 0) {
        size_t bytes = 0;
        CUresult result = api.cuDeviceTotalMem_v2(&bytes, 0);
        printf("total %d %zu\n", result, bytes);
    } else if (strcmp(command, "ptsz-variant") == 0) {
        void *handle = driver_handle();
        printf("ptsz-variant %d %d\n", (void *)api.cuMemAllocAsync == dlsym(handle, "cuMemAllocAsync_ptsz"),
               (void *)api.cuMemFreeAsync == dlsym(handle, "cuMemFreeAsync_ptsz"));
    } else if (strcmp(command, "wait") == 0) {
        char line[64];
        printf("wait\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            exit(0);
    } else {
        fprintf(stderr, "slice_probe: unknown command %s\n", command);
        exit(2);
    }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int first;
    const char *path = path_option(argc, argv, &first);
    resolve(path);
#define REQUIRE(name, base)                                                                        \
    if (!api.name) {                                                                               \
        fprintf(stderr, "slice_probe: %s not found through %s\n", #name, path);                    \
        return 3;                                                                                  \
    }
    PROBED_ENTRY_POINTS(REQUIRE)
#undef REQUIRE
    for (int i = first; i < argc; i++) {
        if (strcmp(argv[i], "exec") == 0) {
            printf("exec\n");
            fflush(stdout);
            char path_option[64];
            snprintf(path_option, sizeof path_option, "--path=%s", path);
            char *next[argc + 2];
            int count = 0;
            next[count++] = argv[0];
            next[count++] = path_option;
            for (int j = i + 1; j < argc; j++)
                next[count++] = argv[j];
            next[count] = NULL;
            execv("/proc/self/exe", next);
            return 5;
        }
        run(argv[i]);
    }
    return 0;
}
