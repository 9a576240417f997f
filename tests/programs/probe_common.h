/*
 * What the C programs of tests/programs and benchmarks/ share: each drives the driver API as a
 * program on a real GPU does, and most stop at the first call that fails, naming it. Header only
 * (static functions), so that each program still builds from its one .c file.
 */
#ifndef VGPU_PROBE_COMMON_H
#define VGPU_PROBE_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vgpu/cuda_abi.h"

/* An empty kernel, real PTX, so that the programs also run on a real GPU. */
static const char NOOP_PTX[] = ".version 7.0\n.target sm_50\n.address_size 64\n"
                               ".visible .entry noop()\n{\n\tret;\n}\n";

/* Exits 3 with the call's text and result unless it succeeds: CUDA and NVML calls both return
 * 0 for success. */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        int check_ = (int)(call);                                                                  \
        if (check_ != 0) {                                                                         \
            fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, check_);          \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)

static inline long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A size as the probes' commands take it: a number of bytes, or of KiB, MiB, GiB with K, M, G. */
static inline unsigned long long parse_bytes(const char *text)
{
    char *end;
    unsigned long long value = strtoull(text, &end, 10);
    switch (*end) {
    case 'K': return value << 10;
    case 'M': return value << 20;
    case 'G': return value << 30;
    default: return value;
    }
}

/* The option --path=WAY a probe may take before its commands (how it obtains the driver's entry
 * points): WAY, or "direct" without it; *first is the index in argv of the first command. */
static inline const char *path_option(int argc, char **argv, int *first)
{
    *first = 1;
    if (argc > 1 && strncmp(argv[1], "--path=", 7) == 0) {
        *first = 2;
        return argv[1] + 7;
    }
    return "direct";
}

/* How a program starts on device `ordinal`: cuInit, then its primary context retained and made
 * current. The first failure, for programs that report it rather than stop. */
static inline CUresult use_primary_context(int ordinal, CUcontext *context)
{
    CUdevice device;
    CUresult result = cuInit(0);
    if (result == CUDA_SUCCESS)
        result = cuDeviceGet(&device, ordinal);
    if (result == CUDA_SUCCESS)
        result = cuDevicePrimaryCtxRetain(context, device);
    if (result == CUDA_SUCCESS)
        result = cuCtxSetCurrent(*context);
    return result;
}

/* use_primary_context for programs that stop at the first failure. */
static inline CUcontext require_primary_context(int ordinal)
{
    CUcontext context;
    CHECK(use_primary_context(ordinal, &context));
    return context;
}

/* The empty kernel of NOOP_PTX, loaded into the current context. */
static inline CUfunction load_noop(void)
{
    CUmodule module;
    CUfunction function;
    CHECK(cuModuleLoadData(&module, NOOP_PTX));
    CHECK(cuModuleGetFunction(&function, module, "noop"));
    return function;
}

/* A stream, and two events to time what runs on it between them. */
struct timed_stream {
    CUstream stream;
    CUevent before, after;
};

static inline struct timed_stream new_timed_stream(unsigned int stream_flags)
{
    struct timed_stream timed;
    CHECK(cuStreamCreate(&timed.stream, stream_flags));
    CHECK(cuEventCreate(&timed.before, 0));
    CHECK(cuEventCreate(&timed.after, 0));
    return timed;
}

/* Device memory in use as the current context sees it: cuMemGetInfo_v2's total less its free. */
static inline long long used_bytes(void)
{
    size_t free_bytes, total;
    CHECK(cuMemGetInfo_v2(&free_bytes, &total));
    return (long long)(total - free_bytes);
}

#endif /* VGPU_PROBE_COMMON_H */
