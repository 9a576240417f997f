/*
 * The simulated machine, shared by the simulated libcuda.so.1 and libnvidia-ml.so.1 (both are
 * built from native/sim/common plus their own directory). Nothing declared here is exported:
 * the build hides every symbol, and each library's exports.map lists its entry points only.
 *
 * A machine is the devices of VGPU_SIM_DEVICES (spec.c) plus a state file at VGPU_SIM_STATE
 * (shared.c) that every process using the same path maps MAP_SHARED. Per device the file holds
 *   - the execution timeline: the instant the device finishes all work queued so far;
 *   - a log of the intervals kernels held the device (engine.c), from which NVML computes busy
 *     time exactly;
 *   - one slot per process: its identity and the device memory it holds.
 * No lock is ever held inside the file. Every update is a single atomic operation or a sequence
 * that any other process can finish or repair, so a process killed at any instruction (SIGKILL
 * mid-call) leaves nothing that blocks the others.
 */
#ifndef VGPU_SIM_H
#define VGPU_SIM_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define SIM_MAX_DEVICES 16
#define SIM_MAX_PROCS 64 /* process slots per device */
#define SIM_NAME_SIZE 96 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define SIM_UUID_SIZE 48 /* "GPU-" + 36 characters + NUL, rounded up */

#define SIM_DEFAULT_NAME "jupyter-vgpu simulated GPU"
#define SIM_DEFAULT_MEMORY (16ull << 30)
#define SIM_DEFAULT_SMS 100u
#define SIM_DEFAULT_CONTEXT_MEMORY 0ull
#define SIM_DEFAULT_BLOCK_NS 10000ull
#define SIM_MAX_MEMORY (64ull << 40) /* keeps byte counts clear of the generation bits of a slot */

/* Compute capability of every simulated device (Hopper), and its consequences. */
#define SIM_CC_MAJOR 9
#define SIM_CC_MINOR 0
#define SIM_WARP_SIZE 32
#define SIM_MAX_THREADS_PER_BLOCK 1024
#define SIM_MAX_THREADS_PER_SM 2048
#define SIM_MAX_BLOCKS_PER_SM 32
#define SIM_THREADS_PER_BLOCK_UNIT 256 /* a block of up to this many threads costs one block_ns */
#define SIM_MAX_SHARED_MEMORY_OPTIN 232448

/* Where a device sits on the PCI bus, the same for libcuda and NVML. */
#define SIM_PCI_BUS(index) (0x18 + (index))
#define SIM_PCI_DEVICE_ID 0x233010deu /* device 0x2330, vendor NVIDIA */
#define SIM_PCI_SUBSYSTEM_ID 0x16c110deu

/* NVML samples utilisation over this period, as the real library does. */
#define SIM_SAMPLE_PERIOD_NS 1000000000ull

/* Occupancy weights are fixed point: SIM_WEIGHT_ONE means every SM of the device. */
#define SIM_WEIGHT_ONE 65536u

/* The body of an entry point that answers one value, in either library: `checked`, the call's
 * checks as the library makes them, gives its status (0: success); then `value` is stored
 * through `out`. */
#define SIM_CHECKED_ANSWER(status_type, checked, out, value)                                                           \
    status_type result = (checked);                                                                                    \
    if (result == 0)                                                                                                   \
        *(out) = (value);                                                                                              \
    return result

/* SIM_CHECKED_ANSWER of a handle: `lookup` checks the call and finds `object` (a `type` *, the
 * thing the handle names), and `value` is an expression of it. Each library wraps it for its
 * kinds of handle (DEVICE_ANSWER, STREAM_ANSWER, ...). */
#define SIM_ANSWER(status_type, type, object, lookup, out, value)                                                      \
    type *object;                                                                                                      \
    SIM_CHECKED_ANSWER(status_type, lookup, out, value)

/* ---- device model (spec.c) ------------------------------------------------------------ */

struct sim_device_spec {
    char name[SIM_NAME_SIZE];
    char uuid[SIM_UUID_SIZE]; /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lower case */
    unsigned char uuid_bytes[16];
    uint64_t memory;         /* bytes */
    uint64_t context_memory; /* bytes the driver holds on the device for each context */
    uint32_t sms;
    uint64_t block_ns; /* time one block of <= 256 threads occupies an SM */
};

struct sim_spec {
    int count;
    struct sim_device_spec devices[SIM_MAX_DEVICES];
};

/* Parses VGPU_SIM_DEVICES (NULL or "" gives the default device). Returns 0, or -1 with a
 * sentence in `error` that says what is wrong and what is accepted. */
int sim_spec_parse(const char *text, struct sim_spec *spec, char *error, size_t error_size);

/* A hash of everything the spec decides, naming the default state file and telling a state
 * file made for another spec. */
uint64_t sim_spec_hash(const struct sim_spec *spec);

/* Applies CUDA_VISIBLE_DEVICES (NULL: all devices) as the real driver does: a comma-separated
 * list of indices or GPU-UUIDs (a unique prefix is enough), read up to the first entry that is
 * invalid, out of range or repeated. Fills ordinal -> device index; returns how many. */
int sim_visible_devices(const char *text, const struct sim_spec *spec, int order[SIM_MAX_DEVICES]);

/* ---- environment (env.c): the only place either library reads the environment --------- */

struct sim_env {
    const char *devices;         /* VGPU_SIM_DEVICES, NULL when unset or empty */
    const char *state_path;      /* VGPU_SIM_STATE, NULL when unset or empty */
    const char *visible_devices; /* CUDA_VISIBLE_DEVICES, NULL when unset (empty hides all) */
    const char *runtime_dir;     /* XDG_RUNTIME_DIR, NULL when unset or empty */
    const char *driver_version;  /* VGPU_SIM_DRIVER_VERSION ("13.0"), NULL when unset or empty */
    int fail_launches;           /* VGPU_SIM_FAIL_LAUNCHES set and not "0": every launch fails */
    /* The checkpoint API's model (cuda/checkpoint.c), read by the process being checkpointed:
     * VGPU_SIM_CHECKPOINT_BANDWIDTH, bytes per second a checkpoint or restore copies (unset:
     * as fast as the host copies), and VGPU_SIM_RESTORE_OOM_FAILS=1, a restore refused for lack
     * of memory leaves the process FAILED for good (as on driver 580). */
    const char *checkpoint_bandwidth;
    const char *restore_oom_fails;
};
void sim_env_read(struct sim_env *env);
/* The CUDA version the driver reports (cuDriverGetVersion, NVML's CUDA version) and whose entry
 * points cuGetProcAddress serves: VGPU_SIM_DRIVER_VERSION as "MAJOR.MINOR", 12.0 to 13.9,
 * default 13.0 (the r580 drivers). Parse returns 0, or -1 with a sentence in `error`. */
#define SIM_DEFAULT_DRIVER_VERSION 13000
int sim_driver_version_parse(const char *text, int *version, char *error, size_t error_size);
int sim_driver_version(void); /* the setting, or the default while it is malformed */

/* The process table the simulated driver sees, as a real driver sees the host's: VGPU_SIM_PROC,
 * default /proc. A test that runs a program in a PID namespace with a /proc of its own points
 * this at the host's /proc (bind-mounted elsewhere), so that NVML lists the program under a pid
 * its getpid() does not return, as in a container. */
const char *sim_proc_root(void);

/* ---- the kernel model (engine.c) ------------------------------------------------------- */

struct sim_kernel_cost {
    uint64_t duration_ns;
    uint32_t weight;      /* share of the device's SMs it occupies, of SIM_WEIGHT_ONE */
    uint64_t wave_blocks; /* blocks that run at once: sms * blocks_per_sm */
};

/* How long a grid of `blocks` blocks of `threads_per_block` threads holds the device:
 *   blocks_per_sm = max(1, min(32, 2048 / threads_per_block))
 *   waves         = ceil(blocks / (sms * blocks_per_sm))
 *   duration      = waves * block_ns * ceil(threads_per_block / 256)
 *   weight        = min(1, blocks / (sms * blocks_per_sm))
 * A kernel whose blocks fill half the SMs counts half in SM utilisation. */
void sim_kernel_cost(const struct sim_device_spec *device, uint64_t blocks, uint32_t threads_per_block,
                     struct sim_kernel_cost *cost);

/* ---- the state file (shared.c) --------------------------------------------------------- */

/* One process's holdings on one device. `owner` is the process identity (sim_identity());
 * `memory` packs a generation (bumped at each claim, so a late repair of a previous owner's
 * slot can never touch the new owner's bytes) above the bytes held. */
struct sim_slot {
    alignas(64) _Atomic uint64_t owner; /* 0: free */
    _Atomic uint64_t memory;            /* generation << 48 | bytes */
    _Atomic uint32_t contexts;          /* contexts the owner holds on the device */
};
#define SIM_SLOT_BYTES_MASK ((1ull << 48) - 1)
#define SIM_SLOT_GENERATION(memory) ((uint32_t)((memory) >> 48))

/* One stretch of time a process's kernels held a device. `commit` is the record's ring index
 * plus one once it is complete (0 while it is written): a reader that sees the same commit
 * before and after reading the fields has a consistent record. */
struct sim_interval {
    _Atomic uint64_t commit;
    _Atomic uint64_t start_ns;
    _Atomic uint64_t end_ns; /* grows in place when the same process's next kernel follows at once */
    _Atomic uint64_t tag;    /* weight | slot << 17 | generation << 24 */
};
#define SIM_TAG(weight, slot, generation) ((uint64_t)(weight) | (uint64_t)(slot) << 17 | (uint64_t)(generation) << 24)
#define SIM_TAG_WEIGHT(tag) ((uint32_t)((tag) & 0x1ffff))
#define SIM_TAG_SLOT(tag) ((int)(((tag) >> 17) & 0x7f))
#define SIM_TAG_GENERATION(tag) ((uint32_t)(((tag) >> 24) & 0xffff))

struct sim_shared_device {
    alignas(64) _Atomic uint64_t free_at_ns; /* the timeline: when all work queued so far ends */
    alignas(64) _Atomic uint64_t ring_head;  /* interval records ever appended */
    alignas(64) _Atomic uint32_t slots_used; /* slots [0, slots_used) have ever been claimed */
    struct sim_slot slots[SIM_MAX_PROCS];
};

/* A device as one process sees it: its spec and where its state lies in the mapping. */
struct sim_device_view {
    int index; /* in the spec (NVML's index) */
    const struct sim_device_spec *spec;
    struct sim_shared_device *shared;
    struct sim_interval *ring;
    uint64_t ring_mask; /* records - 1; records is a power of two */
};

/* One CUDA process as the driver's checkpoint API sees it (cuda/checkpoint.c): its state, and
 * the channel through which a controller (another process) asks the process's checkpoint thread
 * to lock, checkpoint, restore or unlock it. `request` and `response` are futex words. */
#define SIM_CHECKPOINT_RECORDS 256
struct sim_checkpoint_record {
    alignas(64) _Atomic uint64_t owner; /* identity of the process (sim_identity); 0: free */
    _Atomic uint64_t controller;        /* identity of the controller whose request is open; 0: none */
    _Atomic uint32_t state;             /* CUprocessState */
    _Atomic uint32_t restore_tid;       /* the checkpoint thread's tid */
    _Atomic uint32_t request;           /* sequence number of the latest request */
    _Atomic uint32_t response;          /* sequence number of the latest request answered */
    _Atomic uint32_t operation, timeout_ms;
    _Atomic int32_t result;
};

struct sim_machine {
    struct sim_spec spec;
    struct sim_device_view devices[SIM_MAX_DEVICES];
    struct sim_checkpoint_record *checkpoint_records; /* SIM_CHECKPOINT_RECORDS of them */
    void *mapping;
    size_t mapping_size;
};

/* Parses the spec and maps (creating it if needed) the state file. On failure prints one line
 * on stderr, naming `library`, and returns -1. */
int sim_machine_open(struct sim_machine *machine, const struct sim_env *env, const char *library);
void sim_machine_close(struct sim_machine *machine);

/* The identity of a process in a slot: its start time (clock ticks since boot) and pid. */
uint64_t sim_identity(pid_t pid);
/* The pid the driver (and so NVML) knows this process by: its pid in sim_proc_root(). */
pid_t sim_driver_pid(void);
pid_t sim_identity_pid(uint64_t identity);
/* Whether the process of an identity still runs (the same pid and start time). */
int sim_identity_alive(uint64_t identity);

/* Claims a slot for `identity` (reusing one it already owns, as after exec); -1 when all are
 * taken by live processes. */
int sim_slot_claim(struct sim_device_view *device, uint64_t identity);
/* Gives a slot back at exit: its bytes return to the device. */
void sim_slot_release(struct sim_device_view *device, int slot, uint64_t identity);
/* Frees the slots of processes that are gone; returns how many. */
int sim_reap_dead(struct sim_device_view *device);

/* Adds `bytes` to a slot if the device's capacity allows it, across all processes; 0 or -1. */
int sim_memory_charge(struct sim_device_view *device, int slot, uint64_t bytes);
void sim_memory_uncharge(struct sim_device_view *device, int slot, uint64_t bytes);
/* Bytes every process holds on the device now. */
uint64_t sim_device_used(const struct sim_device_view *device);
uint32_t sim_slot_generation(const struct sim_device_view *device, int slot);
void sim_slot_add_contexts(struct sim_device_view *device, int slot, int delta);

struct sim_process {
    pid_t pid;
    int slot;
    uint64_t memory;
};
/* Live processes that hold a context or memory on the device (reaps the dead first). */
int sim_list_processes(struct sim_device_view *device, struct sim_process *out, int max);

/* ---- execution and usage (engine.c) ----------------------------------------------------- */

/* Runs a kernel of `duration_ns` on the device's timeline: it starts when the device has
 * finished everything queued before it (by any process) or now, whichever is later. Records
 * the interval under `tag` (SIM_TAG) and returns its end; *start_ns gets its start. */
uint64_t sim_device_execute(struct sim_device_view *device, uint64_t tag, uint64_t now_ns, uint64_t duration_ns,
                            uint64_t *start_ns);

/* Busy time over a window [from_ns, to_ns], from the interval log. */
struct sim_usage {
    uint64_t device_busy_ns;                  /* any process */
    uint64_t slot_weighted_ns[SIM_MAX_PROCS]; /* per slot, scaled by occupancy weight */
    unsigned char slot_active[SIM_MAX_PROCS]; /* ran kernels after active_since_ns */
};
void sim_usage_scan(const struct sim_device_view *device, uint64_t from_ns, uint64_t to_ns, uint64_t active_since_ns,
                    struct sim_usage *usage);

/* ---- time -------------------------------------------------------------------------------- */

/* The timeline's clock: CLOCK_MONOTONIC is the same in every process of the machine. */
static inline uint64_t sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleeps (no spinning) until the timeline's clock reaches `deadline_ns`. */
void sim_sleep_until(uint64_t deadline_ns);

#endif /* VGPU_SIM_H */
