/*
 * The slice's shared memory: two files per slice, mapped by whoever publishes the slice's limits
 * (Python, through cffi) and by every process of the slice (the interposer, C). This header is
 * the only definition of their layout. Python feeds the text between the CDEF markers to cffi's
 * cdef, so that part holds plain declarations only: fixed-width integers, #define'd integer
 * constants, explicit padding, no attributes or expressions.
 *
 * The two files, and who writes what:
 *   - the limits page (struct vgpu_limits_page, "<slice>.region.limits" or $VGPU_LIMITS): the
 *     slice's device and limits, written only by the publisher, i.e. the Jupyter server (or
 *     `jupyter vgpu run`), or the node's broker, which creates it under its own account so that
 *     a kernel running under another account can read it but not write it. The interposer maps
 *     it read-only.
 *   - the region (struct vgpu_region, "<slice>.region" or $VGPU_REGION): what the slice uses.
 *     Each process of the slice owns one proc slot and is the only writer of its counters; the
 *     controller (one process of the slice at a time, holding the lease) writes the limiter
 *     fields, the measured utilisation and the slots' `granted` tokens; any process of the slice
 *     raises `context_memory` to what its first context measured.
 *
 * Publishing limits without torn reads: `limits` has two copies. A writer (serialised by an
 * flock on the limits file) fills the copy that is not active, bumping that copy's `sequence`
 * to odd before and to even after, then stores the index of the copy in `active_limits`.
 * A reader loads `active_limits`, reads the copy between two loads of its `sequence`, and
 * retries when the sequence changed or is odd. A writer that dies mid-update leaves the active
 * copy untouched. Each copy carries `check` = vgpu_limits_check(...) below so that a page
 * scribbled over by something else is told apart from a valid one.
 *
 * The page's place in line (queue_position, queue_eta_s) is one pair, published the same way
 * with one copy: under the flock, the writer bumps `queue_sequence` to odd, writes both, bumps it
 * to even; a reader retries while it is odd or changed across its reads.
 *
 * Compatibility: a field added in reserved bytes keeps the page's size and version when its
 * zero value means what a file written before it meant (a page of an older publisher reads as
 * "not in line, never interrupted"); a change that cannot be read that way bumps the version.
 *
 * Crash safety: a process's usage lives only in its own slot; the slice's usage is the sum of
 * the live slots. A slot whose pid is gone (or reused: start_time differs) is reaped by any
 * process of the slice or by the server, so a SIGKILLed process stops counting without anyone
 * holding a lock it could die with.
 */
#ifndef VGPU_REGION_H
#define VGPU_REGION_H

#include <stdint.h>

/* VGPU_REGION_CDEF_BEGIN */
#define VGPU_REGION_MAGIC 0x55504756
#define VGPU_LIMITS_MAGIC 0x4d494c56
#define VGPU_REGION_VERSION 3
#define VGPU_REGION_MAX_PROCS 128
#define VGPU_DEVICE_UUID_SIZE 96

#define VGPU_POLICY_HARD 0
#define VGPU_POLICY_BURST 1

#define VGPU_SM_SHARE_MIN 1
#define VGPU_SM_SHARE_MAX 100

#define VGPU_QUEUE_NO_ESTIMATE 0xFFFFFFFF

/* Why the slice's calls wait while `suspended` is set (the page's wait_reason). */
#define VGPU_WAIT_FOR_ROOM 0
#define VGPU_WAIT_TAKEN_BACK 1

/* One published copy of the slice's limits: 64 bytes. */
struct vgpu_limits {
    uint64_t sequence;     /* odd while a writer is filling this copy */
    uint64_t memory_limit; /* bytes; 0 means no memory cap */
    uint32_t sm_share;     /* percent of the device's SMs, 1..100 */
    uint32_t policy;       /* VGPU_POLICY_HARD or VGPU_POLICY_BURST */
    uint64_t check;        /* vgpu_limits_check(memory_limit, sm_share, policy) */
    uint8_t reserved[32];
};

/* One process of the slice: 128 bytes, two cache lines, written only by that process (except
 * by a reaper once the process is gone, and `granted` by the controller). */
struct vgpu_proc_slot {
    int32_t pid;               /* 0: free; claimed with compare-and-swap */
    uint32_t wanting;          /* threads of this process waiting for launch tokens */
    uint64_t start_time;       /* field 22 of /proc/<pid>/stat, tells a reused pid apart */
    uint64_t allocated;        /* bytes held through the hooked allocation calls */
    uint64_t driver_reserved;  /* bytes the driver holds for this process beyond `allocated`
                                  (contexts), from NVML's per-process figure */
    uint64_t launches;         /* launches that went through the limiter */
    uint64_t throttled_ns;     /* time spent waiting in the limiter */
    uint32_t sm_util_permille; /* last measured SM utilisation of this process, per mille */
    uint32_t oom_refusals;     /* allocations refused by the cap */
    int64_t granted;           /* launch tokens the controller set aside for this process;
                                  below 0 when it overdrew them */
    int32_t nvml_pid;          /* the pid NVML lists this process under (the host's pid when the
                                  slice runs in a PID namespace); 0 until known */
    uint32_t resume_requests;  /* CUDA calls (hooked or gated) made while the page said
                                  `suspended`: each asks the publisher to resume the slice (the
                                  call itself waits in libvgpu.so until then) */
    /* cuMemAllocManaged calls that succeeded, ever: the driver cannot suspend a process that
     * holds managed memory. */
    uint64_t managed_allocations;
    /* Answers to the page's `release_request` (the cached memory a suspend need not copy). The
     * process's libvgpu.so answers for the driver's stream-ordered pools; the kernel's Python side
     * (jupyter_vgpu/notebook/release.py), in the same process, for the frameworks' caches: */
    uint64_t pools_released;      /* bytes the last trim of the driver's pools gave back */
    uint64_t torch_released;      /* bytes the last torch.cuda.empty_cache() gave back */
    uint64_t cupy_released;       /* bytes the last CuPy free_all_blocks() gave back */
    uint32_t pools_answered;      /* the release_request libvgpu.so answered last (0: none) */
    uint32_t frameworks_answered; /* the release_request the frameworks' side answered last */
    uint32_t frameworks_watching; /* 1 while the kernel's Python side answers requests: libvgpu.so
                                     trims after it, the publisher waits for it */
    uint8_t reserved1[12];
};

/* The limits page: what the slice may use, written only by its publisher: 320 bytes. */
struct vgpu_limits_page {
    /* Header, written once when the page is created: 128 bytes. */
    uint32_t magic;     /* VGPU_LIMITS_MAGIC */
    uint32_t version;   /* VGPU_REGION_VERSION */
    uint32_t page_size; /* sizeof(struct vgpu_limits_page) */
    uint32_t reserved0;
    char device_uuid[VGPU_DEVICE_UUID_SIZE]; /* NVML UUID of the slice's device, NUL-terminated */
    int32_t device_index;                    /* NVML index of the slice's device */
    uint32_t reserved1[3];

    /* Limits, published as described above: 64 + 2 * 64 bytes. */
    uint64_t active_limits; /* 0 or 1: the copy readers use */
    uint32_t suspended;     /* 1 while the publisher holds the slice suspended: checkpointed by
                               the driver, or lent before its processes used the GPU. Every
                               CUDA call waits in libvgpu.so while it is set; 0 otherwise */
    /* The slice's place in its device's line while it waits for room, published with the
     * `queue_sequence` protocol below: */
    uint32_t queue_position;  /* 1: next; 0: not known, or not in line (queue_eta_s is then
                                 not read) */
    uint32_t queue_eta_s;     /* seconds until its room is expected; VGPU_QUEUE_NO_ESTIMATE: none */
    uint32_t queue_sequence;  /* odd while the publisher writes queue_position and queue_eta_s */
    uint32_t leave_line;      /* bumped by the publisher when the user interrupts the kernel:
                                 calls waiting for room then give up (CUDA_ERROR_OUT_OF_MEMORY) */
    uint32_t release_request; /* bumped by the publisher before a suspend: each process gives
                                 back cached device memory it does not use (the driver's pools
                                 trimmed, the frameworks' caches emptied) and answers in its
                                 slot (pools_answered, frameworks_answered); never what the
                                 program still holds */
    uint32_t wait_reason;     /* VGPU_WAIT_TAKEN_BACK while borrowed room is taken back from the
                                 slice for someone within their guarantee (a classroom's broker):
                                 its waiting calls say so; VGPU_WAIT_FOR_ROOM otherwise */
    uint8_t reserved2[28];
    struct vgpu_limits limits[2];
};

struct vgpu_region {
    /* Header, written once when the region is created: 64 bytes. */
    uint32_t magic;       /* VGPU_REGION_MAGIC */
    uint32_t version;     /* VGPU_REGION_VERSION */
    uint32_t region_size; /* sizeof(struct vgpu_region) */
    uint32_t max_procs;   /* VGPU_REGION_MAX_PROCS */
    uint8_t reserved0[48];

    /* Limiter, shared by the processes of the slice: 64 bytes. */
    int32_t controller_pid;           /* process running the controller; 0 when none */
    uint32_t sm_util_permille;        /* SM utilisation of the whole slice, last controller period */
    uint64_t controller_heartbeat_ns; /* CLOCK_MONOTONIC of the controller's last period */
    int64_t tokens;                   /* launch budget the controller refills and launches draw from */
    uint64_t tokens_per_second;       /* refill rate the controller settled on */
    uint32_t device_busy_permille;    /* utilisation of the device by processes outside the slice */
    uint32_t refill_epoch;            /* bumped by every refill that waiting launches should see: their futex */
    uint64_t reserved3[3];

    /* Highest slot index ever claimed + 1, so that sums stop early. */
    uint32_t procs_high_water;
    /* Driver memory of a process's first context on the slice's device, the most any process
     * of the slice measured (NVML) right after creating it; valid once context_memory_known is
     * 1. Later processes count it for their first context at once, instead of starting NVML on
     * their start-up path, and measure their own within a monitor period. */
    uint32_t context_memory_known;
    uint64_t context_memory;
    uint8_t reserved4[48];

    struct vgpu_proc_slot procs[VGPU_REGION_MAX_PROCS];
};
/* VGPU_REGION_CDEF_END */

/* Mixes the limits with odd 64-bit constants (arithmetic modulo 2^64, as Python computes it
 * with & 0xffffffffffffffff) so that zeroed or scribbled memory does not pass for a valid copy. */
static inline uint64_t vgpu_limits_check(uint64_t memory_limit, uint32_t sm_share, uint32_t policy)
{
    return (memory_limit * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)sm_share * 0xc2b2ae3d27d4eb4fULL) ^
           ((uint64_t)(policy + 1) * 0x165667b19e3779f9ULL) ^ (uint64_t)VGPU_REGION_MAGIC;
}

_Static_assert(sizeof(struct vgpu_limits) == 64, "vgpu_limits is one cache line");
_Static_assert(sizeof(struct vgpu_proc_slot) == 128, "a proc slot is two cache lines");
_Static_assert(__builtin_offsetof(struct vgpu_limits_page, active_limits) == 128, "page header is 128 bytes");
_Static_assert(__builtin_offsetof(struct vgpu_limits_page, limits) % 64 == 0, "limits are cache-line aligned");
_Static_assert(sizeof(struct vgpu_limits_page) == 320, "a limits page is five cache lines");
_Static_assert(__builtin_offsetof(struct vgpu_limits_page, limits) -
                       __builtin_offsetof(struct vgpu_limits_page, active_limits) ==
                   64,
               "the page's flags are one cache line");
_Static_assert(__builtin_offsetof(struct vgpu_region, controller_pid) == 64, "region header is 64 bytes");
_Static_assert(__builtin_offsetof(struct vgpu_region, procs) % 64 == 0, "slots are cache-line aligned");
_Static_assert(__builtin_offsetof(struct vgpu_region, procs) -
                       __builtin_offsetof(struct vgpu_region, procs_high_water) ==
                   64,
               "the usage summary is one cache line");

#endif /* VGPU_REGION_H */
