/*
 * A CUDA call of a suspended slice (region.h's `suspended`). The call asks the publisher for the
 * slice's room (a resume request in this process's slot), then waits here, reading the page every
 * VGPU_WAIT_POLL_NS, until the publisher clears the flag; only then does it call the driver.
 * Waiting here rather than in the driver holds for a process the driver never checkpointed too:
 * a kernel that has no context yet, whose room the publisher lends meanwhile, creates none (and
 * so holds no device memory) until its room is back.
 *
 * What the user sees: ipykernel forwards the kernel process's stderr into the running cell's
 * output, so the wait says so there. One line when the process starts waiting, with its place in
 * line and the estimate where the publisher gave them (region.h's queue_position, queue_eta_s);
 * another when what it says changes, at most one a second; one when the room is back. They are
 * the process's lines, not each waiting thread's: written under one lock, compared with the last.
 *
 * Leaving the line: the user's Kernel > Interrupt makes the publisher bump `leave_line`. Every
 * call waiting then returns CUDA_ERROR_OUT_OF_MEMORY without calling the driver (frameworks raise
 * their out-of-memory error; the kernel's pending SIGINT then raises KeyboardInterrupt), and for
 * VGPU_LEFT_LINE_NS after, calls fail the same way at once, asking nothing: a framework retries
 * an allocation refused inside the same operation (PyTorch empties its cache and tries again),
 * and that retry must not join the line again. After that a call asks again.
 *
 * A process that gave its slot back (it is exiting) does not wait: its teardown must end.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define W (vgpu_state.waiting)

/* A forked child (a DataLoader worker) starts with no thread waiting, whatever its parent's
 * threads were doing, and with a lock nobody holds. */
static void after_fork_in_child(void)
{
    pthread_mutex_init(&W.lock, NULL);
    W.waiting = 0;
    W.announced = 0;
}

static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

/* The page's place in line, read with region.h's queue_sequence protocol; 0 when not known. */
static void read_queue(const struct vgpu_limits_page *page, uint32_t *position, uint32_t *eta)
{
    for (int attempt = 0; attempt < 1000; attempt++) {
        uint32_t before = __atomic_load_n(&page->queue_sequence, __ATOMIC_ACQUIRE);
        if (before & 1)
            continue;
        *position = __atomic_load_n(&page->queue_position, __ATOMIC_RELAXED);
        *eta = __atomic_load_n(&page->queue_eta_s, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&page->queue_sequence, __ATOMIC_RELAXED) == before)
            return;
    }
    *position = 0; /* a publisher that died mid-write: say no place rather than a torn one */
}

/* "GPU 0", or "the GPU" for a slice that names no device index. */
static void format_device(char *out, size_t size, const struct vgpu_limits_page *page)
{
    if (page->device_index >= 0)
        snprintf(out, size, "GPU %d", (int)page->device_index);
    else
        snprintf(out, size, "the GPU");
}

static const char *ordinal_suffix(uint32_t number)
{
    if (number % 100 >= 11 && number % 100 <= 13)
        return "th";
    switch (number % 10) {
    case 1: return "st";
    case 2: return "nd";
    case 3: return "rd";
    default: return "th";
    }
}

/* "about 40 s", "about 2 min": as precise as an estimate is. */
static void format_eta(char *out, size_t size, uint32_t seconds)
{
    if (seconds < 10)
        snprintf(out, size, "a few seconds");
    else if (seconds < 55)
        snprintf(out, size, "about %u s", (seconds + 5) / 10 * 10);
    else if (seconds < 99 * 60 + 30)
        snprintf(out, size, "about %u min", seconds < 90 ? 1 : (seconds + 30) / 60);
    else
        snprintf(out, size, "about %u h", (seconds + 1800) / 3600);
}

/* What the process says while it waits, for the page as it is now (no prefix, no newline). */
static void format_waiting(char *out, size_t size, const struct vgpu_limits_page *page)
{
    char device[32], place[96] = "";
    format_device(device, sizeof device, page);
    uint32_t position, eta;
    read_queue(page, &position, &eta);
    if (__atomic_load_n(&page->wait_reason, __ATOMIC_RELAXED) == VGPU_WAIT_TAKEN_BACK) {
        /* An estimate only where the publisher knows one: no made-up time. */
        char when[40] = "";
        if (position != 0 && eta != VGPU_QUEUE_NO_ESTIMATE) {
            char about[32];
            format_eta(about, sizeof about, eta);
            snprintf(when, sizeof when, ", %s", about);
        }
        snprintf(out, size,
                 "paused: room on %s was taken back for a student within their guarantee; carries on when room "
                 "frees%s",
                 device, when);
        return;
    }
    if (position != 0 && eta != VGPU_QUEUE_NO_ESTIMATE) {
        char when[32];
        format_eta(when, sizeof when, eta);
        snprintf(place, sizeof place, " (%u%s in line, %s)", position, ordinal_suffix(position), when);
    } else if (position != 0) {
        snprintf(place, sizeof place, " (%u%s in line)", position, ordinal_suffix(position));
    }
    snprintf(out, size, "waiting for room on %s%s; Kernel > Interrupt stops waiting, nothing is lost", device, place);
}

/* Under W.lock: writes the waiting line if it says something new (or nothing was said since the
 * wait began), at most one changed line every VGPU_WAIT_LINE_NS. */
static void say_waiting(const struct vgpu_limits_page *page, uint64_t now)
{
    char line[VGPU_WAIT_LINE_SIZE];
    format_waiting(line, sizeof line, page);
    if (W.announced && (strcmp(line, W.said) == 0 || now - W.said_ns < VGPU_WAIT_LINE_NS))
        return;
    vgpu_report_line("%s", line);
    memcpy(W.said, line, sizeof line);
    W.said_ns = now;
    W.announced = 1;
}

/* Under W.lock: this thread stops waiting; the room is back. */
static void end_wait(const struct vgpu_limits_page *page)
{
    W.waiting--;
    if (!W.announced)
        return;
    W.announced = 0;
    char device[32];
    format_device(device, sizeof device, page);
    vgpu_report_line("room on %s is back; carrying on", device);
}

/* Under W.lock: this thread leaves the line the publisher bumped to `line`; the first to see
 * that bump says so and starts the time calls fail at once. */
static void leave(const struct vgpu_limits_page *page, uint32_t line)
{
    W.waiting--;
    W.announced = 0;
    if (W.has_left && W.left_line == line)
        return;
    W.has_left = 1;
    W.left_line = line;
    atomic_store_explicit(&W.left_ns, vgpu_now_ns(), memory_order_relaxed);
    char device[32];
    format_device(device, sizeof device, page);
    vgpu_report_line("interrupted: left the line for %s; the kernel stays suspended, nothing is lost; its next "
                     "CUDA call asks for room again",
                     device);
}

static void nap(void)
{
    struct timespec pause = {.tv_sec = 0, .tv_nsec = (long)VGPU_WAIT_POLL_NS};
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
    }
}

int vgpu_call_while_suspended(int waits)
{
    const struct vgpu_limits_page *page = vgpu_state.region.page;
    if (vgpu_slot_released())
        return 0; /* exiting: nothing is counted or held back any more */
    uint64_t left = atomic_load_explicit(&W.left_ns, memory_order_relaxed);
    if (waits && left != 0 && vgpu_now_ns() - left < VGPU_LEFT_LINE_NS)
        return 1; /* the framework's retry of the call that just left the line */
    vgpu_request_resume();
    if (!waits)
        return 0;

    pthread_once(&W.fork_handler_once, register_fork_handler);
    uint64_t began = vgpu_now_ns();
    pthread_mutex_lock(&W.lock);
    if (W.waiting++ == 0)
        W.line_at_start = __atomic_load_n(&page->leave_line, __ATOMIC_ACQUIRE);
    uint32_t line_at_start = W.line_at_start;
    say_waiting(page, began);
    pthread_mutex_unlock(&W.lock);

    for (;;) {
        nap();
        if (__atomic_load_n(&page->suspended, __ATOMIC_ACQUIRE) == 0) {
            pthread_mutex_lock(&W.lock);
            end_wait(page);
            pthread_mutex_unlock(&W.lock);
            VGPU_LOG(VGPU_LOG_INFO, "waited %.3f s for the slice's room", (double)(vgpu_now_ns() - began) / 1e9);
            return 0;
        }
        uint32_t line = __atomic_load_n(&page->leave_line, __ATOMIC_ACQUIRE);
        if (line != line_at_start) {
            pthread_mutex_lock(&W.lock);
            leave(page, line);
            pthread_mutex_unlock(&W.lock);
            return 1;
        }
        /* One writer at a time; a thread that finds another saying it has nothing to add. */
        if (pthread_mutex_trylock(&W.lock) == 0) {
            say_waiting(page, vgpu_now_ns());
            pthread_mutex_unlock(&W.lock);
        }
    }
}
