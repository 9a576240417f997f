/*
 * Device memory shared between processes. A real driver maps the exporter's memory into the
 * importer: no new device memory, so the importer's slot is not charged (NVML shows the memory
 * under the exporter only) and closing an import gives nothing back.
 *
 * Legacy IPC (cuIpcGetMemHandle, cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle): exporting linear
 * memory moves its pages into a memfd mapped shared at the same address; the 64-byte handle
 * names the exporter (pid and identity), the memfd's descriptor there and a serial the memfd's
 * name carries. The importer opens the memfd through the exporter's /proc/PID/fd (as the
 * driver's own IPC needs the exporter alive) and maps it at an address of its own, so each side
 * reads what the other wrote. Memory never written reads zeros there, not the poison byte.
 *
 * VMM (cuMemExportToShareableHandle, cuMemImportFromShareableHandle, POSIX descriptors): a
 * cuMemCreate handle already is a memfd; exporting hands out a duplicate descriptor, importing
 * takes one that names a simulated device's VMM memfd and makes an uncharged handle of it, which
 * cuMemMap maps like any other.
 *
 * The exporter freeing memory an importer still has open is undefined with a real driver; here
 * the importer keeps the bytes, and the memory stops counting anywhere.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_sim.h"

#define IPC_MAGIC 0x3163706975677076ull /* "vgpuipc1", little end first */
#define IPC_PREFIX "jupyter-vgpu-sim-ipc-"

/* What a CUipcMemHandle carries. */
struct ipc_handle {
    uint64_t magic;
    uint64_t exporter; /* identity (sim_identity) */
    uint64_t serial;
    uint64_t size;
    int32_t pid; /* the exporter's pid in sim_proc_root() */
    int32_t fd;  /* the memfd's descriptor in the exporter */
    int32_t device;
};
_Static_assert(sizeof(struct ipc_handle) <= CU_IPC_HANDLE_SIZE, "fits the driver's handle");

static _Atomic uint64_t next_serial = 1;

static void share_name(char *name, size_t size, uint64_t exporter, uint64_t serial)
{
    snprintf(name, size, IPC_PREFIX "%llx-%llu", (unsigned long long)exporter, (unsigned long long)serial);
}

/* Whether descriptor `fd` of this process is the memfd named `name` (what readlink shows). */
static int is_memfd(int fd, const char *name)
{
    char link[64], target[256], expected[256];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t length = readlink(link, target, sizeof target - 1);
    if (length < 0)
        return 0;
    target[length] = '\0';
    snprintf(expected, sizeof expected, "/memfd:%s", name);
    return strncmp(target, expected, strlen(expected)) == 0;
}

void sim_ipc_share_drop(struct sim_allocation *allocation)
{
    /* The address goes back to being private and inaccessible, as the rest of the arena. */
    mmap((void *)allocation->base, allocation->span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
         -1, 0);
    allocation->host_access = 0;
    close(allocation->share->fd);
    free(allocation->share);
    allocation->share = NULL;
}

/* Moves an allocation's pages into a memfd mapped at the same address; the lock is held. */
static CUresult share(struct sim_allocation *allocation)
{
    struct sim_ipc_share *shared = calloc(1, sizeof *shared);
    if (!shared)
        return CUDA_ERROR_OUT_OF_MEMORY;
    shared->serial = atomic_fetch_add(&next_serial, 1);
    char name[128];
    share_name(name, sizeof name, sim_cuda.identity, shared->serial);
    shared->fd = memfd_create(name, MFD_CLOEXEC);
    int ok = shared->fd >= 0 && ftruncate(shared->fd, (off_t)allocation->span) == 0;
    if (ok && allocation->host_access)
        ok = pwrite(shared->fd, (const void *)allocation->base, allocation->span, 0) == (ssize_t)allocation->span;
    int prot = allocation->host_access ? PROT_READ | PROT_WRITE : PROT_NONE;
    if (ok)
        ok =
            mmap((void *)allocation->base, allocation->span, prot, MAP_SHARED | MAP_FIXED, shared->fd, 0) != MAP_FAILED;
    if (!ok) {
        if (shared->fd >= 0)
            close(shared->fd);
        free(shared);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    allocation->share = shared;
    return CUDA_SUCCESS;
}

/* Memory a legacy handle can export: cuMemAlloc's and cuMemAllocPitch's, not a pool's, managed
 * memory, a graph allocation or memory opened from another process. */
static int exportable(const struct sim_allocation *allocation)
{
    return allocation->kind == SIM_ALLOCATION_LINEAR && !allocation->pool && !allocation->managed &&
           !allocation->graph && !(allocation->share && allocation->share->imported);
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    CUresult result = sim_check(pHandle != NULL);
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&sim_cuda.lock);
    struct sim_allocation *allocation = sim_allocation_at(dptr);
    result = allocation && exportable(allocation) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS && !allocation->share)
        result = share(allocation);
    if (result == CUDA_SUCCESS) {
        struct ipc_handle handle = {
            .magic = IPC_MAGIC,
            .exporter = sim_cuda.identity,
            .serial = allocation->share->serial,
            .size = allocation->size,
            .pid = sim_driver_pid(),
            .fd = allocation->share->fd,
            .device = allocation->device->view->index,
        };
        memset(pHandle, 0, sizeof *pHandle);
        memcpy(pHandle->reserved, &handle, sizeof handle);
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

/* This process's open import of an exporter's memory, or NULL; the lock is held. */
static struct sim_allocation *opened(const struct ipc_handle *handle)
{
    for (size_t i = 0; i < sim_cuda.allocations.count; i++) {
        struct sim_allocation *allocation = (struct sim_allocation *)sim_cuda.allocations.entries[i].value;
        if (allocation->share && allocation->share->imported && allocation->share->exporter == handle->exporter &&
            allocation->share->serial == handle->serial)
            return allocation;
    }
    return NULL;
}

/* Opens the exporter's memfd through its /proc/PID/fd; -1 if it is gone (or is another file). */
static int open_exported(const struct ipc_handle *handle, uint64_t span)
{
    char path[512], name[128];
    snprintf(path, sizeof path, "%s/%d/fd/%d", sim_proc_root(), (int)handle->pid, (int)handle->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -1;
    share_name(name, sizeof name, handle->exporter, handle->serial);
    struct stat status;
    if (!is_memfd(fd, name) || fstat(fd, &status) != 0 || (uint64_t)status.st_size != span) {
        close(fd);
        return -1;
    }
    return fd;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    struct CUctx_st *ctx;
    CUresult result = sim_current_context(&ctx, pdptr && Flags == CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (result != CUDA_SUCCESS)
        return result;
    struct ipc_handle h;
    memcpy(&h, handle.reserved, sizeof h);
    if (h.magic != IPC_MAGIC || h.exporter == sim_cuda.identity || h.size == 0)
        return CUDA_ERROR_INVALID_VALUE; /* not a handle, or this process's own memory */
    if (h.device != ctx->device->view->index)
        return CUDA_ERROR_INVALID_DEVICE;
    uint64_t span = (h.size + 4095) / 4096 * 4096;
    pthread_mutex_lock(&sim_cuda.lock);
    struct sim_allocation *allocation = opened(&h);
    if (allocation) {
        allocation->share->opens++; /* opened again: the same address, one more close to come */
        *pdptr = allocation->base;
        pthread_mutex_unlock(&sim_cuda.lock);
        return CUDA_SUCCESS;
    }
    result = CUDA_ERROR_INVALID_VALUE;
    int fd = open_exported(&h, span);
    struct sim_allocation space = fd >= 0 ? sim_linear_take(ctx->device, h.size, span) : (struct sim_allocation){0};
    uintptr_t address = space.base;
    struct sim_ipc_share *shared = address ? calloc(1, sizeof *shared) : NULL;
    allocation = shared ? calloc(1, sizeof *allocation) : NULL;
    if (allocation &&
        mmap((void *)address, span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED) {
        *shared =
            (struct sim_ipc_share){.fd = fd, .serial = h.serial, .imported = 1, .opens = 1, .exporter = h.exporter};
        *allocation = space;
        allocation->ctx = ctx;
        allocation->host_access = PROT_READ | PROT_WRITE;
        allocation->share = shared;
        if (sim_map_put(&sim_cuda.allocations, address, (uintptr_t)allocation) == 0) {
            *pdptr = address;
            pthread_mutex_unlock(&sim_cuda.lock);
            return CUDA_SUCCESS;
        }
        sim_ipc_share_drop(allocation);
        fd = -1;
        shared = NULL;
        result = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (address)
        sim_address_give(address, span, space.in_arena);
    pthread_mutex_unlock(&sim_cuda.lock);
    if (fd >= 0)
        close(fd);
    free(shared);
    free(allocation);
    return result;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    CUresult result = sim_ready_locked();
    if (result != CUDA_SUCCESS)
        return result;
    struct sim_allocation *allocation = sim_allocation_at(dptr);
    result = CUDA_ERROR_INVALID_VALUE;
    if (allocation && allocation->share && allocation->share->imported) {
        if (--allocation->share->opens == 0) {
            sim_map_take(&sim_cuda.allocations, dptr, NULL);
            sim_release_linear(allocation); /* uncharged: it was never charged here */
        }
        result = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

/* ---- VMM shareable handles ---------------------------------------------------------------- */

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags)
{
    CUresult result = sim_lock_handle((void *)(uintptr_t)handle, SIM_HANDLE_VMM, shareableHandle && flags == 0);
    if (result != CUDA_SUCCESS)
        return result;
    const struct sim_vmm_handle *exported = (const struct sim_vmm_handle *)(uintptr_t)handle;
    /* Only as a type cuMemCreate was asked to make it shareable as (requestedHandleTypes). */
    result = CUDA_ERROR_INVALID_VALUE;
    if (handleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && (exported->shareable & handleType)) {
        int fd = dup(exported->fd);
        result = fd >= 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        if (fd >= 0)
            *(int *)shareableHandle = fd;
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

/* The simulated device whose VMM memfd `fd` is (its name says), or NULL for any other file. */
static struct sim_cuda_device *vmm_memfd_device(int fd)
{
    for (int d = 0; d < sim_cuda.device_count; d++) {
        char name[64];
        sim_vmm_memfd_name(name, sizeof name, &sim_cuda.devices[d]);
        if (is_memfd(fd, name))
            return &sim_cuda.devices[d];
    }
    return NULL;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType)
{
    CUresult result = sim_check(handle && shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (result != CUDA_SUCCESS)
        return result;
    int given = (int)(intptr_t)osHandle;
    struct sim_cuda_device *device = vmm_memfd_device(given);
    struct stat status;
    if (!device || fstat(given, &status) != 0 || status.st_size <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_vmm_handle *imported = calloc(1, sizeof *imported);
    if (!imported)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *imported = (struct sim_vmm_handle){.device = device,
                                        .size = (uint64_t)status.st_size,
                                        .fd = fcntl(given, F_DUPFD_CLOEXEC, 0),
                                        .shareable = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                        .imported = 1};
    if (imported->fd < 0) {
        free(imported);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!sim_vmm_register(imported)) {
        sim_vmm_destroy(imported);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (uintptr_t)imported;
    return CUDA_SUCCESS;
}
