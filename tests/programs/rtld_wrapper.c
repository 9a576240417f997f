/*
 * A second preloaded library (after libvgpu.so) that wraps getpid through
 * dlsym(RTLD_NEXT, "getpid"), as profilers and other interposers do. Built as a shared
 * library by the tests. If the interposer's dlsym resolved RTLD_NEXT relative to itself, the
 * "next" getpid seen from here would be this wrapper again, and getpid would recurse forever.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

static int calls;

__attribute__((visibility("default"))) int rtld_wrapper_calls(void)
{
    return calls;
}

__attribute__((visibility("default"))) pid_t getpid(void)
{
    pid_t (*next)(void) = (pid_t(*)(void))dlsym(RTLD_NEXT, "getpid");
    if (!next || next == getpid)
        abort();
    calls++;
    return next();
}
