/*
 * A tiny stand-in libcuda.so.1 (stand_in_driver.h) whose pitched allocation scribbles over the
 * slice's published limits (its limits page, VGPU_REGION + ".limits") while it runs, and chooses a 4 KiB pitch, wider than the
 * interposer expects. Built as a shared library (soname libcuda.so.1) by the tests, to prove that
 * when the interposer grows a charge to the pitch the driver chose, limits it cannot read then
 * refuse the extra bytes (fail closed) instead of counting as "no cap".
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "stand_in_driver.h"
#include "vgpu/region.h"

/* Scribbles over the limits: the active copy's check stops matching its fields, so to a reader
 * the page is corrupt. (The page is the publisher's; this process of the same account can
 * still open it for writing, as a hostile kernel could where no broker owns the page.) */
static void before_pitched_allocation(void)
{
    const char *region = getenv("VGPU_REGION");
    char path[4096];
    if (!region || snprintf(path, sizeof path, "%s.limits", region) >= (int)sizeof path)
        return;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return;
    struct vgpu_limits_page *page = mmap(NULL, sizeof *page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (page == MAP_FAILED)
        return;
    uint64_t active = __atomic_load_n(&page->active_limits, __ATOMIC_ACQUIRE) & 1;
    __atomic_fetch_xor(&page->limits[active].check, 1, __ATOMIC_SEQ_CST);
    munmap(page, sizeof *page);
}
