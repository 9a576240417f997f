/*
 * The driver's checkpoint API (CUDA 12.8+), as a real driver behaves toward any caller: a
 * controller process locks, checkpoints, restores and unlocks a CUDA process by pid.
 *
 * Two sides. Every process that initialises the driver claims a checkpoint record in the state
 * file (struct sim_checkpoint_record) and starts a checkpoint thread, as the real driver keeps a
 * thread of its own in each CUDA process (cuCheckpointProcessGetRestoreThreadId names it). A
 * controller writes its request into the target's record, bumps `request` and wakes the futex;
 * the target's checkpoint thread carries it out inside the target (where its device memory and
 * allocation table are) and answers in `result` and `response`. So the controller and the target
 * see one state, and a controller can be any process of the machine, initialised or not (only a
 * restore needs a controller that has called cuInit, as without persistence mode).
 *
 * Built for another architecture than x86-64, every call answers CUDA_ERROR_NOT_SUPPORTED, as
 * the driver did on aarch64.
 *
 * States: RUNNING -lock-> LOCKED -checkpoint-> CHECKPOINTED -restore-> LOCKED -unlock-> RUNNING;
 * any other step is CUDA_ERROR_ILLEGAL_STATE.
 *   lock        takes the copy lock (waiting for copies in flight) and the library's lock
 *               (waiting for calls in their critical sections), closes the gate (later calls of
 *               the process wait in sim_ready), then waits for the process's queued kernels to
 *               end. Past `timeoutMs` it undoes all of that: CUDA_ERROR_TIMEOUT, still RUNNING.
 *   checkpoint  moves every allocation's bytes to host memory (their device addresses stay
 *               reserved, inaccessible), and takes the process's bytes and contexts off its
 *               device slots, so the device's memory is free and NVML no longer lists the pid.
 *   restore     charges the bytes back (CUDA_ERROR_OUT_OF_MEMORY, still CHECKPOINTED, when the
 *               device has no room; with VGPU_SIM_RESTORE_OOM_FAILS=1 the process is FAILED for
 *               good, as on driver 580), then copies them back to the same addresses.
 *   unlock      opens the gate: the calls that waited go on.
 * Moving the bytes takes bytes / VGPU_SIM_CHECKPOINT_BANDWIDTH of wall time (the host moves
 * a linear allocation's pages without copying them).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cuda_sim.h"

/* The driver answers the checkpoint API on x86-64 only (on aarch64 it said "not supported"). */
#if defined(__x86_64__)
#define CHECKPOINT_SUPPORTED 1
#else
#define CHECKPOINT_SUPPORTED 0
#endif

enum checkpoint_operation { OPERATION_LOCK = 1, OPERATION_CHECKPOINT, OPERATION_RESTORE, OPERATION_UNLOCK };

/* Device bytes held in host memory while the process is checkpointed. */
struct saved_range {
    void *copy;
    uint64_t bytes;
    struct sim_allocation *allocation; /* a linear allocation's pages, or */
    struct sim_vmm_handle *handle;     /* a VMM handle's memory */
};

_Atomic int sim_checkpoint_gate;
static _Thread_local int is_checkpoint_thread;

/* This process as a checkpoint target. Touched by the checkpoint thread only, except `record`. */
static struct {
    struct sim_checkpoint_record *record;
    pthread_rwlock_t copies; /* read: a copy in flight; write: the process is locked */
    uint64_t bandwidth;      /* bytes per second; 0: as fast as the host copies */
    int restore_oom_fails;
    struct saved_range *saved;
    size_t saved_count;
    uint64_t device_bytes[SIM_MAX_DEVICES];    /* taken off each device's slot at checkpoint */
    uint32_t device_contexts[SIM_MAX_DEVICES]; /* likewise */
} target = {.copies = PTHREAD_RWLOCK_INITIALIZER};

/* The state file as a controller that never called cuInit maps it. */
static struct {
    pthread_once_t once;
    struct sim_machine machine;
    int opened;
} controller = {.once = PTHREAD_ONCE_INIT};

static long futex(_Atomic uint32_t *word, int operation, uint32_t value, const struct timespec *timeout)
{
    return syscall(SYS_futex, (uint32_t *)word, operation, value, timeout, NULL, 0);
}

/* The wall-clock time (CLOCK_REALTIME, which pthread's timed locks take) at which the monotonic
 * clock reads `deadline_ns`: the clock-choosing locks (pthread_*_clock*lock) need glibc 2.30+,
 * newer than the wheels' floor (vgpu/glibc_floor.h). */
static struct timespec wall_clock_at(uint64_t deadline_ns)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t monotonic = sim_now_ns();
    uint64_t ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec +
                  (deadline_ns > monotonic ? deadline_ns - monotonic : 0);
    return (struct timespec){(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
}

/* ---- the target's side ------------------------------------------------------------------------ */

void sim_checkpoint_wait_at_gate(void)
{
    if (is_checkpoint_thread)
        return;
    while (atomic_load_explicit(&sim_checkpoint_gate, memory_order_acquire))
        futex((_Atomic uint32_t *)&sim_checkpoint_gate, FUTEX_WAIT_PRIVATE, 1, NULL);
}

void sim_copy_begin(void)
{
    if (!is_checkpoint_thread)
        pthread_rwlock_rdlock(&target.copies);
}

void sim_copy_end(void)
{
    if (!is_checkpoint_thread)
        pthread_rwlock_unlock(&target.copies);
}

/* When the last kernel this process queued on a device ends: the latest end among the device's
 * interval records tagged with this process's slot and generation. Records are appended in
 * timeline order (bar launches in flight), so the scan stops after a long run of records that
 * ended before `now_ns`. */
static uint64_t work_end_ns(const struct sim_cuda_device *device, uint64_t now_ns)
{
    int slot = atomic_load(&device->slot);
    if (slot < 0)
        return 0;
    const struct sim_device_view *view = device->view;
    uint32_t generation = sim_slot_generation(view, slot);
    uint64_t head = atomic_load(&view->shared->ring_head), end = 0;
    int stale = 0;
    for (uint64_t i = head; i > 0 && head - i <= view->ring_mask && stale < 256; i--) {
        const struct sim_interval *record = &view->ring[(i - 1) & view->ring_mask];
        if (atomic_load(&record->commit) != i)
            continue;
        uint64_t tag = atomic_load(&record->tag), record_end = atomic_load(&record->end_ns);
        stale = record_end < now_ns ? stale + 1 : 0;
        if (SIM_TAG_SLOT(tag) == slot && SIM_TAG_GENERATION(tag) == generation && record_end > end)
            end = record_end;
    }
    return end;
}

static uint64_t process_work_end_ns(uint64_t now_ns)
{
    uint64_t end = 0;
    for (int i = 0; i < sim_cuda.device_count; i++) {
        uint64_t device_end = work_end_ns(&sim_cuda.devices[i], now_ns);
        end = device_end > end ? device_end : end;
    }
    return end;
}

static void open_gate(void)
{
    atomic_store(&sim_checkpoint_gate, 0);
    futex((_Atomic uint32_t *)&sim_checkpoint_gate, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
}

static CUresult lock_process(uint32_t timeout_ms)
{
    uint64_t deadline = timeout_ms ? sim_now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
    struct timespec until = wall_clock_at(deadline);
    if (deadline ? pthread_rwlock_timedwrlock(&target.copies, &until) != 0 : pthread_rwlock_wrlock(&target.copies) != 0)
        return CUDA_ERROR_TIMEOUT;
    if (deadline ? pthread_mutex_timedlock(&sim_cuda.lock, &until) != 0 : pthread_mutex_lock(&sim_cuda.lock) != 0) {
        pthread_rwlock_unlock(&target.copies);
        return CUDA_ERROR_TIMEOUT;
    }
    atomic_store(&sim_checkpoint_gate, 1);
    /* Submitted work completes before the process counts as locked. */
    for (uint64_t now = sim_now_ns(), end; (end = process_work_end_ns(now)) > now; now = sim_now_ns()) {
        if (deadline && end > deadline) {
            sim_sleep_until(deadline);
            open_gate();
            pthread_mutex_unlock(&sim_cuda.lock);
            pthread_rwlock_unlock(&target.copies);
            return CUDA_ERROR_TIMEOUT;
        }
        sim_sleep_until(end);
    }
    return CUDA_SUCCESS;
}

static void unlock_process(void)
{
    open_gate();
    pthread_mutex_unlock(&sim_cuda.lock);
    pthread_rwlock_unlock(&target.copies);
}

/* Copies take at least bytes / bandwidth from `started_ns`. */
static void pace_copy(uint64_t started_ns, uint64_t bytes)
{
    if (target.bandwidth)
        sim_sleep_until(started_ns + (uint64_t)((double)bytes * 1e9 / (double)target.bandwidth));
}

/* A linear allocation's pages move to host memory whole (mremap, no copy: the simulator's
 * device memory is host memory already), and its addresses stay reserved, PROT_NONE, for the
 * restore; the modelled copy time is pace_copy's. A VMM handle's bytes are copied out of its
 * memfd, whose pages are then given back. */
static int save_range(struct saved_range *range)
{
    if (range->allocation) {
        void *base = (void *)(uintptr_t)range->allocation->base;
        size_t span = range->allocation->span;
        void *host = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (host == MAP_FAILED)
            return -1;
        if (mremap(base, span, span, MREMAP_MAYMOVE | MREMAP_FIXED, host) == MAP_FAILED) {
            munmap(host, span);
            return -1;
        }
        if (mmap(base, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
            mremap(host, span, span, MREMAP_MAYMOVE | MREMAP_FIXED, base);
            return -1;
        }
        range->copy = host;
        return 0;
    }
    range->copy = malloc(range->bytes ? range->bytes : 1);
    if (!range->copy)
        return -1;
    if (pread(range->handle->fd, range->copy, range->bytes, 0) != (ssize_t)range->bytes) {
        free(range->copy);
        return -1;
    }
    fallocate(range->handle->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)range->bytes);
    return 0;
}

static void put_back_range(struct saved_range *range)
{
    if (range->allocation) {
        /* Onto the reserved addresses: the same pages, at the same device addresses. */
        void *base = (void *)(uintptr_t)range->allocation->base;
        if (mremap(range->copy, range->allocation->span, range->allocation->span, MREMAP_MAYMOVE | MREMAP_FIXED,
                   base) == MAP_FAILED)
            fprintf(stderr, "libcuda (jupyter-vgpu simulated GPU): restoring %llu bytes at %p failed: %s\n",
                    (unsigned long long)range->bytes, base, strerror(errno));
        return;
    }
    if (pwrite(range->handle->fd, range->copy, range->bytes, 0) != (ssize_t)range->bytes)
        fprintf(stderr, "libcuda (jupyter-vgpu simulated GPU): restoring a VMM handle's %llu bytes failed: %s\n",
                (unsigned long long)range->bytes, strerror(errno));
    free(range->copy);
}

/* The ranges whose bytes a checkpoint keeps: linear allocations a copy has touched (the others
 * were never written) and VMM handles. */
static size_t list_ranges(struct saved_range *out)
{
    size_t count = 0;
    for (size_t i = 0; i < sim_cuda.allocations.count; i++) {
        struct sim_allocation *allocation = (struct sim_allocation *)sim_cuda.allocations.entries[i].value;
        if (allocation->kind == SIM_ALLOCATION_LINEAR && allocation->host_access) {
            if (out)
                out[count] = (struct saved_range){.bytes = allocation->size, .allocation = allocation};
            count++;
        }
    }
    for (size_t i = 0; i < sim_cuda.handles.count; i++) {
        if (sim_cuda.handles.entries[i].value != SIM_HANDLE_VMM)
            continue;
        struct sim_vmm_handle *handle = (struct sim_vmm_handle *)sim_cuda.handles.entries[i].key;
        if (out)
            out[count] = (struct saved_range){.bytes = handle->size, .handle = handle};
        count++;
    }
    return count;
}

static CUresult checkpoint_process(void)
{
    uint64_t started = sim_now_ns(), bytes = 0;
    size_t count = list_ranges(NULL);
    target.saved = calloc(count ? count : 1, sizeof *target.saved);
    if (!target.saved)
        return CUDA_ERROR_OUT_OF_MEMORY;
    list_ranges(target.saved);
    for (size_t i = 0; i < count; i++) {
        if (save_range(&target.saved[i]) != 0) {
            while (i-- > 0)
                put_back_range(&target.saved[i]);
            free(target.saved);
            target.saved = NULL;
            return CUDA_ERROR_OUT_OF_MEMORY; /* host memory ran out: still LOCKED, nothing lost */
        }
        bytes += target.saved[i].bytes;
    }
    target.saved_count = count;
    /* Every GPU resource goes, contexts included: the device's memory is free, NVML lists no pid. */
    for (int i = 0; i < sim_cuda.device_count; i++) {
        struct sim_cuda_device *device = &sim_cuda.devices[i];
        int slot = atomic_load(&device->slot);
        target.device_bytes[i] = target.device_contexts[i] = 0;
        if (slot < 0)
            continue;
        struct sim_slot *holdings = &device->view->shared->slots[slot];
        target.device_bytes[i] = atomic_load(&holdings->memory) & SIM_SLOT_BYTES_MASK;
        target.device_contexts[i] = atomic_load(&holdings->contexts);
        sim_memory_uncharge(device->view, slot, target.device_bytes[i]);
        sim_slot_add_contexts(device->view, slot, -(int)target.device_contexts[i]);
    }
    pace_copy(started, bytes);
    return CUDA_SUCCESS;
}

static CUresult restore_process(void)
{
    uint64_t started = sim_now_ns(), bytes = 0;
    for (int i = 0; i < sim_cuda.device_count; i++) {
        struct sim_cuda_device *device = &sim_cuda.devices[i];
        int slot = atomic_load(&device->slot);
        if (slot < 0 || sim_memory_charge(device->view, slot, target.device_bytes[i]) == 0)
            continue;
        while (i-- > 0) {
            slot = atomic_load(&sim_cuda.devices[i].slot);
            if (slot >= 0)
                sim_memory_uncharge(sim_cuda.devices[i].view, slot, target.device_bytes[i]);
        }
        if (target.restore_oom_fails)
            atomic_store(&target.record->state, CU_PROCESS_STATE_FAILED);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < sim_cuda.device_count; i++) {
        int slot = atomic_load(&sim_cuda.devices[i].slot);
        if (slot >= 0)
            sim_slot_add_contexts(sim_cuda.devices[i].view, slot, (int)target.device_contexts[i]);
    }
    for (size_t i = 0; i < target.saved_count; i++) {
        bytes += target.saved[i].bytes;
        put_back_range(&target.saved[i]);
    }
    free(target.saved);
    target.saved = NULL;
    target.saved_count = 0;
    pace_copy(started, bytes);
    return CUDA_SUCCESS;
}

/* Carries out one request; the state moves only on success. */
static CUresult perform(enum checkpoint_operation operation, uint32_t timeout_ms)
{
    _Atomic uint32_t *state = &target.record->state;
    static const CUprocessState required[] = {
        [OPERATION_LOCK] = CU_PROCESS_STATE_RUNNING,
        [OPERATION_CHECKPOINT] = CU_PROCESS_STATE_LOCKED,
        [OPERATION_RESTORE] = CU_PROCESS_STATE_CHECKPOINTED,
        [OPERATION_UNLOCK] = CU_PROCESS_STATE_LOCKED,
    };
    if (operation < OPERATION_LOCK || operation > OPERATION_UNLOCK)
        return CUDA_ERROR_INVALID_VALUE;
    if (atomic_load(state) != (uint32_t)required[operation])
        return CUDA_ERROR_ILLEGAL_STATE;
    CUresult result = CUDA_SUCCESS;
    switch (operation) {
    case OPERATION_LOCK:
        result = lock_process(timeout_ms);
        if (result == CUDA_SUCCESS)
            atomic_store(state, CU_PROCESS_STATE_LOCKED);
        break;
    case OPERATION_CHECKPOINT:
        result = checkpoint_process();
        if (result == CUDA_SUCCESS)
            atomic_store(state, CU_PROCESS_STATE_CHECKPOINTED);
        break;
    case OPERATION_RESTORE:
        result = restore_process();
        if (result == CUDA_SUCCESS)
            atomic_store(state, CU_PROCESS_STATE_LOCKED);
        break;
    case OPERATION_UNLOCK:
        unlock_process();
        atomic_store(state, CU_PROCESS_STATE_RUNNING);
        break;
    }
    return result;
}

static void *serve_requests(void *argument)
{
    (void)argument;
    is_checkpoint_thread = 1;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are for the program's own threads */
    struct sim_checkpoint_record *record = target.record;
    atomic_store(&record->restore_tid, (uint32_t)syscall(SYS_gettid));
    futex(&record->restore_tid, FUTEX_WAKE, INT_MAX, NULL);
    uint32_t seen = atomic_load(&record->response);
    for (;;) {
        uint32_t request = atomic_load(&record->request);
        if (request == seen) {
            futex(&record->request, FUTEX_WAIT, seen, NULL);
            continue;
        }
        seen = request;
        CUresult result =
            perform((enum checkpoint_operation)atomic_load(&record->operation), atomic_load(&record->timeout_ms));
        atomic_store(&record->result, result);
        atomic_store(&record->response, request);
        futex(&record->response, FUTEX_WAKE, INT_MAX, NULL);
    }
    return NULL;
}

static uint64_t parse_bandwidth(const char *text)
{
    if (!text)
        return 0;
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno || end == text || *end != '\0' || text[0] == '-') {
        fprintf(stderr,
                "libcuda (jupyter-vgpu simulated GPU): VGPU_SIM_CHECKPOINT_BANDWIDTH=%s is not a number of bytes per "
                "second (a whole number, such as 7000000000); checkpoints copy as fast as the host does\n",
                text);
        return 0;
    }
    return value;
}

/* The child of a fork has no checkpoint thread; it claims its own record at its cuInit. */
static void forget_target_after_fork(void)
{
    target.record = NULL;
    atomic_store(&sim_checkpoint_gate, 0);
    pthread_rwlock_init(&target.copies, NULL);
}

static struct sim_checkpoint_record *claim_record(struct sim_checkpoint_record *records, uint64_t identity)
{
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < SIM_CHECKPOINT_RECORDS; i++) {
            uint64_t owner = atomic_load(&records[i].owner);
            /* Round 0: our own (after exec) or a free record; round 1: one whose owner is gone. */
            int take = round == 0 ? owner == identity || owner == 0 : owner != 0 && !sim_identity_alive(owner);
            if (take && atomic_compare_exchange_strong(&records[i].owner, &owner, identity))
                return &records[i];
        }
    }
    return NULL;
}

void sim_checkpoint_start(const struct sim_env *env)
{
    if (!CHECKPOINT_SUPPORTED)
        return;
    static int fork_handler_installed;
    if (!fork_handler_installed)
        fork_handler_installed = pthread_atfork(NULL, NULL, forget_target_after_fork) == 0;
    target.bandwidth = parse_bandwidth(env->checkpoint_bandwidth);
    target.restore_oom_fails = env->restore_oom_fails && strcmp(env->restore_oom_fails, "1") == 0;
    struct sim_checkpoint_record *record = claim_record(sim_cuda.machine.checkpoint_records, sim_cuda.identity);
    if (!record)
        return; /* more live CUDA processes than records: this one cannot be checkpointed */
    atomic_store(&record->controller, 0);
    atomic_store(&record->state, CU_PROCESS_STATE_RUNNING);
    atomic_store(&record->restore_tid, 0);
    atomic_store(&record->request, atomic_load(&record->response));
    target.record = record;
    pthread_attr_t attributes;
    pthread_t thread;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attributes, 256 << 10);
    if (pthread_create(&thread, &attributes, serve_requests, NULL) != 0) {
        target.record = NULL;
        atomic_store(&record->owner, 0);
    } else {
        /* Ready to serve before cuInit returns: a controller may ask at once. */
        while (atomic_load(&record->restore_tid) == 0)
            futex(&record->restore_tid, FUTEX_WAIT, 0, NULL);
    }
    pthread_attr_destroy(&attributes);
}

/* ---- the controller's side ---------------------------------------------------------------------- */

static void open_controller_machine(void)
{
    struct sim_env env;
    sim_env_read(&env);
    controller.opened = sim_machine_open(&controller.machine, &env, "libcuda (jupyter-vgpu simulated GPU)") == 0;
}

/* The checkpoint records of this machine: the driver's mapping once initialised, else one of
 * the controller's own. */
static struct sim_checkpoint_record *machine_records(void)
{
    if (atomic_load(&sim_cuda.state) == SIM_READY)
        return sim_cuda.machine.checkpoint_records;
    pthread_once(&controller.once, open_controller_machine);
    return controller.opened ? controller.machine.checkpoint_records : NULL;
}

/* The live CUDA process `pid` (as the driver numbers it), or NULL. */
static struct sim_checkpoint_record *find_process(int pid, uint64_t *identity)
{
    struct sim_checkpoint_record *records = machine_records();
    if (!records || pid <= 0)
        return NULL;
    for (int i = 0; i < SIM_CHECKPOINT_RECORDS; i++) {
        uint64_t owner = atomic_load(&records[i].owner);
        if (owner != 0 && sim_identity_pid(owner) == (pid_t)pid && sim_identity_alive(owner)) {
            *identity = owner;
            return &records[i];
        }
    }
    return NULL;
}

/* Sends one request to `pid`'s checkpoint thread and waits for its answer. One controller at a
 * time per process: a second waits for the first (or takes over from one that died). */
static CUresult request(int pid, enum checkpoint_operation operation, uint32_t timeout_ms)
{
    uint64_t owner;
    struct sim_checkpoint_record *record = find_process(pid, &owner);
    if (!record)
        return CUDA_ERROR_INVALID_VALUE;
    if ((pid_t)pid == sim_driver_pid())
        return CUDA_ERROR_NOT_SUPPORTED; /* the checkpoint thread would wait on its own caller */
    uint64_t me = sim_identity(sim_driver_pid());
    for (;;) {
        uint64_t holder = atomic_load(&record->controller);
        if (holder == 0 || !sim_identity_alive(holder)) {
            if (atomic_compare_exchange_strong(&record->controller, &holder, me))
                break;
            continue;
        }
        struct timespec pause = {0, 1000000L}; /* another controller's request: rare and short */
        nanosleep(&pause, NULL);
        if (atomic_load(&record->owner) != owner)
            return CUDA_ERROR_INVALID_VALUE;
    }
    atomic_store(&record->operation, operation);
    atomic_store(&record->timeout_ms, timeout_ms);
    uint32_t sequence = atomic_load(&record->response) + 1;
    atomic_store(&record->request, sequence);
    futex(&record->request, FUTEX_WAKE, INT_MAX, NULL);
    CUresult result = CUDA_ERROR_INVALID_VALUE; /* the process ended before answering */
    for (;;) {
        uint32_t answered = atomic_load(&record->response);
        if (answered == sequence) {
            result = atomic_load(&record->result);
            break;
        }
        if (atomic_load(&record->owner) != owner || !sim_identity_alive(owner))
            break;
        struct timespec look_again = {0, 100000000L}; /* to notice a target that died */
        futex(&record->response, FUTEX_WAIT, answered, &look_again);
    }
    atomic_compare_exchange_strong(&record->controller, &me, 0);
    return result;
}

static int all_zero(const void *bytes, size_t size)
{
    const unsigned char *byte = bytes;
    for (size_t i = 0; i < size; i++)
        if (byte[i])
            return 0;
    return 1;
}

/* The record of the CUDA process `pid` for a query answering into `out`, or the error. */
static CUresult queried_process(int pid, const void *out, const struct sim_checkpoint_record **record)
{
    uint64_t owner;
    if (!CHECKPOINT_SUPPORTED)
        return CUDA_ERROR_NOT_SUPPORTED;
    *record = out ? find_process(pid, &owner) : NULL;
    return *record ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* A request checked as the driver checks it: supported, then its arguments (`arguments_valid`:
 * the reserved fields are zero), then, for a restore, a controller that has initialised the
 * driver (without persistence mode, which the simulator has not, a restore needs one). */
static CUresult checked_request(int pid, enum checkpoint_operation operation, uint32_t timeout_ms, int arguments_valid)
{
    if (!CHECKPOINT_SUPPORTED)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!arguments_valid)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult ready = operation == OPERATION_RESTORE ? sim_ready() : CUDA_SUCCESS;
    return ready != CUDA_SUCCESS ? ready : request(pid, operation, timeout_ms);
}

CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
    const struct sim_checkpoint_record *record;
    CUresult result = queried_process(pid, state, &record);
    if (result == CUDA_SUCCESS)
        *state = (CUprocessState)atomic_load(&record->state);
    return result;
}

CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
    const struct sim_checkpoint_record *record;
    CUresult result = queried_process(pid, tid, &record);
    if (result == CUDA_SUCCESS)
        *tid = (int)atomic_load(&record->restore_tid);
    return result;
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    int valid = !args || (args->reserved0 == 0 && all_zero(args->reserved1, sizeof args->reserved1));
    return checked_request(pid, OPERATION_LOCK, args ? args->timeoutMs : 0, valid);
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
    return checked_request(pid, OPERATION_CHECKPOINT, 0, !args || all_zero(args, sizeof *args));
}

CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    return checked_request(pid, OPERATION_RESTORE, 0, !args || all_zero(args, sizeof *args));
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
    return checked_request(pid, OPERATION_UNLOCK, 0, !args || all_zero(args, sizeof *args));
}
