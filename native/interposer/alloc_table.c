/*
 * The table of live allocations: key (device pointer, VMM handle, array handle) -> what it was
 * charged, sharded by key with one lock per shard, so that a free gives back exactly what its
 * allocation added and threads allocating at once rarely share a lock.
 */
#include <linux/futex.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

#define T (vgpu_state.alloc_table)

#define TABLE_MIN_CAPACITY 64

static uint64_t mix64(uint64_t value)
{
    value ^= value >> 33;
    value *= 0xff51afd7ed558ccdULL;
    value ^= value >> 33;
    value *= 0xc4ceb9fe1a85ec53ULL;
    value ^= value >> 33;
    return value;
}

static uint64_t entry_hash(uint8_t kind, uint64_t key)
{
    return mix64(key ^ ((uint64_t)kind << 58));
}

/* A shard's lock is a futex word (0 free, 1 held, 2 held and waited for): every allocation and
 * every free takes one, and taking a free one is a single compare-and-swap here, where
 * pthread_mutex_lock and _unlock are two calls into libc doing several times the work (about a
 * quarter of what an allocation and its free added before). A thread that finds it held sleeps
 * in the kernel, never spins. */
static __attribute__((noinline)) void shard_lock_wait(struct vgpu_alloc_shard *shard, uint32_t seen)
{
    if (seen != 2)
        seen = atomic_exchange_explicit(&shard->lock, 2, memory_order_acquire);
    while (seen != 0) {
        syscall(SYS_futex, &shard->lock, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
        seen = atomic_exchange_explicit(&shard->lock, 2, memory_order_acquire);
    }
}

static inline void shard_lock(struct vgpu_alloc_shard *shard)
{
    uint32_t seen = 0;
    if (__builtin_expect(!atomic_compare_exchange_strong_explicit(&shard->lock, &seen, 1, memory_order_acquire,
                                                                  memory_order_relaxed),
                         0))
        shard_lock_wait(shard, seen);
}

static inline void shard_unlock(struct vgpu_alloc_shard *shard)
{
    if (__builtin_expect(atomic_exchange_explicit(&shard->lock, 0, memory_order_release) == 2, 0))
        syscall(SYS_futex, &shard->lock, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static struct vgpu_alloc_shard *shard_of(uint64_t hash)
{
    _Static_assert((VGPU_ALLOC_SHARDS & (VGPU_ALLOC_SHARDS - 1)) == 0, "shards are a power of two");
    return &T.shards[hash >> 58 & (VGPU_ALLOC_SHARDS - 1)];
}

/* The slot of (kind, key) in the shard, or of the first free place for it; NULL if full. */
static struct vgpu_alloc_entry *shard_probe(struct vgpu_alloc_shard *shard, uint64_t hash, uint8_t kind, uint64_t key,
                                            int for_insert)
{
    if (!shard->capacity)
        return NULL;
    uint32_t mask = shard->capacity - 1;
    struct vgpu_alloc_entry *reusable = NULL;
    for (uint32_t step = 0, index = (uint32_t)hash & mask; step < shard->capacity; step++, index = (index + 1) & mask) {
        struct vgpu_alloc_entry *entry = &shard->entries[index];
        if (entry->kind == VGPU_KIND_EMPTY)
            return for_insert ? (reusable ? reusable : entry) : NULL;
        if (entry->kind == VGPU_KIND_DELETED) {
            if (!reusable)
                reusable = entry;
        } else if (entry->kind == kind && entry->key == key) {
            return entry;
        }
    }
    return for_insert ? reusable : NULL;
}

/* Rebuilds the shard's array at a size that keeps probing short and drops deleted entries. */
static int shard_grow(struct vgpu_alloc_shard *shard)
{
    uint32_t capacity = TABLE_MIN_CAPACITY;
    while (capacity < shard->live * 4u)
        capacity *= 2;
    struct vgpu_alloc_entry *entries = calloc(capacity, sizeof *entries);
    if (!entries)
        return -1;
    struct vgpu_alloc_entry *old = shard->entries;
    uint32_t old_capacity = shard->capacity;
    shard->entries = entries;
    shard->capacity = capacity;
    shard->used = shard->live;
    for (uint32_t index = 0; index < old_capacity; index++) {
        struct vgpu_alloc_entry *entry = &old[index];
        if (entry->kind != VGPU_KIND_EMPTY && entry->kind != VGPU_KIND_DELETED)
            *shard_probe(shard, entry_hash(entry->kind, entry->key), entry->kind, entry->key, 1) = *entry;
    }
    free(old);
    return 0;
}

/* Records an allocation. If the key is already there, the driver handed out again something
 * we thought live (freed behind our back, e.g. with its context): returns the bytes that old
 * entry held, so the caller gives them back. Returns -1 when out of host memory. */
int64_t vgpu_table_insert(const struct vgpu_alloc_entry *new_entry)
{
    uint64_t hash = entry_hash(new_entry->kind, new_entry->key);
    struct vgpu_alloc_shard *shard = shard_of(hash);
    int64_t replaced = 0;
    shard_lock(shard);
    if ((shard->used + 1) * 2 > shard->capacity && shard_grow(shard) != 0) {
        shard_unlock(shard);
        return -1;
    }
    struct vgpu_alloc_entry *entry = shard_probe(shard, hash, new_entry->kind, new_entry->key, 1);
    if (entry->kind == new_entry->kind && entry->key == new_entry->key) {
        replaced = (int64_t)entry->size;
    } else {
        if (entry->kind == VGPU_KIND_EMPTY)
            shard->used++;
        shard->live++;
    }
    *entry = *new_entry;
    shard_unlock(shard);
    return replaced;
}

/* Takes every entry owned by `context` out of the table; returns the bytes they held. */
uint64_t vgpu_table_take_context(uint64_t context)
{
    uint64_t bytes = 0;
    for (int index = 0; index < VGPU_ALLOC_SHARDS; index++) {
        struct vgpu_alloc_shard *shard = &T.shards[index];
        shard_lock(shard);
        for (uint32_t slot = 0; slot < shard->capacity; slot++) {
            struct vgpu_alloc_entry *entry = &shard->entries[slot];
            if (entry->kind != VGPU_KIND_EMPTY && entry->kind != VGPU_KIND_DELETED && entry->context == context) {
                bytes += entry->size;
                entry->kind = VGPU_KIND_DELETED;
                shard->live--;
            }
        }
        shard_unlock(shard);
    }
    return bytes;
}

/* Takes (kind, key) out of the table; returns 1 and the entry if it was there. Taken out
 * before the driver frees it, so that an allocation reusing the address right after the free
 * can never be mistaken for the old one. */
int vgpu_table_take(uint8_t kind, uint64_t key, struct vgpu_alloc_entry *out)
{
    uint64_t hash = entry_hash(kind, key);
    struct vgpu_alloc_shard *shard = shard_of(hash);
    shard_lock(shard);
    struct vgpu_alloc_entry *entry = shard_probe(shard, hash, kind, key, 0);
    int found = entry != NULL;
    if (found) {
        *out = *entry;
        entry->kind = VGPU_KIND_DELETED;
        shard->live--;
    }
    shard_unlock(shard);
    return found;
}

/* A forked child owns none of its parent's allocations: it starts from an empty table (and
 * from unlocked shards, whoever held them in the parent). */
static void forget_after_fork(void)
{
    for (int index = 0; index < VGPU_ALLOC_SHARDS; index++) {
        struct vgpu_alloc_shard *shard = &T.shards[index];
        atomic_store_explicit(&shard->lock, 0, memory_order_relaxed);
        free(shard->entries);
        shard->entries = NULL;
        shard->capacity = shard->used = shard->live = 0;
    }
}

/* At load: a fork while another thread holds a shard's lock must leave the child a table it can
 * use, and a check on every allocation would cost more than registering once. */
__attribute__((constructor)) static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, forget_after_fork);
}
