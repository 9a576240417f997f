/*
 * Process state: the one struct of everything libvgpu.so changes at run time (each member
 * belongs to the file it is named after), the environment (read here and nowhere else), and
 * the clock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "internal.h"

struct vgpu_state vgpu_state = {
    .env = {.once = PTHREAD_ONCE_INIT},
    .resolve = {.names_once = PTHREAD_ONCE_INIT, .reverse_once = PTHREAD_ONCE_INIT},
    .region =
        {
            .init_once = PTHREAD_ONCE_INIT,
            .messages_once = PTHREAD_ONCE_INIT,
            .slot_index = -1,
            .suspended_flag = &vgpu_never_suspended,
        },
    .waiting = {.fork_handler_once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER},
    /* Each trampoline's tail until its entry point is resolved (gate.c). */
    .gate = {.entry =
                 {
#define VGPU_GATE(index, symbol) [VGPU_GATE_##symbol] = vgpu_gate_tail_##symbol,
#include VGPU_GATES_DEF
                 }},
    .driver_memory = {.fork_handler_once = PTHREAD_ONCE_INIT, .nvml_lock = PTHREAD_MUTEX_INITIALIZER},
    .monitor = {.handlers_once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER},
    .charge = {.graph_lock = PTHREAD_MUTEX_INITIALIZER, .pool_lock = PTHREAD_MUTEX_INITIALIZER},
    .pacing =
        {
            .once = PTHREAD_ONCE_INIT,
            .lock = PTHREAD_MUTEX_INITIALIZER,
            .wake = PTHREAD_COND_INITIALIZER,
        },
};

uint64_t vgpu_now_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

/* NULL or unknown: off, so that a typo never makes a program's stderr noisy. */
static enum vgpu_log_level parse_log_level(const char *value)
{
    static const char *const names[] = {"off", "error", "warn", "info", "debug"};
    if (!value)
        return VGPU_LOG_OFF;
    for (size_t level = 0; level < sizeof names / sizeof names[0]; level++)
        if (strcasecmp(value, names[level]) == 0)
            return (enum vgpu_log_level)level;
    return VGPU_LOG_OFF;
}

/* Copies an environment value, cut to fit: what does not fit names no file we could open. */
static void copy_value(char *out, size_t size, const char *value)
{
    size_t length = value ? strnlen(value, size - 1) : 0;
    memcpy(out, value ? value : "", length);
    out[length] = '\0';
}

static void read_environment(void)
{
    struct vgpu_env *env = &vgpu_state.env;
    env->log_level = parse_log_level(getenv("VGPU_LOG_LEVEL"));
    copy_value(env->region_path, sizeof env->region_path, getenv("VGPU_REGION"));
    const char *limits = getenv("VGPU_LIMITS");
    if (limits && *limits)
        copy_value(env->limits_path, sizeof env->limits_path, limits);
    else if (env->region_path[0] && snprintf(env->limits_path, sizeof env->limits_path, "%s.limits",
                                             env->region_path) >= (int)sizeof env->limits_path)
        env->limits_path[0] = '\0'; /* too long to name a file: attaching says so */
    copy_value(env->kernel_id, sizeof env->kernel_id, getenv("JUPYTER_VGPU_KERNEL_ID"));
    const char *server = getenv("JUPYTER_VGPU_SERVER_URL");
    env->has_server = server != NULL && server[0] != '\0';
    atomic_store_explicit(&env->ready, 1, memory_order_release);
}

const struct vgpu_env *vgpu_env_read(void)
{
    pthread_once(&vgpu_state.env.once, read_environment);
    return &vgpu_state.env;
}
