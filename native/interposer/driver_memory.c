/*
 * Driver memory beyond allocations: contexts (and whatever else the driver keeps for a process)
 * take device memory no allocation hook sees. NVML knows each process's total; what it shows
 * beyond this process's `allocated` is the driver's, and counts against the cap as the slot's
 * driver_reserved.
 *
 * A new context counts at once. The first process of a slice to create one measures it and
 * records the figure in the region; a later process counts that recorded size for its first
 * context instead of loading and starting NVML on its start-up path (about 0.15 ms on the
 * simulated GPU, tens of milliseconds on a real one: every DataLoader worker and subprocess that
 * uses CUDA would pay it), and its monitor measures the real figure at its first period. Until
 * then the figure is an estimate, which a cap decision never rests on: one it could change is
 * measured first (charge.c).
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
    const struct vgpu_limits_page *page = vgpu_limits_page();
    nvmlDevice_t device = NULL;
    if (page && init && init() == NVML_SUCCESS) {
        char uuid[VGPU_DEVICE_UUID_SIZE];
        memcpy(uuid, page->device_uuid, sizeof uuid);
        uuid[sizeof uuid - 1] = '\0';
        if (!(uuid[0] && by_uuid && by_uuid(uuid, &device) == NVML_SUCCESS) &&
            !(by_index && page->device_index >= 0 &&
              by_index((unsigned int)page->device_index, &device) == NVML_SUCCESS))
            device = NULL;
    }
    D.nvml_slice_device = device;
    atomic_store_explicit(&D.nvml_ready, device ? 1 : -1, memory_order_release);
    if (!device)
        VGPU_LOG(VGPU_LOG_WARN, "NVML cannot find the slice's device: driver memory of contexts is not counted");
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

/* A forked child starts over: NVML initialised anew, no sample of the parent's (it says
 * nothing of the child's allocations), and no context counted yet. */
static void after_fork_in_child(void)
{
    pthread_mutex_init(&D.nvml_lock, NULL);
    atomic_store_explicit(&D.nvml_ready, 0, memory_order_relaxed);
    D.previous_valid = 0;
    D.counted = 0;
    D.estimated_context = NULL;
    atomic_store_explicit(&D.estimated, 0, memory_order_relaxed);
}

static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

/* Before nvml_lock is first taken: a fork while another thread holds it must leave the child a
 * lock it can take. */
static void prepare_for_fork(void)
{
    pthread_once(&D.fork_handler_once, register_fork_handler);
}

/* Sets the slot's driver_reserved from NVML, under nvml_lock. Returns the figure NVML gave
 * for this process, or -1 when it gave none (no NVML, allocations moved meanwhile, this process
 * not listed or listed without a figure). */
static int64_t measure_locked(struct vgpu_proc_slot *slot)
{
    nvmlDevice_t device = slice_nvml_device();
    struct vgpu_nvml_sample sample;
    /* Allocations are charged before the driver makes them and given back after it freed them,
     * so while none moved during the query, NVML's figure minus `allocated` never over-states
     * the driver's own memory. If some moved, try again next period. */
    uint64_t changes = atomic_load_explicit(&D.allocated_changes, memory_order_seq_cst);
    uint64_t allocated = __atomic_load_n(&slot->allocated, __ATOMIC_SEQ_CST);
    int steady = device && nvml_sample(device, &sample) &&
                 atomic_load_explicit(&D.allocated_changes, memory_order_seq_cst) == changes;
    int64_t measured = -1;
    if (steady) {
        unsigned int pid = (unsigned int)__atomic_load_n(&slot->nvml_pid, __ATOMIC_ACQUIRE);
        if (!pid && (pid = find_nvml_pid(slot, &sample, allocated)) != 0) {
            __atomic_store_n(&slot->nvml_pid, (int32_t)pid, __ATOMIC_RELEASE);
            if (pid != (unsigned int)getpid())
                VGPU_LOG(VGPU_LOG_INFO, "NVML lists this process (pid %d here) as pid %u", (int)getpid(), pid);
        }
        /* Not listed: no context on the device yet, so no driver memory either. */
        int64_t used = pid ? sampled_use(&sample, pid) : NOT_LISTED;
        uint64_t reserved = used > 0 && (uint64_t)used > allocated ? (uint64_t)used - allocated : 0;
        if (used != NOT_AVAILABLE) {
            __atomic_store_n(&slot->driver_reserved, reserved, __ATOMIC_SEQ_CST);
            D.estimated_context = NULL;
            atomic_store_explicit(&D.estimated, 0, memory_order_relaxed);
        }
        if (used >= 0)
            measured = (int64_t)reserved;
        D.previous = sample;
        D.previous_allocated = allocated;
    }
    D.previous_valid = steady;
    return measured;
}

void vgpu_refresh_driver_reserved(void)
{
    prepare_for_fork();
    struct vgpu_proc_slot *slot = vgpu_claimed_slot();
    if (!slot || pthread_mutex_trylock(&D.nvml_lock) != 0)
        return; /* no GPU use yet, or a refresh is already under way */
    measure_locked(slot);
    pthread_mutex_unlock(&D.nvml_lock);
}

void vgpu_measure_driver_memory(void)
{
    prepare_for_fork();
    struct vgpu_proc_slot *slot = vgpu_claimed_slot();
    if (!slot)
        return;
    pthread_mutex_lock(&D.nvml_lock); /* a refresh under way is waited for: it may have been early */
    if (atomic_load_explicit(&D.estimated, memory_order_relaxed))
        measure_locked(slot);
    pthread_mutex_unlock(&D.nvml_lock);
}

/* Raises the slice's recorded context size to `bytes`. */
static void record_context_memory(struct vgpu_region *region, uint64_t bytes)
{
    uint64_t seen = __atomic_load_n(&region->context_memory, __ATOMIC_RELAXED);
    while (seen < bytes &&
           !__atomic_compare_exchange_n(&region->context_memory, &seen, bytes, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    __atomic_store_n(&region->context_memory_known, 1, __ATOMIC_RELEASE);
}

void vgpu_driver_memory_context_created(CUcontext context)
{
    prepare_for_fork();
    struct vgpu_proc_slot *slot = vgpu_claimed_slot();
    struct vgpu_region *region = vgpu_region();
    if (!slot || !region)
        return;
    pthread_mutex_lock(&D.nvml_lock); /* not a trylock: this context must count now */
    int first = !D.counted;
    D.counted = 1;
    if (first && __atomic_load_n(&region->context_memory_known, __ATOMIC_ACQUIRE)) {
        /* The slice knows what a context takes on its device: count that now, and leave loading
         * and starting NVML to the monitor's first period (or to a cap decision it matters to). */
        uint64_t recorded = __atomic_load_n(&region->context_memory, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->driver_reserved, recorded, __ATOMIC_SEQ_CST);
        D.estimated_context = context;
        atomic_store_explicit(&D.estimated, recorded, memory_order_relaxed);
    } else {
        int64_t measured = measure_locked(slot);
        if (first && measured >= 0)
            record_context_memory(region, (uint64_t)measured);
    }
    pthread_mutex_unlock(&D.nvml_lock);
}

void vgpu_driver_memory_context_gone(CUcontext context)
{
    prepare_for_fork();
    struct vgpu_proc_slot *slot = vgpu_claimed_slot();
    if (!slot)
        return;
    pthread_mutex_lock(&D.nvml_lock);
    if (context && context == D.estimated_context) {
        /* The only driver memory counted was this context's, at the recorded size. */
        __atomic_store_n(&slot->driver_reserved, 0, __ATOMIC_SEQ_CST);
        D.estimated_context = NULL;
        atomic_store_explicit(&D.estimated, 0, memory_order_relaxed);
    } else {
        measure_locked(slot);
    }
    pthread_mutex_unlock(&D.nvml_lock);
}
