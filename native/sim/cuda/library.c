/*
 * Code objects as the driver-API clients load them: module variants (cuModuleLoadDataEx), the
 * CUDA 12 library and kernel API (cuLibrary*, cuKernel*: loadable without a current context),
 * the JIT linker (cuLink*), function attributes and occupancy. The simulator never runs code:
 * any image loads, any name is a function, a link produces a placeholder image, and what a
 * function's attributes say is what a small kernel compiled for the device would say.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_sim.h"

#define SIM_LINK_MAGIC 0x4c4e4b31u
#define SIM_DEFAULT_DYNAMIC_SHARED 49152 /* without opting in, as on the real device */

/* JIT options the driver answers: CU_JIT_WALL_TIME, the info and error logs and their sizes. */
enum {
    SIM_JIT_WALL_TIME = 2,
    SIM_JIT_INFO_LOG_BUFFER = 3,
    SIM_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
    SIM_JIT_ERROR_LOG_BUFFER = 5,
    SIM_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
};

/* Fills what a JIT step reports back: no time taken, empty logs. */
static void answer_jit_options(unsigned int count, const CUjit_option *options, void **values)
{
    if (!options || !values)
        return;
    for (unsigned int i = 0; i < count; i++) {
        switch (options[i]) {
        case SIM_JIT_WALL_TIME: memset(&values[i], 0, sizeof values[i]); break;
        case SIM_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
        case SIM_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: values[i] = NULL; break; /* bytes written: 0 */
        case SIM_JIT_INFO_LOG_BUFFER:
        case SIM_JIT_ERROR_LOG_BUFFER:
            if (values[i])
                *(char *)values[i] = '\0';
            break;
        default: break;
        }
    }
}

/* ---- modules and libraries ------------------------------------------------------------------ */

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,
                            void **optionValues)
{
    CUresult result = cuModuleLoadData(module, image);
    if (result == CUDA_SUCCESS)
        answer_jit_options(numOptions, options, optionValues);
    return result;
}

CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode)
{
    CUresult result = sim_check(mode != NULL);
    if (result == CUDA_SUCCESS)
        *mode = CU_MODULE_LAZY_LOADING; /* the default since CUDA 12.2 */
    return result;
}

static struct CUmod_st *library_of(CUlibrary library)
{
    struct CUmod_st *module = (struct CUmod_st *)library;
    return module && module->magic == SIM_MODULE_MAGIC && module->is_library ? module : NULL;
}

static struct CUfunc_st *kernel_of(CUkernel kernel)
{
    struct CUfunc_st *function = (struct CUfunc_st *)kernel;
    return function && function->magic == SIM_FUNCTION_MAGIC && function->module->is_library ? function : NULL;
}

static struct CUfunc_st *function_of(CUfunction hfunc)
{
    return hfunc && hfunc->magic == SIM_FUNCTION_MAGIC ? hfunc : NULL;
}

/* The body of a query of what a library, kernel or function handle leads to: `checked`, the
 * call's ready and argument checks; then `object`, what `lookup` finds through the handle (called
 * only once the checks pass: INVALID_HANDLE if it finds nothing), answered through `out` as
 * `value`. */
#define LOOKUP_ANSWER(checked, type, object, lookup, out, value)                                                       \
    CUresult result = (checked);                                                                                       \
    type *object = result == CUDA_SUCCESS ? (lookup) : NULL;                                                           \
    if (result == CUDA_SUCCESS && !object)                                                                             \
        result = CUDA_ERROR_INVALID_HANDLE;                                                                            \
    if (result == CUDA_SUCCESS)                                                                                        \
        *(out) = (value);                                                                                              \
    return result

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions, void **jitOptionsValues,
                           unsigned int numJitOptions, CUlibraryOption *libraryOptions, void **libraryOptionValues,
                           unsigned int numLibraryOptions)
{
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    CUresult result = sim_check(library && code);
    if (result != CUDA_SUCCESS)
        return result;
    struct CUmod_st *loaded;
    result = sim_module_load(1, &loaded);
    if (result == CUDA_SUCCESS) {
        answer_jit_options(numJitOptions, jitOptions, jitOptionsValues);
        *library = (CUlibrary)loaded;
    }
    return result;
}

CUresult cuLibraryUnload(CUlibrary library)
{
    CUresult result = sim_ready();
    if (result != CUDA_SUCCESS)
        return result;
    return library_of(library) ? cuModuleUnload((CUmodule)library) : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    CUresult result = sim_check(pKernel && name);
    if (result != CUDA_SUCCESS)
        return result;
    struct CUmod_st *module = library_of(library);
    if (!module)
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUfunc_st *function = sim_module_function(module, name);
    if (!function)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pKernel = (CUkernel)function;
    return CUDA_SUCCESS;
}

/* The module and functions of a library in the current context: the library's own, since one
 * loaded image serves every context here. */
CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    struct CUctx_st *ctx;
    LOOKUP_ANSWER(sim_current_context(&ctx, pMod != NULL), struct CUmod_st, module, library_of(library), pMod, module);
}

CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    struct CUctx_st *ctx;
    LOOKUP_ANSWER(sim_current_context(&ctx, pFunc != NULL), struct CUfunc_st, function, kernel_of(kernel), pFunc,
                  function);
}

CUresult cuKernelGetLibrary(CUlibrary *pLib, CUkernel kernel)
{
    LOOKUP_ANSWER(sim_check(pLib != NULL), struct CUfunc_st, function, kernel_of(kernel), pLib,
                  (CUlibrary)function->module);
}

static CUresult name_of(const char **name, struct CUfunc_st *function)
{
    CUresult result = sim_check(name != NULL);
    if (result == CUDA_SUCCESS && !function)
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS)
        *name = function->name;
    return result;
}

CUresult cuKernelGetName(const char **name, CUkernel hfunc)
{
    return name_of(name, kernel_of(hfunc));
}

CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
    return name_of(name, function_of(hfunc));
}

CUresult cuFuncGetModule(CUmodule *hmod, CUfunction hfunc)
{
    LOOKUP_ANSWER(sim_check(hmod != NULL), struct CUfunc_st, function, function_of(hfunc), hmod, function->module);
}

/* ---- function attributes and occupancy -------------------------------------------------------- */

/* What a small kernel compiled for compute capability 9.0 reports, unless the program set it. */
static int attribute_default(CUfunction_attribute attribute)
{
    switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return SIM_MAX_THREADS_PER_BLOCK;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: return 32;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: return SIM_CC_MAJOR * 10 + SIM_CC_MINOR;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: return SIM_DEFAULT_DYNAMIC_SHARED;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: return -1;
    default: return 0;
    }
}

static CUresult get_attribute(int *pi, CUfunction_attribute attrib, struct CUfunc_st *function)
{
    CUresult result = sim_check(pi && attrib >= 0 && attrib < CU_FUNC_ATTRIBUTE_MAX);
    if (result == CUDA_SUCCESS && !function)
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS)
        *pi = function->attributes[attrib] ? function->attributes[attrib] : attribute_default(attrib);
    return result;
}

/* Only the attributes a program may set: the dynamic shared memory it opts in to (up to the
 * device's limit) and the carve-out, a percentage; the others are properties of the code. */
static CUresult set_attribute(CUfunction_attribute attrib, int value, struct CUfunc_st *function)
{
    int valid = (attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES && value >= 0 &&
                 value <= SIM_MAX_SHARED_MEMORY_OPTIN) ||
                (attrib == CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT && value >= -1 && value <= 100);
    CUresult result = sim_check(valid);
    if (result == CUDA_SUCCESS && !function)
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS)
        function->attributes[attrib] = value;
    return result;
}

CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    return get_attribute(pi, attrib, function_of(hfunc));
}

CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    return set_attribute(attrib, value, function_of(hfunc));
}

CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, 1);
    return result != CUDA_SUCCESS ? result : get_attribute(pi, attrib, kernel_of(kernel));
}

CUresult cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev)
{
    struct sim_cuda_device *device;
    CUresult result = sim_device_ready(dev, &device, 1);
    return result != CUDA_SUCCESS ? result : set_attribute(attrib, val, kernel_of(kernel));
}

CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config)
{
    CUresult result = sim_check(config >= 0 && config <= 3);
    if (result == CUDA_SUCCESS && !function_of(hfunc))
        result = CUDA_ERROR_INVALID_HANDLE;
    return result; /* a preference: nothing to change on the simulated device */
}

/* Blocks of `blockSize` threads one SM holds at once: the thread, block and shared-memory
 * limits of the device, as the kernel model (sim_kernel_cost) counts them. */
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
                                                              size_t dynamicSMemSize, unsigned int flags)
{
    CUresult result = sim_check(numBlocks && blockSize > 0 && blockSize <= SIM_MAX_THREADS_PER_BLOCK && flags <= 1);
    if (result == CUDA_SUCCESS && !function_of(func))
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result != CUDA_SUCCESS)
        return result;
    int blocks = SIM_MAX_THREADS_PER_SM / blockSize;
    if (blocks > SIM_MAX_BLOCKS_PER_SM)
        blocks = SIM_MAX_BLOCKS_PER_SM;
    if (dynamicSMemSize > 0 && (size_t)blocks * dynamicSMemSize > SIM_MAX_SHARED_MEMORY_OPTIN)
        blocks = (int)(SIM_MAX_SHARED_MEMORY_OPTIN / dynamicSMemSize);
    *numBlocks = blocks;
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                     size_t dynamicSMemSize)
{
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize, dynamicSMemSize, 0);
}

/* ---- the linker ------------------------------------------------------------------------------- */

struct CUlinkState_st {
    uint32_t magic;
    unsigned int inputs;
    char image[96]; /* what cuLinkComplete hands out: owned by the state, as the driver's */
};

CUresult cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options, void **optionValues, CUlinkState *stateOut)
{
    CUresult result = sim_check(stateOut && (numOptions == 0 || (options && optionValues)));
    if (result != CUDA_SUCCESS)
        return result;
    struct CUlinkState_st *state = calloc(1, sizeof *state);
    if (!state)
        return CUDA_ERROR_OUT_OF_MEMORY;
    state->magic = SIM_LINK_MAGIC;
    answer_jit_options(numOptions, options, optionValues);
    *stateOut = state;
    return CUDA_SUCCESS;
}

static int live_link(CUlinkState state)
{
    return state && state->magic == SIM_LINK_MAGIC;
}

CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name,
                          unsigned int numOptions, CUjit_option *options, void **optionValues)
{
    (void)name;
    CUresult result = sim_check(data && size && type >= 0 && type <= 5);
    if (result == CUDA_SUCCESS && !live_link(state))
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS) {
        state->inputs++;
        answer_jit_options(numOptions, options, optionValues);
    }
    return result;
}

CUresult cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char *path, unsigned int numOptions,
                          CUjit_option *options, void **optionValues)
{
    CUresult result = sim_check(path && type >= 0 && type <= 5);
    if (result == CUDA_SUCCESS && !live_link(state))
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result != CUDA_SUCCESS)
        return result;
    FILE *file = fopen(path, "rb");
    if (!file)
        return CUDA_ERROR_FILE_NOT_FOUND;
    fclose(file);
    state->inputs++;
    answer_jit_options(numOptions, options, optionValues);
    return CUDA_SUCCESS;
}

CUresult cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut)
{
    CUresult result = sim_check(cubinOut && sizeOut);
    if (result == CUDA_SUCCESS && !live_link(state))
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result != CUDA_SUCCESS)
        return result;
    if (state->inputs == 0)
        return CUDA_ERROR_INVALID_VALUE; /* nothing to link */
    int length = snprintf(state->image, sizeof state->image,
                          "jupyter-vgpu simulated GPU: an image linked from %u inputs, never run", state->inputs);
    *cubinOut = state->image;
    *sizeOut = (size_t)length + 1;
    return CUDA_SUCCESS;
}

CUresult cuLinkDestroy(CUlinkState state)
{
    CUresult result = sim_ready();
    if (result == CUDA_SUCCESS && !live_link(state))
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS) {
        state->magic = SIM_DEAD_MAGIC;
        free(state);
    }
    return result;
}
