/*
 * Driver memory beyond allocations: contexts (and whatever else the driver keeps for a process)
 * take device memory no allocation hook sees. NVML knows each process's total; what it shows
 * beyond this process's `allocated` is the driver's, and counts against the cap as the slot's
 * driver_reserved.
 *
 * In a container with its own PID namespace NVML lists the process under the host's pid, not
 * getpid(): the pid is then found as the one whose memory moved between two samples by exactly
 * what this process's own allocations moved.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define D (vgpu_state.driver_memory)

/* Finding this process's NVML pid by its allocations: a move of at least this much, matched
 * within this much (the driver rounds allocations up to its pages). */
#define NVML_PID_SIGNATURE_MIN ((int64_t)4 << 20)
#define NVML_PID_SIGNATURE_SLACK ((int64_t)2 << 20)

/* NVML's handle of the slice's device, initialising NVML on first use. Under nvml_lock. */
static nvmlDevice_t slice_nvml_device(void)
{
    int ready = atomic_load_explicit(&D.nvml_ready, memory_order_acquire);
    if (ready)
        return ready > 0 ? D.nvml_slice_device : NULL;
    vgpu_pfn_nvmlInit_v2 init = VGPU_CALLED(nvmlInit_v2);
    vgpu_pfn_nvmlDeviceGetHandleByUUID by_uuid = VGPU_CALLED(nvmlDeviceGetHandleByUUID);
    vgpu_pfn_nvmlDeviceGetHandleByIndex_v2 by_index = VGPU_CALLED(nvmlDeviceGetHandleByIndex_v2);
    struct vgpu_region *region = vgpu_region();
    nvmlDevice_t device = NULL;
    if (region && init && init() == NVML_SUCCESS) {
        char uuid[VGPU_DEVICE_UUID_SIZE];
        memcpy(uuid, region->device_uuid, sizeof uuid);
        uuid[sizeof uuid - 1] = '\0';
        if (!(uuid[0] && by_uuid && by_uuid(uuid, &device) == NVML_SUCCESS) &&
            !(by_index && region->device_index >= 0 &&
              by_index((unsigned int)region->device_index, &device) == NVML_SUCCESS))
            device = NULL;
    }
    D.nvml_slice_device = device;
    atomic_store_explicit(&D.nvml_ready, device ? 1 : -1, memory_order_release);
    if (!device)
        vgpu_log(VGPU_LOG_WARN, "NVML cannot find the slice's device: driver memory of contexts is not counted");
    return device;
}

/* NVML's list of the device's processes and the memory each uses, into `sample` (the first
 * VGPU_NVML_SAMPLE of them). Returns 0 when NVML cannot list them. */
static int nvml_sample(nvmlDevice_t device, struct vgpu_nvml_sample *sample)
{
    vgpu_pfn_nvmlDeviceGetComputeRunningProcesses_v3 list = VGPU_CALLED(nvmlDeviceGetComputeRunningProcesses_v3);
    if (!list)
        return 0;
    nvmlProcessInfo_t on_stack[VGPU_NVML_SAMPLE], *infos = on_stack;
    unsigned int count = VGPU_NVML_SAMPLE;
    nvmlReturn_t result = list(device, &count, infos);
    if (result == NVML_ERROR_INSUFFICIENT_SIZE) {
        count += 16; /* room for processes starting meanwhile */
        infos = malloc(count * sizeof *infos);
        result = infos ? list(device, &count, infos) : NVML_ERROR_UNKNOWN;
    }
    sample->count = 0;
    for (unsigned int index = 0; result == NVML_SUCCESS && index < count && sample->count < VGPU_NVML_SAMPLE; index++) {
        sample->pid[sample->count] = infos[index].pid;
        sample->used[sample->count++] = infos[index].usedGpuMemory;
    }
    if (infos != on_stack)
        free(infos);
    return result == NVML_SUCCESS;
}

#define NOT_LISTED (-1)
#define NOT_AVAILABLE (-2) /* listed, without a figure (NVML_VALUE_NOT_AVAILABLE) */

/* The memory NVML shows for `pid`, NOT_LISTED or NOT_AVAILABLE. */
static int64_t sampled_use(const struct vgpu_nvml_sample *sample, unsigned int pid)
{
    for (unsigned int i = 0; i < sample->count; i++)
        if (sample->pid[i] == pid)
            return sample->used[i] == ~0ULL ? NOT_AVAILABLE : (int64_t)sample->used[i];
    return NOT_LISTED;
}

static int claimed_by_another_slot(const struct vgpu_proc_slot *self, unsigned int pid)
{
    struct vgpu_region *region = vgpu_region();
    uint32_t slots = region ? vgpu_slots_in_use(region) : 0;
    for (uint32_t i = 0; i < slots; i++) {
        const struct vgpu_proc_slot *slot = &region->procs[i];
        if (slot != self && __atomic_load_n(&slot->pid, __ATOMIC_ACQUIRE) > 0 &&
            (unsigned int)__atomic_load_n(&slot->nvml_pid, __ATOMIC_ACQUIRE) == pid)
            return 1;
    }
    return 0;
}

/* The pid NVML lists this process under. Its own pid, unless it runs in a PID namespace (a
 * container) while NVML reports the host's pids: then the one process, among those no other
 * process of the slice has claimed, whose memory moved between two samples by what this
 * process's own allocations moved (which this process knows to the byte). 0 while unknown. */
static unsigned int find_nvml_pid(const struct vgpu_proc_slot *self, const struct vgpu_nvml_sample *now,
                                  uint64_t allocated)
{
    unsigned int own = (unsigned int)getpid();
    if (sampled_use(now, own) != NOT_LISTED)
        return own;
    if (!D.previous_valid)
        return 0;
    int64_t moved = (int64_t)(allocated - D.previous_allocated);
    if (moved > -NVML_PID_SIGNATURE_MIN && moved < NVML_PID_SIGNATURE_MIN)
        return 0; /* too small a change to tell processes apart */
    unsigned int found = 0;
    for (unsigned int i = 0; i < now->count; i++) {
        int64_t before = sampled_use(&D.previous, now->pid[i]), after = sampled_use(now, now->pid[i]);
        if (before < 0 || after < 0)
            continue;
        int64_t their_move = after - before;
        if (their_move - moved > NVML_PID_SIGNATURE_SLACK || moved - their_move > NVML_PID_SIGNATURE_SLACK ||
            claimed_by_another_slot(self, now->pid[i]))
            continue;
        if (found)
            return 0; /* two moved alike: wait for a move that tells them apart */
        found = now->pid[i];
    }
    return found;
}

/* A forked child starts over: NVML initialised anew, and no sample of the parent's, which says
 * nothing of the child's allocations. */
static void after_fork_in_child(void)
{
    pthread_mutex_init(&D.nvml_lock, NULL);
    atomic_store_explicit(&D.nvml_ready, 0, memory_order_relaxed);
    D.previous_valid = 0;
}

static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

void vgpu_refresh_driver_reserved(void)
{
    /* Before the lock is first taken: a fork while another thread holds it must leave the
     * child a lock it can take. */
    pthread_once(&D.fork_handler_once, register_fork_handler);
    struct vgpu_proc_slot *slot = vgpu_claimed_slot();
    if (!slot || pthread_mutex_trylock(&D.nvml_lock) != 0)
        return; /* no GPU use yet, or a refresh is already under way */
    nvmlDevice_t device = slice_nvml_device();
    struct vgpu_nvml_sample sample;
    /* Allocations are charged before the driver makes them and given back after it freed them,
     * so while none moved during the query, NVML's figure minus `allocated` never over-states
     * the driver's own memory. If some moved, try again next period. */
    uint64_t changes = atomic_load_explicit(&D.allocated_changes, memory_order_seq_cst);
    uint64_t allocated = __atomic_load_n(&slot->allocated, __ATOMIC_SEQ_CST);
    int steady = device && nvml_sample(device, &sample) &&
                 atomic_load_explicit(&D.allocated_changes, memory_order_seq_cst) == changes;
    if (steady) {
        unsigned int pid = (unsigned int)__atomic_load_n(&slot->nvml_pid, __ATOMIC_ACQUIRE);
        if (!pid && (pid = find_nvml_pid(slot, &sample, allocated)) != 0) {
            __atomic_store_n(&slot->nvml_pid, (int32_t)pid, __ATOMIC_RELEASE);
            if (pid != (unsigned int)getpid())
                vgpu_log(VGPU_LOG_INFO, "NVML lists this process (pid %d here) as pid %u", (int)getpid(), pid);
        }
        /* Not listed: no context on the device yet, so no driver memory either. */
        int64_t used = pid ? sampled_use(&sample, pid) : NOT_LISTED;
        uint64_t reserved = used > 0 && (uint64_t)used > allocated ? (uint64_t)used - allocated : 0;
        if (used != NOT_AVAILABLE)
            __atomic_store_n(&slot->driver_reserved, reserved, __ATOMIC_SEQ_CST);
        D.previous = sample;
        D.previous_allocated = allocated;
    }
    D.previous_valid = steady;
    pthread_mutex_unlock(&D.nvml_lock);
}
