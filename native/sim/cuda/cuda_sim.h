/*
 * What the files of the simulated libcuda.so.1 share. One concern per file:
 *   driver.c   the library's state, cuInit, fork and exit, versions, error strings,
 *              cuGetProcAddress, the registry of live handles, device queries
 *   context.c  contexts (primary and created), the per-thread context stack, charging device
 *              memory to this process's slot
 *   memory.c   every allocation family, the address arena, copies into device memory
 *   host.c     pinned host memory, pointer attributes and address ranges
 *   library.c  module variants, the library and kernel API, the linker, function attributes
 *   pool.c     stream-ordered memory pools: each device's default and current pool, pool
 *              attributes
 *   graph_memory.c  graph memory nodes: the addresses they fix, the device's graph memory pool
 *              that backs them on launch and keeps them until trimmed
 *   ipc.c      device memory shared between processes: legacy IPC handles, VMM shareable handles
 *   exec.c     streams, events, modules, launches, graphs: the front of the engine (engine.c)
 *   map.c      a sorted map, for allocations and handles
 *   checkpoint.c  the checkpoint API: this process's checkpoint thread, the gate that holds its
 *              calls while it is locked, and the calls a controller makes on another process
 * Handles the program passes back (CUcontext, CUstream, ...) point to the structs below; the
 * driver's opaque types are completed here.
 */
#ifndef VGPU_SIM_CUDA_H
#define VGPU_SIM_CUDA_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* Declared with default visibility so that their definitions are exported; the build hides
 * everything else and the generated version script (native/build.py) lists these names and the
 * real driver's other entry points, which answer CUDA_ERROR_NOT_SUPPORTED. */
#pragma GCC visibility push(default)
#include "vgpu/cuda_abi.h"
#pragma GCC visibility pop
/* The optional graph-introspection entry points are exported too: with them the interposer
 * prices a graph exactly instead of estimating. */

#include "../common/sim.h"

#define SIM_CTX_MAGIC 0x43545831u
#define SIM_STREAM_MAGIC 0x53545231u
#define SIM_EVENT_MAGIC 0x45564e31u
#define SIM_MODULE_MAGIC 0x4d4f4431u
#define SIM_FUNCTION_MAGIC 0x46554e31u
#define SIM_GRAPH_NODE_MAGIC 0x474e4431u
#define SIM_DEAD_MAGIC 0xdeadu

#define SIM_PUSH_BUFFER 1024 /* launches a stream queues before the next one waits, as a GPU's push buffer */
#define SIM_CTX_STACK_DEPTH 64
#define SIM_LIMIT_COUNT 7 /* CU_LIMIT_STACK_SIZE .. CU_LIMIT_PERSISTING_L2_CACHE_SIZE */
#define SIM_VMM_GRANULARITY (2ull << 20)
#define SIM_PITCH_ALIGNMENT 512
/* What new device memory holds until written: not zeros, so that a program reading memory no
 * copy or memset wrote (a kernel's output: the simulator runs no kernel) sees garbage. */
#define SIM_POISON_BYTE 0xa5
#define SIM_POISON_CHUNK (2ull << 20)
#define SIM_REAP_INTERVAL_NS 100000000ull /* how often calls that report free memory look for the dead */

/* ---- map.c ------------------------------------------------------------------------------ */

struct sim_map_entry {
    uint64_t key;
    uintptr_t value;
};
struct sim_map {
    struct sim_map_entry *entries; /* sorted by key */
    size_t count, capacity;
};
/* Index of the first entry whose key is >= key (count if none). */
size_t sim_map_lower_bound(const struct sim_map *map, uint64_t key);
int sim_map_put(struct sim_map *map, uint64_t key, uintptr_t value); /* 0, or -1 out of memory */
int sim_map_get(const struct sim_map *map, uint64_t key, uintptr_t *value);
int sim_map_take(struct sim_map *map, uint64_t key, uintptr_t *value);
/* The entry with the greatest key <= key, or NULL. */
const struct sim_map_entry *sim_map_floor(const struct sim_map *map, uint64_t key);

/* ---- objects ---------------------------------------------------------------------------- */

/* A device as this process uses it. */
struct sim_cuda_device {
    CUdevice ordinal;
    struct sim_device_view *view;
    _Atomic int slot;  /* this process's slot in the state file; -1 until it first holds something */
    uint64_t tag_base; /* slot and generation bits of this process's interval records */
    struct CUctx_st *primary;
    struct CUmemPoolHandle_st *default_pool;
    struct CUmemPoolHandle_st *current_pool; /* what cuMemAllocAsync draws from; under the lock */
    _Atomic uint64_t next_reap_ns;
    /* The graph memory pool (graph_memory.c), under the lock: its blocks, and the figures of
     * cuDeviceGetGraphMemAttribute. */
    struct sim_graph_block *graph_blocks;
    uint64_t graph_used, graph_used_high, graph_reserved, graph_reserved_high;
};

struct CUctx_st {
    uint32_t magic;
    struct sim_cuda_device *device;
    int is_primary;
    _Atomic int active; /* 0 once destroyed (or, for a primary context, released or reset) */
    unsigned int flags;
    int retains; /* primary: cuDevicePrimaryCtxRetain count; under the lock */
    struct CUstream_st *null_stream;
    struct CUstream_st *streams;    /* created streams; under the lock */
    size_t limits[SIM_LIMIT_COUNT]; /* cuCtxSetLimit's values; 0: the default */
    CUfunc_cache cache_config;
};

struct CUstream_st {
    uint32_t magic;
    unsigned int flags;
    int priority;
    struct CUctx_st *ctx;
    _Atomic uint64_t tail_ns;               /* when the last kernel queued on it ends */
    _Atomic uint64_t launches;              /* kernels ever queued on it */
    _Atomic uint64_t ends[SIM_PUSH_BUFFER]; /* end of launch n at [n % SIM_PUSH_BUFFER] */
    struct CUgraph_st *capture;             /* the graph being captured instead of executing, or NULL */
    struct CUstream_st *next;               /* in its context's list, or in the free list */
};

struct CUevent_st {
    uint32_t magic;
    unsigned int flags;
    _Atomic uint64_t time_ns; /* when the work before its record completes */
    _Atomic int recorded;
    struct CUevent_st *next_free;
};

/* A function of a module, or a kernel of a library (a CUkernel is a CUfunction here: a library
 * is a module loaded without a context, and one kernel serves every context). */
struct CUfunc_st {
    uint32_t magic;
    struct CUmod_st *module;
    int attributes[CU_FUNC_ATTRIBUTE_MAX]; /* set by cuFuncSetAttribute; 0: the default */
    struct CUfunc_st *next;
    char name[];
};

struct CUmod_st {
    uint32_t magic;
    struct CUfunc_st *functions;
    int is_library; /* cuLibraryLoadData */
};

struct sim_launch {
    struct CUfunc_st *function;
    unsigned int grid[3];
    unsigned int block[3];
    unsigned int shared_bytes;
    int cooperative;
};

/* Graphs hold kernel nodes (captured, or a graph launched into a capture, inlined) and memory
 * nodes (cuGraphAddMemAllocNode, cuGraphAddMemFreeNode). */
struct CUgraphNode_st {
    uint32_t magic;
    CUgraphNodeType type;          /* KERNEL, MEM_ALLOC or MEM_FREE */
    struct sim_launch launch;      /* a kernel node's */
    struct CUctx_st *ctx;          /* a kernel node's */
    struct sim_graph_block *block; /* an allocation node's memory */
    CUdeviceptr freed;             /* a free node's address */
};

struct CUgraph_st {
    size_t count, capacity;
    struct CUgraphNode_st **nodes;
    int memory_nodes;            /* it holds allocation or free nodes */
    struct CUgraphExec_st *exec; /* then its one executable, or NULL */
};

struct CUgraphExec_st {
    size_t count; /* kernels */
    size_t allocations, frees;
    struct sim_graph_block **blocks; /* what its allocation nodes allocate, in node order */
    CUdeviceptr *freed;              /* what its free nodes free */
    struct CUgraph_st *graph;        /* the graph it was made from while both live, if it has memory nodes */
    struct sim_launch launches[];
};

/* Handles checked by lookup, never by reading through them: they are freed when destroyed, so a
 * second destroy (or any use after it) must not touch their memory. */
enum sim_handle_kind {
    SIM_HANDLE_ARRAY = 1,
    SIM_HANDLE_MIPMAPPED_ARRAY,
    SIM_HANDLE_POOL,
    SIM_HANDLE_VMM,
    SIM_HANDLE_GRAPH,
    SIM_HANDLE_GRAPH_EXEC,
};

/* A pool's figures are this process's allocations from it, under the lock. */
struct CUmemPoolHandle_st {
    struct sim_cuda_device *device;
    int is_default;
    int destroyed;                     /* freed when its last allocation is */
    uint64_t used;                     /* bytes of its allocations not yet freed */
    uint64_t reserved;                 /* bytes it holds on the device (charged): used + unused */
    uint64_t used_high, reserved_high; /* high-water marks since the program last reset each */
    uint64_t release_threshold;
    int reuse_follow_event_dependencies, reuse_allow_opportunistic, reuse_allow_internal_dependencies;
};

/* Arrays and mipmapped arrays: memory on a device with no address of their own. */
struct sim_array {
    struct sim_cuda_device *device;
    struct CUctx_st *ctx;
    uint64_t bytes;
};
struct CUarray_st {
    struct sim_array array;
};
struct CUmipmappedArray_st {
    struct sim_array array;
};

/* Physical memory of cuMemCreate: a memfd, so one handle can be mapped at several addresses. */
struct sim_vmm_handle {
    struct sim_cuda_device *device;
    uint64_t size;
    int fd;
    int mappings;
    int released;
    CUmemAllocationHandleType shareable; /* handle types it may be exported as */
    int imported; /* cuMemImportFromShareableHandle: another process's memory, not charged here */
};

enum sim_allocation_kind { SIM_ALLOCATION_LINEAR, SIM_ALLOCATION_MAPPING };

/* A range of device addresses: a linear allocation or a VMM mapping. Device addresses are
 * host addresses kept PROT_NONE until a copy first writes them, so a program that dereferences
 * a device pointer on the host faults, as it would with a real GPU. */
struct sim_allocation {
    uint64_t base, size;
    uint64_t span; /* address space taken: size rounded up to pages */
    enum sim_allocation_kind kind;
    struct sim_cuda_device *device;
    struct CUctx_st *ctx;            /* linear: freed with this context */
    struct CUmemPoolHandle_st *pool; /* linear from a pool, or NULL */
    struct sim_vmm_handle *handle;   /* mapping: the memory behind it */
    int in_arena;
    int host_access; /* pages readable and writable by copies */
    /* Linear: which SIM_POISON_CHUNK-sized pieces hold the poison byte yet (NULL: none); a piece
     * is poisoned when a copy first touches it, so untouched memory costs nothing. */
    uint64_t *poisoned;
    int managed;                   /* cuMemAllocManaged */
    struct sim_graph_block *graph; /* linear memory of a graph allocation node (graph_memory.c) */
    struct sim_ipc_share *share;   /* linear memory shared between processes (ipc.c), or NULL */
};

/* Linear memory another process can open (ipc.c): once exported, its pages are a memfd's, mapped
 * shared at the same address; an importer maps the same memfd, found through the exporter's
 * /proc/PID/fd, at an address of its own. */
struct sim_ipc_share {
    int fd;
    uint64_t serial;   /* names the memfd: a handle never opens another export that reused the fd */
    int imported;      /* this process opened it (cuIpcOpenMemHandle) rather than exported it */
    int opens;         /* imported: cuIpcOpenMemHandle calls not closed yet */
    uint64_t exporter; /* imported: the exporter's identity (with the serial, finds an open one again) */
};
/* Gives back what sharing added to linear memory being released (the lock is held). */
void sim_ipc_share_drop(struct sim_allocation *allocation);

/* Address space for linear allocations: one PROT_NONE reservation handed out first-fit, so
 * an allocation costs no system call until a copy touches it. */
struct sim_arena {
    uintptr_t base;
    size_t size, top;           /* bytes below top have been handed out at least once */
    struct sim_map free_ranges; /* offset -> length of free ranges below top, coalesced */
};

enum sim_cuda_state { SIM_UNINITIALISED, SIM_READY, SIM_INIT_FAILED, SIM_DEINITIALISED };

/* The library's one piece of process state (per-thread state: struct sim_thread). */
struct sim_cuda {
    _Atomic int state;
    CUresult init_result;
    pthread_mutex_t lock; /* guards everything below that is not atomic; never taken by launches */
    struct sim_machine machine;
    uint64_t identity;                               /* this process in the state file's slots */
    int device_count;                                /* visible through CUDA_VISIBLE_DEVICES */
    struct sim_cuda_device devices[SIM_MAX_DEVICES]; /* by ordinal */
    struct sim_arena arena;
    struct sim_map allocations;  /* base address -> struct sim_allocation * */
    struct sim_map reservations; /* cuMemAddressReserve base -> size */
    struct sim_map handles;      /* handles of enum sim_handle_kind -> their kind */
    struct sim_map host_buffers; /* pinned host memory: address -> struct sim_host_buffer * (host.c) */
    int fail_launches;           /* VGPU_SIM_FAIL_LAUNCHES: every launch fails */
    struct CUstream_st *free_streams;
    struct CUevent_st *free_events;
    int fork_handler_installed;
};
extern struct sim_cuda sim_cuda;

struct sim_thread {
    struct CUctx_st *stack[SIM_CTX_STACK_DEPTH];
    int depth;
};
extern _Thread_local struct sim_thread sim_thread;

/* ---- the entry-point table (generated by native/build.py) -------------------------------- */

/* One entry point of the real driver, as cuGetProcAddress serves it. */
struct sim_entry_point {
    const char *base;         /* the name asked for: "cuMemAlloc" of "cuMemAlloc_v2" */
    const char *name;         /* the exported name */
    int version;              /* the CUDA version that introduced this variant */
    unsigned char per_thread; /* a _ptds / _ptsz variant */
    unsigned char modelled;   /* 0: it answers CUDA_ERROR_NOT_SUPPORTED */
    void *function;
};
/* Sorted by base, then plain variants before per-thread ones, then version. */
extern const struct sim_entry_point sim_entry_points[];
extern const size_t sim_entry_point_count;
/* What an entry point the simulator does not model does: says so on stderr the first time
 * (`said`), answers CUDA_ERROR_NOT_SUPPORTED. */
CUresult sim_not_modelled(const char *name, _Atomic int *said);
/* ---- checkpoint.c ----------------------------------------------------------------------- */

/* Non-zero while a controller holds this process locked or checkpointed: calls wait at the gate
 * (in sim_ready, the first thing every entry point that touches the GPU does). */
extern _Atomic int sim_checkpoint_gate;
void sim_checkpoint_wait_at_gate(void);
/* Claims this process's checkpoint record and starts its checkpoint thread (at cuInit, the
 * lock held). */
void sim_checkpoint_start(const struct sim_env *env);
/* Around a copy that touches device bytes on the host side: a checkpoint waits for copies in
 * flight, and a copy started while the process is locked waits for the unlock. */
void sim_copy_begin(void);
void sim_copy_end(void);

/* ---- driver.c --------------------------------------------------------------------------- */

static inline CUresult sim_ready(void)
{
    int state = atomic_load_explicit(&sim_cuda.state, memory_order_acquire);
    if (__builtin_expect(state == SIM_READY, 1)) {
        if (__builtin_expect(atomic_load_explicit(&sim_checkpoint_gate, memory_order_acquire), 0))
            sim_checkpoint_wait_at_gate();
        return CUDA_SUCCESS;
    }
    return state == SIM_DEINITIALISED ? CUDA_ERROR_DEINITIALIZED : CUDA_ERROR_NOT_INITIALIZED;
}

/* The ready check, then the lock taken (on success only: the caller releases it). */
static inline CUresult sim_ready_locked(void)
{
    CUresult result = sim_ready();
    if (result == CUDA_SUCCESS)
        pthread_mutex_lock(&sim_cuda.lock);
    return result;
}

/* A call checked as the driver checks it: not initialised first, then INVALID_VALUE unless
 * `arguments_valid`. The caller's expression must not read through its pointers: it is
 * evaluated before the ready check. */
static inline CUresult sim_check(int arguments_valid)
{
    CUresult result = sim_ready();
    return result == CUDA_SUCCESS && !arguments_valid ? CUDA_ERROR_INVALID_VALUE : result;
}

/* The device of an ordinal, after the ready check; NULL if there is none. */
struct sim_cuda_device *sim_device(CUdevice ordinal);

/* The initialised driver's device `ordinal`, or the error the driver gives: not initialised
 * first, then an invalid device, then INVALID_VALUE unless `arguments_valid` (as sim_check). */
CUresult sim_device_ready(CUdevice ordinal, struct sim_cuda_device **device, int arguments_valid);
/* The body of a device query: `value`, an expression of the `device` ordinal `dev` names. */
#define DEVICE_ANSWER(dev, out, value)                                                                                 \
    SIM_ANSWER(CUresult, struct sim_cuda_device, device, sim_device_ready(dev, &device, (out) != NULL), out, value)

/* Records that `handle` is a live object of `kind` (so calls can tell it from garbage); 0 when
 * out of memory. */
int sim_register_handle(const void *handle, enum sim_handle_kind kind);
/* Whether `handle` is a live object of `kind`; the lock is held. */
int sim_handle_is(const void *handle, enum sim_handle_kind kind);
/* Checks a call on a handle as the driver does (sim_check, then INVALID_VALUE unless `handle`
 * is a live object of `kind`) and takes the lock; the caller releases it on success. */
CUresult sim_lock_handle(const void *handle, enum sim_handle_kind kind, int arguments_valid);

/* Frees dead processes' memory on a device, at most every SIM_REAP_INTERVAL_NS. */
void sim_reap_now_and_then(struct sim_cuda_device *device);

/* The device a memory location names, after the ready check; NULL unless it is a device. */
static inline struct sim_cuda_device *sim_device_at(const CUmemLocation *location)
{
    return location->type == CU_MEM_LOCATION_TYPE_DEVICE ? sim_device(location->id) : NULL;
}

/* ---- context.c -------------------------------------------------------------------------- */

static inline struct CUctx_st *sim_current(void)
{
    return sim_thread.depth > 0 ? sim_thread.stack[sim_thread.depth - 1] : NULL;
}

/* The current context after the ready check, or an error: INVALID_CONTEXT if there is none,
 * then INVALID_VALUE unless `arguments_valid` (as sim_check). */
CUresult sim_current_context(struct CUctx_st **ctx, int arguments_valid);

/* Claims this process's slot on a device; the _locked variant for callers holding the lock. */
CUresult sim_attach(struct sim_cuda_device *device);
CUresult sim_attach_locked(struct sim_cuda_device *device);
/* Device memory held by this process: charged against the device's capacity, across processes.
 * Attaches first if needed, so never call it with the lock held before the device is attached. */
CUresult sim_charge(struct sim_cuda_device *device, uint64_t bytes);
void sim_uncharge(struct sim_cuda_device *device, uint64_t bytes);

/* ---- memory.c --------------------------------------------------------------------------- */

/* Frees what a context owns (its linear allocations and arrays); the lock is held. */
void sim_free_context_memory(struct CUctx_st *ctx);
/* Address space for linear memory: `span` bytes (a multiple of the host page) kept PROT_NONE,
 * from the arena or a mapping of their own (*in_arena says which); 0 when none is left. The lock
 * is held. */
uintptr_t sim_address_take(uint64_t span, int *in_arena);
void sim_address_give(uintptr_t address, uint64_t span, int in_arena);
/* What every kind of linear memory (cuMemAlloc's, a graph allocation's, an IPC import's) starts
 * as: `size` bytes on a device at `span` bytes of address space (sim_address_take), base 0 when
 * none is left. The lock is held. */
struct sim_allocation sim_linear_take(struct sim_cuda_device *device, uint64_t size, uint64_t span);
/* The allocation that starts at `address`, or NULL; the lock is held. */
struct sim_allocation *sim_allocation_at(CUdeviceptr address);
/* Gives back the pages of linear memory (its bytes are gone; the addresses stay reserved) and
 * forgets its poison marks; the lock is held. */
void sim_linear_pages_drop(struct sim_allocation *allocation);
/* Gives back linear memory already taken out of the allocations map; the lock is held. */
void sim_release_linear(struct sim_allocation *allocation);
/* VMM handles (cuMemCreate's memfds): the memfd's name says the device (so an imported
 * descriptor can be told from any other file); a handle registered, and destroyed (closed, and
 * uncharged unless imported). */
#define SIM_VMM_MEMFD_PREFIX "jupyter-vgpu-sim-vmm-"
void sim_vmm_memfd_name(char *name, size_t size, const struct sim_cuda_device *device);
int sim_vmm_register(struct sim_vmm_handle *handle);
void sim_vmm_destroy(struct sim_vmm_handle *handle);

/* ---- graph_memory.c --------------------------------------------------------------------- */

/* The memory of one graph allocation node: its address is fixed when the node is made; a launch
 * backs it (charged to this process's slot as the device's graph pool reserve) and makes it
 * live; a free node, cuMemFree or cuMemFreeAsync ends its life, the pool keeps the memory
 * reserved until cuDeviceGraphMemTrim. Freed once no node or executable owns it, nothing is
 * reserved for it and it is not live. All under the lock. */
struct sim_graph_block {
    struct sim_allocation allocation; /* in sim_cuda.allocations while live */
    int live, backed;
    int owners;                   /* its node, and the executable made from the node's graph */
    struct sim_graph_block *next; /* in its device's graph_blocks */
};
CUresult sim_graph_block_new(struct sim_cuda_device *device, uint64_t size, struct sim_graph_block **block);
void sim_graph_block_release(struct sim_graph_block *block); /* one owner fewer */
/* An executable's launch: its allocations made live (backing what is not backed yet), then its
 * frees. Refused whole (INVALID_VALUE: an allocation still live, a free of nothing live;
 * OUT_OF_MEMORY: the device cannot back it) before anything changes. */
CUresult sim_graph_memory_launch(struct CUgraphExec_st *exec);
/* A free of live graph memory outside its graph (cuMemFree, cuMemFreeAsync). */
void sim_graph_block_free(struct sim_graph_block *block);

/* ---- pool.c ----------------------------------------------------------------------------- */

/* A new pool on a device, every reuse policy on as the driver starts one; NULL out of memory.
 * The caller registers it (SIM_HANDLE_POOL). */
struct CUmemPoolHandle_st *sim_pool_new(struct sim_cuda_device *device);
/* The pool a stream-ordered allocation draws from: `asked` if it is a live pool (NULL if not),
 * the device's current pool when nothing is asked. Takes the lock. */
struct CUmemPoolHandle_st *sim_pool_to_draw(struct sim_cuda_device *device, CUmemoryPool asked);
/* Before an allocation of `bytes` from the pool: takes what it can of the pool's unused
 * reserve for it and returns how much (the rest is charged to the device); unclaim gives it up
 * when the allocation fails. Both take the lock. */
uint64_t sim_pool_claim(struct CUmemPoolHandle_st *pool, uint64_t bytes);
void sim_pool_unclaim(struct CUmemPoolHandle_st *pool, uint64_t reused);
/* An allocation from the pool was made (`charged`: what was not claimed from its reserve) or
 * freed; the lock is held. A freed allocation's memory stays reserved by the pool, except in a
 * destroyed pool, which gives it back and goes with its last allocation. */
void sim_pool_took(struct CUmemPoolHandle_st *pool, uint64_t charged);
void sim_pool_gave(struct CUmemPoolHandle_st *pool, uint64_t bytes);
/* Memory of a destroyed context's allocation freed into the pool goes back to the device (the
 * lock is held). */
void sim_pool_forget(struct CUmemPoolHandle_st *pool, uint64_t bytes);
/* A synchronisation: every pool gives back what it holds beyond its release threshold. Takes
 * the lock. */
void sim_pools_synchronised(void);

/* ---- exec.c ----------------------------------------------------------------------------- */

/* A function of a module, found or made (lock not held); NULL out of memory. */
struct CUfunc_st *sim_module_function(struct CUmod_st *module, const char *name);
/* Loads a new module (a library where `is_library`) into *module; OUT_OF_MEMORY if it cannot. */
CUresult sim_module_load(int is_library, struct CUmod_st **module);

struct CUstream_st *sim_stream_new(struct CUctx_st *ctx, unsigned int flags); /* lock held */
void sim_stream_retire(struct CUstream_st *stream);                           /* lock held */
/* The stream a handle names (NULL and the special handles: the current context's default
 * stream), after the ready check. */
CUresult sim_stream_resolve(CUstream handle, struct CUstream_st **stream);
/* Opens an entry point that works on a stream, as VGPU_HOOK_REAL opens a hook: declares `stream`,
 * the stream `handle` names, and `result`, and returns the error when it names none. */
#define SIM_STREAM_OR_RETURN(handle)                                                                                   \
    struct CUstream_st *stream;                                                                                        \
    CUresult result = sim_stream_resolve(handle, &stream);                                                             \
    if (__builtin_expect(result != CUDA_SUCCESS, 0))                                                                   \
    return result

/* When every kernel queued in a context so far ends (takes the lock). */
uint64_t sim_context_tail(struct CUctx_st *ctx);

#endif /* VGPU_SIM_CUDA_H */
