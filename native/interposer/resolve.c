/*
 * Symbol resolution: how a program reaches our hooks, and how hooks reach the real driver.
 *
 * Three ways in, one entry of ours per name: a hook (hooks.def) or a gated entry point's
 * trampoline (gate_entry.S, the generated gate list); each is an "entry" below:
 *   - direct linking: the dynamic linker binds the program's cuMemAlloc_v2 to our export;
 *   - dlopen + dlsym: our `dlsym` (dlsym_entry.S) asks vgpu_dlsym_filter below;
 *   - cuGetProcAddress(_v2): we call the real one, then swap a real entry point of a hooked or
 *     gated function for our entry.
 * Real entry points are looked up lazily, by exact name, and cached per hook with acquire/release
 * atomics. A hook forwards to the next definition after libvgpu.so in the global search order
 * when there is one (another interposer loaded after us: HAMi-core's libvgpu.so, which HAMi
 * loads through /etc/ld.so.preload, after the libraries of LD_PRELOAD), else to the real
 * library's own (its handle's); a name the real library lacks stays missing either way.
 */
#include <dlfcn.h>
#include <string.h>

#include "internal.h"

#define R (vgpu_state.resolve)

typedef void *(*vgpu_dlsym_fn)(void *handle, const char *symbol);

struct vgpu_hook_info {
    const char *name;
    enum vgpu_library library;
    void *hook;
};

/* By entry id: the hooks, then the gated entry points. */
static const struct vgpu_hook_info hook_table[VGPU_ENTRY_COUNT] = {
#define VGPU_CUDA_HOOK(symbol) [VGPU_HOOK_##symbol] = {#symbol, VGPU_LIB_CUDA, (void *)symbol},
#define VGPU_NVML_HOOK(symbol) [VGPU_HOOK_##symbol] = {#symbol, VGPU_LIB_NVML, (void *)symbol},
#include "hooks.def"
#define VGPU_GATE(index, symbol) [VGPU_HOOK_COUNT + VGPU_GATE_##symbol] = {#symbol, VGPU_LIB_CUDA, vgpu_gate_##symbol},
#include VGPU_GATES_DEF
};

static const char *const library_names[VGPU_LIB_COUNT] = {
    [VGPU_LIB_CUDA] = "libcuda.so.1",
    [VGPU_LIB_NVML] = "libnvidia-ml.so.1",
};

_Static_assert(VGPU_ENTRY_COUNT * 2 < VGPU_NAME_TABLE_SIZE, "name table keeps probing short");
_Static_assert(VGPU_ENTRY_COUNT * 4 < VGPU_REVERSE_TABLE_SIZE, "reverse table keeps probing short");
_Static_assert(VGPU_ENTRY_COUNT < 65535, "entry ids + 1 fit the uint16_t tables");

/* ---- the real dlsym ------------------------------------------------------------------ */

static vgpu_dlsym_fn real_dlsym(void)
{
    void *found = atomic_load_explicit(&R.real_dlsym, memory_order_acquire);
    if (found)
        return (vgpu_dlsym_fn)found;
    /* RTLD_NEXT from here: the libc after us. GLIBC_2.34 is where dlsym moved into libc;
     * older glibc (and the compat symbol) carry the architecture's base version. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; !found && i < sizeof versions / sizeof versions[0]; i++)
        found = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (found)
        atomic_store_explicit(&R.real_dlsym, found, memory_order_release);
    return (vgpu_dlsym_fn)found;
}

/* ---- the real libraries and their entry points ---------------------------------------- */

/* The real library's handle; with `may_load`, loads it (LD_LIBRARY_PATH decides which, so the
 * simulated GPU is found the same way the program finds it). Only a found handle is cached:
 * a library not loaded now may be loaded later. */
static void *library_handle(enum vgpu_library library, int may_load)
{
    void *handle = atomic_load_explicit(&R.library_handle[library], memory_order_acquire);
    if (handle)
        return handle;
    /* One dlopen either way: a library already loaded is found without loading it again, and
     * an RTLD_NOLOAD probe first would search the library path for nothing. */
    handle = dlopen(library_names[library], may_load ? RTLD_LAZY : RTLD_LAZY | RTLD_NOLOAD);
    if (!handle)
        return NULL;
    void *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(&R.library_handle[library], &expected, handle, memory_order_acq_rel,
                                                 memory_order_acquire)) {
        dlclose(handle); /* another thread won; drop our extra reference */
        handle = expected;
    }
    return handle;
}

/* Looks `name` up in the real library once and caches the answer in `cache`; a miss is cached
 * only when the library is loaded (and thus really lacks it). `hook` is ours, never an answer.
 *
 * For a hook (`hook` set), the answer is the next definition after libvgpu.so in the global
 * scope when there is one, the library's own otherwise. A library preloaded after us that
 * wraps the same entry point (HAMi-core, through /etc/ld.so.preload) is bound by nobody: the
 * program's references bind to our export, which comes first. Forwarding to the library's own
 * entry point would bypass it, and with it its memory cap; forwarding to the next definition
 * chains the two, so the lower cap wins. Entry points we only call (`hook` NULL) stay the
 * library's own. */
static void *resolve_cached(_Atomic uintptr_t *cache, enum vgpu_library library, const char *name, const void *hook,
                            int may_load)
{
    uintptr_t cached = atomic_load_explicit(cache, memory_order_acquire);
    if (cached > VGPU_REAL_MISSING)
        return (void *)cached;
    if (cached == VGPU_REAL_MISSING)
        return NULL;
    void *handle = library_handle(library, may_load);
    vgpu_dlsym_fn lookup = real_dlsym();
    if (!handle || !lookup)
        return NULL;
    void *real = lookup(handle, name);
    if (real == hook)
        real = NULL; /* never forward a hook to itself */
    if (real && hook) {
        void *next = lookup(RTLD_NEXT, name); /* RTLD_NEXT from this file: after libvgpu.so */
        if (next && next != hook)
            real = next;
    }
    atomic_store_explicit(cache, real ? (uintptr_t)real : VGPU_REAL_MISSING, memory_order_release);
    VGPU_LOG(VGPU_LOG_DEBUG, "%s -> %s %p", name, library_names[library], real);
    return real;
}

static void *resolve_real(int id, int may_load)
{
    return resolve_cached(&R.real_entry[id], hook_table[id].library, hook_table[id].name, hook_table[id].hook,
                          may_load);
}

void *vgpu_real_lookup(enum vgpu_hook_id id)
{
    return resolve_real(id, 1);
}

void *vgpu_gate_real(enum vgpu_gate_id gate)
{
    return resolve_real(VGPU_HOOK_COUNT + (int)gate, 1);
}

/* The real library's own entry point of entry `id` (not cached, never ours), or NULL; unlike
 * resolve_real, never another interposer's. Never loads the library. */
static void *library_entry(int id)
{
    void *handle = library_handle(hook_table[id].library, 0);
    vgpu_dlsym_fn lookup = real_dlsym();
    void *entry = handle && lookup ? lookup(handle, hook_table[id].name) : NULL;
    return entry == hook_table[id].hook ? NULL : entry;
}

static const struct vgpu_called_info {
    const char *name;
    enum vgpu_library library;
} called_table[VGPU_CALLED_COUNT] = {
#define VGPU_CALLED_INFO(library, name) [VGPU_CALLED_##name] = {#name, library},
    VGPU_CALLED_ENTRY_POINTS(VGPU_CALLED_INFO)
#undef VGPU_CALLED_INFO
};

void *vgpu_real_called(enum vgpu_called_id id)
{
    return resolve_cached(&R.called_entry[id], called_table[id].library, called_table[id].name, NULL, 1);
}

void *vgpu_real_symbol(enum vgpu_library library, const char *symbol)
{
    void *handle = library_handle(library, 1);
    vgpu_dlsym_fn lookup = real_dlsym();
    return handle && lookup ? lookup(handle, symbol) : NULL;
}

/* ---- hook names ------------------------------------------------------------------------ */

static uint32_t name_hash(const char *name)
{
    uint32_t hash = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        hash = (hash ^ *p) * 16777619u;
    return hash;
}

/* Built by the first dlsym of a name that could be ours, not at load: most processes never
 * ask, and start-up is paid by every process that inherits LD_PRELOAD. */
static void build_name_table(void)
{
    for (int id = 0; id < VGPU_ENTRY_COUNT; id++) {
        uint32_t slot = name_hash(hook_table[id].name) & (VGPU_NAME_TABLE_SIZE - 1);
        while (R.name_slots[slot])
            slot = (slot + 1) & (VGPU_NAME_TABLE_SIZE - 1);
        R.name_slots[slot] = (uint16_t)(id + 1);
    }
}

/* The entry id of `name`, or -1. Every dlsym of the process comes through here, so names that
 * cannot be ours (not cu* / nvml*) leave after two byte compares. */
static int hook_by_name(const char *name)
{
    if (!((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && strncmp(name, "nvml", 4) == 0)))
        return -1;
    pthread_once(&R.names_once, build_name_table);
    uint32_t slot = name_hash(name) & (VGPU_NAME_TABLE_SIZE - 1);
    for (uint16_t entry; (entry = R.name_slots[slot]) != 0; slot = (slot + 1) & (VGPU_NAME_TABLE_SIZE - 1))
        if (strcmp(hook_table[entry - 1].name, name) == 0)
            return entry - 1;
    return -1;
}

/* ---- dlsym ------------------------------------------------------------------------------ */

struct vgpu_dlsym_decision {
    void *result;     /* what dlsym returns, when forward_to is NULL */
    void *forward_to; /* the real dlsym, to be tail-called with the caller's arguments */
};

struct vgpu_dlsym_decision vgpu_dlsym_filter(void *handle, const char *name);

struct vgpu_dlsym_decision vgpu_dlsym_filter(void *handle, const char *name)
{
    vgpu_dlsym_fn lookup = real_dlsym();
    int id = name ? hook_by_name(name) : -1;
    if (id < 0)
        return (struct vgpu_dlsym_decision){NULL, (void *)lookup};
    void *hook = hook_table[id].hook;
    if (!lookup)
        return (struct vgpu_dlsym_decision){NULL, NULL};
    /* Only what the program could see anyway: a hook is handed out only where the real
     * library's entry point would have been found, else what the real dlsym answers (NULL when
     * the driver lacks the name: never a hook that would have nothing to call), and a lookup
     * never loads the driver. For the global scope (RTLD_DEFAULT, RTLD_NEXT), RTLD_NEXT asked
     * from here sees it without our own exports. */
    int global_scope = handle == RTLD_NEXT || handle == RTLD_DEFAULT;
    void *found = lookup(global_scope ? RTLD_NEXT : handle, name);
    if (global_scope) {
        if (!found || !resolve_real(id, 0))
            return (struct vgpu_dlsym_decision){found, NULL};
        /* RTLD_NEXT is the caller's next: the real dlsym, tail-called, answers it from the
         * caller's return address. That is our hook for the program and libraries before us,
         * and the next definition for a library after us (an interposer looking for its real
         * entry point, as HAMi-core's does): our hook there would forward back into it. */
        if (handle == RTLD_NEXT)
            return (struct vgpu_dlsym_decision){NULL, (void *)lookup};
        return (struct vgpu_dlsym_decision){hook, NULL};
    }
    /* An explicit handle: the driver's, NVML's, one whose dependencies include them, or the
     * global scope (dlopen(NULL)), which finds our export first. The library's own entry point
     * is swapped for the hook; another interposer's, found through its own handle, is not. */
    if (found == hook)
        return (struct vgpu_dlsym_decision){resolve_real(id, 0) ? hook : NULL, NULL};
    if (found && found == library_entry(id))
        return (struct vgpu_dlsym_decision){hook, NULL};
    return (struct vgpu_dlsym_decision){found, NULL};
}

/* ---- cuGetProcAddress ------------------------------------------------------------------- */

static uint32_t pointer_hash(uintptr_t pointer)
{
    uint64_t mixed = (uint64_t)pointer * 0x9e3779b97f4a7c15ULL;
    return (uint32_t)(mixed >> 40);
}

static void reverse_insert(uintptr_t real, int id)
{
    if (!real)
        return;
    uint32_t slot = pointer_hash(real) & (VGPU_REVERSE_TABLE_SIZE - 1);
    /* Two hooks sharing one real function (a driver may alias _ptsz variants) forward to the
     * same place, so the first one serves both. */
    while (R.reverse_hook[slot] && R.reverse_real[slot] != real)
        slot = (slot + 1) & (VGPU_REVERSE_TABLE_SIZE - 1);
    if (!R.reverse_hook[slot]) {
        R.reverse_real[slot] = real;
        R.reverse_hook[slot] = (uint16_t)(id + 1);
    }
}

/* Both what an entry of ours forwards to and the driver's own entry point lead to our entry:
 * with an interposer after us, cuGetProcAddress answers with its wrappers for the names it wraps
 * and the driver's entry points for the rest (at most two slots per CUDA entry point: the table
 * stays under half full). Built at the first cuGetProcAddress, which resolves every entry point
 * of the driver (a few hundred lookups, once per process). */
static void build_reverse_table(void)
{
    for (int id = 0; id < VGPU_ENTRY_COUNT; id++) {
        if (hook_table[id].library != VGPU_LIB_CUDA)
            continue;
        reverse_insert((uintptr_t)resolve_real(id, 1), id);
        reverse_insert((uintptr_t)library_entry(id), id);
    }
}

/* Our entry for a real entry point the driver handed out, or the pointer itself. */
static void *hook_for_real_entry(void *entry)
{
    if (!entry)
        return entry;
    pthread_once(&R.reverse_once, build_reverse_table);
    uintptr_t real = (uintptr_t)entry;
    uint32_t slot = pointer_hash(real) & (VGPU_REVERSE_TABLE_SIZE - 1);
    for (uint16_t hook; (hook = R.reverse_hook[slot]) != 0; slot = (slot + 1) & (VGPU_REVERSE_TABLE_SIZE - 1))
        if (R.reverse_real[slot] == real)
            return hook_table[hook - 1].hook;
    return entry;
}

/* The real driver answers first (a missing entry point stays missing, with its status);
 * then a real entry point of a hooked or gated function is swapped for our entry. A request
 * for cuGetProcAddress itself thereby returns our hook too. */
VGPU_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus)
{
    VGPU_HOOK_REAL(cuGetProcAddress_v2);
    CUresult result = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (result == CUDA_SUCCESS && pfn)
        *pfn = hook_for_real_entry(*pfn);
    return result;
}

VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    VGPU_HOOK_REAL(cuGetProcAddress);
    CUresult result = real(symbol, pfn, cudaVersion, flags);
    if (result == CUDA_SUCCESS && pfn)
        *pfn = hook_for_real_entry(*pfn);
    return result;
}
