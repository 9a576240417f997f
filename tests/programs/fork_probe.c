/*
 * A process of a slice that forks: the parent allocates PARENT_BYTES, forks, and the child
 * (a process of its own in the slice) sets up its own context, frees the parent's pointer
 * (which it does not own: the driver decides, the child's usage must not go negative), and
 * allocates CHILD_BYTES. Each prints "parent PID RC" / "child PID RC FREE_RC" and "ready", then
 * waits for a line on stdin; the parent forwards its line to the child and reaps it.
 *
 *   fork_probe PARENT_BYTES CHILD_BYTES
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe_common.h"

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    size_t parent_bytes = strtoull(argv[1], NULL, 10), child_bytes = strtoull(argv[2], NULL, 10);
    CUdeviceptr parent_pointer = 0;
    CUcontext context;
    CUresult result = use_primary_context(0, &context);
    if (result == CUDA_SUCCESS)
        result = cuMemAlloc_v2(&parent_pointer, parent_bytes);
    printf("parent %d %d\n", (int)getpid(), result);
    fflush(stdout);

    int to_child[2];
    if (pipe(to_child) != 0)
        return 1;
    pid_t child = fork();
    if (child < 0)
        return 1;
    if (child == 0) {
        close(to_child[1]);
        CUresult freed = cuMemFree_v2(parent_pointer);
        CUdeviceptr pointer = 0;
        CUresult child_result = use_primary_context(0, &context);
        if (child_result == CUDA_SUCCESS)
            child_result = cuMemAlloc_v2(&pointer, child_bytes);
        printf("child %d %d %d\nready\n", (int)getpid(), child_result, freed);
        fflush(stdout);
        char byte;
        if (read(to_child[0], &byte, 1) < 0)
            return 1;
        return 0;
    }
    close(to_child[0]);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        line[0] = '\n';
    if (write(to_child[1], "x", 1) < 0)
        return 1;
    int status;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
