/*
 * Graph memory nodes, as the CUDA Programming Guide ("Graph memory nodes") describes them:
 *   - an allocation node's address is fixed when the node is made (cuGraphAddMemAllocNode's
 *     `dptr`): address space only, no device memory yet;
 *   - a launch backs the executable's allocations with device memory, taken into the device's
 *     graph memory pool (charged to this process's slot: NVML shows it, other processes lose it),
 *     and makes them live; a free node in the graph, or cuMemFree / cuMemFreeAsync after it, ends
 *     an allocation's life;
 *   - the pool keeps the memory it reserved when allocations die, and when their graph or
 *     executable is destroyed, for the next launch; cuDeviceGraphMemTrim gives back what no live
 *     allocation uses.
 * cuDeviceGetGraphMemAttribute reports the pool: USED_MEM_* the live allocations, RESERVED_MEM_*
 * what it holds. A launch whose memory the device cannot back is refused (OUT_OF_MEMORY) before
 * anything of it runs, as a driver refuses a launch when the graph pool cannot grow.
 *
 * Simplifications: every allocation node has memory of its own (a real driver may let
 * allocations whose lifetimes do not overlap share physical memory within one graph, so its
 * reserve can be smaller); launches end at once for the pool (the simulator runs no kernels), so
 * a trim right after a launch finds nothing executing.
 */
#include <stdlib.h>

#include "cuda_sim.h"

#define SIM_GRAPH_ALIGNMENT (2ull << 20) /* what graph allocations are rounded to, as VMM memory */

static void link_block(struct sim_graph_block *block)
{
    struct sim_cuda_device *device = block->allocation.device;
    block->next = device->graph_blocks;
    device->graph_blocks = block;
}

/* Frees a block nothing needs any more: no owner, not live, nothing reserved. */
static void forget_if_unused(struct sim_graph_block *block)
{
    if (block->owners || block->live || block->backed)
        return;
    struct sim_cuda_device *device = block->allocation.device;
    for (struct sim_graph_block **at = &device->graph_blocks; *at; at = &(*at)->next)
        if (*at == block) {
            *at = block->next;
            break;
        }
    sim_address_give(block->allocation.base, block->allocation.span, block->allocation.in_arena);
    free(block->allocation.poisoned);
    free(block);
}

CUresult sim_graph_block_new(struct sim_cuda_device *device, uint64_t size, struct sim_graph_block **out)
{
    if (size > device->view->spec->memory)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_graph_block *block = calloc(1, sizeof *block);
    if (!block)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t span = (size + SIM_GRAPH_ALIGNMENT - 1) / SIM_GRAPH_ALIGNMENT * SIM_GRAPH_ALIGNMENT;
    block->allocation = sim_linear_take(device, size, span);
    if (!block->allocation.base) {
        free(block);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    block->allocation.graph = block;
    block->owners = 1;
    link_block(block);
    *out = block;
    return CUDA_SUCCESS;
}

void sim_graph_block_release(struct sim_graph_block *block)
{
    block->owners--;
    forget_if_unused(block);
}

void sim_graph_block_free(struct sim_graph_block *block)
{
    block->live = 0;
    block->allocation.device->graph_used -= block->allocation.size;
    forget_if_unused(block);
}

/* The live graph allocation that starts at `address`, or NULL. */
static struct sim_graph_block *live_block(CUdeviceptr address)
{
    struct sim_allocation *allocation = sim_allocation_at(address);
    return allocation ? allocation->graph : NULL;
}

static void raise(uint64_t *high, uint64_t value)
{
    if (*high < value)
        *high = value;
}

CUresult sim_graph_memory_launch(struct CUgraphExec_st *exec)
{
    if (!exec->allocations && !exec->frees)
        return CUDA_SUCCESS;
    /* What each device must newly back; the devices are attached before the lock is taken. */
    uint64_t backing[SIM_MAX_DEVICES] = {0};
    for (size_t i = 0; i < exec->allocations; i++) {
        CUresult attached = sim_attach(exec->blocks[i]->allocation.device);
        if (attached != CUDA_SUCCESS)
            return attached;
    }
    pthread_mutex_lock(&sim_cuda.lock);
    CUresult result = CUDA_SUCCESS;
    for (size_t i = 0; i < exec->allocations && result == CUDA_SUCCESS; i++) {
        struct sim_graph_block *block = exec->blocks[i];
        if (block->live)
            result = CUDA_ERROR_INVALID_VALUE; /* freed neither in the graph nor since its last launch */
        else if (!block->backed)
            backing[block->allocation.device->view->index] += block->allocation.size;
    }
    for (size_t i = 0; i < exec->frees && result == CUDA_SUCCESS; i++) {
        struct sim_graph_block *freed = live_block(exec->freed[i]);
        int own = 0; /* allocated by this very launch */
        for (size_t j = 0; j < exec->allocations; j++)
            own |= exec->blocks[j]->allocation.base == exec->freed[i];
        if (!freed && !own)
            result = CUDA_ERROR_INVALID_VALUE;
    }
    int charged = -1;
    for (int d = 0; d < sim_cuda.device_count && result == CUDA_SUCCESS; d++) {
        struct sim_cuda_device *device = &sim_cuda.devices[d];
        if (backing[device->view->index] && (result = sim_charge(device, backing[device->view->index])) == CUDA_SUCCESS)
            charged = d;
    }
    if (result != CUDA_SUCCESS) {
        for (int d = 0; d <= charged; d++)
            if (backing[sim_cuda.devices[d].view->index])
                sim_uncharge(&sim_cuda.devices[d], backing[sim_cuda.devices[d].view->index]);
        pthread_mutex_unlock(&sim_cuda.lock);
        return result;
    }
    for (size_t i = 0; i < exec->allocations; i++) {
        struct sim_graph_block *block = exec->blocks[i];
        struct sim_cuda_device *device = block->allocation.device;
        if (!block->backed) {
            block->backed = 1;
            device->graph_reserved += block->allocation.size;
            raise(&device->graph_reserved_high, device->graph_reserved);
        }
        if (sim_map_put(&sim_cuda.allocations, block->allocation.base, (uintptr_t)&block->allocation) != 0) {
            result = CUDA_ERROR_OUT_OF_MEMORY; /* host memory: it stays reserved, not live */
            continue;
        }
        block->live = 1;
        device->graph_used += block->allocation.size;
        raise(&device->graph_used_high, device->graph_used);
    }
    for (size_t i = 0; i < exec->frees; i++) {
        struct sim_graph_block *freed = live_block(exec->freed[i]);
        if (freed) {
            sim_map_take(&sim_cuda.allocations, freed->allocation.base, NULL);
            sim_graph_block_free(freed);
        }
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return result;
}

/* ---- the device's graph memory pool ------------------------------------------------------- */

CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    struct sim_cuda_device *trimmed;
    CUresult result = sim_device_ready(device, &trimmed, 1);
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&sim_cuda.lock);
    for (struct sim_graph_block *block = trimmed->graph_blocks, *next; block; block = next) {
        next = block->next;
        if (!block->backed || block->live)
            continue;
        block->backed = 0;
        trimmed->graph_reserved -= block->allocation.size;
        sim_linear_pages_drop(&block->allocation);
        sim_uncharge(trimmed, block->allocation.size);
        forget_if_unused(block);
    }
    pthread_mutex_unlock(&sim_cuda.lock);
    return CUDA_SUCCESS;
}

static int known_attribute(CUgraphMem_attribute attr)
{
    return attr >= CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT && attr <= CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH;
}

CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    struct sim_cuda_device *pool;
    CUresult result = sim_device_ready(device, &pool, value && known_attribute(attr));
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&sim_cuda.lock);
    const uint64_t figures[] = {pool->graph_used, pool->graph_used_high, pool->graph_reserved,
                                pool->graph_reserved_high};
    *(cuuint64_t *)value = figures[attr];
    pthread_mutex_unlock(&sim_cuda.lock);
    return CUDA_SUCCESS;
}

/* Only the high-water marks can be set, and only to zero (which starts them afresh from now). */
CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    struct sim_cuda_device *pool;
    int high = attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH || attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH;
    CUresult result = sim_device_ready(device, &pool, value && high);
    if (result != CUDA_SUCCESS)
        return result;
    if (*(const cuuint64_t *)value != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.lock);
    if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
        pool->graph_used_high = pool->graph_used;
    else
        pool->graph_reserved_high = pool->graph_reserved;
    pthread_mutex_unlock(&sim_cuda.lock);
    return CUDA_SUCCESS;
}
