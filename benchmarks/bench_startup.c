/*
 * What a process pays to start and end under libvgpu.so: a DataLoader worker or a subprocess of
 * a notebook pays it every time it starts.
 *
 *   bench_startup calls COUNT
 *       the timed program: with COUNT 0 it makes no driver call at all (a tool that merely
 *       inherits LD_PRELOAD); otherwise it sets up a context and makes COUNT driver calls
 *       (allocations and frees, memory queries, launches), then exits.
 *   bench_startup spawn ROUNDS PRELOAD... -- PROGRAM ARGS...
 *       each round runs PROGRAM bare, then once under each PRELOAD (LD_PRELOAD=PRELOAD for that
 *       child only: this process runs bare), and prints one line per round: the nanoseconds
 *       from spawn to exit of each run, bare first. Alternating within a round keeps drift in
 *       the machine's load from favouring one side.
 *
 * Works on the simulated GPU and on a real one (the kernel is a real, empty PTX kernel).
 */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tests/programs/probe_common.h"

extern char **environ;

/* Set-up (5 calls) and tear-down (3 calls) count towards COUNT; the rest are rounds of an
 * allocation, a free, a memory query and a launch. */
static int calls(long count)
{
    if (count <= 0)
        return 0;
    CUmodule module;
    CUfunction noop;
    require_primary_context(0);
    CHECK(cuModuleLoadData(&module, NOOP_PTX));
    CHECK(cuModuleGetFunction(&noop, module, "noop"));
    for (long done = 8; done + 4 <= count; done += 4) {
        CUdeviceptr pointer;
        size_t free_bytes, total;
        CHECK(cuMemAlloc_v2(&pointer, 1 << 20));
        CHECK(cuMemGetInfo_v2(&free_bytes, &total));
        CHECK(cuLaunchKernel(noop, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CHECK(cuMemFree_v2(pointer));
    }
    CHECK(cuCtxSynchronize());
    CHECK(cuModuleUnload(module));
    CHECK(cuDevicePrimaryCtxRelease_v2(0));
    return 0;
}

/* The environment of a child: this one's, with LD_PRELOAD set to `preload` or removed. */
static char **child_environment(const char *preload)
{
    size_t count = 0;
    while (environ[count])
        count++;
    char **env = calloc(count + 2, sizeof *env);
    size_t used = 0;
    for (size_t i = 0; i < count; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0)
            env[used++] = environ[i];
    if (preload) {
        size_t length = strlen(preload) + sizeof "LD_PRELOAD=";
        env[used] = malloc(length);
        snprintf(env[used++], length, "LD_PRELOAD=%s", preload);
    }
    env[used] = NULL;
    return env;
}

static long long run_once(char **argv, char **env)
{
    pid_t child;
    long long start = now_ns();
    if (posix_spawn(&child, argv[0], NULL, NULL, argv, env) != 0) {
        perror("posix_spawn");
        exit(1);
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "%s failed (status %#x)\n", argv[0], status);
        exit(1);
    }
    return now_ns() - start;
}

static int spawn(int argc, char **argv)
{
    int rounds = argc > 2 ? atoi(argv[2]) : 0, separator = 3;
    while (separator < argc && strcmp(argv[separator], "--") != 0)
        separator++;
    if (rounds < 1 || separator + 1 >= argc) {
        fprintf(stderr, "usage: bench_startup spawn ROUNDS PRELOAD... -- PROGRAM ARGS...\n");
        return 2;
    }
    int variants = separator - 3 + 1;
    char ***envs = calloc((size_t)variants, sizeof *envs);
    envs[0] = child_environment(NULL);
    for (int v = 1; v < variants; v++)
        envs[v] = child_environment(argv[2 + v]);
    char **program = argv + separator + 1;
    for (int round = 0; round < rounds; round++) {
        for (int v = 0; v < variants; v++)
            printf("%s%lld", v ? " " : "", run_once(program, envs[v]));
        printf("\n");
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "calls") == 0)
        return calls(atol(argv[2]));
    if (argc >= 2 && strcmp(argv[1], "spawn") == 0)
        return spawn(argc, argv);
    fprintf(stderr, "usage: bench_startup calls COUNT | spawn ROUNDS PRELOAD... -- PROGRAM ARGS...\n");
    return 2;
}
