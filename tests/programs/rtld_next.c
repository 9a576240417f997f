/*
 * RTLD_NEXT from the program itself, under the interposer's dlsym: the program wraps `puts`
 * and finds the real one with dlsym(RTLD_NEXT, "puts"), on every call (repeated lookups must
 * keep working). glibc resolves RTLD_NEXT relative to the caller's return address, so a dlsym
 * override that forwarded from its own frame would hand back the wrapper itself (endless
 * recursion) or nothing. Built at -O0 and -O2 by the tests.
 *
 * Prints "puts-next OK|BAD", "getpid-next OK|BAD", "hook-next-before-load OK|BAD" (nothing
 * while the driver is not loaded), "hook-next 1|0" (dlsym(RTLD_NEXT, "cuMemAlloc_v2") from the
 * program is the interposer's hook once the driver is loaded) and, when the preloaded
 * rtld_wrapper library is present, "wrapper OK|BAD|absent".
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*puts_fn)(const char *);

static puts_fn libc_symbol_puts(void)
{
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    return libc ? (puts_fn)dlsym(libc, "puts") : NULL;
}

static int wrapped_calls;

int puts(const char *text)
{
    puts_fn next = (puts_fn)dlsym(RTLD_NEXT, "puts");
    if (!next || next == puts) {
        static const char message[] = "rtld_next: dlsym(RTLD_NEXT, \"puts\") did not find libc's puts\n";
        if (write(2, message, sizeof message - 1) < 0)
            _exit(6);
        _exit(5);
    }
    wrapped_calls++;
    return next(text);
}

int main(void)
{
    for (int i = 0; i < 3; i++)
        puts("hello through the wrapper");
    puts_fn next = (puts_fn)dlsym(RTLD_NEXT, "puts");
    printf("puts-next %s\n", wrapped_calls == 3 && next == libc_symbol_puts() ? "OK" : "BAD");

    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void *real_getpid = libc ? dlsym(libc, "getpid") : NULL;
    void *next_getpid = dlsym(RTLD_NEXT, "getpid");
    void *wrapper_getpid = dlsym(RTLD_DEFAULT, "rtld_wrapper_calls") ? dlsym(RTLD_DEFAULT, "getpid") : real_getpid;
    printf("getpid-next %s\n", next_getpid && (next_getpid == real_getpid || next_getpid == wrapper_getpid) ? "OK" : "BAD");

    /* A hooked name: before the driver is in the global scope, nothing (as without us); after,
     * the interposer's hook (as the interposer's own export, looked up through its handle). */
    void *driver_loaded = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *before = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    void *interposer = dlopen("libvgpu.so", RTLD_NOW | RTLD_NOLOAD);
    void *hook = interposer ? dlsym(interposer, "cuMemAlloc_v2") : NULL;
    printf("hook-next-before-load %s\n", driver_loaded || before == NULL ? "OK" : "BAD");
    dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    void *after = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    hook = interposer ? dlsym(interposer, "cuMemAlloc_v2") : NULL;
    printf("hook-next %d\n", after != NULL && after == hook);

    int (*wrapper_calls)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "rtld_wrapper_calls");
    if (wrapper_calls) {
        int before = wrapper_calls();
        pid_t pid = getpid();
        printf("wrapper %s\n", pid > 0 && wrapper_calls() == before + 1 ? "OK" : "BAD");
    } else {
        printf("wrapper absent\n");
    }
    return 0;
}
