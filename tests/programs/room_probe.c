/*
 * A process that has not used the GPU yet (tests/interposer/test_waiting_for_room.py): cuInit and
 * cuDeviceGet of device 0, print "ready", then obey stdin lines, each call made by a thread of its
 * own so that several can wait at once while the program goes on reading. Each call is named by
 * the test, and answered with a line-buffered "NAME RESULT":
 *   ctx NAME            cuDevicePrimaryCtxRetain of device 0
 *   alloc NAME BYTES    cuMemAlloc_v2 in that context (once a "ctx" retained it)
 *   resolve NAME        cuGetProcAddress_v2("cuMemAlloc")
 *   count NAME          cuDeviceGetCount, an entry point libvgpu.so does not hook (its gate's),
 *                       obtained the way --path says: linked directly (default), dlopen + dlsym,
 *                       or cuGetProcAddress
 *   ping                "pong 0", from the reading thread (no CUDA call)
 * Exits when stdin closes, once every call it started has answered.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe_common.h"

static CUcontext context;
static CUdevice device;
static CUresult (*device_count)(int *count);
static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;

/* One call: what to call, the name the test gave it, its size. */
struct call {
    void *(*run)(void *);
    char name[64];
    size_t bytes;
};

static void answer(const char *name, CUresult result)
{
    pthread_mutex_lock(&print_lock);
    printf("%s %d\n", name, (int)result);
    pthread_mutex_unlock(&print_lock);
}

static void *retain(void *argument)
{
    const struct call *call = argument;
    CUcontext made;
    CUresult result = cuDevicePrimaryCtxRetain(&made, device);
    if (result == CUDA_SUCCESS)
        __atomic_store_n(&context, made, __ATOMIC_RELEASE);
    answer(call->name, result);
    return NULL;
}

static void *allocate(void *argument)
{
    const struct call *call = argument;
    CUcontext current = __atomic_load_n(&context, __ATOMIC_ACQUIRE);
    if (current)
        CHECK(cuCtxSetCurrent(current));
    CUdeviceptr pointer;
    answer(call->name, cuMemAlloc_v2(&pointer, call->bytes));
    return NULL;
}

static void *resolve(void *argument)
{
    const struct call *call = argument;
    void *function = NULL;
    CUdriverProcAddressQueryResult found;
    answer(call->name, cuGetProcAddress_v2("cuMemAlloc", &function, CUDA_VERSION_SUPPORTED, 0, &found));
    return NULL;
}

static void *count(void *argument)
{
    const struct call *call = argument;
    int devices = 0;
    answer(call->name, device_count(&devices));
    return NULL;
}

/* cuDeviceGetCount the way `path` says, made before "ready" (the slice's calls may wait later). */
static void obtain_device_count(const char *path)
{
    if (strcmp(path, "direct") == 0) {
        device_count = cuDeviceGetCount;
    } else if (strcmp(path, "dlsym") == 0) {
        void *driver = dlopen("libcuda.so.1", RTLD_NOW);
        *(void **)&device_count = driver ? dlsym(driver, "cuDeviceGetCount") : NULL;
    } else if (strcmp(path, "procaddr") == 0) {
        CUdriverProcAddressQueryResult found;
        CHECK(cuGetProcAddress_v2("cuDeviceGetCount", (void **)&device_count, CUDA_VERSION_SUPPORTED, 0, &found));
    }
    if (!device_count) {
        fprintf(stderr, "room_probe: no cuDeviceGetCount through %s\n", path);
        exit(2);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int first;
    const char *path = path_option(argc, argv, &first);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    obtain_device_count(path);
    printf("ready\n");
    static pthread_t threads[256];
    static struct call calls[256];
    size_t started = 0;
    char line[256];
    while (fgets(line, sizeof line, stdin) && started < sizeof threads / sizeof threads[0]) {
        struct call *call = &calls[started];
        char verb[16], bytes[32] = "0";
        if (sscanf(line, "%15s %63s %31s", verb, call->name, bytes) < 1)
            continue;
        call->bytes = parse_bytes(bytes);
        call->run = strcmp(verb, "ctx") == 0       ? retain
                    : strcmp(verb, "alloc") == 0   ? allocate
                    : strcmp(verb, "resolve") == 0 ? resolve
                    : strcmp(verb, "count") == 0   ? count
                                                   : NULL;
        if (strcmp(verb, "ping") == 0)
            answer("pong", CUDA_SUCCESS);
        else if (call->run && pthread_create(&threads[started], NULL, call->run, call) == 0)
            started++;
    }
    for (size_t index = 0; index < started; index++)
        pthread_join(threads[index], NULL);
    return 0;
}
