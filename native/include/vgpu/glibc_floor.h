/*
 * The native libraries run on glibc 2.28 (RHEL 8, Rocky 8, Debian 10) and newer: the wheel is
 * manylinux_2_28 or older (auditwheel names the oldest tag they fit). native/build.py includes
 * this header first in every C file (-include), so no source names a symbol version itself.
 *
 * Why: a library binds each glibc function it calls to the version that the build machine's glibc
 * marks as the default. glibc 2.34 moved libpthread and libdl into libc and gave their functions
 * new versions (pthread_create@GLIBC_2.34, dlopen@GLIBC_2.34), and 2.32/2.33 did the same to
 * pthread_sigmask and fstat, so a library built on a newer system asks for a glibc that RHEL 8
 * does not have. Every glibc keeps the old versions, so binding to them here (.symver) runs on
 * 2.28 and on today's glibc alike. On glibc < 2.34 those old versions live in libpthread.so.0 and
 * libdl.so.2, which build.py therefore links by name (they are empty stubs on newer glibc).
 *
 * The versions are each architecture's first: GLIBC_2.2.5 on x86-64, GLIBC_2.17 on aarch64 (its
 * first glibc), except where a function came later on x86-64 (pthread_condattr_setclock, 2.3.3;
 * pthread_setname_np, 2.12). Functions whose default version is 2.28 or older need no line here.
 * Functions newer than 2.28 (e.g. pthread_cond_clockwait, 2.30) must not be used:
 * tests/packaging/test_glibc_floor.py finds them.
 */
#ifndef VGPU_GLIBC_FLOOR_H
#define VGPU_GLIBC_FLOOR_H
#ifndef __ASSEMBLER__ /* build.py includes it in the .S files too, which call nothing of glibc */

#if defined(__x86_64__)
#define VGPU_GLIBC_FIRST "GLIBC_2.2.5"
#define VGPU_GLIBC_2_3_3 "GLIBC_2.3.3"
#define VGPU_GLIBC_2_12 "GLIBC_2.12"
#elif defined(__aarch64__)
#define VGPU_GLIBC_FIRST "GLIBC_2.17"
#define VGPU_GLIBC_2_3_3 "GLIBC_2.17"
#define VGPU_GLIBC_2_12 "GLIBC_2.17"
#else
#error "jupyter-vgpu's native libraries are built for x86-64 and aarch64 only"
#endif

/* Binds every reference to `name` in this file to name@version. */
#define VGPU_GLIBC_SYMBOL(name, version) __asm__(".symver " #name "," #name "@" version)

/* libdl's functions (libc's since 2.34). */
VGPU_GLIBC_SYMBOL(dladdr, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(dlclose, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(dlerror, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(dlopen, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(dlvsym, VGPU_GLIBC_FIRST);

/* libpthread's functions (libc's since 2.34). */
VGPU_GLIBC_SYMBOL(pthread_attr_setstacksize, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_create, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_detach, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_getspecific, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_join, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_key_create, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_key_delete, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_kill, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_mutex_timedlock, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_mutex_trylock, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_mutexattr_destroy, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_mutexattr_init, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_mutexattr_settype, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_once, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_rwlock_init, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_rwlock_rdlock, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_rwlock_timedwrlock, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_rwlock_unlock, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_rwlock_wrlock, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_setspecific, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_sigmask, VGPU_GLIBC_FIRST);
VGPU_GLIBC_SYMBOL(pthread_condattr_setclock, VGPU_GLIBC_2_3_3);
VGPU_GLIBC_SYMBOL(pthread_setname_np, VGPU_GLIBC_2_12);

/* fstat became a function of its own in 2.33; before, <sys/stat.h> turned it into a call of
 * __fxstat(_STAT_VER, ...), which every glibc still exports. */
#include <sys/stat.h>
extern int __fxstat(int stat_version, int fd, struct stat *buffer);
VGPU_GLIBC_SYMBOL(__fxstat, VGPU_GLIBC_FIRST);
#if defined(__x86_64__)
#define VGPU_STAT_VERSION 1 /* _STAT_VER_LINUX */
#else
#define VGPU_STAT_VERSION 0 /* _STAT_VER_KERNEL: aarch64's struct stat is the kernel's */
#endif
static inline int vgpu_fstat(int fd, struct stat *buffer)
{
    return __fxstat(VGPU_STAT_VERSION, fd, buffer);
}
#define fstat vgpu_fstat

#endif
#endif
