/*
 * The virtual execution engine: what a kernel costs, the device timeline every process shares,
 * and the log of intervals NVML computes utilisation from.
 *
 * Timeline. A device runs one kernel at a time, of any process (time-slicing between contexts,
 * as a GPU without MPS). `free_at_ns` is when everything queued so far ends; a launch takes
 * [max(now, free_at), + duration) with one CAS loop, so launches from any number of processes
 * serialise without a lock and a process dying mid-launch leaves at worst an interval nobody
 * recorded.
 *
 * Interval log. One ring per device (not per process): kernels never overlap on a device, so
 * the number of records a period needs is bounded by period / block_ns whoever launched them,
 * and the ring is sized from that (shared.c). A kernel that starts exactly when the same
 * process's previous interval ends extends that record in place (a CAS on its end), so a
 * process keeping the device busy costs one record however many kernels it queues. Busy time
 * over a window is then summed from the records: exact, not sampled.
 */
#include <errno.h>

#include "sim.h"

/* Scanning back, this many consecutive complete records that end before the window mean no
 * older one can reach into it: records are appended in timeline order except for launches in
 * flight between their CAS and their append, and there are never this many of those at once. */
#define SIM_SCAN_STALE_RUN 256

static uint64_t saturating_mul(uint64_t a, uint64_t b)
{
    uint64_t product;
    return __builtin_mul_overflow(a, b, &product) || product > (UINT64_MAX >> 2) ? (UINT64_MAX >> 2) : product;
}

void sim_kernel_cost(const struct sim_device_spec *device, uint64_t blocks, uint32_t threads_per_block,
                     struct sim_kernel_cost *cost)
{
    uint32_t blocks_per_sm = SIM_MAX_THREADS_PER_SM / threads_per_block;
    if (blocks_per_sm > SIM_MAX_BLOCKS_PER_SM)
        blocks_per_sm = SIM_MAX_BLOCKS_PER_SM;
    if (blocks_per_sm < 1)
        blocks_per_sm = 1;
    uint64_t wave_blocks = (uint64_t)device->sms * blocks_per_sm;
    uint64_t waves = (blocks + wave_blocks - 1) / wave_blocks;
    uint64_t block_units = (threads_per_block + SIM_THREADS_PER_BLOCK_UNIT - 1) / SIM_THREADS_PER_BLOCK_UNIT;
    cost->duration_ns = saturating_mul(saturating_mul(waves, device->block_ns), block_units);
    cost->weight = blocks >= wave_blocks ? SIM_WEIGHT_ONE : (uint32_t)(blocks * SIM_WEIGHT_ONE / wave_blocks);
    cost->wave_blocks = wave_blocks;
}

static void record_interval(struct sim_device_view *device, uint64_t tag, uint64_t start, uint64_t end)
{
    struct sim_shared_device *shared = device->shared;
    uint64_t head = atomic_load_explicit(&shared->ring_head, memory_order_acquire);
    if (head > 0) {
        struct sim_interval *last = &device->ring[(head - 1) & device->ring_mask];
        uint64_t expected_end = start;
        if (atomic_load_explicit(&last->commit, memory_order_acquire) == head &&
            atomic_load_explicit(&last->tag, memory_order_relaxed) == tag &&
            atomic_compare_exchange_strong_explicit(&last->end_ns, &expected_end, end, memory_order_release,
                                                    memory_order_relaxed))
            return;
    }
    uint64_t index = atomic_fetch_add_explicit(&shared->ring_head, 1, memory_order_relaxed);
    struct sim_interval *record = &device->ring[index & device->ring_mask];
    atomic_store_explicit(&record->commit, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&record->start_ns, start, memory_order_relaxed);
    atomic_store_explicit(&record->end_ns, end, memory_order_relaxed);
    atomic_store_explicit(&record->tag, tag, memory_order_relaxed);
    atomic_store_explicit(&record->commit, index + 1, memory_order_release);
}

uint64_t sim_device_execute(struct sim_device_view *device, uint64_t tag, uint64_t now_ns, uint64_t duration_ns,
                            uint64_t *start_ns)
{
    _Atomic uint64_t *free_at = &device->shared->free_at_ns;
    uint64_t busy_until = atomic_load_explicit(free_at, memory_order_relaxed);
    uint64_t start, end;
    do {
        start = busy_until > now_ns ? busy_until : now_ns;
        end = start + duration_ns;
    } while (
        !atomic_compare_exchange_weak_explicit(free_at, &busy_until, end, memory_order_acq_rel, memory_order_relaxed));
    record_interval(device, tag, start, end);
    *start_ns = start;
    return end;
}

void sim_usage_scan(const struct sim_device_view *device, uint64_t from_ns, uint64_t to_ns, uint64_t active_since_ns,
                    struct sim_usage *usage)
{
    for (size_t i = 0; i < sizeof usage->slot_weighted_ns / sizeof usage->slot_weighted_ns[0]; i++) {
        usage->slot_weighted_ns[i] = 0;
        usage->slot_active[i] = 0;
    }
    usage->device_busy_ns = 0;
    uint32_t generation[SIM_MAX_PROCS];
    for (int slot = 0; slot < SIM_MAX_PROCS; slot++)
        generation[slot] = sim_slot_generation(device, slot);

    uint64_t head = atomic_load_explicit(&device->shared->ring_head, memory_order_acquire);
    uint64_t records = device->ring_mask + 1;
    uint64_t oldest = head > records ? head - records : 0;
    uint64_t horizon = from_ns < active_since_ns ? from_ns : active_since_ns;
    unsigned stale_run = 0;
    for (uint64_t index = head; index-- > oldest;) {
        struct sim_interval *record = &device->ring[index & device->ring_mask];
        uint64_t commit = atomic_load_explicit(&record->commit, memory_order_acquire);
        if (commit != index + 1)
            continue;
        uint64_t start = atomic_load_explicit(&record->start_ns, memory_order_relaxed);
        uint64_t end = atomic_load_explicit(&record->end_ns, memory_order_relaxed);
        uint64_t tag = atomic_load_explicit(&record->tag, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&record->commit, memory_order_relaxed) != commit)
            continue; /* overwritten while we read it */
        if (end <= horizon) {
            if (++stale_run >= SIM_SCAN_STALE_RUN)
                break;
            continue;
        }
        stale_run = 0;
        uint64_t lo = start > from_ns ? start : from_ns;
        uint64_t hi = end < to_ns ? end : to_ns;
        uint64_t overlap = hi > lo ? hi - lo : 0;
        usage->device_busy_ns += overlap;
        int slot = SIM_TAG_SLOT(tag);
        if (slot < SIM_MAX_PROCS && SIM_TAG_GENERATION(tag) == generation[slot]) {
            uint64_t weight = SIM_TAG_WEIGHT(tag); /* split so that long windows cannot overflow */
            usage->slot_weighted_ns[slot] +=
                overlap / SIM_WEIGHT_ONE * weight + overlap % SIM_WEIGHT_ONE * weight / SIM_WEIGHT_ONE;
            if (end > active_since_ns && start < to_ns)
                usage->slot_active[slot] = 1;
        }
    }
}

void sim_sleep_until(uint64_t deadline_ns)
{
    /* A deadline already behind us returns at once: clock_nanosleep would still switch tasks
     * and add the timer slack (about 50 us) before coming back. */
    if (deadline_ns <= sim_now_ns())
        return;
    struct timespec until = {.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                             .tv_nsec = (long)(deadline_ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {
    }
}
