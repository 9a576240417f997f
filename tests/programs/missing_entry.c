/*
 * Asks for entry points by name only (dlopen/dlsym and cuGetProcAddress_v2), so it runs on a
 * driver that lacks some of them. For each NAME given: "NAME HANDLE DEFAULT NEXT PROCADDR_RC"
 * where HANDLE/DEFAULT/NEXT are 1 when dlsym(driver handle | RTLD_DEFAULT | RTLD_NEXT, NAME)
 * found something, and PROCADDR_RC is what cuGetProcAddress_v2 returned for BASE (NAME without
 * a _v2 suffix), with ":STATUS:FOUND" appended. Then asks for 2 GiB through cuMemAlloc_v2 as
 * dlsym(driver handle) and as cuGetProcAddress_v2 found it: "alloc-dlsym RC", "alloc-procaddr RC".
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "vgpu/cuda_abi.h"

typedef CUresult (*get_proc_address_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

int main(int argc, char **argv)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!driver)
        return 3;
    get_proc_address_fn get_proc_address = (get_proc_address_fn)dlsym(driver, "cuGetProcAddress_v2");
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i];
        char base[128];
        snprintf(base, sizeof base, "%s", name);
        char *suffix = strstr(base, "_v2");
        if (suffix && suffix[3] == '\0')
            *suffix = '\0';
        void *found = NULL;
        CUdriverProcAddressQueryResult status = -1;
        CUresult rc = get_proc_address ? get_proc_address(base, &found, CUDA_VERSION_SUPPORTED, 0, &status)
                                       : CUDA_ERROR_NOT_FOUND;
        printf("%s %d %d %d %d:%d:%d\n", name, dlsym(driver, name) != NULL, dlsym(RTLD_DEFAULT, name) != NULL,
               dlsym(RTLD_NEXT, name) != NULL, rc, status, found != NULL);
    }
    typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
    alloc_fn by_dlsym = (alloc_fn)dlsym(driver, "cuMemAlloc_v2");
    alloc_fn by_procaddr = NULL;
    CUdriverProcAddressQueryResult status;
    if (get_proc_address)
        get_proc_address("cuMemAlloc", (void **)&by_procaddr, CUDA_VERSION_SUPPORTED, 0, &status);
    CUdeviceptr pointer;
    printf("alloc-dlsym %d\n", by_dlsym ? by_dlsym(&pointer, 2ULL << 30) : -1);
    printf("alloc-procaddr %d\n", by_procaddr ? by_procaddr(&pointer, 2ULL << 30) : -1);
    return 0;
}
