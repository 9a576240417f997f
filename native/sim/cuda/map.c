/* A map from 64-bit keys to values, kept sorted in one array: allocations need "which range
 * holds this address" (the floor of a key), and the live sets are small enough that binary
 * search plus memmove beats a tree. */
#include <stdlib.h>
#include <string.h>

#include "cuda_sim.h"

size_t sim_map_lower_bound(const struct sim_map *map, uint64_t key)
{
    size_t lo = 0, hi = map->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (map->entries[mid].key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int sim_map_put(struct sim_map *map, uint64_t key, uintptr_t value)
{
    size_t at = sim_map_lower_bound(map, key);
    if (at < map->count && map->entries[at].key == key) {
        map->entries[at].value = value;
        return 0;
    }
    if (map->count == map->capacity) {
        size_t capacity = map->capacity ? map->capacity * 2 : 64;
        struct sim_map_entry *entries = realloc(map->entries, capacity * sizeof *entries);
        if (!entries)
            return -1;
        map->entries = entries;
        map->capacity = capacity;
    }
    memmove(&map->entries[at + 1], &map->entries[at], (map->count - at) * sizeof *map->entries);
    map->entries[at] = (struct sim_map_entry){key, value};
    map->count++;
    return 0;
}

int sim_map_get(const struct sim_map *map, uint64_t key, uintptr_t *value)
{
    size_t at = sim_map_lower_bound(map, key);
    if (at == map->count || map->entries[at].key != key)
        return -1;
    if (value)
        *value = map->entries[at].value;
    return 0;
}

int sim_map_take(struct sim_map *map, uint64_t key, uintptr_t *value)
{
    size_t at = sim_map_lower_bound(map, key);
    if (at == map->count || map->entries[at].key != key)
        return -1;
    if (value)
        *value = map->entries[at].value;
    memmove(&map->entries[at], &map->entries[at + 1], (map->count - at - 1) * sizeof *map->entries);
    map->count--;
    return 0;
}

const struct sim_map_entry *sim_map_floor(const struct sim_map *map, uint64_t key)
{
    size_t at = sim_map_lower_bound(map, key);
    if (at < map->count && map->entries[at].key == key)
        return &map->entries[at];
    return at > 0 ? &map->entries[at - 1] : NULL;
}
