/*
 * A stand-in for HAMi-core's libvgpu.so, for tests/interposer/test_coexistence.py: on Kubernetes
 * with HAMi, HAMi-core is loaded into every container process through /etc/ld.so.preload, after
 * the libraries of LD_PRELOAD (ours). The tests build this file as a shared library literally
 * named libvgpu.so, in a folder of its own.
 *
 * Like HAMi-core it caps device memory at $CUDA_DEVICE_MEMORY_LIMIT (HAMi's format: a number with
 * an optional k/m/g suffix, binary: "1024m", "2g"; unset or 0: no cap), by exporting the driver's
 * and NVML's entry points (symbol interposition) and forwarding to the next definition:
 *   cuMemAlloc_v2      refused with CUDA_ERROR_OUT_OF_MEMORY past the cap (one line on stderr,
 *                      "hami_standin: OOM ..."), else forwarded and counted;
 *   cuMemFree_v2       forwarded, and what it allocated given back;
 *   cuMemGetInfo_v2    total = the cap, free = the cap less what it counts (as HAMi-core reports);
 *   nvmlDeviceGetMemoryInfo  the same figures in NVML's struct;
 *   cuGetProcAddress_v2  its own hooks for "cuMemAlloc", "cuMemFree" and "cuGetProcAddress", as
 *                      HAMi-core's does; for anything else what the next definition answers, the
 *                      driver's own entry point for "cuMemGetInfo" included (HAMi-core built
 *                      without HOOK_MEMINFO_ENABLE hands that one out unwrapped, though it exports
 *                      a cuMemGetInfo_v2 wrapper).
 *
 * Real entry points are found the way $HAMI_STANDIN_RESOLVE says:
 *   handle (default)   as HAMi-core's load_cuda_libraries: the real dlsym (dlvsym of "dlsym" from
 *                      RTLD_NEXT) on dlopen("libcuda.so.1") / dlopen("libnvidia-ml.so.1"), then
 *                      the real dlsym(RTLD_NEXT, name) for names the library lacks;
 *   rtld_next          plain dlsym(RTLD_NEXT, name), bound like any caller's to the first dlsym
 *                      of the process (libvgpu.so's, which comes before this library), as
 *                      simpler interposers do.
 * HAMi-core's own `dlsym` override is left out: libvgpu.so's comes first in the search order, so
 * no caller binds to it.
 *
 * A hook entered again on the same thread while it runs (a forwarding loop between two
 * interposers) prints "hami_standin: re-entered NAME" and aborts, instead of running out of
 * stack. `hami_standin_state` (exported) tells a program what the stand-in saw.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpu/cuda_abi.h"
#include "vgpu/nvml_abi.h"

#define EXPORT __attribute__((visibility("default")))

typedef void *(*dlsym_fn)(void *, const char *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*info_fn)(size_t *, size_t *);
typedef CUresult (*procaddr_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef nvmlReturn_t (*nvml_info_fn)(nvmlDevice_t, nvmlMemory_t *);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long cap;
static unsigned long long used;
static struct {
    long alloc, free, info, nvml, procaddr, refused;
} calls;
static struct {
    CUdeviceptr pointer;
    size_t bytes;
} held[1024];

static struct {
    alloc_fn alloc;
    free_fn free;
    info_fn info;
    procaddr_fn procaddr;
    nvml_info_fn nvml;
} real;

/* HAMi-core's limit format: digits, then an optional k/m/g (either case), binary units. */
static unsigned long long parse_limit(const char *text)
{
    if (!text || !*text)
        return 0;
    char *end;
    unsigned long long value = strtoull(text, &end, 10);
    switch (*end) {
    case 'k': case 'K': return value << 10;
    case 'm': case 'M': return value << 20;
    case 'g': case 'G': return value << 30;
    default: return value;
    }
}

static dlsym_fn libc_dlsym(void)
{
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        void *found = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
        if (found)
            return (dlsym_fn)found;
    }
    return NULL;
}

static void *next_definition(void *library, dlsym_fn lookup, const char *name)
{
    void *found = library && lookup ? lookup(library, name) : NULL;
    if (!found && lookup)
        found = lookup(RTLD_NEXT, name);
    return found;
}

static void initialise(void)
{
    cap = parse_limit(getenv("CUDA_DEVICE_MEMORY_LIMIT"));
    const char *mode = getenv("HAMI_STANDIN_RESOLVE");
    if (mode && strcmp(mode, "rtld_next") == 0) {
        real.alloc = (alloc_fn)dlsym(RTLD_NEXT, "cuMemAlloc_v2");
        real.free = (free_fn)dlsym(RTLD_NEXT, "cuMemFree_v2");
        real.info = (info_fn)dlsym(RTLD_NEXT, "cuMemGetInfo_v2");
        real.procaddr = (procaddr_fn)dlsym(RTLD_NEXT, "cuGetProcAddress_v2");
        real.nvml = (nvml_info_fn)dlsym(RTLD_NEXT, "nvmlDeviceGetMemoryInfo");
    } else {
        dlsym_fn lookup = libc_dlsym();
        void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NODELETE);
        void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NODELETE);
        real.alloc = (alloc_fn)next_definition(cuda, lookup, "cuMemAlloc_v2");
        real.free = (free_fn)next_definition(cuda, lookup, "cuMemFree_v2");
        real.info = (info_fn)next_definition(cuda, lookup, "cuMemGetInfo_v2");
        real.procaddr = (procaddr_fn)next_definition(cuda, lookup, "cuGetProcAddress_v2");
        real.nvml = (nvml_info_fn)next_definition(nvml, lookup, "nvmlDeviceGetMemoryInfo");
    }
}

/* Entered/left around every hook: a second entry on one thread is a forwarding loop. */
static _Thread_local const char *running;

static void enter(const char *name)
{
    if (running) {
        fprintf(stderr, "hami_standin: re-entered %s (inside %s)\n", name, running);
        fflush(stderr);
        abort();
    }
    running = name;
    pthread_once(&once, initialise);
}

static void leave(void)
{
    running = NULL;
}

EXPORT void hami_standin_state(unsigned long long *cap_out, unsigned long long *used_out, long counts[6])
{
    pthread_mutex_lock(&lock);
    *cap_out = cap;
    *used_out = used;
    long copy[6] = {calls.alloc, calls.free, calls.info, calls.nvml, calls.procaddr, calls.refused};
    memcpy(counts, copy, sizeof copy);
    pthread_mutex_unlock(&lock);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    enter("cuMemAlloc_v2");
    CUresult result = CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    calls.alloc++;
    int refused = cap && used + bytesize > cap;
    if (refused) {
        calls.refused++;
        fprintf(stderr, "hami_standin: OOM cuMemAlloc_v2 asked for %zu bytes, %llu of %llu used\n", bytesize, used,
                cap);
        result = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (real.alloc) {
        result = real.alloc(dptr, bytesize);
        if (result == CUDA_SUCCESS) {
            for (size_t i = 0; i < sizeof held / sizeof held[0]; i++) {
                if (!held[i].pointer) {
                    held[i].pointer = *dptr;
                    held[i].bytes = bytesize;
                    used += bytesize;
                    break;
                }
            }
        }
    }
    pthread_mutex_unlock(&lock);
    leave();
    return result;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    enter("cuMemFree_v2");
    pthread_mutex_lock(&lock);
    calls.free++;
    CUresult result = real.free ? real.free(dptr) : CUDA_ERROR_NOT_INITIALIZED;
    for (size_t i = 0; result == CUDA_SUCCESS && dptr && i < sizeof held / sizeof held[0]; i++) {
        if (held[i].pointer == dptr) {
            used -= held[i].bytes;
            held[i].pointer = 0;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    leave();
    return result;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    enter("cuMemGetInfo_v2");
    CUresult result = real.info ? real.info(free, total) : CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    calls.info++;
    if (result == CUDA_SUCCESS && cap && free && total) {
        *total = cap;
        *free = used < cap ? cap - used : 0;
    }
    pthread_mutex_unlock(&lock);
    leave();
    return result;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    enter("nvmlDeviceGetMemoryInfo");
    nvmlReturn_t result = real.nvml ? real.nvml(device, memory) : NVML_ERROR_UNINITIALIZED;
    pthread_mutex_lock(&lock);
    calls.nvml++;
    if (result == NVML_SUCCESS && cap && memory) {
        memory->total = cap;
        memory->used = used;
        memory->free = used < cap ? cap - used : 0;
    }
    pthread_mutex_unlock(&lock);
    leave();
    return result;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *symbolStatus)
{
    enter("cuGetProcAddress_v2");
    CUresult result = real.procaddr ? real.procaddr(symbol, pfn, cudaVersion, flags, symbolStatus)
                                    : CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    calls.procaddr++;
    pthread_mutex_unlock(&lock);
    if (result == CUDA_SUCCESS && symbol && pfn && *pfn) {
        if (strcmp(symbol, "cuMemAlloc") == 0)
            *pfn = (void *)cuMemAlloc_v2;
        else if (strcmp(symbol, "cuMemFree") == 0)
            *pfn = (void *)cuMemFree_v2;
        else if (strcmp(symbol, "cuGetProcAddress") == 0)
            *pfn = (void *)cuGetProcAddress_v2;
    }
    leave();
    return result;
}
