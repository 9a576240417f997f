/*
 * The slice of the CUDA driver ABI that jupyter-vgpu uses, declared from the public ABI
 * (names, enum values, struct layouts) so that nothing here needs the CUDA toolkit.
 *
 * Both the interposer (native/interposer) and the simulated driver (native/sim) include this
 * header; declarations that only one of them needs still live here so there is one copy.
 * Names are the driver's exported symbol names (cuMemAlloc_v2, not the cuMemAlloc macro).
 */
#ifndef VGPU_CUDA_ABI_H
#define VGPU_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_VERSION_SUPPORTED 12080 /* the driver API version this project's own programs ask cuGetProcAddress for */

typedef int CUresult;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_UNSUPPORTED_LIMIT = 215,
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_TIMEOUT = 909,
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
    CUDA_ERROR_UNKNOWN = 999,
};

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

/* Device attributes (CUdevice_attribute). */
typedef int CUdevice_attribute;
enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY = 9,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK = 12,
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
    CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS = 31,
    CU_DEVICE_ATTRIBUTE_ECC_ENABLED = 32,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36,
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37,
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
    CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR = 82,
    CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89,
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR = 106,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
};

/* cuGetProcAddress flags and symbol status. */
enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1,
};
typedef int CUdriverProcAddressQueryResult;
enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
};

/* Arrays. */
typedef int CUarray_format;
enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20,
};
/* 8- and 16-bit normalized formats carry their channel count in the format (X1, X2, X4). */
enum {
    CU_AD_FORMAT_UNORM_INT8X1 = 0xc0,
    CU_AD_FORMAT_UNORM_INT8X2 = 0xc1,
    CU_AD_FORMAT_UNORM_INT8X4 = 0xc2,
    CU_AD_FORMAT_UNORM_INT16X1 = 0xc3,
    CU_AD_FORMAT_UNORM_INT16X2 = 0xc4,
    CU_AD_FORMAT_UNORM_INT16X4 = 0xc5,
    CU_AD_FORMAT_SNORM_INT8X1 = 0xc6,
    CU_AD_FORMAT_SNORM_INT8X2 = 0xc7,
    CU_AD_FORMAT_SNORM_INT8X4 = 0xc8,
    CU_AD_FORMAT_SNORM_INT16X1 = 0xc9,
    CU_AD_FORMAT_SNORM_INT16X2 = 0xca,
    CU_AD_FORMAT_SNORM_INT16X4 = 0xcb,
};
/* CUDA_ARRAY3D_DESCRIPTOR.Flags */
#define CUDA_ARRAY3D_LAYERED 0x01
#define CUDA_ARRAY3D_SURFACE_LDST 0x02
#define CUDA_ARRAY3D_CUBEMAP 0x04
#define CUDA_ARRAY3D_TEXTURE_GATHER 0x08
#define CUDA_ARRAY3D_SPARSE 0x40
#define CUDA_ARRAY3D_DEFERRED_MAPPING 0x80
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* Virtual memory management (VMM). */
typedef int CUmemLocationType;
enum { CU_MEM_LOCATION_TYPE_INVALID = 0, CU_MEM_LOCATION_TYPE_DEVICE = 1 };
enum { CU_MEM_LOCATION_TYPE_HOST = 2, CU_MEM_LOCATION_TYPE_HOST_NUMA = 3, CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4 };
typedef int CUmemAllocationType;
enum { CU_MEM_ALLOCATION_TYPE_INVALID = 0, CU_MEM_ALLOCATION_TYPE_PINNED = 1 };
typedef int CUmemAllocationHandleType;
typedef int CUmemAllocationGranularity_flags;
enum { CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1 };
typedef int CUmemAccess_flags;
enum { CU_MEM_ACCESS_FLAGS_PROT_NONE = 0, CU_MEM_ACCESS_FLAGS_PROT_READ = 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 };
typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;
typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;
/* Attributes of a stream-ordered memory pool (cuMemPoolGetAttribute): the reuse policies are
 * int, the rest cuuint64_t. */
typedef int CUmemPool_attribute;
enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
};
typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

enum { CU_MEM_ATTACH_GLOBAL = 0x1, CU_MEM_ATTACH_HOST = 0x2 };
enum { CU_STREAM_DEFAULT = 0x0, CU_STREAM_NON_BLOCKING = 0x1 };
enum {
    CU_EVENT_DEFAULT = 0x0,
    CU_EVENT_BLOCKING_SYNC = 0x1,
    CU_EVENT_DISABLE_TIMING = 0x2,
    CU_EVENT_INTERPROCESS = 0x4
};
/* Special stream handles: the legacy default stream and the per-thread default stream. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
typedef int CUstreamCaptureMode;
enum { CU_STREAM_CAPTURE_MODE_GLOBAL = 0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1, CU_STREAM_CAPTURE_MODE_RELAXED = 2 };

/* Launches. */
typedef struct CUlaunchAttribute_st {
    int id;
    char pad[4];
    char value[64];
} CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* Graph introspection: how the interposer prices a graph's kernels (values and layout as
 * in CUDA 12's cuda.h; CUDA_KERNEL_NODE_PARAMS is the _v2 layout that
 * cuGraphKernelNodeGetParams_v2 fills). */
typedef struct CUkern_st *CUkernel;
typedef int CUgraphNodeType;
enum {
    CU_GRAPH_NODE_TYPE_KERNEL = 0,
    CU_GRAPH_NODE_TYPE_MEMCPY = 1,
    CU_GRAPH_NODE_TYPE_MEMSET = 2,
    CU_GRAPH_NODE_TYPE_HOST = 3,
    CU_GRAPH_NODE_TYPE_GRAPH = 4,
    CU_GRAPH_NODE_TYPE_EMPTY = 5,
    CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
    CU_GRAPH_NODE_TYPE_MEM_FREE = 11,
    CU_GRAPH_NODE_TYPE_CONDITIONAL = 13,
};
typedef struct CUDA_KERNEL_NODE_PARAMS_v2_st {
    CUfunction func;
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS;

/* Graph memory nodes (CUDA 11.4+): an allocation node's address is fixed when the node is made
 * (`dptr`, out), its memory is backed when a launch runs it and kept in the device's graph memory
 * pool until cuDeviceGraphMemTrim. Values and layout as in CUDA 12's cuda.h. */
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_v1_st {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef int CUgraphMem_attribute;
enum {
    CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,
    CU_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3,
};

/* Sharing device memory between processes: legacy IPC handles (64 opaque bytes) and VMM
 * shareable handles (a POSIX file descriptor on Linux). */
#define CU_IPC_HANDLE_SIZE 64
typedef struct CUipcMemHandle_st {
    char reserved[CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;
enum { CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1 };
enum { CU_MEM_HANDLE_TYPE_NONE = 0x0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1 };

/* Making an executable from a graph (cuGraphInstantiateWithParams) and remaking one from another
 * graph (cuGraphExecUpdate_v2): values and layout as in CUDA 12's cuda.h. */
typedef int CUgraphInstantiateResult;
enum { CUDA_GRAPH_INSTANTIATE_SUCCESS = 0, CUDA_GRAPH_INSTANTIATE_ERROR = 1 };
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    CUgraphInstantiateResult result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;
typedef int CUgraphExecUpdateResult;
enum {
    CU_GRAPH_EXEC_UPDATE_SUCCESS = 0,
    CU_GRAPH_EXEC_UPDATE_ERROR = 1,
    CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED = 2,
};
typedef struct CUgraphExecUpdateResultInfo_st {
    CUgraphExecUpdateResult result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;

/* What the driver-API clients (cuda-bindings, cuda.core, numba-cuda) use on their memory and
 * launch paths: values as in CUDA 13's cuda.h. */
typedef struct CUlib_st *CUlibrary;
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUexecAffinityParam_st CUexecAffinityParam; /* only the pointer is passed through */
typedef struct CUlinkState_st *CUlinkState;
typedef int CUjit_option;
typedef int CUjitInputType;
typedef int CUlibraryOption;
typedef int CUlimit;
typedef int CUfunc_cache;
typedef int CUdevice_P2PAttribute;
typedef int CUmoduleLoadingMode;
enum { CU_MODULE_EAGER_LOADING = 1, CU_MODULE_LAZY_LOADING = 2 };
typedef int CUfunction_attribute;
enum {
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
    CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES = 2,
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
    CU_FUNC_ATTRIBUTE_PTX_VERSION = 5,
    CU_FUNC_ATTRIBUTE_BINARY_VERSION = 6,
    CU_FUNC_ATTRIBUTE_CACHE_MODE_CA = 7,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9,
    CU_FUNC_ATTRIBUTE_MAX = 17,
};
typedef int CUpointer_attribute;
enum {
    CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
    CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
    CU_POINTER_ATTRIBUTE_SYNC_MEMOPS = 6,
    CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
    CU_POINTER_ATTRIBUTE_MAPPED = 13,
    CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES = 14,
    CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 15,
    CU_POINTER_ATTRIBUTE_ACCESS_FLAGS = 16,
    CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17,
    CU_POINTER_ATTRIBUTE_MAPPING_SIZE = 18,
    CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR = 19,
    CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID = 20,
    CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE = 21,
};
typedef int CUmemorytype;
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2, CU_MEMORYTYPE_ARRAY = 3, CU_MEMORYTYPE_UNIFIED = 4 };
enum {
    CU_MEMHOSTALLOC_PORTABLE = 0x01,
    CU_MEMHOSTALLOC_DEVICEMAP = 0x02,
    CU_MEMHOSTALLOC_WRITECOMBINED = 0x04,
    CU_MEMHOSTREGISTER_PORTABLE = 0x01,
    CU_MEMHOSTREGISTER_DEVICEMAP = 0x02,
    CU_MEMHOSTREGISTER_IOMEMORY = 0x04,
    CU_MEMHOSTREGISTER_READ_ONLY = 0x08,
};
typedef int CUstreamCaptureStatus;
enum { CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_STREAM_CAPTURE_STATUS_ACTIVE = 1 };
typedef void (*CUhostFn)(void *userData);
typedef void (*CUstreamCallback)(CUstream hStream, CUresult status, void *userData);
enum { CU_EVENT_WAIT_DEFAULT = 0x0, CU_EVENT_RECORD_DEFAULT = 0x0 };
#define SIM_STREAM_GREATEST_PRIORITY (-5) /* a Hopper part's range: 0 (least) to -5 */
/* The checkpoint API (CUDA 12.8+): another process locks, checkpoints, restores and unlocks a
 * CUDA process by pid. Every args struct is 64 bytes; reserved fields must be zero. The restore
 * args are the 12.8 layout (later drivers put GPU remapping pairs, then custom storage, in the
 * same 64 bytes; zeroed, every layout means "restore where it was"). */
typedef int CUprocessState;
enum {
    CU_PROCESS_STATE_RUNNING = 0,
    CU_PROCESS_STATE_LOCKED = 1,
    CU_PROCESS_STATE_CHECKPOINTED = 2,
    CU_PROCESS_STATE_FAILED = 3,
};
typedef struct CUcheckpointLockArgs_st {
    unsigned int timeoutMs; /* 0: wait as long as it takes */
    unsigned int reserved0;
    cuuint64_t reserved1[7];
} CUcheckpointLockArgs;
typedef struct CUcheckpointCheckpointArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointCheckpointArgs;
typedef struct CUcheckpointRestoreArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointRestoreArgs;
typedef struct CUcheckpointUnlockArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointUnlockArgs;

/* cuCtxCreate_v4 parameters (CUDA 12.5+); only the pointer is passed through. */
typedef struct CUctxCreateParams_st CUctxCreateParams;

/*
 * Entry points, one line each: VGPU_CUDA_API(return, name, (params)).
 * A translation unit defines VGPU_CUDA_API before including this list to declare prototypes,
 * typedefs of function-pointer types, or tables; by default it declares prototypes.
 */
/* One entry point a line (tests/sim/test_sim_exports.py reads the list), left as written: */
/* clang-format off */
#define VGPU_CUDA_ENTRY_POINTS(X) \
    X(CUresult, cuInit, (unsigned int Flags)) \
    X(CUresult, cuDriverGetVersion, (int *driverVersion)) \
    X(CUresult, cuGetErrorString, (CUresult error, const char **pStr)) \
    X(CUresult, cuGetErrorName, (CUresult error, const char **pStr)) \
    X(CUresult, cuGetProcAddress, (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)) \
    X(CUresult, cuGetProcAddress_v2, (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)) \
    X(CUresult, cuDeviceGet, (CUdevice *device, int ordinal)) \
    X(CUresult, cuDeviceGetCount, (int *count)) \
    X(CUresult, cuDeviceGetName, (char *name, int len, CUdevice dev)) \
    X(CUresult, cuDeviceGetUuid, (CUuuid *uuid, CUdevice dev)) \
    X(CUresult, cuDeviceGetUuid_v2, (CUuuid *uuid, CUdevice dev)) \
    X(CUresult, cuDeviceGetAttribute, (int *pi, CUdevice_attribute attrib, CUdevice dev)) \
    X(CUresult, cuDeviceComputeCapability, (int *major, int *minor, CUdevice dev)) \
    X(CUresult, cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev)) \
    X(CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool *pool_out, CUdevice dev)) \
    X(CUresult, cuDeviceGetMemPool, (CUmemoryPool *pool, CUdevice dev)) \
    X(CUresult, cuDeviceSetMemPool, (CUdevice dev, CUmemoryPool pool)) \
    X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxReset_v2, (CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxGetState, (CUdevice dev, unsigned int *flags, int *active)) \
    X(CUresult, cuDevicePrimaryCtxSetFlags_v2, (CUdevice dev, unsigned int flags)) \
    X(CUresult, cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev)) \
    X(CUresult, cuCtxCreate_v4, (CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev)) \
    X(CUresult, cuCtxDestroy_v2, (CUcontext ctx)) \
    X(CUresult, cuCtxSetCurrent, (CUcontext ctx)) \
    X(CUresult, cuCtxGetCurrent, (CUcontext *pctx)) \
    X(CUresult, cuCtxPushCurrent_v2, (CUcontext ctx)) \
    X(CUresult, cuCtxPopCurrent_v2, (CUcontext *pctx)) \
    X(CUresult, cuCtxGetDevice, (CUdevice *device)) \
    X(CUresult, cuCtxSynchronize, (void)) \
    X(CUresult, cuMemGetInfo_v2, (size_t *free, size_t *total)) \
    X(CUresult, cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize)) \
    X(CUresult, cuMemAllocPitch_v2, (CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes)) \
    X(CUresult, cuMemAllocManaged, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags)) \
    X(CUresult, cuMemFree_v2, (CUdeviceptr dptr)) \
    X(CUresult, cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream)) \
    X(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream)) \
    X(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)) \
    X(CUresult, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)) \
    X(CUresult, cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream)) \
    X(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream hStream)) \
    X(CUresult, cuMemPoolCreate, (CUmemoryPool *pool, const CUmemPoolProps *poolProps)) \
    X(CUresult, cuMemPoolDestroy, (CUmemoryPool pool)) \
    X(CUresult, cuMemPoolGetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value)) \
    X(CUresult, cuMemPoolSetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value)) \
    X(CUresult, cuMemPoolTrimTo, (CUmemoryPool pool, size_t minBytesToKeep)) \
    X(CUresult, cuMemCreate, (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)) \
    X(CUresult, cuMemRelease, (CUmemGenericAllocationHandle handle)) \
    X(CUresult, cuMemAddressReserve, (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags)) \
    X(CUresult, cuMemAddressFree, (CUdeviceptr ptr, size_t size)) \
    X(CUresult, cuMemMap, (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)) \
    X(CUresult, cuMemUnmap, (CUdeviceptr ptr, size_t size)) \
    X(CUresult, cuMemSetAccess, (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)) \
    X(CUresult, cuMemGetAllocationGranularity, (size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option)) \
    X(CUresult, cuDeviceGraphMemTrim, (CUdevice device)) \
    X(CUresult, cuDeviceGetGraphMemAttribute, (CUdevice device, CUgraphMem_attribute attr, void *value)) \
    X(CUresult, cuArrayCreate_v2, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)) \
    X(CUresult, cuArray3DCreate_v2, (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)) \
    X(CUresult, cuArrayDestroy, (CUarray hArray)) \
    X(CUresult, cuMipmappedArrayCreate, (CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc, unsigned int numMipmapLevels)) \
    X(CUresult, cuMipmappedArrayDestroy, (CUmipmappedArray hMipmappedArray)) \
    X(CUresult, cuMemcpyHtoD_v2, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)) \
    X(CUresult, cuMemcpyDtoH_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)) \
    X(CUresult, cuMemsetD8_v2, (CUdeviceptr dstDevice, unsigned char uc, size_t N)) \
    X(CUresult, cuStreamCreate, (CUstream *phStream, unsigned int Flags)) \
    X(CUresult, cuStreamDestroy_v2, (CUstream hStream)) \
    X(CUresult, cuStreamSynchronize, (CUstream hStream)) \
    X(CUresult, cuStreamQuery, (CUstream hStream)) \
    X(CUresult, cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode)) \
    X(CUresult, cuStreamEndCapture, (CUstream hStream, CUgraph *phGraph)) \
    X(CUresult, cuEventCreate, (CUevent *phEvent, unsigned int Flags)) \
    X(CUresult, cuEventRecord, (CUevent hEvent, CUstream hStream)) \
    X(CUresult, cuEventSynchronize, (CUevent hEvent)) \
    X(CUresult, cuEventQuery, (CUevent hEvent)) \
    X(CUresult, cuEventElapsedTime, (float *pMilliseconds, CUevent hStart, CUevent hEnd)) \
    X(CUresult, cuEventDestroy_v2, (CUevent hEvent)) \
    X(CUresult, cuModuleLoadData, (CUmodule *module, const void *image)) \
    X(CUresult, cuModuleUnload, (CUmodule hmod)) \
    X(CUresult, cuModuleGetFunction, (CUfunction *hfunc, CUmodule hmod, const char *name)) \
    X(CUresult, cuLaunchKernel, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)) \
    X(CUresult, cuLaunchKernel_ptsz, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)) \
    X(CUresult, cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)) \
    X(CUresult, cuLaunchKernelEx_ptsz, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)) \
    X(CUresult, cuLaunchCooperativeKernel, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)) \
    X(CUresult, cuLaunchCooperativeKernel_ptsz, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)) \
    X(CUresult, cuGraphInstantiateWithFlags, (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)) \
    X(CUresult, cuGraphInstantiateWithParams, (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)) \
    X(CUresult, cuGraphInstantiateWithParams_ptsz, (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)) \
    X(CUresult, cuGraphInstantiate_v2, (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize)) \
    X(CUresult, cuGraphExecUpdate, (CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out, CUgraphExecUpdateResult *updateResult_out)) \
    X(CUresult, cuGraphExecUpdate_v2, (CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo)) \
    X(CUresult, cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream)) \
    X(CUresult, cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream)) \
    X(CUresult, cuGraphExecDestroy, (CUgraphExec hGraphExec)) \
    X(CUresult, cuGraphDestroy, (CUgraph hGraph)) \
    X(CUresult, cuCheckpointProcessGetState, (int pid, CUprocessState *state)) \
    X(CUresult, cuCheckpointProcessGetRestoreThreadId, (int pid, int *tid)) \
    X(CUresult, cuCheckpointProcessLock, (int pid, CUcheckpointLockArgs *args)) \
    X(CUresult, cuCheckpointProcessCheckpoint, (int pid, CUcheckpointCheckpointArgs *args)) \
    X(CUresult, cuCheckpointProcessRestore, (int pid, CUcheckpointRestoreArgs *args)) \
    X(CUresult, cuCheckpointProcessUnlock, (int pid, CUcheckpointUnlockArgs *args))
/* clang-format on */

/*
 * Entry points the simulated driver models for driver-API clients (cuda-bindings, cuda.core,
 * numba-cuda) and the interposer neither hooks nor calls. Same form as the list above.
 */
/* One entry point a line (tests/sim/test_sim_exports.py reads the list), left as written: */
/* clang-format off */
#define VGPU_SIM_CLIENT_ENTRY_POINTS(X) \
    X(CUresult, cuCtxCreate_v3, (CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags, CUdevice dev)) \
    X(CUresult, cuCtxGetDevice_v2, (CUdevice *device, CUcontext ctx)) \
    X(CUresult, cuCtxSynchronize_v2, (CUcontext ctx)) \
    X(CUresult, cuCtxGetApiVersion, (CUcontext ctx, unsigned int *version)) \
    X(CUresult, cuCtxGetFlags, (unsigned int *flags)) \
    X(CUresult, cuCtxGetId, (CUcontext ctx, unsigned long long *ctxId)) \
    X(CUresult, cuCtxGetStreamPriorityRange, (int *leastPriority, int *greatestPriority)) \
    X(CUresult, cuCtxGetLimit, (size_t *pvalue, CUlimit limit)) \
    X(CUresult, cuCtxSetLimit, (CUlimit limit, size_t value)) \
    X(CUresult, cuCtxGetCacheConfig, (CUfunc_cache *pconfig)) \
    X(CUresult, cuCtxSetCacheConfig, (CUfunc_cache config)) \
    X(CUresult, cuCtxEnablePeerAccess, (CUcontext peerContext, unsigned int Flags)) \
    X(CUresult, cuCtxDisablePeerAccess, (CUcontext peerContext)) \
    X(CUresult, cuDeviceCanAccessPeer, (int *canAccessPeer, CUdevice dev, CUdevice peerDev)) \
    X(CUresult, cuDeviceGetP2PAttribute, (int *value, CUdevice_P2PAttribute attrib, CUdevice srcDevice, CUdevice dstDevice)) \
    X(CUresult, cuDeviceGetPCIBusId, (char *pciBusId, int len, CUdevice dev)) \
    X(CUresult, cuDeviceGetByPCIBusId, (CUdevice *dev, const char *pciBusId)) \
    X(CUresult, cuMemsetD16_v2, (CUdeviceptr dstDevice, unsigned short us, size_t N)) \
    X(CUresult, cuMemsetD32_v2, (CUdeviceptr dstDevice, unsigned int ui, size_t N)) \
    X(CUresult, cuMemsetD8Async, (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)) \
    X(CUresult, cuMemsetD16Async, (CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream)) \
    X(CUresult, cuMemsetD32Async, (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)) \
    X(CUresult, cuMemcpyDtoD_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)) \
    X(CUresult, cuMemcpy, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)) \
    X(CUresult, cuMemcpyAsync, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
    X(CUresult, cuMemcpyHtoDAsync_v2, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)) \
    X(CUresult, cuMemcpyDtoHAsync_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)) \
    X(CUresult, cuMemcpyDtoDAsync_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)) \
    X(CUresult, cuMemHostAlloc, (void **pp, size_t bytesize, unsigned int Flags)) \
    X(CUresult, cuMemAllocHost_v2, (void **pp, size_t bytesize)) \
    X(CUresult, cuMemFreeHost, (void *p)) \
    X(CUresult, cuMemHostGetDevicePointer_v2, (CUdeviceptr *pdptr, void *p, unsigned int Flags)) \
    X(CUresult, cuMemHostGetFlags, (unsigned int *pFlags, void *p)) \
    X(CUresult, cuMemHostRegister_v2, (void *p, size_t bytesize, unsigned int Flags)) \
    X(CUresult, cuMemHostUnregister, (void *p)) \
    X(CUresult, cuPointerGetAttribute, (void *data, CUpointer_attribute attribute, CUdeviceptr ptr)) \
    X(CUresult, cuPointerGetAttributes, (unsigned int numAttributes, CUpointer_attribute *attributes, void **data, CUdeviceptr ptr)) \
    X(CUresult, cuMemGetAddressRange_v2, (CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)) \
    X(CUresult, cuStreamCreateWithPriority, (CUstream *phStream, unsigned int flags, int priority)) \
    X(CUresult, cuStreamGetPriority, (CUstream hStream, int *priority)) \
    X(CUresult, cuStreamGetFlags, (CUstream hStream, unsigned int *flags)) \
    X(CUresult, cuStreamGetCtx, (CUstream hStream, CUcontext *pctx)) \
    X(CUresult, cuStreamGetCtx_v2, (CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)) \
    X(CUresult, cuStreamGetId, (CUstream hStream, unsigned long long *streamId)) \
    X(CUresult, cuStreamGetDevice, (CUstream hStream, CUdevice *device)) \
    X(CUresult, cuStreamIsCapturing, (CUstream hStream, CUstreamCaptureStatus *captureStatus)) \
    X(CUresult, cuStreamWaitEvent, (CUstream hStream, CUevent hEvent, unsigned int Flags)) \
    X(CUresult, cuStreamAddCallback, (CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags)) \
    X(CUresult, cuLaunchHostFunc, (CUstream hStream, CUhostFn fn, void *userData)) \
    X(CUresult, cuEventRecordWithFlags, (CUevent hEvent, CUstream hStream, unsigned int flags)) \
    X(CUresult, cuEventElapsedTime_v2, (float *pMilliseconds, CUevent hStart, CUevent hEnd)) \
    X(CUresult, cuModuleLoadDataEx, (CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options, void **optionValues)) \
    X(CUresult, cuModuleGetLoadingMode, (CUmoduleLoadingMode *mode)) \
    X(CUresult, cuLinkCreate_v2, (unsigned int numOptions, CUjit_option *options, void **optionValues, CUlinkState *stateOut)) \
    X(CUresult, cuLinkAddData_v2, (CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name, unsigned int numOptions, CUjit_option *options, void **optionValues)) \
    X(CUresult, cuLinkAddFile_v2, (CUlinkState state, CUjitInputType type, const char *path, unsigned int numOptions, CUjit_option *options, void **optionValues)) \
    X(CUresult, cuLinkComplete, (CUlinkState state, void **cubinOut, size_t *sizeOut)) \
    X(CUresult, cuLinkDestroy, (CUlinkState state)) \
    X(CUresult, cuLibraryLoadData, (CUlibrary *library, const void *code, CUjit_option *jitOptions, void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions, void **libraryOptionValues, unsigned int numLibraryOptions)) \
    X(CUresult, cuLibraryUnload, (CUlibrary library)) \
    X(CUresult, cuLibraryGetKernel, (CUkernel *pKernel, CUlibrary library, const char *name)) \
    X(CUresult, cuLibraryGetModule, (CUmodule *pMod, CUlibrary library)) \
    X(CUresult, cuKernelGetFunction, (CUfunction *pFunc, CUkernel kernel)) \
    X(CUresult, cuKernelGetLibrary, (CUlibrary *pLib, CUkernel kernel)) \
    X(CUresult, cuKernelGetName, (const char **name, CUkernel hfunc)) \
    X(CUresult, cuKernelGetAttribute, (int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev)) \
    X(CUresult, cuKernelSetAttribute, (CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev)) \
    X(CUresult, cuFuncGetAttribute, (int *pi, CUfunction_attribute attrib, CUfunction hfunc)) \
    X(CUresult, cuFuncSetAttribute, (CUfunction hfunc, CUfunction_attribute attrib, int value)) \
    X(CUresult, cuFuncSetCacheConfig, (CUfunction hfunc, CUfunc_cache config)) \
    X(CUresult, cuFuncGetName, (const char **name, CUfunction hfunc)) \
    X(CUresult, cuFuncGetModule, (CUmodule *hmod, CUfunction hfunc)) \
    X(CUresult, cuOccupancyMaxActiveBlocksPerMultiprocessor, (int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize)) \
    X(CUresult, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, (int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize, unsigned int flags)) \
    X(CUresult, cuGraphCreate, (CUgraph *phGraph, unsigned int flags)) \
    X(CUresult, cuGraphAddMemAllocNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)) \
    X(CUresult, cuGraphAddMemFreeNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, CUdeviceptr dptr)) \
    X(CUresult, cuGraphMemFreeNodeGetParams, (CUgraphNode hNode, CUdeviceptr *dptr_out)) \
    X(CUresult, cuDeviceSetGraphMemAttribute, (CUdevice device, CUgraphMem_attribute attr, void *value)) \
    X(CUresult, cuIpcGetMemHandle, (CUipcMemHandle *pHandle, CUdeviceptr dptr)) \
    X(CUresult, cuIpcOpenMemHandle_v2, (CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)) \
    X(CUresult, cuIpcCloseMemHandle, (CUdeviceptr dptr)) \
    X(CUresult, cuMemExportToShareableHandle, (void *shareableHandle, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType handleType, unsigned long long flags)) \
    X(CUresult, cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *handle, void *osHandle, CUmemAllocationHandleType shHandleType))
/* clang-format on */

/*
 * Entry points the interposer calls only when the installed driver has them, looked up by name
 * (vgpu_real_symbol); without them it falls back to an estimate. Every real driver since CUDA
 * 12.0 exports them; the simulated driver need not. Same form as the list above.
 */
/* One entry point a line (tests/sim/test_sim_exports.py reads the list), left as written: */
/* clang-format off */
#define VGPU_CUDA_OPTIONAL_ENTRY_POINTS(X) \
    X(CUresult, cuGraphGetNodes, (CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)) \
    X(CUresult, cuGraphNodeGetType, (CUgraphNode hNode, CUgraphNodeType *type)) \
    X(CUresult, cuGraphKernelNodeGetParams_v2, (CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *nodeParams)) \
    X(CUresult, cuGraphChildGraphNodeGetGraph, (CUgraphNode hNode, CUgraph *phGraph)) \
    X(CUresult, cuGraphMemAllocNodeGetParams, (CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out))
/* clang-format on */

#define VGPU_DECLARE_PROTOTYPE(ret, name, params) ret name params;
VGPU_CUDA_ENTRY_POINTS(VGPU_DECLARE_PROTOTYPE)
VGPU_CUDA_OPTIONAL_ENTRY_POINTS(VGPU_DECLARE_PROTOTYPE)
VGPU_SIM_CLIENT_ENTRY_POINTS(VGPU_DECLARE_PROTOTYPE)
#undef VGPU_DECLARE_PROTOTYPE

#ifdef __cplusplus
}
#endif
#endif /* VGPU_CUDA_ABI_H */
