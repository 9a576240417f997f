/*
 * A program under two interposers at once (tests/interposer/test_coexistence.py): libvgpu.so and
 * a stand-in for HAMi-core (hami_standin.c), also named libvgpu.so. Runs one command per
 * argument and prints one line per command.
 *
 *   coexist_probe [--path=direct|dlsym|procaddr] COMMAND...
 *
 * --path: how cuMemAlloc_v2, cuMemFree_v2 and cuMemGetInfo_v2 are obtained: linked directly
 * (default); dlopen("libcuda.so.1") + dlsym; or cuGetProcAddress_v2 by base name, then through
 * the cuGetProcAddress it returns for itself (as CUDA 12 runtimes do).
 *
 * Commands (BYTES takes K/M/G suffixes, binary):
 *   maps          every mapped file named libvgpu.so      -> "maps N PATH..." (N distinct paths)
 *   init          cuInit, primary context of device 0, made current      -> "init RC"
 *   alloc:BYTES   cuMemAlloc_v2                                          -> "alloc RC"
 *   free          cuMemFree_v2 of every allocation that succeeded       -> "free RC" (first failure)
 *   info          cuMemGetInfo_v2                                        -> "info RC FREE TOTAL"
 *   nvml          nvmlInit_v2, device 0, nvmlDeviceGetMemoryInfo         -> "nvml RC FREE TOTAL"
 *   standin       what the stand-in saw, if it is loaded -> "standin CAP USED ALLOC FREE INFO NVML
 *                 PROCADDR REFUSED", or "standin absent"
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe_common.h"
#include "vgpu/nvml_abi.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*info_fn)(size_t *, size_t *);
typedef CUresult (*procaddr_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef void (*state_fn)(unsigned long long *, unsigned long long *, long[6]);

static alloc_fn api_alloc;
static free_fn api_free;
static info_fn api_info;
static CUdeviceptr held[256];
static int held_count;

static void fail(const char *what)
{
    fprintf(stderr, "coexist_probe: %s\n", what);
    exit(3);
}

static void resolve(const char *path)
{
    if (strcmp(path, "direct") == 0) {
        api_alloc = cuMemAlloc_v2;
        api_free = cuMemFree_v2;
        api_info = cuMemGetInfo_v2;
        return;
    }
    void *driver = dlopen("libcuda.so.1", RTLD_NOW);
    if (!driver)
        fail("dlopen libcuda.so.1");
    if (strcmp(path, "dlsym") == 0) {
        api_alloc = (alloc_fn)dlsym(driver, "cuMemAlloc_v2");
        api_free = (free_fn)dlsym(driver, "cuMemFree_v2");
        api_info = (info_fn)dlsym(driver, "cuMemGetInfo_v2");
    } else if (strcmp(path, "procaddr") == 0) {
        procaddr_fn first = (procaddr_fn)dlsym(driver, "cuGetProcAddress_v2");
        procaddr_fn get = NULL;
        CUdriverProcAddressQueryResult status;
        if (!first || first("cuGetProcAddress", (void **)&get, CUDA_VERSION_SUPPORTED, 0, &status) != CUDA_SUCCESS ||
            !get)
            fail("no cuGetProcAddress");
        if (get("cuMemAlloc", (void **)&api_alloc, CUDA_VERSION_SUPPORTED, 0, &status) != CUDA_SUCCESS ||
            get("cuMemFree", (void **)&api_free, CUDA_VERSION_SUPPORTED, 0, &status) != CUDA_SUCCESS ||
            get("cuMemGetInfo", (void **)&api_info, CUDA_VERSION_SUPPORTED, 0, &status) != CUDA_SUCCESS)
            fail("cuGetProcAddress_v2 failed");
    } else {
        fail("unknown path");
    }
    if (!api_alloc || !api_free || !api_info)
        fail("an entry point is missing");
}

/* The distinct paths of mapped files whose name is libvgpu.so, from /proc/self/maps. */
static void print_maps(void)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps)
        fail("/proc/self/maps");
    char line[4096], paths[8][4096];
    int count = 0;
    while (fgets(line, sizeof line, maps)) {
        line[strcspn(line, "\n")] = '\0';
        char *path = strchr(line, '/');
        const char *slash = path ? strrchr(path, '/') : NULL;
        if (!slash || strcmp(slash, "/libvgpu.so") != 0)
            continue;
        int seen = 0;
        for (int i = 0; i < count && !seen; i++)
            seen = strcmp(paths[i], path) == 0;
        if (!seen && count < 8)
            snprintf(paths[count++], sizeof paths[0], "%s", path);
    }
    fclose(maps);
    printf("maps %d", count);
    for (int i = 0; i < count; i++)
        printf(" %s", paths[i]);
    printf("\n");
}

static void run(const char *command)
{
    if (strcmp(command, "maps") == 0) {
        print_maps();
    } else if (strcmp(command, "init") == 0) {
        CUcontext context;
        printf("init %d\n", use_primary_context(0, &context));
    } else if (strncmp(command, "alloc:", 6) == 0) {
        CUdeviceptr pointer = 0;
        CUresult result = api_alloc(&pointer, parse_bytes(command + 6));
        if (result == CUDA_SUCCESS && held_count < (int)(sizeof held / sizeof held[0]))
            held[held_count++] = pointer;
        printf("alloc %d\n", result);
    } else if (strcmp(command, "free") == 0) {
        CUresult first_failure = CUDA_SUCCESS;
        for (int i = 0; i < held_count; i++) {
            CUresult result = api_free(held[i]);
            if (result != CUDA_SUCCESS && first_failure == CUDA_SUCCESS)
                first_failure = result;
        }
        held_count = 0;
        printf("free %d\n", first_failure);
    } else if (strcmp(command, "info") == 0) {
        size_t free_bytes = 0, total = 0;
        CUresult result = api_info(&free_bytes, &total);
        printf("info %d %zu %zu\n", result, free_bytes, total);
    } else if (strcmp(command, "nvml") == 0) {
        nvmlDevice_t device;
        nvmlMemory_t memory = {0};
        nvmlReturn_t result = nvmlInit_v2();
        if (result == NVML_SUCCESS)
            result = nvmlDeviceGetHandleByIndex_v2(0, &device);
        if (result == NVML_SUCCESS)
            result = nvmlDeviceGetMemoryInfo(device, &memory);
        printf("nvml %d %llu %llu\n", result, memory.free, memory.total);
    } else if (strcmp(command, "standin") == 0) {
        state_fn state = (state_fn)dlsym(RTLD_DEFAULT, "hami_standin_state");
        if (!state) {
            printf("standin absent\n");
            return;
        }
        unsigned long long cap, used;
        long counts[6];
        state(&cap, &used, counts);
        printf("standin %llu %llu %ld %ld %ld %ld %ld %ld\n", cap, used, counts[0], counts[1], counts[2], counts[3],
               counts[4], counts[5]);
    } else {
        fail("unknown command");
    }
}

int main(int argc, char **argv)
{
    int first;
    const char *path = path_option(argc, argv, &first);
    resolve(path);
    for (int i = first; i < argc; i++) {
        run(argv[i]);
        fflush(stdout);
    }
    return 0;
}
