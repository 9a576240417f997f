/*
 * Process identity, shared by the interposer and the simulated driver: both keep per-process
 * slots in shared memory and must tell a live process from a dead one whose pid was reused.
 * Header-only (static inline) so each library carries its own copy without exporting it.
 */
#ifndef VGPU_PROC_H
#define VGPU_PROC_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* Start time of a process in clock ticks since boot (field 22 of <proc_root>/<pid>/stat), or 0
 * when the process does not exist; its state letter (field 3) in *state when state is not NULL.
 * Parsed after the last ')' since the command name may hold any byte. */
static inline uint64_t vgpu_proc_stat_at(const char *proc_root, pid_t pid, char *state)
{
    char path[4096 + 32], buf[1024];
    snprintf(path, sizeof path, "%s/%d/stat", proc_root, (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2])
        return 0;
    if (state)
        *state = p[2];
    /* After ") " come fields 3.. ; the start time is field 22, i.e. the 20th after ')'. */
    p++;
    for (int field = 3; field < 22 && p; field++)
        p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

static inline uint64_t vgpu_proc_start_time_at(const char *proc_root, pid_t pid)
{
    return vgpu_proc_stat_at(proc_root, pid, NULL);
}

/* Whether the process that owned a slot (pid + start time) still runs, as a /proc tells it (not
 * kill(): the simulated driver keeps pids of a /proc that need not be this process's PID
 * namespace). A zombie (or a dying process) does not: a process has closed its files, the GPU
 * driver's among them, before its parent reaps it, and a real driver frees its memory and drops
 * it from NVML's process list then, whenever (and whether) its parent reaps it. */
static inline int vgpu_proc_alive_at(const char *proc_root, pid_t pid, uint64_t start_time)
{
    if (pid <= 0)
        return 0;
    char state = 0;
    uint64_t now_start = vgpu_proc_stat_at(proc_root, pid, &state);
    return now_start != 0 && now_start == start_time && state != 'Z' && state != 'X';
}

/* The same, in this process's own /proc. */
static inline uint64_t vgpu_proc_start_time(pid_t pid)
{
    return vgpu_proc_start_time_at("/proc", pid);
}

static inline int vgpu_proc_alive(pid_t pid, uint64_t start_time)
{
    return vgpu_proc_alive_at("/proc", pid, start_time);
}

#endif /* VGPU_PROC_H */
