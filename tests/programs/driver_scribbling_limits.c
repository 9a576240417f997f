/*
 * A tiny stand-in libcuda.so.1 (stand_in_driver.h) whose pitched allocation scribbles over the
 * slice's published limits (VGPU_REGION) while it runs, and chooses a 4 KiB pitch, wider than the
 * interposer expects. Built as a shared library (soname libcuda.so.1) by the tests, to prove that
 * when the interposer grows a charge to the pitch the driver chose, limits it cannot read then
 * refuse the extra bytes (fail closed) instead of counting as "no cap".
 */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "stand_in_driver.h"
#include "vgpu/region.h"

/* Scribbles over the limits: the active copy's check stops matching its fields, so to a reader
 * the region is corrupt. */
static void before_pitched_allocation(void)
{
    const char *path = getenv("VGPU_REGION");
    int fd = path ? open(path, O_RDWR | O_CLOEXEC) : -1;
    if (fd < 0)
        return;
    struct vgpu_region *region = mmap(NULL, sizeof *region, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (region == MAP_FAILED)
        return;
    uint64_t active = __atomic_load_n(&region->active_limits, __ATOMIC_ACQUIRE) & 1;
    __atomic_fetch_xor(&region->limits[active].check, 1, __ATOMIC_SEQ_CST);
    munmap(region, sizeof *region);
}
