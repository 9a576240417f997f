/*
 * What the files of libvgpu.so share. One concern per file, listed from the bottom up: a file
 * calls only files listed before it, so no two files call each other.
 *   state.c          the one struct of mutable process state (defined there), the environment
 *                    (read there and nowhere else), the clock
 *   log.c            logging (stderr only, silent unless asked, except the lines users must see)
 *   resolve.c        symbol resolution: real dlsym, the dlsym override (dlsym_entry.S), the hook
 *                    table built from hooks.def, cuGetProcAddress, lazy lookup of real entry points
 *   region.c         the slice's region: attach and validate, limits, the fail-closed reason,
 *                    this process's slot, reaping the slots of processes that are gone
 *   waiting.c        a CUDA call of a suspended slice: its resume request, its wait for room,
 *                    the lines that tell the cell, leaving the line
 *   gate.c           every other entry point of the driver: the trampolines' way into the wait
 *                    (gate_entry.S, one trampoline per gated entry point, generated list)
 *   device.c         which device is the slice's: one verdict cache, for CUDA devices and NVML
 *                    handles alike
 *   alloc_table.c    the table of live allocations and what each was charged
 *   driver_memory.c  driver memory beyond allocations (contexts), from NVML's per-process
 *                    figures, and the pid NVML lists this process under (PID namespaces)
 *   graph_prices.c   what a launch of each graph executable costs, and the graph memory it backs
 *   pacing.c         the SM-share limiter: per-thread token caches, the shared pool, the controller
 *   monitor.c        the monitor thread of a process that uses the GPU: reaper, driver memory
 *                    refresh, and a controller for the slice it launches in
 *   charge.c         charging allocations to this process's slot within the cap, giving back
 *   memory.c         allocation and free hooks
 *   context.c        context hooks
 *   view.c           what the program is shown of memory (cuMemGetInfo, cuDeviceTotalMem)
 *   nvml.c           NVML hooks
 *   launch.c         launch hooks: cost of a launch, then vgpu_launch_admit()
 * All symbols here have hidden visibility (the build passes -fvisibility=hidden); only hooks,
 * the gate's trampolines and dlsym are exported, through the version script native/build.py
 * generates from hooks.def (and the driver's list, for the gate).
 */
#ifndef VGPU_INTERPOSER_INTERNAL_H
#define VGPU_INTERPOSER_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "vgpu/cuda_abi.h"
#include "vgpu/nvml_abi.h"
#include "vgpu/region.h"

#define VGPU_EXPORT __attribute__((visibility("default")))
#define VGPU_HIDDEN __attribute__((visibility("hidden")))

/* The gate list native/build.py generates (VGPU_GATE(index, name) per gated entry point: every
 * entry point of the driver that hooks.def neither hooks nor leaves alone), named by the build. */
#ifndef VGPU_GATES_DEF
#error "build libvgpu.so with native/build.py: it generates the gate list (VGPU_GATES_DEF)"
#endif

/* ---- state.c ------------------------------------------------------------------------ */

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t vgpu_now_ns(void);

enum vgpu_log_level { VGPU_LOG_OFF = 0, VGPU_LOG_ERROR, VGPU_LOG_WARN, VGPU_LOG_INFO, VGPU_LOG_DEBUG };

/* The environment, read once (the first call) and never again: an inline check of `ready`
 * (end of file), so that every log call does not pay for a pthread_once call. */
struct vgpu_env {
    pthread_once_t once;
    atomic_int ready;
    enum vgpu_log_level log_level; /* VGPU_LOG_LEVEL */
    char region_path[PATH_MAX];    /* VGPU_REGION, or empty */
    char limits_path[PATH_MAX];    /* VGPU_LIMITS, or the region's path + ".limits" */
    char kernel_id[64];            /* JUPYTER_VGPU_KERNEL_ID: the Jupyter kernel of this slice, or empty */
    int has_server;                /* JUPYTER_VGPU_SERVER_URL set: a vGPU server resizes the kernel's slice */
};
static inline const struct vgpu_env *vgpu_env(void);
const struct vgpu_env *vgpu_env_read(void);

/* ---- log.c -------------------------------------------------------------------------- */

/* Logs one line at `level` if VGPU_LOG_LEVEL asks for it. The check is inline and comes first,
 * so a debug line on a hot path costs one compare while logging is off (its arguments are not
 * even evaluated). */
#define VGPU_LOG(level, ...) (vgpu_log_wanted(level) ? vgpu_log_line((level), __VA_ARGS__) : (void)0)
static inline int vgpu_log_wanted(enum vgpu_log_level level);
void vgpu_log_line(enum vgpu_log_level level, const char *format, ...) __attribute__((format(printf, 2, 3)));
/* The one line a refused allocation prints, whatever the log level. */
void vgpu_report_oom(const char *call, uint64_t request, uint64_t usage, uint64_t limit);
/* One line the user must see, whatever the log level: "jupyter-vgpu: " + the text + newline,
 * in one write (cut to 1 KiB). */
void vgpu_report_line(const char *format, ...) __attribute__((format(printf, 1, 2)));
/* Writes a whole line to stderr with write(2): no stdio, no locks a hook could deadlock on. */
void vgpu_write_stderr(const char *text, size_t length);

/* ---- resolve.c ---------------------------------------------------------------------- */

/* One id per line of hooks.def. */
enum vgpu_hook_id {
#define VGPU_CUDA_HOOK(symbol) VGPU_HOOK_##symbol,
#define VGPU_NVML_HOOK(symbol) VGPU_HOOK_##symbol,
#include "hooks.def"
    VGPU_HOOK_COUNT
};

/* What a hook returns when the installed library lacks its real entry point: the status its
 * own library uses for a missing function. */
enum {
#define VGPU_CUDA_HOOK(symbol) VGPU_MISSING_##symbol = CUDA_ERROR_NOT_FOUND,
#define VGPU_NVML_HOOK(symbol) VGPU_MISSING_##symbol = NVML_ERROR_FUNCTION_NOT_FOUND,
#include "hooks.def"
};

/* Function-pointer types named after each entry point: vgpu_pfn_cuMemAlloc_v2, ... */
#define VGPU_DECLARE_PFN(ret, name, params) typedef ret(*vgpu_pfn_##name) params;
VGPU_CUDA_ENTRY_POINTS(VGPU_DECLARE_PFN)
VGPU_NVML_ENTRY_POINTS(VGPU_DECLARE_PFN)
#undef VGPU_DECLARE_PFN

enum vgpu_library { VGPU_LIB_CUDA, VGPU_LIB_NVML, VGPU_LIB_COUNT };

/* One id per gated entry point (the generated list), and the trampolines by names C may use:
 * vgpu_gate_<name> is the exported trampoline <name>, vgpu_gate_tail_<name> its way into
 * gate.c (gate_entry.S). */
enum vgpu_gate_id {
#define VGPU_GATE(index, symbol) VGPU_GATE_##symbol,
#include VGPU_GATES_DEF
    VGPU_GATE_COUNT
};
#define VGPU_GATE(index, symbol) extern char vgpu_gate_##symbol[] VGPU_HIDDEN, vgpu_gate_tail_##symbol[] VGPU_HIDDEN;
#include VGPU_GATES_DEF

/* Hooks and gated entry points share one space of entry ids for symbol resolution: a hook's id,
 * or VGPU_HOOK_COUNT + a gate's id. */
#define VGPU_ENTRY_COUNT (VGPU_HOOK_COUNT + VGPU_GATE_COUNT)

/* The real entry point behind a hook, or NULL when the installed driver lacks it: an inline
 * read of the cache (end of this file) on every forwarded call, vgpu_real_lookup the first
 * time. */
static inline void *vgpu_real(enum vgpu_hook_id id);
void *vgpu_real_lookup(enum vgpu_hook_id id);
#define VGPU_REAL(name) ((vgpu_pfn_##name)vgpu_real(VGPU_HOOK_##name))

/* What a CUDA hook returns when it gives up waiting for room (waiting.c): the user left the
 * line. NVML hooks never wait, so never return theirs. */
enum {
#define VGPU_CUDA_HOOK(symbol) VGPU_LEFT_LINE_##symbol = CUDA_ERROR_OUT_OF_MEMORY,
#define VGPU_NVML_HOOK(symbol) VGPU_LEFT_LINE_##symbol = NVML_ERROR_UNKNOWN,
#include "hooks.def"
};

/* What a hook does while the slice is suspended (waiting.c), known at compile time: CUDA hooks
 * ask for a resume and wait for room; symbol resolution (cuGetProcAddress) asks and goes on, as
 * it answers from the driver's table and a runtime that fails it fails its initialisation for
 * good; NVML hooks do neither (NVML answers a suspended process at once). */
#define VGPU_ASKS_FOR_ROOM(name) (#name[0] == 'c')
#define VGPU_WAITS_FOR_ROOM(name)                                                                                      \
    (VGPU_ASKS_FOR_ROOM(name) && VGPU_HOOK_##name != VGPU_HOOK_cuGetProcAddress &&                                     \
     VGPU_HOOK_##name != VGPU_HOOK_cuGetProcAddress_v2)

/* Opens every hook. First, while the slice is suspended, the call waits for room (waiting.c;
 * one inline load of the page's flag otherwise) and returns CUDA_ERROR_OUT_OF_MEMORY at once
 * where the user left the line. Then it declares `real`, the real entry point behind hook
 * `name`. When the installed library lacks it, the hook returns that library's "not found" at
 * once, before doing anything else: it never calls through NULL, never charges an allocation
 * nobody can make, never holds a launch back. */
#define VGPU_HOOK_REAL(name)                                                                                           \
    if (__builtin_expect(vgpu_held_back(VGPU_ASKS_FOR_ROOM(name), VGPU_WAITS_FOR_ROOM(name)), 0))                      \
        return VGPU_LEFT_LINE_##name;                                                                                  \
    vgpu_pfn_##name real = VGPU_REAL(name);                                                                            \
    if (__builtin_expect(real == NULL, 0))                                                                             \
    return VGPU_MISSING_##name

/* The real entry point of any symbol of the driver or NVML (hooked or not), or NULL. Not
 * cached: callers on a hot path keep what it returns. */
void *vgpu_real_symbol(enum vgpu_library library, const char *symbol);

/* Entry points libvgpu.so calls but does not hook, resolved and cached like the hooks' real
 * ones: X(library, name). */
#define VGPU_CALLED_ENTRY_POINTS(X)                                                                                    \
    X(VGPU_LIB_CUDA, cuCtxGetCurrent)                                                                                  \
    X(VGPU_LIB_CUDA, cuCtxGetDevice)                                                                                   \
    X(VGPU_LIB_CUDA, cuDevicePrimaryCtxGetState)                                                                       \
    X(VGPU_LIB_CUDA, cuDeviceGetCount)                                                                                 \
    X(VGPU_LIB_CUDA, cuDeviceGetUuid)                                                                                  \
    X(VGPU_LIB_CUDA, cuDeviceGetUuid_v2)                                                                               \
    X(VGPU_LIB_CUDA, cuDeviceGetGraphMemAttribute)                                                                     \
    X(VGPU_LIB_CUDA, cuDeviceGetDefaultMemPool)                                                                        \
    X(VGPU_LIB_CUDA, cuDeviceGetMemPool)                                                                               \
    X(VGPU_LIB_CUDA, cuMemPoolGetAttribute)                                                                            \
    X(VGPU_LIB_NVML, nvmlInit_v2)                                                                                      \
    X(VGPU_LIB_NVML, nvmlDeviceGetHandleByUUID)                                                                        \
    X(VGPU_LIB_NVML, nvmlDeviceGetHandleByIndex_v2)                                                                    \
    X(VGPU_LIB_NVML, nvmlDeviceGetUUID)                                                                                \
    X(VGPU_LIB_NVML, nvmlDeviceGetComputeRunningProcesses_v3)
/* The list's expansion ends in a comma, which clang-format cannot see: */
/* clang-format off */
enum vgpu_called_id {
#define VGPU_CALLED_ID(library, name) VGPU_CALLED_##name,
    VGPU_CALLED_ENTRY_POINTS(VGPU_CALLED_ID)
#undef VGPU_CALLED_ID
    VGPU_CALLED_COUNT
};
/* clang-format on */
/* Inline (end of file) like vgpu_real: an allocation asks the driver for its context through it. */
static inline void *vgpu_called(enum vgpu_called_id id);
void *vgpu_real_called(enum vgpu_called_id id);
#define VGPU_CALLED(name) ((vgpu_pfn_##name)vgpu_called(VGPU_CALLED_##name))

/* The real entry point behind gated entry point `gate`, or NULL when the driver lacks it
 * (cached as a hook's is). */
void *vgpu_gate_real(enum vgpu_gate_id gate);

#define VGPU_REAL_UNRESOLVED 0
#define VGPU_REAL_MISSING 1
#define VGPU_NAME_TABLE_SIZE 2048    /* power of two, > 2 x entries */
#define VGPU_REVERSE_TABLE_SIZE 4096 /* power of two, > 4 x entries: two per CUDA entry point */
struct vgpu_resolve_state {
    _Atomic(void *) real_dlsym;
    _Atomic(void *) library_handle[VGPU_LIB_COUNT];
    /* Per entry id: VGPU_REAL_UNRESOLVED, VGPU_REAL_MISSING (the loaded library lacks it), or
     * the real entry point. */
    _Atomic uintptr_t real_entry[VGPU_ENTRY_COUNT];
    _Atomic uintptr_t called_entry[VGPU_CALLED_COUNT];
    /* Open addressing, entry id + 1 per slot (0: empty); filled once under `names_once`. */
    pthread_once_t names_once;
    uint16_t name_slots[VGPU_NAME_TABLE_SIZE];
    /* Real entry point -> entry id + 1, filled once under `reverse_once`. */
    pthread_once_t reverse_once;
    uintptr_t reverse_real[VGPU_REVERSE_TABLE_SIZE];
    uint16_t reverse_hook[VGPU_REVERSE_TABLE_SIZE];
};

/* ---- region.c ----------------------------------------------------------------------- */

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

/* Prints vgpu_fail_reason() on stderr, once per process, whatever the log level: the slice is
 * failed closed and the user must learn why their allocations are refused. */
void vgpu_report_fail_closed(void);

/* The mapped region; NULL when failed closed. */
struct vgpu_region *vgpu_region(void);

/* The slice's limits page, mapped read-only; NULL when failed closed. */
const struct vgpu_limits_page *vgpu_limits_page(void);

/* Counts a request to resume the suspended slice in this process's slot (waiting.c). */
void vgpu_request_resume(void);

/* This process's slot, claimed on the first call in a process (and again in a forked child);
 * NULL when failed closed. Processes that use the GPU claim it through vgpu_gpu_slot()
 * (monitor.c), which also starts their monitor thread. */
struct vgpu_proc_slot *vgpu_self_slot(void);

/* How many slots from the start of `procs` may be in use (the high water, bounded): scans
 * of the slots stop there. */
uint32_t vgpu_slots_in_use(const struct vgpu_region *region);

/* This process's slot if it claimed one already (never claims); NULL otherwise. Inline (end of
 * file): every charge and free asks. */
static inline struct vgpu_proc_slot *vgpu_claimed_slot(void);

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

enum vgpu_fail_kind {
    VGPU_FAIL_NONE = 0,
    VGPU_FAIL_ATTACH,  /* no usable region or limits page: unset, missing, foreign, corrupt header */
    VGPU_FAIL_LIMITS,  /* the page's published limits do not pass their check */
    VGPU_FAIL_NO_SLOT, /* every proc slot of the region is held by a live process */
};
struct vgpu_region_state {
    pthread_once_t init_once;
    atomic_int ready;                    /* init_once has run: checked inline before calling it */
    struct vgpu_region *region;          /* set once by init; NULL when attaching failed */
    const struct vgpu_limits_page *page; /* set once by init with region; NULL when attaching failed */
    /* The page's `suspended` flag, or vgpu_never_suspended while no page is mapped: what the
     * gate's trampolines read on every call (never NULL, so one load and one branch). */
    const uint32_t *suspended_flag;
    char attach_failure[PATH_MAX + 512]; /* why attaching failed, written once by init */
    pthread_once_t messages_once;
    char limits_failure[PATH_MAX + 512]; /* the message for corrupt limits, written once */
    char slot_failure[PATH_MAX + 512];   /* the message for a full region, written once */
    atomic_int last_failure;             /* enum vgpu_fail_kind of the latest refusal */
    atomic_uint reported_failures;       /* bit per enum vgpu_fail_kind already printed */
    /* This process's slot: -1 none yet, -2 being claimed by a thread, -3 given back at exit,
     * else its index. */
    atomic_int slot_index;
};

/* ---- waiting.c ---------------------------------------------------------------------- */

/* What a hook does while the slice's page says suspended (VGPU_HOOK_REAL, through
 * vgpu_held_back, inline at the end of this file): `asks`, a CUDA hook, counts a resume request;
 * `waits`, one that uses the GPU, then waits here until the publisher clears the flag. Returns
 * nonzero when the call must not reach the driver: the user left the line while it waited, or
 * did within the last VGPU_LEFT_LINE_NS. */
static inline int vgpu_held_back(int asks, int waits);
int vgpu_call_while_suspended(int waits);

#define VGPU_WAIT_POLL_NS 10000000ULL   /* how often a waiting call reads the page */
#define VGPU_WAIT_LINE_NS 1000000000ULL /* at most one changed waiting line a second */
#define VGPU_LEFT_LINE_NS 2000000000ULL /* calls fail at once this long after leaving the line */
#define VGPU_WAIT_LINE_SIZE 256
struct vgpu_waiting_state {
    pthread_once_t fork_handler_once;
    pthread_mutex_t lock;           /* guards what follows; held while a line is written */
    unsigned waiting;               /* threads of this process waiting for room now */
    uint32_t line_at_start;         /* the page's leave_line when the first of them began */
    int announced;                  /* a waiting line went out since: the wait's end is said too */
    char said[VGPU_WAIT_LINE_SIZE]; /* the last waiting line written, */
    uint64_t said_ns;               /* and when */
    int has_left;                   /* this process left the line at least once: */
    uint32_t left_line;             /* the page's leave_line it left at */
    _Atomic uint64_t left_ns;       /* when (read without the lock by calls that fail at once) */
};

/* A word that reads 0: region state's suspended_flag before (or without) a limits page. */
extern const uint32_t vgpu_never_suspended;

/* ---- gate.c ------------------------------------------------------------------------- */

/* What a trampoline does past its one branch (gate_entry.S): the slice is suspended, or its
 * entry point is not resolved yet. Waits as a hook does (waiting.c) and resolves the real entry
 * point; `forward`: where the trampoline jumps with the caller's arguments, or NULL, and then
 * `status` is what the call returns (the user left the line, or the driver lacks the entry
 * point). Two words, returned in two registers. */
struct vgpu_gate_decision {
    void *forward;
    uintptr_t status;
};
struct vgpu_gate_decision vgpu_gate_enter(uint32_t gate);

/* Where each trampoline jumps while the slice runs: its real entry point once resolved, its own
 * tail into vgpu_gate_enter until then (and for good where the driver lacks it), so that the
 * trampoline's one branch is the suspended flag. Written by gate.c, read by the trampolines at
 * an offset native/build.py takes from the compiler (VGPU_GATE_ENTRY_OFFSET). */
struct vgpu_gate_state {
    void *entry[VGPU_GATE_COUNT];
};

/* ---- device.c ----------------------------------------------------------------------- */

/* Whether a device is the slice's device: a CUDA device, the current context's device, an
 * NVML handle. When the driver cannot say, it is: a process of a slice sees its slice rather
 * than the whole device. */
int vgpu_cuda_device_is_slice(CUdevice device);
int vgpu_current_cuda_device_is_slice(void);
int vgpu_nvml_device_is_slice(nvmlDevice_t device);

/* A device's identity does not change while the process runs, so each verdict is asked once:
 * a lock-free list of (device, verdict) cells, claimed with compare-and-swap, then published. */
#define VGPU_VERDICT_CACHE 128
struct vgpu_device_state {
    _Atomic uintptr_t key[VGPU_VERDICT_CACHE]; /* the device, tagged with its library; 0: free */
    _Atomic uint8_t verdict[VGPU_VERDICT_CACHE];
    /* Visible CUDA devices (0: not asked yet, -1: unknown); with one, no need to ask which
     * device the current context is on. */
    atomic_int cuda_device_count;
};

/* ---- alloc_table.c ------------------------------------------------------------------ */

enum vgpu_alloc_kind {
    VGPU_KIND_EMPTY = 0,
    VGPU_KIND_DEVICE_POINTER,  /* cuMemAlloc*, cuMemAllocPitch, cuMemAllocManaged, async and pool allocations */
    VGPU_KIND_VMM_HANDLE,      /* cuMemCreate */
    VGPU_KIND_ARRAY,           /* cuArrayCreate, cuArray3DCreate */
    VGPU_KIND_MIPMAPPED_ARRAY, /* cuMipmappedArrayCreate */
    VGPU_KIND_DELETED = 0xff,
};

/* Which call an allocation came from, for logs. */
enum vgpu_alloc_family {
    VGPU_FAMILY_ALLOC,
    VGPU_FAMILY_PITCH,
    VGPU_FAMILY_MANAGED,
    VGPU_FAMILY_ASYNC,
    VGPU_FAMILY_POOL,
    VGPU_FAMILY_VMM,
    VGPU_FAMILY_ARRAY,
    VGPU_FAMILY_MIPMAPPED_ARRAY,
};

struct vgpu_alloc_entry {
    uint64_t key;     /* device pointer, VMM handle or array handle */
    uint64_t size;    /* bytes charged to the slot */
    uint64_t context; /* CUcontext that owns it (the driver frees it with the context); 0: none */
    uint8_t kind;     /* enum vgpu_alloc_kind; VGPU_KIND_EMPTY: empty slot */
    uint8_t family;   /* enum vgpu_alloc_family */
};

/* Records an allocation. If the key is already there, the driver handed out again something
 * we thought live (freed behind our back, e.g. with its context): returns the bytes that old
 * entry held, so the caller gives them back. Returns -1 when out of host memory. */
int64_t vgpu_table_insert(const struct vgpu_alloc_entry *entry);

/* Takes (kind, key) out of the table; returns 1 and the entry if it was there. A free takes
 * its entry out before the driver frees it, so that an allocation reusing the address right
 * after the free can never be mistaken for the old one. */
int vgpu_table_take(uint8_t kind, uint64_t key, struct vgpu_alloc_entry *out);

/* Takes every entry owned by `context` out of the table; returns the bytes they held. */
uint64_t vgpu_table_take_context(uint64_t context);

#define VGPU_ALLOC_SHARDS 64
struct vgpu_alloc_shard {
    _Atomic uint32_t lock;            /* a futex word (alloc_table.c) */
    struct vgpu_alloc_entry *entries; /* capacity entries, power of two; NULL until used */
    uint32_t capacity;
    uint32_t used; /* live + deleted: what probing has to walk over */
    uint32_t live;
} __attribute__((aligned(64)));
struct vgpu_alloc_table_state {
    struct vgpu_alloc_shard shards[VGPU_ALLOC_SHARDS];
};

/* ---- driver_memory.c ---------------------------------------------------------------- */

/* Sets this process's driver_reserved from NVML's figure for it (contexts and other driver
 * memory beyond what the hooks counted); skipped while another refresh is under way. The
 * monitor thread calls it every period. */
void vgpu_refresh_driver_reserved(void);

/* A context was created, or went (with its allocations): its driver memory counts from now on,
 * or stops counting. A process's first context counts at the slice's recorded context size
 * when there is one; any other change is measured. */
void vgpu_driver_memory_context_created(CUcontext context);
void vgpu_driver_memory_context_gone(CUcontext context);

/* Bytes of this process's driver_reserved that are the recorded context size rather than a
 * measurement (inline, end of file); 0 once measured. */
static inline uint64_t vgpu_estimated_driver_memory(void);

/* Measures this process's driver memory now if part of it is an estimate. */
void vgpu_measure_driver_memory(void);

/* Charging calls this on every change of this process's `allocated` (inline, end of file), so
 * that a refresh can tell whether allocations moved while NVML was being asked. */
static inline void vgpu_note_allocated_change(void);

/* What NVML showed of the device's processes at one refresh. */
#define VGPU_NVML_SAMPLE 64
struct vgpu_nvml_sample {
    unsigned int count;
    unsigned int pid[VGPU_NVML_SAMPLE];
    uint64_t used[VGPU_NVML_SAMPLE];
};
struct vgpu_driver_memory_state {
    _Atomic uint64_t allocated_changes;
    pthread_once_t fork_handler_once;
    /* The slice's device as NVML knows it, for the per-process memory figure. */
    atomic_int nvml_ready; /* 0: not tried, 1: ready, -1: unavailable (no NVML) */
    pthread_mutex_t nvml_lock;
    nvmlDevice_t nvml_slice_device;
    /* Under nvml_lock: the last steady sample and this process's `allocated` then, to find the
     * pid NVML lists this process under when it is not getpid(). */
    struct vgpu_nvml_sample previous;
    uint64_t previous_allocated;
    int previous_valid;
    /* Under nvml_lock: whether a context of this process was counted yet, and the one counted
     * at the recorded size while that is not measured (NULL otherwise). */
    int counted;
    CUcontext estimated_context;
    /* Written under nvml_lock, read by charges without it: see vgpu_estimated_driver_memory. */
    _Atomic uint64_t estimated;
};

/* ---- graph_prices.c ----------------------------------------------------------------- */

/* Prices of graph executables: launch.c prices a graph's kernels (where the driver can list
 * them) when an executable is instantiated from it, and again when an update gives the
 * executable another graph's kernels (the new price replaces the old); a graph launch is
 * admitted at that price. An executable without a price is charged a nominal one; the
 * controller's measured cost per token turns that into the right rate all the same. */
#define VGPU_GRAPH_PRICE_UNKNOWN UINT64_MAX
#define VGPU_MAX_LAUNCH_COST (UINT64_C(1) << 48)
/* Graph memory: `memory` is what the executable's allocation nodes take (child graphs included),
 * `has_memory` whether it has any (its size may be unknown: 0). The driver backs it in its graph
 * memory pool on launch and keeps it there until cuDeviceGraphMemTrim, so a launch needs new
 * memory only when the executable was not launched since the pool last gave memory back. */
void vgpu_graph_exec_priced(CUgraphExec exec, uint64_t cost, uint64_t memory, int has_memory);
struct vgpu_graph_launch {
    uint64_t cost;
    uint64_t to_back; /* bytes this launch may newly take into the graph pool */
    int has_memory;
};
void vgpu_graph_exec_launch(CUgraphExec exec, struct vgpu_graph_launch *launch);
void vgpu_graph_exec_backed(CUgraphExec exec); /* launched: its memory is in the pool now */
void vgpu_graph_pool_trimmed(void);            /* every executable's memory may be gone */
void vgpu_graph_exec_forget(CUgraphExec exec);

#define VGPU_GRAPH_TABLE_SIZE 1024 /* power of two */
struct vgpu_graph_price {
    _Atomic uintptr_t exec;
    _Atomic uint64_t cost_plus_one;   /* 0 while the entry is being filled */
    _Atomic uint64_t memory_plus_one; /* 0: no allocation node */
    _Atomic uint64_t backed_epoch;    /* the pool's epoch at its last launch, plus one; 0: none */
};
struct vgpu_graph_prices_state {
    struct vgpu_graph_price entries[VGPU_GRAPH_TABLE_SIZE];
    _Atomic uint64_t pool_epoch; /* trims so far */
};

/* ---- pacing.c ----------------------------------------------------------------------- */

/* Called by every launch hook before it forwards; blocks while the slice is over its SM
 * share. `cost` is the launch's work in warps (blocks x ceil(threads per block / 32)).
 * Returns nonzero on the calling thread's first launch. */
int vgpu_launch_admit(uint64_t cost);

/* Called by the monitor every period: a process that has launched makes sure the slice has a
 * controller (takes the lease when nobody holds it, or its holder is gone). With the limiter
 * off the controller only measures utilisation for reports, so it is started from here rather
 * than by the first launch: a process that ends within the monitor's first period starts no
 * thread for it. */
void vgpu_keep_slice_paced(void);

enum vgpu_pool_mode {
    VGPU_MODE_OFF,     /* sm_share 100: launches do not draw; the controller only measures */
    VGPU_MODE_OPEN,    /* burst on an idle device, or the token cost is not learned yet */
    VGPU_MODE_LIMITED, /* refilled at the rate that meets the share */
};

/* State of the controller thread; only that thread touches it (apart from resets while no
 * controller thread runs). */
struct vgpu_controller {
    /* NVML, resolved once per process (kept across lease changes). */
    int nvml_state; /* 0 not tried, 1 ready, -1 unavailable */
    nvmlDevice_t device;
    vgpu_pfn_nvmlDeviceGetProcessUtilization process_utilization;
    nvmlProcessUtilizationSample_t *samples;
    unsigned int sample_capacity;
    unsigned long long last_seen_us; /* NVML's lastSeenTimeStamp: end of the last window */
    nvmlReturn_t last_result;
    unsigned unattributed_periods; /* in a row: the slice drew tokens, NVML showed none of its pids */
    int warned;                    /* the "cannot measure" warning was printed */

    /* Pool bookkeeping since the last measurement. */
    int pool_known;
    int64_t pool_after_refill;
    int64_t granted;  /* tokens the last refill set aside for waiting processes */
    uint64_t spent;   /* tokens drawn since the last measurement */
    double draw_rate; /* tokens drawn per second, smoothed over a few ticks */
    uint64_t last_draw_ns;
    int drained;             /* the pool ran dry at some tick: launches were held back */
    int slack;               /* at some tick it had not (or the tick was late): the window cannot say the rate is low */
    int held_last_tick;      /* the last tick found the pool drained and every grant drawn, on time */
    int dry_last_tick;       /* ... found them drained, on time or late */
    int shifted;             /* a late tick in this window paid for time missed (refill()) */
    int shifted_last_window; /* the window before had one: its tokens may be spent in this one */
    int window_clean;        /* launches drew tokens throughout the window (no MODE_OFF tick) */
    double carry;            /* fraction of a token owed by the last refill */

    /* The cost estimate: utilisation-seconds per token = util_seconds / token_count. */
    double util_seconds;
    double token_count;
    double integral; /* correction to the target utilisation (fraction of the device) */
    uint32_t share;  /* the limits the last decision was made for */
    uint32_t policy;
    unsigned limited_periods;
    uint64_t others_busy_until_ns;

    enum vgpu_pool_mode mode;
    int learning; /* open only until the cost of a token is known */
    double rate;  /* tokens per second while limited */
    uint64_t last_tick_ns;
    uint64_t last_control_ns;
};

struct vgpu_pacing_state {
    pthread_once_t once;
    pthread_key_t thread_exit_key; /* its destructor folds an exiting thread's launch count */
    pid_t pid;                     /* cached: getpid() is a system call */
    atomic_int launched;           /* a thread of this process has launched */
    struct vgpu_region *region;    /* cached at init, with the page: launches peek at the share */
    const struct vgpu_limits_page *page;
    atomic_int controller_running;
    pthread_mutex_t lock; /* guards `stopping` and `in_nvml`; `wake` ends the controller's tick
                             sleep, and the exit's wait for it to leave NVML */
    pthread_cond_t wake;
    int stopping;
    int in_nvml; /* the controller is calling NVML */
    struct vgpu_controller controller;
};

/* ---- monitor.c ---------------------------------------------------------------------- */

/* This process's slot (vgpu_self_slot), for a process that uses the GPU: its monitor thread
 * runs from the first call on. NULL when failed closed. Inline (end of file) once both are
 * there; vgpu_gpu_slot_start() the first time. */
static inline struct vgpu_proc_slot *vgpu_gpu_slot(void);
struct vgpu_proc_slot *vgpu_gpu_slot_start(void);

struct vgpu_monitor_state {
    pthread_once_t handlers_once; /* exit and fork handlers, registered once per process tree */
    atomic_int started;           /* the monitor was started in this process, or could not be */
    pthread_mutex_t lock;         /* held by the monitor while it works, and across fork */
    int stopping;                 /* under lock */
};

/* ---- charge.c ----------------------------------------------------------------------- */

#define VGPU_POOLS_TRACKED 16

/* An allocation charged to this process's slot. slot NULL: nothing was charged (the process
 * is exiting and gave its slot back). */
struct vgpu_charge {
    struct vgpu_proc_slot *slot;
    uint64_t bytes;
};

/* Frameworks retry a refused allocation at once (numba twice, CuPy three times, PyTorch twice
 * after emptying its cache): the out-of-memory line is written once per burst of refusals. A
 * refusal belongs to the previous one's burst when it asks for the same bytes, comes within
 * VGPU_OOM_BURST_NS of it, and the slice holds no more than it did then. Not "nothing granted in
 * between": PyTorch's expandable segments map a tensor piece by piece (cuMemCreate), release the
 * pieces when one is refused, empty the cache and map them again, so its retry is granted the same
 * pieces before it is refused the same piece (seen on an H100, benchmarks/framework_checks.py). */
#define VGPU_OOM_BURST_NS 1000000000ull
struct vgpu_charge_state {
    _Atomic uint64_t refused_bytes;         /* the last refusal: its request, */
    _Atomic uint64_t refused_ns;            /* when, */
    _Atomic uint64_t refused_usage;         /* and what the slice held then */
    pthread_mutex_t graph_lock;             /* serialises settling graph memory: */
    uint64_t graph_charged;                 /* bytes of the slot's `allocated` that are the graph pool's */
    pthread_mutex_t pool_lock;              /* serialises settling stream-ordered pool memory: */
    uint64_t pool_charged;                  /* bytes of the slot's `allocated` that the pools reserve */
    uint64_t pool_claimed;                  /* of their unused reserve, what allocations in flight took */
    CUmemoryPool pools[VGPU_POOLS_TRACKED]; /* the pools this process drew from */
    int pool_count;
    int release_waited; /* monitor periods a release request waited for the frameworks' answer */
};

/* Charges `bytes` to this process's slot if the slice has room for them (the cap check takes
 * no lock: see charge.c). On CUDA_SUCCESS the caller calls the driver and then
 * vgpu_settle_charge(); otherwise it returns the refusal. */
static inline CUresult vgpu_charge(struct vgpu_charge *charge, const char *call, uint64_t bytes);
/* vgpu_charge; without `report`, a refusal at the cap is neither counted nor said (a first try
 * the caller follows with another, vgpu_charge_making_room). */
CUresult vgpu_charge_try(struct vgpu_charge *charge, const char *call, uint64_t bytes, int report);

/* Moves a charge to `actual` bytes once the driver said what it really took; growing it is
 * checked like a new request. */
CUresult vgpu_recharge(struct vgpu_charge *charge, const char *call, uint64_t actual);

/* After the driver answered: keeps the charge and records the allocation (kind, key), or gives
 * it back. Returns `result`. */
CUresult vgpu_settle_charge(const struct vgpu_charge *charge, CUresult result, uint8_t kind, uint64_t key,
                            uint8_t family);

/* Gives a charge back whole (the allocation was undone). */
void vgpu_uncharge(const struct vgpu_charge *charge);

/* After the driver answered a free of an entry vgpu_table_take() took out: gives the entry's
 * bytes back, or puts the entry back if the driver refused the free. `known`: whether the
 * table knew the freed thing at all. */
void vgpu_release_settle(int known, const struct vgpu_alloc_entry *entry, CUresult result);

/* A context that went took its allocations with it: they stop counting. Returns their bytes. */
uint64_t vgpu_release_context(CUcontext context);

/* Graph memory. A graph launch that may take new memory into the driver's graph pool is charged
 * its allocations first (vgpu_charge, refused like any allocation over the cap); after the launch,
 * or a trim, the slot's graph memory is set to what the driver's pool of the slice's device
 * reserves (cuDeviceGetGraphMemAttribute), the launch's charge included. `charge` NULL: nothing
 * was charged. Without the attribute, a launch's charge is kept until the process ends. */
void vgpu_graph_memory_settle(const struct vgpu_charge *charge, int launched, CUdevice device);

/* The slot's `allocated`, moved by bytes the caller has worked out (settling a pool's charge). */
void vgpu_slot_add(struct vgpu_proc_slot *slot, uint64_t bytes);
void vgpu_slot_subtract(struct vgpu_proc_slot *slot, uint64_t bytes);

/* ---- pool_memory.c: the driver's stream-ordered pools --------------------------------- */

/* The pool an allocation draws from: `asked`, or the current pool of the current context's
 * device; NULL when the driver cannot say. */
CUmemoryPool vgpu_pool_drawn(CUmemoryPool asked);
/* Claims for an allocation of `bytes` what it can of the pool's unused reserve (what its next
 * allocation takes first), less what other allocations in flight claimed; returns the claim. */
uint64_t vgpu_pool_claim(CUmemoryPool pool, uint64_t bytes);
/* After the driver answered a pool allocation charged `charge` with `claimed` of the reserve:
 * records it (no bytes of its own) and sets the pools' charge to what they reserve, or gives
 * the charge back; the claim ends either way. */
CUresult vgpu_pool_allocation_settle(const struct vgpu_charge *charge, CUresult result, CUmemoryPool pool,
                                     uint64_t claimed, CUdeviceptr address, uint8_t family);
/* Sets the pools' charge to what they reserve now (after a free, a trim, a monitor period). */
void vgpu_pool_memory_settle(void);
/* vgpu_charge for an allocation no pool serves (cuMemAlloc, cuMemCreate, arrays, ...): where the
 * cap would refuse it and the process's own pools keep unused reserve (memory the program freed
 * with cuMemFreeAsync), trims them, counts again, and only then refuses (one OOM line). Inline
 * (end of file): a process whose pools reserve nothing pays one load; vgpu_pool_charge_trimming
 * otherwise. */
static inline CUresult vgpu_charge_making_room(struct vgpu_charge *charge, const char *call, uint64_t bytes);
CUresult vgpu_pool_charge_trimming(struct vgpu_charge *charge, const char *call, uint64_t bytes);
/* The monitor's part of a suspend: answers the page's release_request (trims the pools). */
void vgpu_answer_release_request(void);

/* ---- context.c ---------------------------------------------------------------------- */

#define VGPU_CUDA_DEVICE_CACHE 64
struct vgpu_context_state {
    /* Per CUDA device ordinal: its primary context, as cuDevicePrimaryCtxRetain returned it. */
    _Atomic(CUcontext) primary_context[VGPU_CUDA_DEVICE_CACHE];
};

/* ---- view.c ------------------------------------------------------------------------- */

/* What the program is shown for the slice's device, from what the driver reports. Returns 0
 * when the driver's figures stand (no cap), 1 when `view` replaces them: total = the cap,
 * used = the slice's usage, free = what is left (never below 0, never above the device's own
 * free memory). A failed-closed slice shows no free memory. */
struct vgpu_slice_view {
    uint64_t total, used, free;
};
int vgpu_slice_view(uint64_t real_total, uint64_t real_free, struct vgpu_slice_view *view);

/* ---- the one struct of mutable process state ---------------------------------------- */
/*
 * Everything libvgpu.so changes at run time lives in `vgpu_state` (defined in state.c), in
 * the shared region, or in a thread-local variable of the file that owns it (per-thread by
 * nature); everything else is const. Each concern keeps its part in a member named after its
 * file. Shared-memory fields of the region are plain integers in region.h (cffi reads the same
 * text), so the C side accesses them with __atomic builtins; fields here are C11 atomics.
 */
struct vgpu_state {
    struct vgpu_env env;
    struct vgpu_resolve_state resolve;
    struct vgpu_region_state region;
    struct vgpu_waiting_state waiting;
    struct vgpu_gate_state gate;
    struct vgpu_device_state device;
    struct vgpu_alloc_table_state alloc_table;
    struct vgpu_driver_memory_state driver_memory;
    struct vgpu_monitor_state monitor;
    struct vgpu_graph_prices_state graph_prices;
    struct vgpu_pacing_state pacing;
    struct vgpu_context_state context;
    struct vgpu_charge_state charge;
};

extern struct vgpu_state vgpu_state;

static inline const struct vgpu_env *vgpu_env(void)
{
    if (__builtin_expect(atomic_load_explicit(&vgpu_state.env.ready, memory_order_acquire), 1))
        return &vgpu_state.env;
    return vgpu_env_read();
}

static inline int vgpu_log_wanted(enum vgpu_log_level level)
{
    return __builtin_expect(level != VGPU_LOG_OFF && level <= vgpu_env()->log_level, 0);
}

/* The hot path of every hook: one load of the page's flag while the slice is not suspended
 * (`asks` and `waits` are constants, so NVML hooks load nothing). */
static inline int vgpu_held_back(int asks, int waits)
{
    const struct vgpu_limits_page *page = vgpu_state.region.page;
    if (asks && page && __builtin_expect(__atomic_load_n(&page->suspended, __ATOMIC_ACQUIRE) != 0, 0))
        return vgpu_call_while_suspended(waits);
    return 0;
}

static inline struct vgpu_proc_slot *vgpu_claimed_slot(void)
{
    int index = atomic_load_explicit(&vgpu_state.region.slot_index, memory_order_acquire);
    return index >= 0 && vgpu_state.region.region ? &vgpu_state.region.region->procs[index] : NULL;
}

static inline struct vgpu_proc_slot *vgpu_gpu_slot(void)
{
    struct vgpu_proc_slot *slot = vgpu_claimed_slot();
    if (__builtin_expect(slot && atomic_load_explicit(&vgpu_state.monitor.started, memory_order_relaxed), 1))
        return slot;
    return vgpu_gpu_slot_start();
}

static inline void *vgpu_real(enum vgpu_hook_id id)
{
    uintptr_t cached = atomic_load_explicit(&vgpu_state.resolve.real_entry[id], memory_order_acquire);
    return __builtin_expect(cached > VGPU_REAL_MISSING, 1) ? (void *)cached : vgpu_real_lookup(id);
}

static inline void *vgpu_called(enum vgpu_called_id id)
{
    uintptr_t cached = atomic_load_explicit(&vgpu_state.resolve.called_entry[id], memory_order_acquire);
    return __builtin_expect(cached > VGPU_REAL_MISSING, 1) ? (void *)cached : vgpu_real_called(id);
}

static inline CUresult vgpu_charge(struct vgpu_charge *charge, const char *call, uint64_t bytes)
{
    return vgpu_charge_try(charge, call, bytes, 1);
}

static inline CUresult vgpu_charge_making_room(struct vgpu_charge *charge, const char *call, uint64_t bytes)
{
    /* Read without the pools' lock: a hint; the charge decides. */
    if (__builtin_expect(__atomic_load_n(&vgpu_state.charge.pool_charged, __ATOMIC_RELAXED) == 0, 1))
        return vgpu_charge_try(charge, call, bytes, 1);
    return vgpu_pool_charge_trimming(charge, call, bytes);
}

static inline uint64_t vgpu_estimated_driver_memory(void)
{
    return atomic_load_explicit(&vgpu_state.driver_memory.estimated, memory_order_relaxed);
}

static inline void vgpu_note_allocated_change(void)
{
    atomic_fetch_add_explicit(&vgpu_state.driver_memory.allocated_changes, 1, memory_order_relaxed);
}

#endif /* VGPU_INTERPOSER_INTERNAL_H */
