/*
 * What a launch of each graph executable costs, in launch.c's units (warps), and the graph memory
 * its allocation nodes take: set when an executable is made or updated from a graph, read by
 * every launch of it, forgotten when it is destroyed. Whether its memory is in the driver's graph
 * pool already is an epoch: launched since the last trim. A lock-free open-addressing table keyed by the executable; an
 * executable that finds no room near its home, or was never priced, costs the nominal price.
 */
#include "internal.h"

#define G (vgpu_state.graph_prices)

/* Price of a graph launch whose kernels are unknown (the driver cannot list them, or a
 * conditional node runs a data-dependent number of times). The unit is arbitrary: the
 * controller learns device time per token from what it measures, so a fixed price per graph
 * launch still yields the right rate for a program that launches such graphs. */
#define GRAPH_NOMINAL_COST (UINT64_C(1) << 16)
#define GRAPH_PROBES 16 /* an executable lives within this many slots of its home */
#define GRAPH_SLOT_EMPTY ((uintptr_t)0)
#define GRAPH_SLOT_FREED ((uintptr_t)1)

static struct vgpu_graph_price *graph_slot(uintptr_t exec, size_t probe)
{
    size_t home = (size_t)((exec >> 4) * 0x9e3779b97f4a7c15ULL >> 32);
    return &G.entries[(home + probe) & (VGPU_GRAPH_TABLE_SIZE - 1)];
}

/* The entry of an executable already in the table, or NULL. */
static struct vgpu_graph_price *graph_entry(uintptr_t key)
{
    for (size_t probe = 0; probe < GRAPH_PROBES; probe++) {
        struct vgpu_graph_price *entry = graph_slot(key, probe);
        uintptr_t seen = atomic_load_explicit(&entry->exec, memory_order_acquire);
        if (seen == key)
            return entry;
        if (seen == GRAPH_SLOT_EMPTY)
            break;
    }
    return NULL;
}

void vgpu_graph_exec_priced(CUgraphExec exec, uint64_t cost, uint64_t memory, int has_memory)
{
    uintptr_t key = (uintptr_t)exec;
    if (key <= GRAPH_SLOT_FREED)
        return;
    if (cost == VGPU_GRAPH_PRICE_UNKNOWN)
        cost = GRAPH_NOMINAL_COST;
    if (cost > VGPU_MAX_LAUNCH_COST)
        cost = VGPU_MAX_LAUNCH_COST;
    /* An update re-prices the executable's own entry, which may lie past a freed slot. */
    struct vgpu_graph_price *entry = graph_entry(key);
    for (size_t probe = 0; !entry && probe < GRAPH_PROBES; probe++) {
        struct vgpu_graph_price *candidate = graph_slot(key, probe);
        uintptr_t seen = atomic_load(&candidate->exec);
        if ((seen == GRAPH_SLOT_EMPTY || seen == GRAPH_SLOT_FREED) &&
            atomic_compare_exchange_strong(&candidate->exec, &seen, key))
            entry = candidate;
    }
    /* No room near its home: this executable is charged the nominal price, and its graph memory
     * counts as driver memory once measured (driver_memory.c), not before its launch. */
    if (entry) {
        atomic_store(&entry->memory_plus_one, has_memory ? memory + 1 : 0);
        atomic_store(&entry->backed_epoch, 0);
        atomic_store(&entry->cost_plus_one, cost + 1);
    }
}

void vgpu_graph_exec_launch(CUgraphExec exec, struct vgpu_graph_launch *launch)
{
    struct vgpu_graph_price *entry = graph_entry((uintptr_t)exec);
    uint64_t cost_plus_one = entry ? atomic_load_explicit(&entry->cost_plus_one, memory_order_relaxed) : 0;
    uint64_t memory_plus_one = entry ? atomic_load_explicit(&entry->memory_plus_one, memory_order_relaxed) : 0;
    launch->cost = cost_plus_one ? cost_plus_one - 1 : GRAPH_NOMINAL_COST;
    launch->has_memory = memory_plus_one != 0;
    launch->to_back = 0;
    if (__builtin_expect(memory_plus_one != 0, 0) &&
        atomic_load(&entry->backed_epoch) != atomic_load(&G.pool_epoch) + 1)
        launch->to_back = memory_plus_one - 1;
}

void vgpu_graph_exec_backed(CUgraphExec exec)
{
    struct vgpu_graph_price *entry = graph_entry((uintptr_t)exec);
    if (entry)
        atomic_store(&entry->backed_epoch, atomic_load(&G.pool_epoch) + 1);
}

void vgpu_graph_pool_trimmed(void)
{
    atomic_fetch_add(&G.pool_epoch, 1);
}

void vgpu_graph_exec_forget(CUgraphExec exec)
{
    struct vgpu_graph_price *entry = graph_entry((uintptr_t)exec);
    if (entry) {
        atomic_store(&entry->cost_plus_one, 0);
        atomic_store(&entry->memory_plus_one, 0);
        atomic_store(&entry->exec, GRAPH_SLOT_FREED);
    }
}
