/*
 * What the files of libvgpu.so share. One concern per file:
 *   resolve.c  symbol resolution: real dlsym, the dlsym override (dlsym_entry.S), the hook
 *              table built from hooks.def, cuGetProcAddress, lazy lookup of real entry points
 *   state.c    the one struct of process state, environment (read here and nowhere else),
 *              region attach / validation / fail-closed reason, proc slot, fork handling
 *   memory.c   allocation hooks, the allocation table, the cap check, virtualised totals
 *   nvml.c     NVML hooks
 *   launch.c   launch hooks: cost of a launch, then vgpu_launch_admit()
 *   pacing.c   the SM-share limiter: per-thread token caches, the shared pool, the controller
 *   log.c      logging (stderr only, silent unless asked, except the out-of-memory line)
 * All symbols here have hidden visibility (the build passes -fvisibility=hidden); only hooks
 * and dlsym are exported, through exports.map.
 */
#ifndef VGPU_INTERPOSER_INTERNAL_H
#define VGPU_INTERPOSER_INTERNAL_H

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

enum vgpu_library { VGPU_LIB_CUDA, VGPU_LIB_NVML };

/* The real entry point behind a hook, or NULL when the installed driver lacks it. */
void *vgpu_real(enum vgpu_hook_id id);

/* The real entry point of any symbol of the driver or NVML (hooked or not), or NULL. */
void *vgpu_real_symbol(enum vgpu_library library, const char *symbol);

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

/* The mapped region and this process's slot; NULL when failed closed. */
struct vgpu_region *vgpu_region(void);
struct vgpu_proc_slot *vgpu_self_slot(void);

/* Bytes the whole slice holds now: allocated + driver_reserved over live slots. */
uint64_t vgpu_slice_usage(void);

/* Frees the slots of processes that are gone; returns how many were reaped. */
int vgpu_reap_dead_slots(void);

/* ---- pacing.c ----------------------------------------------------------------------- */

/* Called by every launch hook before it forwards; blocks while the slice is over its SM
 * share. `cost` is the launch's work in warps (blocks x ceil(threads per block / 32)). */
void vgpu_launch_admit(uint64_t cost);

/* Prices of graph executables, kept by pacing.c: launch.c prices a graph's kernels when it is
 * instantiated (where the driver can list them) and a graph launch is admitted at that price.
 * An executable without a price is charged a nominal one; the controller's measured cost per
 * token turns that into the right rate all the same. */
void vgpu_graph_exec_priced(CUgraphExec exec, uint64_t cost);
uint64_t vgpu_graph_exec_cost(CUgraphExec exec);
void vgpu_graph_exec_forget(CUgraphExec exec);

/* ---- log.c -------------------------------------------------------------------------- */

enum vgpu_log_level { VGPU_LOG_OFF = 0, VGPU_LOG_ERROR, VGPU_LOG_WARN, VGPU_LOG_INFO, VGPU_LOG_DEBUG };
void vgpu_log(enum vgpu_log_level level, const char *format, ...) __attribute__((format(printf, 2, 3)));
/* The one line a refused allocation prints, whatever the log level. */
void vgpu_report_oom(const char *call, uint64_t request, uint64_t usage, uint64_t limit);

#endif /* VGPU_INTERPOSER_INTERNAL_H */
