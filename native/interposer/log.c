/*
 * Logging. libvgpu.so lives inside other people's programs: it never writes to stdout (tools
 * parse it) and writes to stderr only the out-of-memory line, the fail-closed reason, the lines
 * of a call waiting for room (waiting.c), and whatever VGPU_LOG_LEVEL asks for. Lines go out
 * with one write(2) each, so hooks never take stdio's stream locks (a hook may run inside a
 * signal-unsafe spot of the program, or while another thread holds stderr's lock).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

void vgpu_write_stderr(const char *text, size_t length)
{
    while (length > 0) {
        ssize_t written = write(STDERR_FILENO, text, length);
        if (written < 0) {
            if (errno == EINTR)
                continue;
            return; /* nowhere left to complain */
        }
        text += written;
        length -= (size_t)written;
    }
}

void vgpu_log_line(enum vgpu_log_level level, const char *format, ...)
{
    (void)level; /* VGPU_LOG checked it */
    char line[1024];
    int prefix = snprintf(line, sizeof line, "jupyter-vgpu[%d]: ", (int)getpid());
    va_list args;
    va_start(args, format);
    int body = vsnprintf(line + prefix, sizeof line - (size_t)prefix - 1, format, args);
    va_end(args);
    size_t length = (size_t)prefix + (body < 0 ? 0 : (size_t)body);
    if (length > sizeof line - 2)
        length = sizeof line - 2; /* truncated: keep the newline */
    line[length++] = '\n';
    vgpu_write_stderr(line, length);
}

void vgpu_report_line(const char *format, ...)
{
    static const char prefix[] = "jupyter-vgpu: ";
    char line[1024];
    memcpy(line, prefix, sizeof prefix - 1);
    va_list args;
    va_start(args, format);
    int body = vsnprintf(line + sizeof prefix - 1, sizeof line - sizeof prefix, format, args);
    va_end(args);
    size_t length = sizeof prefix - 1 + (body < 0 ? 0 : (size_t)body);
    if (length > sizeof line - 2)
        length = sizeof line - 2; /* truncated: keep the newline */
    line[length++] = '\n';
    vgpu_write_stderr(line, length);
}

/* "1.5 GiB": one decimal, binary units, as nvidia-smi users read sizes. */
static void format_size(char *out, size_t size, uint64_t bytes)
{
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (bytes < 1024) {
        snprintf(out, size, "%llu bytes", (unsigned long long)bytes);
        return;
    }
    size_t unit = 0;
    double value = (double)bytes;
    while (value >= 1024.0 && unit + 1 < sizeof units / sizeof units[0]) {
        value /= 1024.0;
        unit++;
    }
    snprintf(out, size, "%.1f %s", value, units[unit]);
}

/* A cap that would have fitted the request, in the form `jupyter vgpu resize` takes: whole
 * GiB above 1 GiB, else whole MiB. */
static void format_suggested_cap(char *out, size_t size, uint64_t needed)
{
    const uint64_t mib = 1ULL << 20, gib = 1ULL << 30;
    if (needed > gib)
        snprintf(out, size, "%lluGiB", (unsigned long long)((needed + gib - 1) / gib));
    else
        snprintf(out, size, "%lluMiB", (unsigned long long)((needed + mib - 1) / mib));
}

void vgpu_report_oom(const char *call, uint64_t request, uint64_t usage, uint64_t limit)
{
    char asked[32], used[32], cap[32], suggested[32], line[512];
    format_size(asked, sizeof asked, request);
    format_size(used, sizeof used, usage);
    format_size(cap, sizeof cap, limit);
    uint64_t needed = usage + request < usage ? UINT64_MAX : usage + request;
    format_suggested_cap(suggested, sizeof suggested, needed);
    /* The resize that helps depends on who holds the slice: a server's Jupyter kernel is resized
     * live from its notebook or the CLI; a kernel started without a server (nbconvert,
     * papermill) and a `jupyter vgpu run` slice are fixed for the run. */
    const char *kernel = vgpu_env()->kernel_id;
    char advice[192];
    if (kernel[0] && vgpu_env()->has_server)
        snprintf(
            advice, sizeof advice,
            "Resize it with `%%vgpu resize --memory %s` in the notebook or `jupyter vgpu resize %.8s --memory %s`.",
            suggested, kernel, suggested);
    else if (kernel[0])
        /* papermill has no --VGPUProvisioner option: its run takes the size from the kernelspec. */
        snprintf(advice, sizeof advice,
                 "This kernel has no vGPU server to resize it: run it again in a larger slice (nbconvert: "
                 "`--VGPUProvisioner.memory=%s`; papermill: `-k` a kernelspec of that size).",
                 suggested);
    else
        snprintf(advice, sizeof advice, "Run it in a larger slice, e.g. `jupyter vgpu run --memory %s -- ...`.",
                 suggested);
    int length = snprintf(line, sizeof line,
                          "jupyter-vgpu: out of GPU memory in this slice: %s asked for %s, the slice uses "
                          "%s of its %s cap. %s\n",
                          call, asked, used, cap, advice);
    if (length > 0)
        vgpu_write_stderr(line, (size_t)length < sizeof line ? (size_t)length : sizeof line - 1);
}
