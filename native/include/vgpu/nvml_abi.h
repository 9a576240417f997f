/*
 * The slice of the NVML ABI that jupyter-vgpu uses, declared from the public ABI so the build
 * needs no NVIDIA headers. Shared by the interposer and the simulated NVML.
 */
#ifndef VGPU_NVML_ABI_H
#define VGPU_NVML_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80
#define NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE 80
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16

typedef struct nvmlDevice_st *nvmlDevice_t;

/* nvmlTemperatureSensors_t */
enum { NVML_TEMPERATURE_GPU = 0 };

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define NVML_STRUCT_VERSION(data, ver) (unsigned int)(sizeof(nvml##data##_v##ver##_t) | ((ver) << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct nvmlProcessUtilizationSample_st {
    unsigned int pid;
    unsigned long long timeStamp; /* CPU timestamp in microseconds */
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

/* What the unversioned (v1) process query fills: no MIG instance ids. */
typedef struct nvmlProcessInfo_v1_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* nvmlProcessInfo_v2_t; the _v2 and _v3 process queries fill this layout. */
typedef struct nvmlProcessInfo_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

/* Entry points, one line each, as in cuda_abi.h. */
/* One entry point a line (tests/sim/test_sim_exports.py reads the list), left as written: */
/* clang-format off */
#define VGPU_NVML_ENTRY_POINTS(X) \
    X(nvmlReturn_t, nvmlInit, (void)) \
    X(nvmlReturn_t, nvmlInit_v2, (void)) \
    X(nvmlReturn_t, nvmlInitWithFlags, (unsigned int flags)) \
    X(nvmlReturn_t, nvmlShutdown, (void)) \
    X(const char *, nvmlErrorString, (nvmlReturn_t result)) \
    X(nvmlReturn_t, nvmlSystemGetDriverVersion, (char *version, unsigned int length)) \
    X(nvmlReturn_t, nvmlSystemGetNVMLVersion, (char *version, unsigned int length)) \
    X(nvmlReturn_t, nvmlSystemGetCudaDriverVersion, (int *cudaDriverVersion)) \
    X(nvmlReturn_t, nvmlSystemGetCudaDriverVersion_v2, (int *cudaDriverVersion)) \
    X(nvmlReturn_t, nvmlDeviceGetCount, (unsigned int *deviceCount)) \
    X(nvmlReturn_t, nvmlDeviceGetCount_v2, (unsigned int *deviceCount)) \
    X(nvmlReturn_t, nvmlDeviceGetHandleByIndex, (unsigned int index, nvmlDevice_t *device)) \
    X(nvmlReturn_t, nvmlDeviceGetHandleByIndex_v2, (unsigned int index, nvmlDevice_t *device)) \
    X(nvmlReturn_t, nvmlDeviceGetHandleByUUID, (const char *uuid, nvmlDevice_t *device)) \
    X(nvmlReturn_t, nvmlDeviceGetIndex, (nvmlDevice_t device, unsigned int *index)) \
    X(nvmlReturn_t, nvmlDeviceGetName, (nvmlDevice_t device, char *name, unsigned int length)) \
    X(nvmlReturn_t, nvmlDeviceGetUUID, (nvmlDevice_t device, char *uuid, unsigned int length)) \
    X(nvmlReturn_t, nvmlDeviceGetPciInfo_v3, (nvmlDevice_t device, nvmlPciInfo_t *pci)) \
    X(nvmlReturn_t, nvmlDeviceGetCudaComputeCapability, (nvmlDevice_t device, int *major, int *minor)) \
    X(nvmlReturn_t, nvmlDeviceGetNumGpuCores, (nvmlDevice_t device, unsigned int *numCores)) \
    X(nvmlReturn_t, nvmlDeviceGetMemoryInfo, (nvmlDevice_t device, nvmlMemory_t *memory)) \
    X(nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t device, nvmlMemory_v2_t *memory)) \
    X(nvmlReturn_t, nvmlDeviceGetUtilizationRates, (nvmlDevice_t device, nvmlUtilization_t *utilization)) \
    X(nvmlReturn_t, nvmlDeviceGetProcessUtilization, (nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization, unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp)) \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos)) \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses_v2, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)) \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)) \
    X(nvmlReturn_t, nvmlDeviceGetTemperature, (nvmlDevice_t device, int sensorType, unsigned int *temp)) \
    X(nvmlReturn_t, nvmlDeviceGetPowerUsage, (nvmlDevice_t device, unsigned int *power))
/* clang-format on */

#define VGPU_DECLARE_PROTOTYPE(ret, name, params) ret name params;
VGPU_NVML_ENTRY_POINTS(VGPU_DECLARE_PROTOTYPE)
#undef VGPU_DECLARE_PROTOTYPE

#ifdef __cplusplus
}
#endif
#endif /* VGPU_NVML_ABI_H */
