/*
 * Launch hooks: each computes what the launch costs and asks the limiter (pacing.c) to admit
 * it before forwarding. Kept thin and alike; the pacing logic lives in one place.
 */
#include <stdlib.h>

#include "internal.h"

static uint64_t launch_cost(unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                            unsigned int bz)
{
    uint64_t blocks = (uint64_t)gx * gy * gz;
    uint64_t threads = (uint64_t)bx * by * bz;
    return blocks * ((threads + 31) / 32);
}

/* Admits a launch (pacing.c). A thread's first launch also makes sure the process has its
 * monitor: a process may launch in a context it made without a hooked call, and allocate
 * nothing through one. */
static inline void admit(uint64_t cost)
{
    if (__builtin_expect(vgpu_launch_admit(cost), 0))
        vgpu_gpu_slot();
}

#define LAUNCH_HOOK(name)                                                                                              \
    VGPU_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,        \
                              unsigned int by, unsigned int bz, unsigned int shm, CUstream stream, void **params,      \
                              void **extra)                                                                            \
    {                                                                                                                  \
        VGPU_HOOK_REAL(name);                                                                                          \
        admit(launch_cost(gx, gy, gz, bx, by, bz));                                                                    \
        return real(f, gx, gy, gz, bx, by, bz, shm, stream, params, extra);                                            \
    }
LAUNCH_HOOK(cuLaunchKernel)
LAUNCH_HOOK(cuLaunchKernel_ptsz)

#define COOPERATIVE_LAUNCH_HOOK(name)                                                                                  \
    VGPU_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,        \
                              unsigned int by, unsigned int bz, unsigned int shm, CUstream stream, void **params)      \
    {                                                                                                                  \
        VGPU_HOOK_REAL(name);                                                                                          \
        admit(launch_cost(gx, gy, gz, bx, by, bz));                                                                    \
        return real(f, gx, gy, gz, bx, by, bz, shm, stream, params);                                                   \
    }
COOPERATIVE_LAUNCH_HOOK(cuLaunchCooperativeKernel)
COOPERATIVE_LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz)

#define LAUNCH_EX_HOOK(name)                                                                                           \
    VGPU_EXPORT CUresult name(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)                 \
    {                                                                                                                  \
        VGPU_HOOK_REAL(name);                                                                                          \
        if (config)                                                                                                    \
            admit(launch_cost(config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,                 \
                              config->blockDimY, config->blockDimZ));                                                  \
        return real(config, f, params, extra);                                                                         \
    }
LAUNCH_EX_HOOK(cuLaunchKernelEx)
LAUNCH_EX_HOOK(cuLaunchKernelEx_ptsz)

/*
 * Graphs. A graph launch runs many kernels at once, so it is paced at their price: when an
 * executable is instantiated, and again when an update gives it another graph's kernels, the
 * graph's kernel nodes are priced like launches (child graphs included), through the driver's
 * introspection calls when it has them. A graph that cannot be priced (no such calls, or a
 * conditional node whose body runs a data-dependent number of times) is charged graph_prices.c's
 * nominal price, which the controller calibrates from measurements.
 */
#define VGPU_DECLARE_OPTIONAL_PFN(ret, name, params) typedef ret(*vgpu_pfn_##name) params;
VGPU_CUDA_OPTIONAL_ENTRY_POINTS(VGPU_DECLARE_OPTIONAL_PFN)
#undef VGPU_DECLARE_OPTIONAL_PFN

#define GRAPH_NESTING_LIMIT 8

struct graph_inspector {
    vgpu_pfn_cuGraphGetNodes get_nodes;
    vgpu_pfn_cuGraphNodeGetType node_type;
    vgpu_pfn_cuGraphKernelNodeGetParams_v2 kernel_params;
    vgpu_pfn_cuGraphChildGraphNodeGetGraph child_graph;
    vgpu_pfn_cuGraphMemAllocNodeGetParams alloc_params; /* NULL: sizes unknown until launched */
    /* What the walk found of graph memory: the bytes of the allocation nodes whose size it knows,
     * and whether there is any. */
    uint64_t memory;
    int has_memory;
};

static uint64_t node_price(struct graph_inspector *api, CUgraphNode node, int depth);

static uint64_t graph_price(struct graph_inspector *api, CUgraph graph, int depth)
{
    size_t count = 0;
    if (depth > GRAPH_NESTING_LIMIT || api->get_nodes(graph, NULL, &count) != CUDA_SUCCESS)
        return VGPU_GRAPH_PRICE_UNKNOWN;
    if (count == 0)
        return 0;
    CUgraphNode *nodes = malloc(count * sizeof *nodes);
    if (!nodes)
        return VGPU_GRAPH_PRICE_UNKNOWN;
    uint64_t total = VGPU_GRAPH_PRICE_UNKNOWN;
    if (api->get_nodes(graph, nodes, &count) == CUDA_SUCCESS) {
        total = 0;
        for (size_t i = 0; i < count && total != VGPU_GRAPH_PRICE_UNKNOWN; i++) {
            uint64_t price = node_price(api, nodes[i], depth);
            total = price == VGPU_GRAPH_PRICE_UNKNOWN ? price : total + price;
        }
    }
    free(nodes);
    return total;
}

static uint64_t node_price(struct graph_inspector *api, CUgraphNode node, int depth)
{
    CUgraphNodeType type;
    if (api->node_type(node, &type) != CUDA_SUCCESS)
        return VGPU_GRAPH_PRICE_UNKNOWN;
    switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
        CUDA_KERNEL_NODE_PARAMS p;
        if (api->kernel_params(node, &p) != CUDA_SUCCESS)
            return VGPU_GRAPH_PRICE_UNKNOWN;
        return launch_cost(p.gridDimX, p.gridDimY, p.gridDimZ, p.blockDimX, p.blockDimY, p.blockDimZ);
    }
    case CU_GRAPH_NODE_TYPE_GRAPH: {
        CUgraph child;
        if (api->child_graph(node, &child) != CUDA_SUCCESS)
            return VGPU_GRAPH_PRICE_UNKNOWN;
        return graph_price(api, child, depth + 1);
    }
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        api->has_memory = 1;
        if (api->alloc_params && api->alloc_params(node, &p) == CUDA_SUCCESS &&
            p.poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
            api->memory = api->memory > UINT64_MAX - p.bytesize ? UINT64_MAX : api->memory + p.bytesize;
        return 0;
    }
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: return VGPU_GRAPH_PRICE_UNKNOWN;
    default: return 0; /* copies, memsets, host calls, events: no SM work worth pacing */
    }
}

/* Prices the executable *exec as made from `graph`; an executable already priced takes the new
 * price (an update swapped its kernels). */
static void price_graph_exec(const CUgraphExec *exec, CUgraph graph)
{
    struct graph_inspector api = {
        (vgpu_pfn_cuGraphGetNodes)vgpu_real_symbol(VGPU_LIB_CUDA, "cuGraphGetNodes"),
        (vgpu_pfn_cuGraphNodeGetType)vgpu_real_symbol(VGPU_LIB_CUDA, "cuGraphNodeGetType"),
        (vgpu_pfn_cuGraphKernelNodeGetParams_v2)vgpu_real_symbol(VGPU_LIB_CUDA, "cuGraphKernelNodeGetParams_v2"),
        (vgpu_pfn_cuGraphChildGraphNodeGetGraph)vgpu_real_symbol(VGPU_LIB_CUDA, "cuGraphChildGraphNodeGetGraph"),
        (vgpu_pfn_cuGraphMemAllocNodeGetParams)vgpu_real_symbol(VGPU_LIB_CUDA, "cuGraphMemAllocNodeGetParams"),
        0,
        0,
    };
    if (!exec || !api.get_nodes || !api.node_type || !api.kernel_params || !api.child_graph)
        return;
    uint64_t cost = graph_price(&api, graph, 0);
    vgpu_graph_exec_priced(*exec, cost, api.memory, api.has_memory);
}

/* Every entry point that makes an executable from a graph (CUDA 11's and 12's instantiations)
 * or remakes one from another graph (updates): once the real call succeeds, the executable costs
 * what `graph` runs. Each takes the executable (or where to put it) and the graph first, named
 * `exec` and `graph`; `made` points to the executable. */
#define GRAPH_EXEC_HOOK(name, made, params, ...)                                                                       \
    VGPU_EXPORT CUresult name params                                                                                   \
    {                                                                                                                  \
        VGPU_HOOK_REAL(name);                                                                                          \
        CUresult result = real(exec, graph, __VA_ARGS__);                                                              \
        if (result == CUDA_SUCCESS)                                                                                    \
            price_graph_exec(made, graph);                                                                             \
        return result;                                                                                                 \
    }
/* The parameter lists are macro arguments, where clang-format would read `T *p` as a product: */
/* clang-format off */
GRAPH_EXEC_HOOK(cuGraphInstantiateWithFlags, exec, (CUgraphExec *exec, CUgraph graph, unsigned long long flags),
                flags)
GRAPH_EXEC_HOOK(cuGraphInstantiateWithParams, exec,
                (CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params), params)
GRAPH_EXEC_HOOK(cuGraphInstantiateWithParams_ptsz, exec,
                (CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params), params)
GRAPH_EXEC_HOOK(cuGraphInstantiate_v2, exec,
                (CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node, char *log, size_t log_size),
                error_node, log, log_size)
GRAPH_EXEC_HOOK(cuGraphExecUpdate_v2, &exec, (CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *info),
                info)
GRAPH_EXEC_HOOK(cuGraphExecUpdate, &exec,
                (CUgraphExec exec, CUgraph graph, CUgraphNode *error_node, CUgraphExecUpdateResult *outcome),
                error_node, outcome)
/* clang-format on */

/* A launch of an executable with allocation nodes, on the slice's device: the slice of the
 * process that launches pays for the memory the driver's graph pool takes for it. What it may
 * newly take is charged before the launch (a launch past the cap is refused with the driver's
 * OUT_OF_MEMORY, and the out-of-memory line once per burst, before it runs or is paced); after it,
 * the charge follows what the pool reserves (charge.c). */
static CUresult launch_with_graph_memory(CUresult (*real)(CUgraphExec, CUstream), CUgraphExec exec, CUstream stream,
                                         const struct vgpu_graph_launch *graph)
{
    vgpu_pfn_cuCtxGetDevice get_device = VGPU_CALLED(cuCtxGetDevice);
    CUdevice device;
    if (!get_device || get_device(&device) != CUDA_SUCCESS || !vgpu_cuda_device_is_slice(device)) {
        admit(graph->cost);
        return real(exec, stream);
    }
    struct vgpu_charge c = {vgpu_claimed_slot(), 0};
    CUresult result = graph->to_back ? vgpu_charge(&c, "cuGraphLaunch", graph->to_back) : CUDA_SUCCESS;
    if (result != CUDA_SUCCESS)
        return result;
    admit(graph->cost);
    result = real(exec, stream);
    vgpu_graph_memory_settle(&c, result == CUDA_SUCCESS, device);
    if (result == CUDA_SUCCESS)
        vgpu_graph_exec_backed(exec);
    return result;
}

#define GRAPH_LAUNCH_HOOK(name)                                                                                        \
    VGPU_EXPORT CUresult name(CUgraphExec exec, CUstream stream)                                                       \
    {                                                                                                                  \
        VGPU_HOOK_REAL(name);                                                                                          \
        struct vgpu_graph_launch graph;                                                                                \
        vgpu_graph_exec_launch(exec, &graph);                                                                          \
        if (__builtin_expect(graph.has_memory, 0))                                                                     \
            return launch_with_graph_memory(real, exec, stream, &graph);                                               \
        admit(graph.cost);                                                                                             \
        return real(exec, stream);                                                                                     \
    }
GRAPH_LAUNCH_HOOK(cuGraphLaunch)
GRAPH_LAUNCH_HOOK(cuGraphLaunch_ptsz)

VGPU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    VGPU_HOOK_REAL(cuGraphExecDestroy);
    vgpu_graph_exec_forget(exec);
    return real(exec);
}
