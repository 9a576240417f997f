/*
 * The monitor thread of a process that uses the GPU: every half second it reaps the slots of
 * processes of the slice that are gone, follows what the driver's memory pools reserve and
 * answers a release request (pool_memory.c), refreshes this process's driver memory, and sees that
 * a slice this process launches in has a controller. Started on the process's first GPU call
 * (a context, an allocation, a launch), so a process that merely inherited LD_PRELOAD stays
 * single-threaded; started again in a forked child that uses the GPU.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define MON (vgpu_state.monitor)

#define MONITOR_PERIOD_NS 500000000L

static void *monitor_main(void *unused)
{
    (void)unused;
    /* Named by itself (one prctl): naming another thread goes through /proc, three system
     * calls on the path of the hook that started it. */
    pthread_setname_np(pthread_self(), "vgpu-monitor");
    for (;;) {
        struct timespec period = {0, MONITOR_PERIOD_NS};
        while (nanosleep(&period, &period) != 0 && errno == EINTR)
            ;
        pthread_mutex_lock(&MON.lock);
        if (MON.stopping) {
            pthread_mutex_unlock(&MON.lock);
            return NULL;
        }
        vgpu_reap_dead_slots();
        /* Not while suspended: a CUDA call then waits for the resume (the flag is raised after
         * a release request is answered, and cleared once the process runs again). */
        const struct vgpu_limits_page *page = vgpu_limits_page();
        if (!page || !__atomic_load_n(&page->suspended, __ATOMIC_ACQUIRE)) {
            vgpu_pool_memory_settle(); /* what a synchronisation gave back */
            vgpu_answer_release_request();
        }
        vgpu_refresh_driver_reserved();
        vgpu_keep_slice_paced();
        pthread_mutex_unlock(&MON.lock);
    }
}

/* At exit, before the driver's and NVML's own exit handlers (registered earlier, so run
 * later), wait for the monitor to finish what it is doing and keep it from starting again. */
static void stop_monitor(void)
{
    pthread_mutex_lock(&MON.lock);
    MON.stopping = 1;
    pthread_mutex_unlock(&MON.lock);
}

/* Keep the monitor out of NVML while the process forks, so the child never inherits a lock
 * that a thread which no longer exists would hold. */
static void before_fork(void)
{
    pthread_mutex_lock(&MON.lock);
}

static void after_fork_in_parent(void)
{
    pthread_mutex_unlock(&MON.lock);
}

/* The child has no monitor thread (threads do not survive fork): it starts its own on its
 * first GPU call. */
static void after_fork_in_child(void)
{
    pthread_mutex_init(&MON.lock, NULL);
    MON.stopping = 0;
    atomic_store_explicit(&MON.started, 0, memory_order_relaxed);
}

/* Once per process tree: atexit and atfork handlers are inherited across fork. */
static void register_handlers(void)
{
    atexit(stop_monitor);
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
}

static void start_monitor(void)
{
    if (atomic_exchange_explicit(&MON.started, 1, memory_order_acq_rel))
        return;
    pthread_once(&MON.handlers_once, register_handlers);
    /* The thread blocks every signal so the program's handlers keep running on its threads. */
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attributes, 256 * 1024);
    pthread_t thread;
    int failed = pthread_create(&thread, &attributes, monitor_main, NULL);
    pthread_attr_destroy(&attributes);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (failed) /* not tried again: `started` stays set */
        VGPU_LOG(VGPU_LOG_WARN,
                 "cannot start the monitor thread (%s): dead processes are reaped by "
                 "others only",
                 strerror(failed));
}

struct vgpu_proc_slot *vgpu_gpu_slot_start(void)
{
    struct vgpu_proc_slot *slot = vgpu_self_slot();
    if (slot && !atomic_load_explicit(&MON.started, memory_order_relaxed))
        start_monitor();
    return slot;
}
