/*
 * The SM-share limiter: paces kernel launches so that the slice's measured SM utilisation
 * follows its share.
 *
 * How it works, and why this shape:
 *  - Launches draw from a token bucket in the region (`tokens`); launch.c prices a launch in
 *    warps. Each thread keeps a small cache of tokens, so admitting a launch is a thread-local
 *    subtraction; an empty cache takes a batch from the shared pool with one atomic; an empty
 *    pool parks the thread on a futex (`refill_epoch`) until the next refill (no spinning).
 *  - Fairness between the processes of a slice: while some of them wait for tokens, a refill
 *    is split evenly between the waiting processes (their slots' `granted`) instead of going
 *    to the pool, where whichever process happened to be on a CPU first would drain it every
 *    time and starve the others. A grant not drawn by the next refill goes back to the pool.
 *  - One process of the slice holds the controller lease (`controller_pid` + heartbeat) and
 *    runs a thread that refills the pool every tick. Every control period it reads the real
 *    NVML's per-process SM utilisation, learns what a token costs in device time (a ratio of
 *    decayed sums: utilisation-seconds over tokens drawn) and sets the refill rate to
 *    share / cost. That is feed-forward from a measured quantity, so no gain depends on the
 *    device's SM count or the kernels' shapes; a small integral term removes what the
 *    estimate misses (queueing, rounding).
 *  - hard: the rate always applies, over any window from a tick's length up, so the pool
 *    banks nothing: a refill the slice leaves undrawn is kept only up to a thread's batch, an
 *    idle slice's pool holds one token (its next launch takes a batch on credit), and a late
 *    tick makes up for the time missed only where the slice was held back throughout it, and
 *    only up to a point of a 100 ms window (the controller's thread waiting for a CPU must not
 *    cost the slice its share; a payment is spent after the time it was due). Tokens saved up
 *    would be spent above the share in whichever window follows (a notebook's next cell after
 *    a pause). Only windows in which
 *    the slice was held back at every tick wind the integral up, so neither an idle pause nor
 *    the window in which a burst ends reads as a rate set too low. burst: the pool stays open
 *    while no process outside the slice uses the device, and closes to the share within one
 *    control period after one starts.
 *  - Admitting a launch costs a thread-local subtraction while the thread holds tokens; only a
 *    thread whose cache is empty reads the limits (so a resize reaches every thread within
 *    about a millisecond of launches). sm_share 100 turns the limiter off: a launch then
 *    costs one limits read and a thread-local count.
 *  - The slot's `launches` counter is folded in from thread-local counts, so threads
 *    launching at once never share a written cache line; `throttled_ns` grows once per wait.
 */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define MS 1000000ULL
#define TICK_NS (5 * MS)                /* refill and heartbeat */
#define LATE_TICK_NS (6 * MS)           /* a refill later than this is a late tick */
#define LATE_PAID_UTIL_NS (1 * MS)      /* a late tick pays for this much device time it missed, at most */
#define CONTROL_PERIOD_NS (25 * MS)     /* measure utilisation, set the rate */
#define REPORT_PERIOD_NS (250 * MS)     /* limiter off or slice idle: measure only to report */
#define IDLE_AFTER_NS (1000 * MS)       /* no tokens drawn this long: the slice is idle */
#define LEARN_PERIOD_NS (10 * MS)       /* the first measurement of a slice that must be limited */
#define LEASE_SUSPECT_NS (50 * MS)      /* heartbeat this old: check whether the holder lives */
#define LEASE_STALE_NS (200 * MS)       /* heartbeat this old: take the lease over */
#define THREAD_BATCH_NS (1 * MS)        /* a thread caches about this much of the refill rate */
#define WAIT_SLICE_NS (5 * MS)          /* longest park before re-checking limits and lease */
#define LAUNCH_FLUSH_EVERY 256          /* thread-local launch counts fold into the slot this often */
#define OTHERS_BUSY_PERMILLE 20         /* burst: the device is busy above this outside the slice */
#define OTHERS_BUSY_HOLD_NS (100 * MS)  /* burst: stay at the share this long after others idle */
#define ESTIMATE_DECAY 0.8              /* per control period: about 125 ms of memory */
#define INTEGRAL_GAIN 0.2               /* per control period, on the utilisation error */
#define NO_SAMPLE_PATIENCE_US 500000ULL /* wait this long for NVML to sample fresh launches */
#define NVML_RESOLUTION 0.01            /* smUtil is a whole percent */

/* An open pool: far above anything a period draws, far below overflow. Levels above the
 * floor mean "open" even after threads drew from it. */
#define POOL_OPEN_LEVEL (INT64_C(1) << 62)
#define POOL_OPEN_FLOOR (INT64_C(1) << 61)

/* Per-thread launch state: only its own thread touches it, so the hot path shares no cache
 * line with another thread. initial-exec: a %fs-relative access, no __tls_get_addr call. */
struct thread_cache {
    uint64_t tokens;             /* drawn from the pool, not yet spent */
    uint64_t launches_unflushed; /* launches not yet added to the slot's counter */
    uint64_t flush_at;           /* 0 until the thread's first launch registered its exit flush */
};
static __thread struct thread_cache thread_cache __attribute__((tls_model("initial-exec")));

#define L (vgpu_state.pacing)

/* ---- small helpers ------------------------------------------------------------------- */

static unsigned long long realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

/* Parks until a refill after the one that published `seen_epoch`, WAIT_SLICE_NS at most. */
static void refill_wait(struct vgpu_region *region, uint32_t seen_epoch)
{
    struct timespec timeout = {0, (long)WAIT_SLICE_NS};
    /* Not FUTEX_PRIVATE: waiters and the refilling controller may be different processes. */
    syscall(SYS_futex, &region->refill_epoch, FUTEX_WAIT, seen_epoch, &timeout, NULL, 0);
}

static void refill_announce(struct vgpu_region *region)
{
    __atomic_fetch_add(&region->refill_epoch, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &region->refill_epoch, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static int process_exists(pid_t pid)
{
    return kill(pid, 0) == 0 || errno != ESRCH;
}

/* The active share, peeked at without the validated read: a share read from a copy being
 * replaced is the old or the new one, either a share that was published. */
static inline uint32_t active_share(const struct vgpu_limits_page *page)
{
    uint64_t active = __atomic_load_n(&page->active_limits, __ATOMIC_ACQUIRE) & 1;
    return __atomic_load_n(&page->limits[active].sm_share, __ATOMIC_RELAXED);
}

/* ---- per-process setup, fork, exit --------------------------------------------------- */

static void fold_launches(struct thread_cache *cache)
{
    if (cache->launches_unflushed == 0)
        return;
    struct vgpu_proc_slot *slot = vgpu_self_slot();
    if (slot)
        __atomic_fetch_add(&slot->launches, cache->launches_unflushed, __ATOMIC_RELAXED);
    cache->launches_unflushed = 0;
}

static void thread_exit_flush(void *cache)
{
    fold_launches(cache);
}

/* `wake` is waited on until CLOCK_MONOTONIC deadlines: a condition variable on that clock, since
 * pthread_cond_clockwait came in glibc 2.30, after the oldest the library runs on (glibc_floor.h). */
static void wake_init(void)
{
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&L.wake, &monotonic);
    pthread_condattr_destroy(&monotonic);
}

static void after_fork_child(void)
{
    /* The child is a new process of the slice: it counts from zero, holds no lease and has no
     * controller thread (threads do not survive fork). */
    L.pid = getpid();
    atomic_store(&L.controller_running, 0);
    pthread_mutex_init(&L.lock, NULL);
    wake_init();
    L.stopping = 0;
    L.in_nvml = 0;
    atomic_store(&L.launched, 0);
    memset(&thread_cache, 0, sizeof thread_cache);
}

static void limiter_init(void)
{
    L.pid = getpid();
    L.region = vgpu_region();
    L.page = vgpu_limits_page();
    wake_init();
    pthread_key_create(&L.thread_exit_key, thread_exit_flush);
    pthread_atfork(NULL, NULL, after_fork_child);
}

static void release_lease(struct vgpu_region *region)
{
    int32_t self = L.pid;
    __atomic_compare_exchange_n(&region->controller_pid, &self, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

__attribute__((destructor)) static void limiter_exit(void)
{
    fold_launches(&thread_cache);
    pthread_mutex_lock(&L.lock);
    L.stopping = 1;
    pthread_cond_broadcast(&L.wake);
    /* Let the controller leave NVML before libraries unload (it enters no more: `stopping`).
     * Only then: waiting for the thread to end would make every short process wait for a
     * controller that has barely started. */
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_nsec += 100 * 1000 * 1000;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    while (L.in_nvml && pthread_cond_timedwait(&L.wake, &L.lock, &deadline) == 0) {
    }
    pthread_mutex_unlock(&L.lock);
    /* Hand the lease back so another process of the slice takes over at once. */
    struct vgpu_region *region = L.pid ? vgpu_region() : NULL;
    if (region)
        release_lease(region);
}

/* ---- the controller ------------------------------------------------------------------ */

/* The controller calls NVML only between these two, and never once the process is exiting. */
static int nvml_enter(void)
{
    pthread_mutex_lock(&L.lock);
    int allowed = !L.stopping;
    L.in_nvml = allowed;
    pthread_mutex_unlock(&L.lock);
    return allowed;
}

static void nvml_leave(void)
{
    pthread_mutex_lock(&L.lock);
    L.in_nvml = 0;
    pthread_cond_broadcast(&L.wake);
    pthread_mutex_unlock(&L.lock);
}

static void nvml_open(struct vgpu_controller *c, const struct vgpu_limits_page *page)
{
    if (c->nvml_state != 0)
        return;
    c->nvml_state = -1;
    vgpu_pfn_nvmlInit_v2 init = (vgpu_pfn_nvmlInit_v2)vgpu_real_symbol(VGPU_LIB_NVML, "nvmlInit_v2");
    vgpu_pfn_nvmlDeviceGetHandleByUUID by_uuid =
        (vgpu_pfn_nvmlDeviceGetHandleByUUID)vgpu_real_symbol(VGPU_LIB_NVML, "nvmlDeviceGetHandleByUUID");
    vgpu_pfn_nvmlDeviceGetHandleByIndex_v2 by_index =
        (vgpu_pfn_nvmlDeviceGetHandleByIndex_v2)vgpu_real_symbol(VGPU_LIB_NVML, "nvmlDeviceGetHandleByIndex_v2");
    c->process_utilization =
        (vgpu_pfn_nvmlDeviceGetProcessUtilization)vgpu_real_symbol(VGPU_LIB_NVML, "nvmlDeviceGetProcessUtilization");
    const char *why = NULL;
    nvmlReturn_t result = NVML_SUCCESS;
    char uuid[VGPU_DEVICE_UUID_SIZE];
    memcpy(uuid, page->device_uuid, sizeof uuid);
    uuid[sizeof uuid - 1] = '\0';
    if (!init || !by_index || !c->process_utilization)
        why = "NVML (libnvidia-ml.so.1) or its per-process utilisation is missing";
    else if ((result = init()) != NVML_SUCCESS)
        why = "nvmlInit_v2 failed";
    else if (uuid[0] && by_uuid && (result = by_uuid(uuid, &c->device)) == NVML_SUCCESS)
        c->nvml_state = 1;
    else if ((result = by_index((unsigned int)page->device_index, &c->device)) == NVML_SUCCESS)
        c->nvml_state = 1;
    else
        why = "NVML does not know the slice's device";
    if (c->nvml_state < 0)
        VGPU_LOG(VGPU_LOG_WARN, "SM share not enforced: %s (NVML result %d)", why, result);
}

struct utilisation {
    uint32_t slice_permille;  /* the slice's processes together */
    uint32_t others_permille; /* every other process on the device */
    double window_s;
};

/* Average smUtil (percent) of one pid over the samples (NVML may return several per pid). */
static double pid_utilisation(const nvmlProcessUtilizationSample_t *samples, unsigned int count, unsigned int pid)
{
    double sum = 0;
    unsigned int n = 0;
    for (unsigned int i = 0; i < count; i++) {
        if (samples[i].pid == pid) {
            sum += samples[i].smUtil;
            n++;
        }
    }
    return n ? sum / n : 0;
}

static uint32_t permille(double percent)
{
    double value = percent * 10.0 + 0.5;
    return value >= 1000.0 ? 1000u : (uint32_t)value;
}

/* Reads utilisation since the last window. Returns 1 with a fresh window, 0 when NVML has no
 * sample of recent launches yet (try again next period), -1 when NVML fails. Writes the
 * slice's and each slot's sm_util_permille and device_busy_permille. */
static int measure(struct vgpu_controller *c, struct vgpu_region *region, struct utilisation *out)
{
    unsigned long long now_us = realtime_us();
    unsigned int count = c->sample_capacity;
    nvmlReturn_t result = c->process_utilization(c->device, c->samples, &count, c->last_seen_us);
    if (result == NVML_ERROR_INSUFFICIENT_SIZE) {
        unsigned int capacity = count + count / 2 + 16;
        nvmlProcessUtilizationSample_t *grown = realloc(c->samples, capacity * sizeof *grown);
        if (!grown)
            return -1;
        c->samples = grown;
        c->sample_capacity = capacity;
        count = capacity;
        result = c->process_utilization(c->device, c->samples, &count, c->last_seen_us);
    }
    c->last_result = result;
    if (result == NVML_ERROR_NOT_FOUND)
        count = 0;
    else if (result != NVML_SUCCESS)
        return -1;
    /* Tokens were drawn but NVML has nothing yet: the launches have not run, or a real
     * driver has not taken its next sample. Keep the window open rather than read it as idle. */
    if (count == 0 && c->spent > 0 && now_us - c->last_seen_us < NO_SAMPLE_PATIENCE_US)
        return 0;

    unsigned long long end_us = now_us;
    double total_percent = 0;
    for (unsigned int i = 0; i < count; i++) {
        if (c->samples[i].timeStamp > end_us)
            end_us = c->samples[i].timeStamp;
        int first = 1;
        for (unsigned int j = 0; j < i && first; j++)
            first = c->samples[j].pid != c->samples[i].pid;
        if (first)
            total_percent += pid_utilisation(c->samples, count, c->samples[i].pid);
    }

    double slice_percent = 0;
    int slice_sampled = 0;
    uint32_t slots = vgpu_slots_in_use(region);
    for (uint32_t i = 0; i < slots; i++) {
        struct vgpu_proc_slot *slot = &region->procs[i];
        /* NVML knows the process by its nvml_pid once driver_memory.c found it (a PID namespace). */
        int32_t owner = __atomic_load_n(&slot->pid, __ATOMIC_ACQUIRE);
        int32_t nvml_pid = __atomic_load_n(&slot->nvml_pid, __ATOMIC_ACQUIRE);
        int32_t pid = owner > 0 && nvml_pid > 0 ? nvml_pid : owner;
        double percent = 0;
        for (unsigned int k = 0; pid > 0 && k < count; k++)
            slice_sampled |= c->samples[k].pid == (unsigned int)pid;
        if (pid > 0)
            percent = pid_utilisation(c->samples, count, (unsigned int)pid);
        slice_percent += percent;
        __atomic_store_n(&slot->sm_util_permille, permille(percent), __ATOMIC_RELAXED);
    }
    double others_percent = total_percent > slice_percent ? total_percent - slice_percent : 0;
    /* Launching, yet invisible to NVML while others are visible: NVML's pids are not ours
     * (a PID namespace), and the slice's utilisation cannot be told apart. */
    c->unattributed_periods = count > 0 && c->spent > 0 && !slice_sampled ? c->unattributed_periods + 1 : 0;

    unsigned long long window_us = end_us > c->last_seen_us ? end_us - c->last_seen_us : 0;
    if (window_us > 1000000ULL)
        window_us = 1000000ULL; /* NVML looks back one second at most */
    c->last_seen_us = end_us;

    out->slice_permille = permille(slice_percent);
    out->others_permille = permille(others_percent);
    out->window_s = (double)window_us / 1e6;
    __atomic_store_n(&region->sm_util_permille, out->slice_permille, __ATOMIC_RELAXED);
    __atomic_store_n(&region->device_busy_permille, out->others_permille, __ATOMIC_RELAXED);
    return 1;
}

/* Utilisation-seconds per token, or 0 while unknown. */
static double token_cost(const struct vgpu_controller *c)
{
    return c->token_count > 0 && c->util_seconds > 0 ? c->util_seconds / c->token_count : 0;
}

static void learn(struct vgpu_controller *c, const struct utilisation *u)
{
    if (!c->window_clean)
        return;
    double util_seconds = u->slice_permille / 1000.0 * u->window_s;
    if (c->spent == 0 && util_seconds == 0)
        return; /* nothing happened: keep the estimate as it is */
    /* Launches too small for NVML's whole percents: count them at the most they can have used,
     * so that the cost is known (and generous) rather than unknown forever. */
    if (util_seconds == 0)
        util_seconds = NVML_RESOLUTION / 2 * u->window_s;
    c->util_seconds = c->util_seconds * ESTIMATE_DECAY + util_seconds;
    c->token_count = c->token_count * ESTIMATE_DECAY + (double)c->spent;
}

/* Integral action on what the feed-forward misses. It winds up only when launches were held
 * back at every tick of the window (a slice that launches less than its share, or stops
 * launching within the window, must not bank a correction), and always winds down when the
 * slice is over its share. */
static void integrate(struct vgpu_controller *c, const struct utilisation *u, uint32_t share)
{
    double error = share / 100.0 - u->slice_permille / 1000.0;
    if (error > 0 && (!c->drained || c->slack))
        return;
    double bound = share / 100.0 * 0.5;
    c->integral += INTEGRAL_GAIN * error;
    if (c->integral > bound)
        c->integral = bound;
    if (c->integral < -bound)
        c->integral = -bound;
}

static void decide(struct vgpu_controller *c, const struct vgpu_limits_snapshot *limits, uint64_t now_ns)
{
    double cost = token_cost(c);
    enum vgpu_pool_mode mode;
    if (limits->sm_share >= VGPU_SM_SHARE_MAX)
        mode = VGPU_MODE_OFF;
    else if (limits->policy == VGPU_POLICY_BURST && now_ns >= c->others_busy_until_ns)
        mode = VGPU_MODE_OPEN; /* nobody else wants the device */
    else if (cost <= 0)
        mode = VGPU_MODE_OPEN; /* open a moment to learn what a token costs */
    else
        mode = VGPU_MODE_LIMITED;
    c->learning = mode == VGPU_MODE_OPEN && cost <= 0 &&
                  !(limits->policy == VGPU_POLICY_BURST && now_ns >= c->others_busy_until_ns);
    if (mode == VGPU_MODE_LIMITED) {
        double share = limits->sm_share / 100.0;
        double target = share + c->integral;
        if (target < share * 0.25)
            target = share * 0.25;
        c->rate = target / cost;
        c->limited_periods++;
    } else {
        c->limited_periods = 0;
    }
    if (mode == VGPU_MODE_OFF)
        c->window_clean = 0; /* launches stop drawing: tokens no longer say what ran */
    if (mode != c->mode)
        VGPU_LOG(VGPU_LOG_DEBUG, "pacing: share %u%% %s, mode %d -> %d, %.0f tokens/s", limits->sm_share,
                 limits->policy == VGPU_POLICY_BURST ? "burst" : "hard", c->mode, mode, c->rate);
    c->mode = mode;
}

static void control(struct vgpu_controller *c, struct vgpu_region *region, const struct vgpu_limits_snapshot *limits,
                    uint64_t now_ns)
{
    if (limits->sm_share != c->share || limits->policy != c->policy) {
        if (c->share)
            c->integral *= (double)limits->sm_share / c->share; /* keep the relative correction */
        c->limited_periods = 0; /* the windows around a resize say nothing about the new rate */
    }
    c->share = limits->sm_share;
    c->policy = limits->policy;

    /* NVML is opened by the first measurement, not when the controller starts: a process that
     * ends before then (with the limiter off, the first is a quarter second away) never pays
     * for it, nor waits for it at exit. */
    struct utilisation u;
    if (!nvml_enter())
        return; /* exiting */
    nvml_open(c, vgpu_limits_page());
    int measured = c->nvml_state > 0 ? measure(c, region, &u) : -1;
    nvml_leave();
    if (!c->warned && c->nvml_state > 0 && (measured < 0 || c->unattributed_periods >= 40)) {
        c->warned = 1;
        if (measured < 0)
            VGPU_LOG(VGPU_LOG_WARN, "SM share not enforced: nvmlDeviceGetProcessUtilization fails (NVML result %d)",
                     c->last_result);
        else
            VGPU_LOG(VGPU_LOG_WARN, "SM share not enforced: NVML lists GPU processes but none of this slice's "
                                    "(are the slice's processes in another PID namespace?)");
    }
    if (measured > 0) {
        if (u.others_permille >= OTHERS_BUSY_PERMILLE)
            c->others_busy_until_ns = now_ns + OTHERS_BUSY_HOLD_NS;
        learn(c, &u);
        VGPU_LOG(VGPU_LOG_DEBUG,
                 "pacing: mode %d, slice %u, others %u per mille over %.3f s, %llu tokens drawn, cost %.3g, rate "
                 "%.0f/s, integral %.3f%s",
                 c->mode, u.slice_permille, u.others_permille, u.window_s, (unsigned long long)c->spent, token_cost(c),
                 c->rate, c->integral,
                 c->drained && !c->slack ? ", held back"
                 : c->drained            ? ", held back at times"
                                         : "");
        /* Only a window governed throughout by the limited rate says how far off it is; a late
         * tick's payment moves launches from the window it paid for into the next, so neither
         * window says anything about the rate (read over the share, they would wind the
         * integral down on every busy machine). */
        int shifted = c->shifted || c->shifted_last_window;
        c->shifted_last_window = c->shifted;
        c->shifted = 0;
        if (c->mode == VGPU_MODE_LIMITED && c->limited_periods >= 2 && !shifted)
            integrate(c, &u, limits->sm_share);
        c->spent = 0;
        c->drained = 0;
        c->slack = 0;
        c->window_clean = 1;
    }
    decide(c, limits, now_ns);
}

/* Takes back what the last refill granted and nobody drew (negative where a process overdrew
 * its grant), and lists the processes with threads waiting for tokens. */
static int64_t take_back_grants(struct vgpu_region *region, struct vgpu_proc_slot **waiting, uint32_t *waiting_count)
{
    int64_t returned = 0;
    uint32_t count = 0, slots = vgpu_slots_in_use(region);
    for (uint32_t i = 0; i < slots; i++) {
        struct vgpu_proc_slot *slot = &region->procs[i];
        if (__atomic_load_n(&slot->granted, __ATOMIC_RELAXED) != 0)
            returned += __atomic_exchange_n(&slot->granted, 0, __ATOMIC_ACQ_REL);
        if (__atomic_load_n(&slot->pid, __ATOMIC_ACQUIRE) > 0 && __atomic_load_n(&slot->wanting, __ATOMIC_ACQUIRE) > 0)
            waiting[count++] = slot;
    }
    *waiting_count = count;
    return returned;
}

static void refill(struct vgpu_controller *c, struct vgpu_region *region, uint64_t now_ns)
{
    uint64_t elapsed = now_ns > c->last_tick_ns ? now_ns - c->last_tick_ns : 0;
    c->last_tick_ns = now_ns;
    int limited = c->mode == VGPU_MODE_LIMITED;
    struct vgpu_proc_slot *waiting[VGPU_REGION_MAX_PROCS];
    uint32_t waiting_count;
    int64_t returned = take_back_grants(region, waiting, &waiting_count);
    int64_t level = __atomic_load_n(&region->tokens, __ATOMIC_ACQUIRE);
    /* The slice took all it was given, the pool and every grant: its launches want more. */
    int dry = limited && level <= 0 && returned <= 0;
    /* A tick this late: the controller's thread waited for a CPU (a busy machine). */
    uint64_t missed = elapsed > LATE_TICK_NS ? elapsed - LATE_TICK_NS : 0;
    if (missed && dry && c->dry_last_tick) {
        /* The slice was held back at both ends of the time missed, so it wanted those tokens:
         * dropping them would cost it its share whenever the machine is busy, however well its
         * own threads are served. They are paid now, so they are spent after the time they
         * were due: a shift of launches into the next measurement window, which a hard share
         * allows only up to LATE_PAID_UTIL_NS of device time (a point of a 100 ms window). A
         * tick later than that is the machine's loss, not a burst; the windows around the
         * payment do not move the integral (control()). */
        double target = c->rate * token_cost(c); /* the device fraction the rate aims at */
        double most = target > 0 ? (double)LATE_PAID_UTIL_NS / target : 0;
        uint64_t paid = (double)missed < most ? missed : (uint64_t)most;
        if (paid > CONTROL_PERIOD_NS)
            paid = CONTROL_PERIOD_NS;
        missed -= paid;
        if (paid)
            c->shifted = 1;
    }
    elapsed -= missed;
    double owed = 0, reserve = 0;
    if (limited) {
        owed = c->rate * (double)elapsed / 1e9 + c->carry;
        if (owed > (double)(POOL_OPEN_FLOOR / 4))
            owed = (double)(POOL_OPEN_FLOOR / 4);
        /* What the slice may keep of a refill it left undrawn: a thread's batch. A hard share
         * holds over any window W only if the slice can never hold more than rate * W plus a
         * little; tokens saved across ticks (or across an idle pause) are a burst above the share
         * that lands in whichever window follows. */
        reserve = c->rate * (double)THREAD_BATCH_NS / 1e9;
    }
    int64_t whole = (int64_t)owed, keep = (int64_t)reserve, each = 0;
    int64_t available, next, drawn_since;
    int idle;
    do {
        /* Drawn since the last refill: from the pool, and from the grants it made. */
        drawn_since = (c->pool_after_refill - level) + (c->granted - returned);
        /* A new controller's first refill cannot tell; a launch started it. */
        idle = waiting_count == 0 && c->pool_known && drawn_since <= 0;
        if (!limited) {
            available = next = POOL_OPEN_LEVEL;
            each = 0;
        } else {
            int64_t base = level >= POOL_OPEN_FLOOR ? 0 : level; /* closing an open pool */
            int64_t left = base + returned;                      /* undrawn (negative: overdrawn, a debt to repay) */
            /* Processes waiting side by side: what one left of its grant (stopped, or not on a
             * CPU in time) goes to the others through this split, up to a tick's worth. */
            int64_t most = waiting_count > 1 ? whole : keep;
            if (idle)
                /* Nobody drew or waits: no refill is banked for the next launch, which finds one
                 * token, enough to take its batch at once as a debt the next refill repays. */
                available = left + whole < 1 ? left + whole : 1;
            else
                available = (left < most ? left : most) + whole;
            each = waiting_count > 0 && available > 0 ? available / waiting_count : 0;
            next = available - each * waiting_count;
        }
    } while (!__atomic_compare_exchange_n(&region->tokens, &level, next, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    for (uint32_t i = 0; i < waiting_count && each > 0; i++)
        __atomic_fetch_add(&waiting[i]->granted, each, __ATOMIC_ACQ_REL);

    uint64_t drawn = c->pool_known && drawn_since > 0 ? (uint64_t)drawn_since : 0;
    c->spent += drawn;
    if (drawn)
        c->last_draw_ns = now_ns;
    if (elapsed > 0)
        c->draw_rate = 0.7 * c->draw_rate + 0.3 * (double)drawn * 1e9 / (double)elapsed;
    /* Whether the slice was held back over this tick: it took all it was given, the pool and
     * every grant, and had at the last tick too (a slice that starts launching within a tick
     * was idle for part of it). A tick it was not (it stopped or started launching, launches
     * less than the rate, or its waiting threads did not get a CPU in time to draw their
     * grants) makes the window say nothing about whether the rate is too low (integrate()). */
    int held = dry && !missed;
    if (limited && elapsed > 0) {
        if (held && c->held_last_tick)
            c->drained = 1;
        else
            c->slack = 1;
    }
    if (elapsed > 0) {
        c->held_last_tick = held;
        c->dry_last_tick = dry;
    }
    c->pool_known = 1;
    c->pool_after_refill = next;
    c->granted = each * (int64_t)waiting_count;
    c->carry = limited && !idle ? owed - (double)whole : 0;
    if (waiting_count > 0 || (level <= 0 && next > 0))
        refill_announce(region);

    /* Threads size their batches from this: a millisecond of the refill rate, or of what the
     * slice draws while the pool is open, whatever its kernels cost. */
    uint64_t per_second = (uint64_t)(limited ? c->rate : c->draw_rate);
    __atomic_store_n(&region->tokens_per_second, per_second, __ATOMIC_RELAXED);
}

/* A decision that changed the mode takes effect now, not at the next tick: the pool opens, or
 * closes to what the tick that begins now may draw (the refill just before, made in the old
 * mode, granted nothing for it). Grants stay, for the next refill to take back. */
static void repool(struct vgpu_controller *c, struct vgpu_region *region)
{
    int limited = c->mode == VGPU_MODE_LIMITED;
    double tick = c->rate * (double)TICK_NS / 1e9;
    int64_t next = !limited                               ? POOL_OPEN_LEVEL
                   : tick < (double)(POOL_OPEN_FLOOR / 4) ? (int64_t)tick
                                                          : POOL_OPEN_FLOOR / 4;
    int64_t level = __atomic_exchange_n(&region->tokens, next, __ATOMIC_ACQ_REL);
    int64_t drawn = c->pool_after_refill - level;
    if (c->pool_known && drawn > 0)
        c->spent += (uint64_t)drawn;
    c->pool_known = 1;
    c->pool_after_refill = next;
    c->carry = 0;
    c->held_last_tick = 0;
    c->dry_last_tick = 0;
    refill_announce(region);
    uint64_t per_second = (uint64_t)(limited ? c->rate : c->draw_rate);
    __atomic_store_n(&region->tokens_per_second, per_second, __ATOMIC_RELAXED);
}

/* A new lease holder starts from the rate the last one published while limited, so a takeover
 * does not open the pool while it relearns the cost. */
static void controller_reset(struct vgpu_controller *c, struct vgpu_region *region, uint64_t now_ns)
{
    struct vgpu_controller kept = *c;
    memset(c, 0, sizeof *c);
    c->nvml_state = kept.nvml_state;
    c->device = kept.device;
    c->process_utilization = kept.process_utilization;
    c->warned = kept.warned;
    c->samples = kept.samples;
    c->sample_capacity = kept.sample_capacity;
    c->last_seen_us = realtime_us();
    /* The first refill, at once, pays for the tick that begins then: the slice is launching (a
     * launch started this controller), and its pool holds at most a token. */
    c->last_tick_ns = now_ns - TICK_NS;
    c->last_control_ns = now_ns;
    c->last_draw_ns = now_ns;
    c->window_clean = 1;
    c->mode = VGPU_MODE_OPEN;

    struct vgpu_limits_snapshot limits;
    if (vgpu_read_limits(&limits) != 0)
        return;
    c->share = limits.sm_share;
    c->policy = limits.policy;
    uint64_t per_second = __atomic_load_n(&region->tokens_per_second, __ATOMIC_RELAXED);
    int64_t level = __atomic_load_n(&region->tokens, __ATOMIC_RELAXED);
    if (per_second > 0 && level < POOL_OPEN_FLOOR && limits.sm_share < VGPU_SM_SHARE_MAX) {
        double cost = (limits.sm_share / 100.0) / (double)per_second;
        c->token_count = (double)per_second * (double)CONTROL_PERIOD_NS / 1e9;
        c->util_seconds = cost * c->token_count;
    }
    decide(c, &limits, now_ns);
}

/* Sleeps until `deadline_ns` (CLOCK_MONOTONIC); returns nonzero when the process is exiting. */
static int controller_sleep(uint64_t deadline_ns)
{
    struct timespec deadline = {(time_t)(deadline_ns / 1000000000ULL), (long)(deadline_ns % 1000000000ULL)};
    pthread_mutex_lock(&L.lock);
    while (!L.stopping && pthread_cond_timedwait(&L.wake, &L.lock, &deadline) == 0) {
    }
    int stopping = L.stopping;
    pthread_mutex_unlock(&L.lock);
    return stopping;
}

static void *controller_main(void *arg)
{
    struct vgpu_region *region = arg;
    struct vgpu_controller *c = &L.controller;
    pthread_setname_np(pthread_self(), "vgpu-pacer");
    uint64_t now = vgpu_now_ns();
    controller_reset(c, region, now);
    uint64_t next_tick = now;
    VGPU_LOG(VGPU_LOG_INFO, "pacing: controller of the slice runs in this process");
    for (;;) {
        /* Another process took the lease (this one stalled past the stale limit): stand down. */
        if (__atomic_load_n(&region->controller_pid, __ATOMIC_ACQUIRE) != L.pid)
            break;
        now = vgpu_now_ns();
        __atomic_store_n(&region->controller_heartbeat_ns, now, __ATOMIC_RELEASE);
        /* The refill comes first: what it finds (tokens drawn, the pool drained or not) belongs
         * to the tick that ends now, and so to the window a measurement now closes. */
        refill(c, region, now);
        /* Limits are read every tick, so a resize is acted on within one. */
        struct vgpu_limits_snapshot limits;
        if (vgpu_read_limits(&limits) == 0) {
            int resized = limits.sm_share != c->share || limits.policy != c->policy;
            /* An idle slice (a notebook between cells) costs NVML a query every REPORT_PERIOD_NS;
             * its first draw brings the fast period back at the next tick. */
            int idle = c->mode == VGPU_MODE_OFF || now - c->last_draw_ns > IDLE_AFTER_NS;
            /* Open only to learn the cost: measure as soon as launches have drawn, so the
             * pool is open for a couple of ticks, not a whole period. */
            uint64_t period = idle                          ? REPORT_PERIOD_NS
                              : c->learning && c->spent > 0 ? LEARN_PERIOD_NS
                                                            : CONTROL_PERIOD_NS;
            if (resized || now - c->last_control_ns + TICK_NS / 2 >= period) {
                enum vgpu_pool_mode before = c->mode;
                control(c, region, &limits, now);
                c->last_control_ns = now;
                if (c->mode != before)
                    repool(c, region);
            }
        }
        next_tick += TICK_NS;
        if (next_tick <= now)
            next_tick = now + TICK_NS;
        if (controller_sleep(next_tick))
            break;
    }
    pthread_mutex_lock(&L.lock);
    atomic_store(&L.controller_running, 0);
    pthread_cond_broadcast(&L.wake);
    pthread_mutex_unlock(&L.lock);
    return NULL;
}

static void start_controller(struct vgpu_region *region)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&L.controller_running, &expected, 1))
        return;
    pthread_mutex_lock(&L.lock);
    int stopping = L.stopping;
    pthread_mutex_unlock(&L.lock);
    int result = -1;
    if (!stopping) {
        pthread_attr_t attr;
        pthread_t thread;
        sigset_t all, old;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        /* The program's signals stay with the program's threads. */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        result = pthread_create(&thread, &attr, controller_main, region);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        if (result != 0)
            VGPU_LOG(VGPU_LOG_WARN, "pacing: cannot start the controller thread (error %d)", result);
    }
    if (result != 0) {
        atomic_store(&L.controller_running, 0);
        release_lease(region);
    }
}

/* Makes sure some live process of the slice runs the controller: this one when nobody holds
 * the lease, or when the holder's heartbeat is stale or the holder is gone. */
static void keep_controller_alive(struct vgpu_region *region, uint64_t now_ns)
{
    int32_t holder = __atomic_load_n(&region->controller_pid, __ATOMIC_ACQUIRE);
    if (holder == L.pid) {
        if (!atomic_load_explicit(&L.controller_running, memory_order_acquire))
            start_controller(region);
        return;
    }
    uint64_t age = 0;
    if (holder != 0) {
        uint64_t beat = __atomic_load_n(&region->controller_heartbeat_ns, __ATOMIC_ACQUIRE);
        age = now_ns > beat ? now_ns - beat : 0;
        if (age < LEASE_SUSPECT_NS)
            return;
        if (age < LEASE_STALE_NS && process_exists(holder))
            return;
    }
    if (__atomic_compare_exchange_n(&region->controller_pid, &holder, L.pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        if (holder != 0)
            VGPU_LOG(VGPU_LOG_INFO, "pacing: took the controller lease from process %d (heartbeat %.0f ms old)", holder,
                     (double)age / 1e6);
        __atomic_store_n(&region->controller_heartbeat_ns, now_ns, __ATOMIC_RELEASE);
        start_controller(region);
    }
}

/* ---- the launch path ----------------------------------------------------------------- */

/* A thread's first launch, and every LAUNCH_FLUSH_EVERY-th: fold the launch count into the
 * slot, and while the limiter is on see that the slice has a controller. Returns whether this
 * was the thread's first launch. */
static __attribute__((noinline)) int flush_launches(struct thread_cache *cache)
{
    pthread_once(&L.once, limiter_init);
    int first = cache->flush_at == 0;
    if (first)
        pthread_setspecific(L.thread_exit_key, cache);
    cache->flush_at = LAUNCH_FLUSH_EVERY;
    fold_launches(cache);
    atomic_store_explicit(&L.launched, 1, memory_order_release);
    /* With the limiter on, the slice needs its controller now; off, the controller only
     * measures for reports, and vgpu_keep_slice_paced() starts it from the monitor. */
    struct vgpu_region *region = L.region;
    if (region && active_share(L.page) < VGPU_SM_SHARE_MAX)
        keep_controller_alive(region, vgpu_now_ns());
    return first;
}

void vgpu_keep_slice_paced(void)
{
    if (!atomic_load_explicit(&L.launched, memory_order_acquire))
        return;
    struct vgpu_region *region = L.region; /* set before `launched` */
    if (region)
        keep_controller_alive(region, vgpu_now_ns());
}

/* Takes `take` tokens from `budget` (the process's grant or the slice's pool) if it holds any.
 * May overdraw: the debt is repaid by later refills, so the rate still holds. */
static int draw_from(int64_t *budget, uint64_t take)
{
    if (__atomic_load_n(budget, __ATOMIC_ACQUIRE) <= 0)
        return 0;
    __atomic_fetch_sub(budget, (int64_t)take, __ATOMIC_ACQ_REL);
    return 1;
}

/* The thread's cache cannot pay for the launch: take a batch from this process's grant or the
 * slice's pool, waiting for the controller's next refill while both are empty. */
static __attribute__((noinline)) void draw_tokens(struct thread_cache *cache, uint64_t cost)
{
    struct vgpu_region *region = vgpu_region();
    if (!region)
        return;
    pthread_once(&L.once, limiter_init);
    if (cost > VGPU_MAX_LAUNCH_COST)
        cost = VGPU_MAX_LAUNCH_COST;
    uint64_t now = vgpu_now_ns(), wait_started = 0;
    keep_controller_alive(region, now);
    struct vgpu_proc_slot *slot = vgpu_self_slot();
    if (slot)
        __atomic_fetch_add(&slot->wanting, 1, __ATOMIC_ACQ_REL);
    uint64_t need = cost - cache->tokens;
    for (;;) {
        /* Read before looking at the budgets, so a refill in between ends the wait at once. */
        uint32_t epoch = __atomic_load_n(&region->refill_epoch, __ATOMIC_ACQUIRE);
        uint64_t batch =
            __atomic_load_n(&region->tokens_per_second, __ATOMIC_RELAXED) / (1000000000ULL / THREAD_BATCH_NS);
        uint64_t take = need > batch ? need : batch;
        if (take > VGPU_MAX_LAUNCH_COST)
            take = VGPU_MAX_LAUNCH_COST;
        if ((slot && draw_from(&slot->granted, take)) || draw_from(&region->tokens, take)) {
            cache->tokens = cache->tokens + take - cost;
            break;
        }
        /* A resize to 100 % lifts the limiter for launches already waiting. */
        struct vgpu_limits_snapshot limits;
        if (vgpu_read_limits(&limits) != 0 || limits.sm_share >= VGPU_SM_SHARE_MAX)
            break;
        if (wait_started) {
            now = vgpu_now_ns();
            keep_controller_alive(region, now);
        } else {
            wait_started = now;
        }
        refill_wait(region, epoch);
    }
    if (slot)
        __atomic_fetch_sub(&slot->wanting, 1, __ATOMIC_ACQ_REL);
    if (wait_started && slot)
        __atomic_fetch_add(&slot->throttled_ns, vgpu_now_ns() - wait_started, __ATOMIC_RELAXED);
}

int vgpu_launch_admit(uint64_t cost)
{
    struct thread_cache *cache = &thread_cache;
    int first = 0;
    if (__builtin_expect(++cache->launches_unflushed >= cache->flush_at, 0))
        first = flush_launches(cache);
    /* Tokens in the cache mean the limiter was on when they were drawn, a millisecond ago at
     * most: spend them without asking for the limits. */
    if (__builtin_expect(cache->tokens >= cost, 1)) {
        cache->tokens -= cost;
        return first;
    }
    /* An empty cache: the limits say whether to draw. With the limiter off every launch comes
     * here, so it peeks at the active share alone (every thread has passed limiter_init in
     * flush_launches, which set `region` and `page`); only a share below 100 is worth the validated read. */
    struct vgpu_region *region = L.region;
    if (!region || active_share(L.page) >= VGPU_SM_SHARE_MAX)
        return first; /* no slice, or the limiter is off */
    struct vgpu_limits_snapshot limits;
    if (vgpu_read_limits(&limits) == 0 && limits.sm_share < VGPU_SM_SHARE_MAX)
        draw_tokens(cache, cost);
    return first;
}
