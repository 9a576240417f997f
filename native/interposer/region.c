/*
 * The slice's region and limits page: attaching to them (at load), the slice's limits, why a
 * slice is failed closed, this process's slot, and reaping the slots of processes that are gone.
 *
 * The limits page is opened read-only and mapped without write permission: this library never
 * writes it, and where the page belongs to another account (the node's broker) nothing in the
 * kernel can.
 *
 * Failing closed: a process of a slice that cannot read its region or its limits page (unset,
 * missing, another version, corrupt) must not run unbounded, so every allocation is refused and the reason is
 * printed once. Nothing is refused before the program asks for GPU memory, so tools that
 * merely inherit LD_PRELOAD (a shell, git) stay silent.
 *
 * Slots (region.h): pid 0 is free; a claimant swaps 0 -> -pid, fills the slot, then publishes
 * pid. A reaper swaps a dead owner's pid -> 0 in one compare-and-swap, so two reapers never both
 * free it and a reaper that dies mid-reap leaves a valid state either way. A claimant that dies
 * between its two steps leaves -pid, which reapers free once that pid is gone.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "vgpu/proc.h"

#define R (vgpu_state.region)

#define SLOT_FREE 0
#define SLOT_NONE (-1)
#define SLOT_CLAIMING (-2)
#define SLOT_RELEASED (-3) /* given back at exit: later calls are no longer counted */

/* ---- attaching ------------------------------------------------------------------------ */

static const char RESTART_HINT[] = "restart the kernel from a matching jupyter-vgpu";

static int attach_failed(const char *format, ...) __attribute__((format(printf, 1, 2)));
static int attach_failed(const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(R.attach_failure, sizeof R.attach_failure, format, args);
    va_end(args);
    return -1;
}

/* Opens one of the slice's files (`what`: "slice region", "the slice's limits page"); on failure
 * fills R.attach_failure and returns -1. */
static int open_slice_file(const char *path, const char *what, int flags)
{
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0)
        attach_failed("jupyter-vgpu: %s %s cannot be opened (%s): allocations are refused; %s", what, path,
                      strerror(errno), RESTART_HINT);
    return fd;
}

/* Opens one of the slice's files and reads its first `size` bytes (the header) into `header`:
 * returns the open fd (-1 as open_slice_file) and sets *file_size to the file's size, or to -1
 * where the file is shorter than the header or cannot be measured. */
static int read_slice_header(const char *path, const char *what, int flags, void *header, size_t size,
                             long long *file_size)
{
    int fd = open_slice_file(path, what, flags);
    if (fd < 0)
        return -1;
    struct stat info;
    ssize_t got = pread(fd, header, size, 0);
    *file_size = fstat(fd, &info) == 0 && got == (ssize_t)size ? (long long)info.st_size : -1;
    return fd;
}

/* Maps `size` bytes of an opened slice file and closes it; NULL (R.attach_failure filled) on failure. */
static void *map_slice_file(int fd, const char *path, const char *what, size_t size, int protection)
{
    void *mapped = mmap(NULL, size, protection, MAP_SHARED, fd, 0);
    int mmap_errno = errno;
    close(fd);
    if (mapped != MAP_FAILED)
        return mapped;
    attach_failed("jupyter-vgpu: %s %s cannot be mapped (%s): allocations are refused; %s", what, path,
                  strerror(mmap_errno), RESTART_HINT);
    return NULL;
}

/* Maps the region and checks its header; on failure fills R.attach_failure. */
static int attach_region(const char *path)
{
    if (!path || !*path)
        return attach_failed("jupyter-vgpu: VGPU_REGION is not set, so this process is in no slice: GPU "
                             "allocations are refused; start it from jupyter-vgpu (a vGPU kernel or "
                             "`jupyter vgpu run`)");
    struct vgpu_region header;
    long long file_size;
    int fd =
        read_slice_header(path, "slice region", O_RDWR, &header, offsetof(struct vgpu_region, reserved0), &file_size);
    if (fd < 0)
        return -1;
    if (file_size < 0 || header.magic != VGPU_REGION_MAGIC) {
        close(fd);
        return attach_failed("jupyter-vgpu: %s is not a jupyter-vgpu slice region: allocations are "
                             "refused; %s",
                             path, RESTART_HINT);
    }
    if (header.version != VGPU_REGION_VERSION) {
        close(fd);
        return attach_failed("jupyter-vgpu: slice region %s is version %u, this libvgpu.so reads version "
                             "%d: allocations are refused; %s",
                             path, header.version, VGPU_REGION_VERSION, RESTART_HINT);
    }
    if (header.region_size != sizeof(struct vgpu_region) || header.max_procs != VGPU_REGION_MAX_PROCS ||
        (uint64_t)file_size < sizeof(struct vgpu_region)) {
        close(fd);
        return attach_failed("jupyter-vgpu: slice region %s is corrupt (region_size %u, max_procs %u, "
                             "file size %lld; expected %zu, %d, at least %zu): allocations are refused; %s",
                             path, header.region_size, header.max_procs, file_size, sizeof(struct vgpu_region),
                             VGPU_REGION_MAX_PROCS, sizeof(struct vgpu_region), RESTART_HINT);
    }
    R.region = map_slice_file(fd, path, "slice region", sizeof(struct vgpu_region), PROT_READ | PROT_WRITE);
    return R.region ? 0 : -1;
}

/* Maps the limits page read-only and checks its header; on failure fills R.attach_failure. */
static int attach_limits_page(const char *path)
{
    if (!*path)
        return attach_failed("jupyter-vgpu: the slice's limits page has no usable name (VGPU_LIMITS, or "
                             "VGPU_REGION + \".limits\", is too long): allocations are refused; %s",
                             RESTART_HINT);
    struct vgpu_limits_page header;
    long long file_size;
    int fd = read_slice_header(path, "the slice's limits page", O_RDONLY, &header,
                               offsetof(struct vgpu_limits_page, reserved0), &file_size);
    if (fd < 0)
        return -1;
    int valid = file_size >= 0 && header.magic == VGPU_LIMITS_MAGIC;
    if (!valid || header.version != VGPU_REGION_VERSION || header.page_size != sizeof(struct vgpu_limits_page) ||
        (uint64_t)file_size < sizeof(struct vgpu_limits_page)) {
        close(fd);
        if (valid && header.version != VGPU_REGION_VERSION)
            return attach_failed("jupyter-vgpu: the slice's limits page %s is version %u, this libvgpu.so "
                                 "reads version %d: allocations are refused; %s",
                                 path, header.version, VGPU_REGION_VERSION, RESTART_HINT);
        return attach_failed("jupyter-vgpu: %s is not a jupyter-vgpu limits page: allocations are "
                             "refused; %s",
                             path, RESTART_HINT);
    }
    R.page = map_slice_file(fd, path, "the slice's limits page", sizeof(struct vgpu_limits_page), PROT_READ);
    return R.page ? 0 : -1;
}

/* A slot that already holds this pid belongs to the image this process ran before an exec
 * (this image has claimed none yet): the exec released its GPU memory, so it stops counting. */
static void release_slots_of_previous_image(struct vgpu_region *region)
{
    int32_t pid = (int32_t)getpid();
    uint32_t limit = vgpu_slots_in_use(region);
    for (uint32_t index = 0; index < limit; index++) {
        int32_t owner = pid;
        if (__atomic_compare_exchange_n(&region->procs[index].pid, &owner, SLOT_FREE, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED))
            VGPU_LOG(VGPU_LOG_INFO, "gave back slot %u of this process's image before exec", index);
    }
}

/* A forked child is a process of its own: it counts separately from zero, with a slot of its
 * own claimed on its first GPU call. */
static void after_fork_in_child(void)
{
    atomic_store_explicit(&R.slot_index, SLOT_NONE, memory_order_relaxed);
}

const uint32_t vgpu_never_suspended = 0;

static void initialise(void)
{
    const struct vgpu_env *env = vgpu_env();
    if (attach_region(env->region_path) == 0 && attach_limits_page(env->limits_path) == 0) {
        VGPU_LOG(VGPU_LOG_INFO, "attached to slice region %s, limits %s", env->region_path, env->limits_path);
        __atomic_store_n(&R.suspended_flag, &R.page->suspended, __ATOMIC_RELEASE);
        release_slots_of_previous_image(R.region);
    } else {
        /* Both or neither: a region without its limits would count usage against no cap. */
        if (R.region)
            munmap(R.region, sizeof(struct vgpu_region));
        R.region = NULL;
        VGPU_LOG(VGPU_LOG_WARN, "%s", R.attach_failure);
    }
    pthread_atfork(NULL, NULL, after_fork_in_child);
    atomic_store_explicit(&R.ready, 1, memory_order_release);
}

/* Every hook comes through here: an inline check first, the pthread_once call only until the
 * constructor (or whatever ran first) has attached. */
static inline void ensure_initialised(void)
{
    if (__builtin_expect(!atomic_load_explicit(&R.ready, memory_order_acquire), 0))
        pthread_once(&R.init_once, initialise);
}

/* At load, not at the first GPU call: the image this pid ran before an exec may have held a
 * slot, which must stop counting whether or not this image ever uses the GPU. A few system
 * calls; the slot itself is claimed only when the process first uses the GPU. */
__attribute__((constructor)) static void attach_at_load(void)
{
    ensure_initialised();
}

struct vgpu_region *vgpu_region(void)
{
    ensure_initialised();
    return R.region;
}

const struct vgpu_limits_page *vgpu_limits_page(void)
{
    ensure_initialised();
    return R.page;
}

void vgpu_request_resume(void)
{
    struct vgpu_proc_slot *slot = vgpu_self_slot();
    if (slot)
        __atomic_add_fetch(&slot->resume_requests, 1, __ATOMIC_RELEASE);
}

/* ---- limits ----------------------------------------------------------------------------- */

static int limits_valid(uint64_t memory_limit, uint32_t sm_share, uint32_t policy, uint64_t check)
{
    return sm_share >= VGPU_SM_SHARE_MIN && sm_share <= VGPU_SM_SHARE_MAX &&
           (policy == VGPU_POLICY_HARD || policy == VGPU_POLICY_BURST) &&
           check == vgpu_limits_check(memory_limit, sm_share, policy);
}

static int fail(enum vgpu_fail_kind kind)
{
    atomic_store_explicit(&R.last_failure, kind, memory_order_relaxed);
    return -1;
}

int vgpu_read_limits(struct vgpu_limits_snapshot *out)
{
    ensure_initialised();
    const struct vgpu_limits_page *page = R.page;
    if (!page || !R.region)
        return fail(VGPU_FAIL_ATTACH);
    /* Seqlock read (region.h). A writer holds a copy odd only for a few stores, so the loop
     * ends at once in practice; the bound only keeps a scribbled page from hanging us. */
    for (int attempt = 0; attempt < 100000; attempt++) {
        uint64_t active = __atomic_load_n(&page->active_limits, __ATOMIC_ACQUIRE);
        if (active > 1)
            break;
        const struct vgpu_limits *copy = &page->limits[active];
        uint64_t before = __atomic_load_n(&copy->sequence, __ATOMIC_ACQUIRE);
        if (before & 1) {
            if (attempt > 64)
                sched_yield();
            continue;
        }
        uint64_t memory_limit = __atomic_load_n(&copy->memory_limit, __ATOMIC_RELAXED);
        uint32_t sm_share = __atomic_load_n(&copy->sm_share, __ATOMIC_RELAXED);
        uint32_t policy = __atomic_load_n(&copy->policy, __ATOMIC_RELAXED);
        uint64_t check = __atomic_load_n(&copy->check, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&copy->sequence, __ATOMIC_RELAXED) != before)
            continue;
        if (!limits_valid(memory_limit, sm_share, policy, check))
            break;
        out->memory_limit = memory_limit;
        out->sm_share = sm_share;
        out->policy = policy;
        return 0;
    }
    return fail(VGPU_FAIL_LIMITS);
}

/* Written when first needed, not at load: most processes never fail, and formatting is the
 * costliest part of what a process would otherwise do at start-up. */
static void format_failure_messages(void)
{
    const struct vgpu_env *env = vgpu_env();
    snprintf(R.limits_failure, sizeof R.limits_failure,
             "jupyter-vgpu: the slice's limits page %s is corrupt (its published limits fail their "
             "check): allocations are refused; %s",
             env->limits_path, RESTART_HINT);
    snprintf(R.slot_failure, sizeof R.slot_failure,
             "jupyter-vgpu: slice region %s has no free process slot (all %d are held by running "
             "processes): allocations of this process are refused",
             env->region_path, VGPU_REGION_MAX_PROCS);
}

const char *vgpu_fail_reason(void)
{
    ensure_initialised();
    pthread_once(&R.messages_once, format_failure_messages);
    switch (atomic_load_explicit(&R.last_failure, memory_order_relaxed)) {
    case VGPU_FAIL_ATTACH: return R.attach_failure;
    case VGPU_FAIL_LIMITS: return R.limits_failure;
    case VGPU_FAIL_NO_SLOT: return R.slot_failure;
    default: return R.region ? "" : R.attach_failure;
    }
}

void vgpu_report_fail_closed(void)
{
    int kind = atomic_load_explicit(&R.last_failure, memory_order_relaxed);
    unsigned bit = 1u << kind;
    if (atomic_fetch_or_explicit(&R.reported_failures, bit, memory_order_relaxed) & bit)
        return;
    const char *reason = vgpu_fail_reason();
    char line[sizeof R.attach_failure + 1];
    int length = snprintf(line, sizeof line, "%s\n", reason);
    if (length > 0)
        vgpu_write_stderr(line, (size_t)length < sizeof line ? (size_t)length : sizeof line - 1);
}

/* ---- slots ------------------------------------------------------------------------------ */

/* Whether the owner of a slot still runs. Without /proc (start time 0) only kill(2) can tell. */
static int slot_owner_alive(pid_t pid, uint64_t start_time)
{
    if (start_time == 0)
        return kill(pid, 0) == 0 || errno != ESRCH;
    return vgpu_proc_alive(pid, start_time);
}

static void raise_high_water(struct vgpu_region *region, uint32_t at_least)
{
    uint32_t seen = __atomic_load_n(&region->procs_high_water, __ATOMIC_SEQ_CST);
    while (seen < at_least && !__atomic_compare_exchange_n(&region->procs_high_water, &seen, at_least, 0,
                                                           __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        ;
}

uint32_t vgpu_slots_in_use(const struct vgpu_region *region)
{
    uint32_t high_water = __atomic_load_n(&region->procs_high_water, __ATOMIC_SEQ_CST);
    return high_water < VGPU_REGION_MAX_PROCS ? high_water : VGPU_REGION_MAX_PROCS;
}

/* Takes a free slot and publishes it zeroed. Returns its index or -1. */
static int claim_slot(struct vgpu_region *region)
{
    int32_t pid = (int32_t)getpid();
    uint64_t start_time = vgpu_proc_start_time(pid);
    /* Processes of the slice that died since anyone last looked stop counting before this
     * one's first allocation is checked against the cap. */
    vgpu_reap_dead_slots();
    for (int index = 0; index < VGPU_REGION_MAX_PROCS; index++) {
        struct vgpu_proc_slot *slot = &region->procs[index];
        int32_t owner = __atomic_load_n(&slot->pid, __ATOMIC_ACQUIRE);
        if (owner != SLOT_FREE)
            continue;
        if (!__atomic_compare_exchange_n(&slot->pid, &owner, -pid, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            continue;
        __atomic_store_n(&slot->start_time, start_time, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->allocated, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->driver_reserved, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->launches, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->throttled_ns, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->sm_util_permille, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->oom_refusals, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->wanting, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->granted, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->nvml_pid, 0, __ATOMIC_RELAXED);
        /* High water first: once the pid is public, every summer must reach this slot. */
        raise_high_water(region, (uint32_t)index + 1);
        __atomic_store_n(&slot->pid, pid, __ATOMIC_SEQ_CST);
        return index;
    }
    return -1;
}

int vgpu_reap_dead_slots(void)
{
    struct vgpu_region *region = vgpu_region();
    if (!region)
        return 0;
    int32_t self = (int32_t)getpid();
    uint32_t limit = vgpu_slots_in_use(region);
    int reaped = 0;
    for (uint32_t index = 0; index < limit; index++) {
        struct vgpu_proc_slot *slot = &region->procs[index];
        int32_t owner = __atomic_load_n(&slot->pid, __ATOMIC_ACQUIRE);
        if (owner == SLOT_FREE || owner == self || owner == -self)
            continue;
        int alive = owner > 0 ? slot_owner_alive(owner, __atomic_load_n(&slot->start_time, __ATOMIC_RELAXED))
                              : (kill(-owner, 0) == 0 || errno != ESRCH); /* mid-claim: start time not yet set */
        if (alive)
            continue;
        if (__atomic_compare_exchange_n(&slot->pid, &owner, SLOT_FREE, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
            reaped++;
            VGPU_LOG(VGPU_LOG_INFO, "reaped slot %u of process %d, which is gone", index, owner > 0 ? owner : -owner);
        }
    }
    return reaped;
}

uint64_t vgpu_slice_usage(void)
{
    struct vgpu_region *region = vgpu_region();
    if (!region)
        return 0;
    uint32_t limit = vgpu_slots_in_use(region);
    uint64_t total = 0;
    for (uint32_t index = 0; index < limit; index++) {
        struct vgpu_proc_slot *slot = &region->procs[index];
        if (__atomic_load_n(&slot->pid, __ATOMIC_SEQ_CST) <= 0)
            continue;
        total += __atomic_load_n(&slot->allocated, __ATOMIC_SEQ_CST);
        total += __atomic_load_n(&slot->driver_reserved, __ATOMIC_SEQ_CST);
    }
    return total;
}

int vgpu_is_slice_uuid(const char *uuid)
{
    const struct vgpu_limits_page *page = vgpu_limits_page();
    if (!page || !page->device_uuid[0])
        return 1;
    return strncasecmp(uuid, page->device_uuid, VGPU_DEVICE_UUID_SIZE) == 0;
}

struct vgpu_proc_slot *vgpu_self_slot(void)
{
    struct vgpu_region *region = vgpu_region();
    if (!region)
        return NULL;
    int index = atomic_load_explicit(&R.slot_index, memory_order_acquire);
    if (index >= 0)
        return &region->procs[index];
    if (index == SLOT_RELEASED)
        return NULL;
    int expected = SLOT_NONE;
    if (atomic_compare_exchange_strong_explicit(&R.slot_index, &expected, SLOT_CLAIMING, memory_order_acq_rel,
                                                memory_order_acquire)) {
        index = claim_slot(region);
        atomic_store_explicit(&R.slot_index, index >= 0 ? index : SLOT_NONE, memory_order_release);
        if (index < 0) {
            fail(VGPU_FAIL_NO_SLOT);
            return NULL;
        }
        VGPU_LOG(VGPU_LOG_INFO, "claimed slot %d of slice region %s", index, vgpu_env()->region_path);
        return &region->procs[index];
    }
    /* Another thread is claiming: a few microseconds. */
    while ((index = atomic_load_explicit(&R.slot_index, memory_order_acquire)) == SLOT_CLAIMING)
        sched_yield();
    if (index == SLOT_RELEASED)
        return NULL;
    if (index < 0) {
        fail(VGPU_FAIL_NO_SLOT);
        return NULL;
    }
    return &region->procs[index];
}

int vgpu_slot_released(void)
{
    return atomic_load_explicit(&R.slot_index, memory_order_acquire) == SLOT_RELEASED;
}

/* A process that exits normally gives its slot back itself: its memory goes with it, and the
 * slice should not wait for a reaper to notice. Runs after the program's exit handlers and the
 * driver's own teardown (libvgpu.so is loaded first, so finalised last; priority 101 puts it
 * after this library's other destructors), so their frees find the slot still there. */
__attribute__((destructor(101))) static void release_slot_at_exit(void)
{
    struct vgpu_region *region = R.region;
    int index = atomic_exchange_explicit(&R.slot_index, SLOT_RELEASED, memory_order_acq_rel);
    if (!region || index < 0)
        return;
    int32_t self = (int32_t)getpid();
    __atomic_compare_exchange_n(&region->procs[index].pid, &self, SLOT_FREE, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED);
}
