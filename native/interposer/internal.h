/*
 * What the files of libvgpu.so share. One concern per file:
 *   resolve.c  symbol resolution: real dlsym, the dlsym override (dlsym_entry.S), the hook
 *              table built from hooks.def, cuGetProcAddress, lazy lookup of real entry points
 *   state.c    the one struct of process state, environment (read here and nowhere else),
 *              region attach / validation / fail-closed reason, proc slot, fork handling,
 *              the monitor thread (reaper + driver memory refresh)
 *   memory.c   allocation hooks, the allocation table, the cap check, virtualised totals
 *   nvml.c     NVML hooks
 *   launch.c   launch hooks: cost of a launch, then vgpu_launch_admit()
 *   pacing.c   the SM-share limiter: per-thread token caches, the shared pool, the controller
 *   log.c      logging (stderr only, silent unless asked, except the out-of-memory line)
 * All symbols here have hidden visibility (the build passes -fvisibility=hidden); only hooks
 * and dlsym are exported, through the version script native/build.py generates from hooks.def.
 */
#ifndef VGPU_INTERPOSER_INTERNAL_H
#define VGPU_INTERPOSER_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "vgpu/cuda_abi.h"
#include "vgpu/nvml_abi.h"
#include "vgpu/region.h"

#define VGPU_EXPORT __attribute__((visibility("default")))

/* ---- resolve.c ---------------------------------------------------------------------- */

/* One id per line of hooks.def. */
enum vgpu_hook_id {
#define VGPU_CUDA_HOOK(symbol) VGPU_HOOK_##symbol,
#define VGPU_NVML_HOOK(symbol) VGPU_HOOK_##symbol,
#include "hooks.def"
    VGPU_HOOK_COUNT
};

/* Function-pointer types named after each entry point: vgpu_pfn_cuMemAlloc_v2, ... */
#define VGPU_DECLARE_PFN(ret, name, params) typedef ret(*vgpu_pfn_##name) params;
VGPU_CUDA_ENTRY_POINTS(VGPU_DECLARE_PFN)
VGPU_NVML_ENTRY_POINTS(VGPU_DECLARE_PFN)
#undef VGPU_DECLARE_PFN

enum vgpu_library { VGPU_LIB_CUDA, VGPU_LIB_NVML, VGPU_LIB_COUNT };

/* The real entry point behind a hook, or NULL when the installed driver lacks it: an inline
 * read of the cache (end of this file) on every forwarded call, vgpu_real_lookup the first
 * time. */
static inline void *vgpu_real(enum vgpu_hook_id id);
void *vgpu_real_lookup(enum vgpu_hook_id id);

/* The real entry point of any symbol of the driver or NVML (hooked or not), or NULL. Not
 * cached: callers on a hot path keep what it returns. */
void *vgpu_real_symbol(enum vgpu_library library, const char *symbol);

/* Entry points libvgpu.so calls but does not hook, resolved and cached like the hooks' real
 * ones: X(library, name). */
#define VGPU_CALLED_ENTRY_POINTS(X)                                                              \
    X(VGPU_LIB_CUDA, cuCtxGetCurrent)                                                            \
    X(VGPU_LIB_CUDA, cuCtxGetDevice)                                                             \
    X(VGPU_LIB_CUDA, cuDevicePrimaryCtxGetState)                                                 \
    X(VGPU_LIB_CUDA, cuDeviceGetCount)                                                           \
    X(VGPU_LIB_CUDA, cuDeviceGetUuid)                                                            \
    X(VGPU_LIB_CUDA, cuDeviceGetUuid_v2)                                                         \
    X(VGPU_LIB_NVML, nvmlInit_v2)                                                                \
    X(VGPU_LIB_NVML, nvmlDeviceGetHandleByUUID)                                                  \
    X(VGPU_LIB_NVML, nvmlDeviceGetHandleByIndex_v2)                                              \
    X(VGPU_LIB_NVML, nvmlDeviceGetUUID)                                                          \
    X(VGPU_LIB_NVML, nvmlDeviceGetComputeRunningProcesses_v3)
enum vgpu_called_id {
#define VGPU_CALLED_ID(library, name) VGPU_CALLED_##name,
    VGPU_CALLED_ENTRY_POINTS(VGPU_CALLED_ID)
#undef VGPU_CALLED_ID
    VGPU_CALLED_COUNT
};
void *vgpu_real_called(enum vgpu_called_id id);
#define VGPU_CALLED(name) ((vgpu_pfn_##name)vgpu_real_called(VGPU_CALLED_##name))

/* Builds the hook-name table; state.c's constructor calls it before anything else. */
void vgpu_resolve_init(void);

/* Calls the real entry point behind hook `name`; a hook whose real function the installed
 * driver lacks reports it as missing instead of calling through NULL. */
#define VGPU_FORWARD_CUDA(name, ...)                                                          \
    do {                                                                                     \
        vgpu_pfn_##name real_ = (vgpu_pfn_##name)vgpu_real(VGPU_HOOK_##name);                \
        return real_ ? real_(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND;                            \
    } while (0)
#define VGPU_REAL(name) ((vgpu_pfn_##name)vgpu_real(VGPU_HOOK_##name))

/* ---- state.c ------------------------------------------------------------------------ */

/* The slice's limits as read at one instant (seqlock read of region.h's `limits`). */
struct vgpu_limits_snapshot {
    uint64_t memory_limit; /* bytes; 0: no cap */
    uint32_t sm_share;     /* 1..100 */
    uint32_t policy;       /* VGPU_POLICY_* */
};

/* Reads the current limits. Returns 0, or -1 when the slice is failed closed (no region, a
 * region of another version, a corrupt one); vgpu_fail_reason() then says why. */
int vgpu_read_limits(struct vgpu_limits_snapshot *out);
const char *vgpu_fail_reason(void);

/* The Jupyter kernel whose slice this is (for messages), or "" outside a Jupyter server. */
const char *vgpu_kernel_id(void);

/* Prints vgpu_fail_reason() on stderr, once per process, whatever the log level: the slice is
 * failed closed and the user must learn why their allocations are refused. */
void vgpu_report_fail_closed(void);

/* The mapped region and this process's slot; NULL when failed closed. vgpu_self_slot() claims
 * a slot on its first call in a process (and again in a forked child). */
struct vgpu_region *vgpu_region(void);
struct vgpu_proc_slot *vgpu_self_slot(void);

/* How many slots from the start of `procs` may be in use (the high water, bounded): scans
 * of the slots stop there. */
uint32_t vgpu_slots_in_use(const struct vgpu_region *region);

/* This process's slot if it claimed one already (never claims); NULL otherwise. */
struct vgpu_proc_slot *vgpu_claimed_slot(void);

/* Whether this process gave its slot back (it is exiting): what it does from then on is no
 * longer counted, and not refused either. */
int vgpu_slot_released(void);

/* Whether `uuid` (NVML form, "GPU-..." or "MIG-...") names the slice's device. An empty region
 * UUID matches every device: the slice then covers whatever device the process uses. */
int vgpu_is_slice_uuid(const char *uuid);

/* Bytes the whole slice holds now: allocated + driver_reserved over live slots. */
uint64_t vgpu_slice_usage(void);

/* Frees the slots of processes that are gone; returns how many were reaped. */
int vgpu_reap_dead_slots(void);

/* ---- memory.c ----------------------------------------------------------------------- */

/* Sets this process's driver_reserved from NVML's figure for it (contexts and other driver
 * memory beyond what the hooks counted). Called by the monitor thread and after contexts. */
void vgpu_refresh_driver_reserved(void);

/* Forgets the allocation table: a forked child owns none of its parent's allocations. */
void vgpu_memory_forget_after_fork(void);

/* What the program is shown for the slice's device, from what the driver reports. Returns 0
 * when the driver's figures stand (no cap), 1 when `view` replaces them: total = the cap,
 * used = the slice's usage, free = what is left (never below 0, never above the device's own
 * free memory). A failed-closed slice shows no free memory. */
struct vgpu_slice_view {
    uint64_t total, used, free;
};
int vgpu_slice_view(uint64_t real_total, uint64_t real_free, struct vgpu_slice_view *view);

/* ---- pacing.c ----------------------------------------------------------------------- */

/* Called by every launch hook before it forwards; blocks while the slice is over its SM
 * share. `cost` is the launch's work in warps (blocks x ceil(threads per block / 32)). */
void vgpu_launch_admit(uint64_t cost);

/* Prices of graph executables, kept by pacing.c: launch.c prices a graph's kernels (where the
 * driver can list them) when an executable is instantiated from it, and again when an update
 * gives the executable another graph's kernels (the new price replaces the old); a graph launch
 * is admitted at that price.
 * An executable without a price is charged a nominal one; the controller's measured cost per
 * token turns that into the right rate all the same. */
#define VGPU_GRAPH_PRICE_UNKNOWN UINT64_MAX
void vgpu_graph_exec_priced(CUgraphExec exec, uint64_t cost);
uint64_t vgpu_graph_exec_cost(CUgraphExec exec);
void vgpu_graph_exec_forget(CUgraphExec exec);

/* ---- log.c -------------------------------------------------------------------------- */

enum vgpu_log_level { VGPU_LOG_OFF = 0, VGPU_LOG_ERROR, VGPU_LOG_WARN, VGPU_LOG_INFO, VGPU_LOG_DEBUG };
void vgpu_log(enum vgpu_log_level level, const char *format, ...) __attribute__((format(printf, 2, 3)));
/* The one line a refused allocation prints, whatever the log level. */
void vgpu_report_oom(const char *call, uint64_t request, uint64_t usage, uint64_t limit);
/* Writes a whole line to stderr with write(2): no stdio, no locks a hook could deadlock on. */
void vgpu_write_stderr(const char *text, size_t length);
/* Parses VGPU_LOG_LEVEL's value (NULL or unknown: off). */
enum vgpu_log_level vgpu_parse_log_level(const char *value);

/* ---- the one struct of mutable process state ---------------------------------------- */
/*
 * Everything libvgpu.so changes at run time lives in `vgpu_state` (defined in state.c) or in
 * the shared region; everything else is const. Each concern keeps its part in a member
 * named after its file. Shared-memory fields of the region are plain integers in region.h
 * (cffi reads the same text), so the C side accesses them with __atomic builtins; fields
 * here are C11 atomics.
 */

/* resolve.c: name table, real entry points, reverse map for cuGetProcAddress. */
#define VGPU_REAL_UNRESOLVED 0
#define VGPU_REAL_MISSING 1
#define VGPU_NAME_TABLE_SIZE 256 /* power of two, > 2 x hooks */
#define VGPU_REVERSE_TABLE_SIZE 256
struct vgpu_resolve_state {
    _Atomic(void *) real_dlsym;
    _Atomic(void *) library_handle[VGPU_LIB_COUNT];
    /* VGPU_REAL_UNRESOLVED, VGPU_REAL_MISSING (the loaded library lacks it), or the real entry
     * point. */
    _Atomic uintptr_t real_entry[VGPU_HOOK_COUNT];
    _Atomic uintptr_t called_entry[VGPU_CALLED_COUNT];
    /* Open addressing, hook id + 1 per slot (0: empty); filled once before `names_ready`. */
    uint8_t name_slots[VGPU_NAME_TABLE_SIZE];
    atomic_int names_ready;
    /* Real entry point -> hook id + 1, filled once under `reverse_once`. */
    pthread_once_t reverse_once;
    uintptr_t reverse_real[VGPU_REVERSE_TABLE_SIZE];
    uint16_t reverse_hook[VGPU_REVERSE_TABLE_SIZE];
};

/* memory.c: the table of live allocations, sharded by key, one lock per shard. */
#define VGPU_ALLOC_SHARDS 64
struct vgpu_alloc_entry {
    uint64_t key;  /* device pointer, VMM handle or array handle */
    uint64_t size; /* bytes charged to the slot */
    uint64_t context; /* CUcontext that owns it (the driver frees it with the context); 0: none */
    uint8_t kind;  /* enum vgpu_alloc_kind (memory.c); 0: empty slot, 0xff: deleted */
    uint8_t family;/* enum vgpu_alloc_family (memory.c), for logs */
};
struct vgpu_alloc_shard {
    pthread_mutex_t lock;
    struct vgpu_alloc_entry *entries; /* capacity entries, power of two; NULL until used */
    uint32_t capacity;
    uint32_t used;   /* live + deleted: what probing has to walk over */
    uint32_t live;
} __attribute__((aligned(64)));
#define VGPU_CUDA_DEVICE_CACHE 64
/* memory.c: what NVML showed of the device's processes at one refresh. */
#define VGPU_NVML_SAMPLE 64
struct vgpu_nvml_sample {
    unsigned int count;
    unsigned int pid[VGPU_NVML_SAMPLE];
    uint64_t used[VGPU_NVML_SAMPLE];
};

struct vgpu_memory_state {
    struct vgpu_alloc_shard shards[VGPU_ALLOC_SHARDS];
    /* Bumped on every change of this process's `allocated`, so that a driver_reserved
     * refresh can tell whether allocations moved while NVML was being asked. */
    _Atomic uint64_t accounting_changes;
    /* Per CUDA device ordinal: 0 unknown, 1 the slice's device, 2 another device. */
    _Atomic uint8_t cuda_device_verdict[VGPU_CUDA_DEVICE_CACHE];
    /* Per CUDA device ordinal: its primary context, as cuDevicePrimaryCtxRetain returned it. */
    _Atomic(CUcontext) primary_context[VGPU_CUDA_DEVICE_CACHE];
    /* Visible CUDA devices (0: not asked yet, -1: unknown); with one, no need to ask which
     * device the current context is on. */
    atomic_int cuda_device_count;
    /* The slice's device as NVML knows it, for the per-process memory figure. */
    atomic_int nvml_ready;   /* 0: not tried, 1: ready, -1: unavailable (no NVML) */
    pthread_mutex_t nvml_lock;
    nvmlDevice_t nvml_slice_device;
    /* Under nvml_lock: the last steady sample and this process's `allocated` then, to find the
     * pid NVML lists this process under when it is not getpid(). */
    struct vgpu_nvml_sample previous;
    uint64_t previous_allocated;
    int previous_valid;
};

/* nvml.c: per NVML device handle, whether it is the slice's device. */
#define VGPU_NVML_HANDLE_CACHE 64
struct vgpu_nvml_state {
    _Atomic(nvmlDevice_t) handle[VGPU_NVML_HANDLE_CACHE];
    _Atomic uint8_t verdict[VGPU_NVML_HANDLE_CACHE]; /* 1 slice's device, 2 another */
};

/* state.c: environment, region, slot, monitor thread. */
enum vgpu_fail_kind {
    VGPU_FAIL_NONE = 0,
    VGPU_FAIL_ATTACH,        /* no usable region: unset, missing, foreign, corrupt header */
    VGPU_FAIL_LIMITS,        /* the region's published limits do not pass their check */
    VGPU_FAIL_NO_SLOT,       /* every proc slot of the region is held by a live process */
};
struct vgpu_process_state {
    pthread_once_t init_once;
    enum vgpu_log_level log_level;
    char region_path[PATH_MAX];
    char kernel_id[64]; /* JUPYTER_VGPU_KERNEL_ID: the Jupyter kernel this slice belongs to, or empty */
    struct vgpu_region *region;      /* set once by init; NULL when attaching failed */
    char attach_failure[PATH_MAX + 512];      /* why attaching failed, written once by init */
    char limits_failure[PATH_MAX + 512];      /* the message for corrupt limits, written once by init */
    char slot_failure[PATH_MAX + 512];        /* the message for a full region, written once by init */
    atomic_int last_failure;         /* enum vgpu_fail_kind of the latest refusal */
    atomic_uint reported_failures;   /* bit per enum vgpu_fail_kind already printed */
    /* This process's slot: -1 none yet, -2 being claimed by a thread, else its index. */
    atomic_int slot_index;
    /* Monitor thread: reaps dead slots and refreshes driver_reserved. */
    atomic_int monitor_started;
    pthread_mutex_t monitor_lock;
    int monitor_stopping;            /* under monitor_lock */
    atomic_int exit_handler_registered; /* kept across fork: atexit handlers are inherited */
};

struct vgpu_state {
    struct vgpu_process_state process;
    struct vgpu_resolve_state resolve;
    struct vgpu_memory_state memory;
    struct vgpu_nvml_state nvml;
};

extern struct vgpu_state vgpu_state;

static inline void *vgpu_real(enum vgpu_hook_id id)
{
    uintptr_t cached = atomic_load_explicit(&vgpu_state.resolve.real_entry[id], memory_order_acquire);
    return __builtin_expect(cached > VGPU_REAL_MISSING, 1) ? (void *)cached : vgpu_real_lookup(id);
}

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t vgpu_now_ns(void);

#endif /* VGPU_INTERPOSER_INTERNAL_H */
