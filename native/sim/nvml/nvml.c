/*
 * The simulated libnvidia-ml.so.1: NVML's view of the simulated machine. It shows every device
 * (NVML ignores CUDA_VISIBLE_DEVICES, as the real one does) with the memory and utilisation
 * that all processes' simulated libcuda put in the shared state file.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#pragma GCC visibility push(default)
#include "vgpu/nvml_abi.h"
#pragma GCC visibility pop

#include "vgpu/cuda_abi.h"
#include "../common/sim.h"

#define SIM_DRIVER_VERSION "570.124.06"
#define SIM_NVML_VERSION "12.570.124.06"
#define SIM_TEMPERATURE_C 45u
#define SIM_POWER_MW 70000u
#define SIM_CORES_PER_SM 128u

struct nvmlDevice_st {
    int index;
};

/* The library's one piece of process state. */
static struct sim_nvml {
    pthread_mutex_t lock; /* init and shutdown */
    _Atomic int refcount; /* nvmlInit calls not yet matched by nvmlShutdown */
    struct sim_machine machine;
    struct nvmlDevice_st handles[SIM_MAX_DEVICES];
} nvml = {.lock = PTHREAD_MUTEX_INITIALIZER};

static nvmlReturn_t init(void)
{
    pthread_mutex_lock(&nvml.lock);
    nvmlReturn_t result = NVML_SUCCESS;
    if (atomic_load(&nvml.refcount) == 0) {
        /* Read afresh at every first init: a long-lived process may switch machines. */
        struct sim_env env;
        sim_env_read(&env);
        if (sim_machine_open(&nvml.machine, &env, "libnvidia-ml (jupyter-vgpu simulated GPU)") != 0) {
            result = NVML_ERROR_DRIVER_NOT_LOADED;
            goto out;
        }
        for (int i = 0; i < nvml.machine.spec.count; i++) {
            nvml.handles[i].index = i;
            sim_reap_dead(&nvml.machine.devices[i]);
        }
    }
    atomic_fetch_add(&nvml.refcount, 1);
out:
    pthread_mutex_unlock(&nvml.lock);
    return result;
}

nvmlReturn_t nvmlInit(void)
{
    return init();
}

nvmlReturn_t nvmlInit_v2(void)
{
    return init();
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS / NO_ATTACH change nothing on a simulated machine */
    return init();
}

nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&nvml.lock);
    nvmlReturn_t result = NVML_SUCCESS;
    if (atomic_load(&nvml.refcount) == 0)
        result = NVML_ERROR_UNINITIALIZED;
    else if (atomic_fetch_sub(&nvml.refcount, 1) == 1)
        sim_machine_close(&nvml.machine);
    pthread_mutex_unlock(&nvml.lock);
    return result;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    static const struct {
        nvmlReturn_t code;
        const char *text;
    } strings[] = {
        {0, "Success"},
        {1, "Uninitialized"},
        {2, "Invalid Argument"},
        {3, "Not Supported"},
        {4, "Insufficient Permissions"},
        {5, "Already Initialized"},
        {6, "Not Found"},
        {7, "Insufficient Size"},
        {8, "Insufficient External Power"},
        {9, "Driver Not Loaded"},
        {10, "Timeout"},
        {11, "Interrupt Request Issue"},
        {12, "NVML Shared Library Not Found"},
        {13, "Function Not Found"},
        {14, "Corrupted infoROM"},
        {15, "GPU is lost"},
        {16, "GPU requires restart"},
        {17, "The operating system has blocked the request"},
        {18, "RM has detected an NVML/RM version mismatch"},
        {19, "In use by another client"},
        {20, "Insufficient Memory"},
        {21, "No data"},
        {22, "The requested vgpu operation is not available on target device, because ECC is enabled"},
        {23, "Insufficient resources"},
        {24, "Frequency not supported"},
        {25, "Argument version mismatch"},
        {26, "Deprecated"},
        {27, "Not ready"},
        {28, "GPU not found"},
        {29, "Invalid state"},
        {30, "Reset not supported"},
        {999, "Unknown Error"},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (strings[i].code == result)
            return strings[i].text;
    return "Unknown Error";
}

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *text)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

static int initialised(void)
{
    return atomic_load(&nvml.refcount) > 0;
}

/* A call checked as NVML checks it: initialised, then the arguments (`arguments_valid`). */
static nvmlReturn_t check(int arguments_valid)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    return arguments_valid ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

/* The device behind a handle (handles are addresses in nvml.handles, nothing else is one), checked
 * as NVML checks a call: initialised, then the handle and the other arguments (`arguments_valid`). */
static nvmlReturn_t device_of(nvmlDevice_t handle, struct sim_device_view **device, int arguments_valid)
{
    uintptr_t first = (uintptr_t)&nvml.handles[0], address = (uintptr_t)handle;
    int known = address >= first && address < first + (uintptr_t)nvml.machine.spec.count * sizeof nvml.handles[0] &&
                (address - first) % sizeof nvml.handles[0] == 0;
    nvmlReturn_t result = check(known && arguments_valid);
    if (result == NVML_SUCCESS)
        *device = &nvml.machine.devices[handle->index];
    return result;
}

/* The body of a device query: `value`, an expression of the `device` behind `handle`. */
#define HANDLE_ANSWER(handle, out, value)                                                                              \
    SIM_ANSWER(nvmlReturn_t, struct sim_device_view, device, device_of(handle, &device, (out) != NULL), out, value)

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return initialised() ? copy_string(version, length, SIM_DRIVER_VERSION) : NVML_ERROR_UNINITIALIZED;
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return copy_string(version, length, SIM_NVML_VERSION);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = sim_driver_version();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    nvmlReturn_t result = check(deviceCount != NULL);
    if (result == NVML_SUCCESS)
        *deviceCount = (unsigned int)nvml.machine.spec.count;
    return result;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount(deviceCount);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t result = check(device && index < (unsigned int)nvml.machine.spec.count);
    if (result == NVML_SUCCESS)
        *device = &nvml.handles[index];
    return result;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t result = check(uuid && device);
    if (result != NVML_SUCCESS)
        return result;
    for (int i = 0; i < nvml.machine.spec.count; i++) {
        if (strcmp(nvml.machine.spec.devices[i].uuid, uuid) == 0) {
            *device = &nvml.handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t handle, unsigned int *index)
{
    HANDLE_ANSWER(handle, index, (unsigned int)device->index);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t handle, char *name, unsigned int length)
{
    struct sim_device_view *device;
    nvmlReturn_t result = device_of(handle, &device, 1);
    return result != NVML_SUCCESS ? result : copy_string(name, length, device->spec->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t handle, char *uuid, unsigned int length)
{
    struct sim_device_view *device;
    nvmlReturn_t result = device_of(handle, &device, 1);
    return result != NVML_SUCCESS ? result : copy_string(uuid, length, device->spec->uuid);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t handle, nvmlPciInfo_t *pci)
{
    struct sim_device_view *device;
    nvmlReturn_t result = device_of(handle, &device, pci != NULL);
    if (result != NVML_SUCCESS)
        return result;
    memset(pci, 0, sizeof *pci);
    pci->domain = 0;
    pci->bus = (unsigned int)SIM_PCI_BUS(device->index);
    pci->device = 0;
    pci->pciDeviceId = SIM_PCI_DEVICE_ID;
    pci->pciSubSystemId = SIM_PCI_SUBSYSTEM_ID;
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", pci->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", pci->bus);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t handle, int *major, int *minor)
{
    struct sim_device_view *device;
    nvmlReturn_t result = device_of(handle, &device, major && minor);
    if (result == NVML_SUCCESS) {
        *major = SIM_CC_MAJOR;
        *minor = SIM_CC_MINOR;
    }
    return result;
}

nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t handle, unsigned int *numCores)
{
    HANDLE_ANSWER(handle, numCores, device->spec->sms * SIM_CORES_PER_SM);
}

/* Device totals over every process; a dead process's memory is freed first, as the driver
 * frees it when the process goes. */
static void memory_totals(struct sim_device_view *device, unsigned long long *total, unsigned long long *used)
{
    sim_reap_dead(device);
    *total = device->spec->memory;
    uint64_t held = sim_device_used(device);
    *used = held < *total ? held : *total;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t handle, nvmlMemory_t *memory)
{
    struct sim_device_view *device;
    nvmlReturn_t result = device_of(handle, &device, memory != NULL);
    if (result != NVML_SUCCESS)
        return result;
    memory_totals(device, &memory->total, &memory->used);
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t handle, nvmlMemory_v2_t *memory)
{
    struct sim_device_view *device;
    nvmlReturn_t result = device_of(handle, &device, memory != NULL);
    if (result != NVML_SUCCESS)
        return result;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory_totals(device, &memory->total, &memory->used);
    memory->reserved = 0; /* the simulated driver keeps no memory outside contexts */
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

static unsigned int percent(uint64_t part, uint64_t whole)
{
    if (whole == 0)
        return 0;
    uint64_t value = (part * 100 + whole / 2) / whole;
    return value > 100 ? 100 : (unsigned int)value;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t handle, nvmlUtilization_t *utilization)
{
    struct sim_device_view *device;
    nvmlReturn_t result = device_of(handle, &device, utilization != NULL);
    if (result != NVML_SUCCESS)
        return result;
    struct sim_usage usage;
    uint64_t now = sim_now_ns();
    uint64_t from = now > SIM_SAMPLE_PERIOD_NS ? now - SIM_SAMPLE_PERIOD_NS : 0;
    sim_usage_scan(device, from, now, now, &usage);
    utilization->gpu = percent(usage.device_busy_ns, now - from);
    utilization->memory = 0; /* the simulator models no memory traffic */
    return NVML_SUCCESS;
}

/* CLOCK_REALTIME microseconds (NVML's timestamps) to the timeline's CLOCK_MONOTONIC ns. */
static uint64_t realtime_us_to_timeline(unsigned long long realtime_us, uint64_t now_timeline, uint64_t now_real_ns)
{
    uint64_t at_real_ns = (uint64_t)realtime_us * 1000ull;
    if (at_real_ns >= now_real_ns)
        return now_timeline;
    uint64_t ago = now_real_ns - at_real_ns;
    return ago < now_timeline ? now_timeline - ago : 0;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t handle, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp)
{
    struct sim_device_view *device;
    nvmlReturn_t result = device_of(handle, &device, processSamplesCount != NULL);
    if (result != NVML_SUCCESS)
        return result;

    struct sim_process processes[SIM_MAX_PROCS];
    int count = sim_list_processes(device, processes, SIM_MAX_PROCS);
    struct timespec real;
    clock_gettime(CLOCK_REALTIME, &real);
    uint64_t now_real_ns = (uint64_t)real.tv_sec * 1000000000ull + (uint64_t)real.tv_nsec;
    uint64_t now = sim_now_ns();
    uint64_t last_seen = realtime_us_to_timeline(lastSeenTimeStamp, now, now_real_ns);
    uint64_t period_start = now > SIM_SAMPLE_PERIOD_NS ? now - SIM_SAMPLE_PERIOD_NS : 0;
    uint64_t from = last_seen > period_start ? last_seen : period_start;
    struct sim_usage usage;
    sim_usage_scan(device, from, now, last_seen, &usage);

    nvmlProcessUtilizationSample_t samples[SIM_MAX_PROCS];
    unsigned int found = 0;
    for (int i = 0; i < count; i++) {
        int slot = processes[i].slot;
        if (!usage.slot_active[slot])
            continue;
        samples[found++] = (nvmlProcessUtilizationSample_t){
            .pid = (unsigned int)processes[i].pid,
            .timeStamp = now_real_ns / 1000ull,
            .smUtil = percent(usage.slot_weighted_ns[slot], now - from),
        };
    }
    if (found == 0)
        return NVML_ERROR_NOT_FOUND;
    if (!utilization || *processSamplesCount < found) {
        *processSamplesCount = found;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(utilization, samples, found * sizeof samples[0]);
    *processSamplesCount = found;
    return NVML_SUCCESS;
}

/* The processes holding memory on a device, checked as NVML checks the query: *infoCount is the
 * room in the caller's array, and a short array gets INSUFFICIENT_SIZE with the room needed. */
static nvmlReturn_t running_processes(nvmlDevice_t handle, unsigned int *infoCount, const void *infos,
                                      struct sim_process processes[SIM_MAX_PROCS], unsigned int *count)
{
    struct sim_device_view *device;
    nvmlReturn_t result = device_of(handle, &device, infoCount != NULL);
    if (result != NVML_SUCCESS)
        return result;
    *count = (unsigned int)sim_list_processes(device, processes, SIM_MAX_PROCS);
    if (*infoCount < *count || (!infos && *count > 0)) {
        *infoCount = *count;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *infoCount = *count;
    return NVML_SUCCESS;
}

/* The v1 query fills the shorter v1 layout: a v2 entry written there would run into the next. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    struct sim_process processes[SIM_MAX_PROCS];
    unsigned int count;
    nvmlReturn_t result = running_processes(device, infoCount, infos, processes, &count);
    for (unsigned int i = 0; result == NVML_SUCCESS && i < count; i++)
        infos[i] = (nvmlProcessInfo_v1_t){.pid = (unsigned int)processes[i].pid, .usedGpuMemory = processes[i].memory};
    return result;
}

static nvmlReturn_t running_processes_v2(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)
{
    struct sim_process processes[SIM_MAX_PROCS];
    unsigned int count;
    nvmlReturn_t result = running_processes(device, infoCount, infos, processes, &count);
    for (unsigned int i = 0; result == NVML_SUCCESS && i < count; i++)
        infos[i] = (nvmlProcessInfo_t){
            .pid = (unsigned int)processes[i].pid,
            .usedGpuMemory = processes[i].memory,
            .gpuInstanceId = 0xFFFFFFFFu, /* no MIG: NVML reports "not available" */
            .computeInstanceId = 0xFFFFFFFFu,
        };
    return result;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return running_processes_v2(device, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return running_processes_v2(device, infoCount, infos);
}

/* A sensor the simulator holds steady: `value` once the call checks out. */
static nvmlReturn_t steady_reading(nvmlDevice_t handle, unsigned int *reading, unsigned int value, int arguments_valid)
{
    struct sim_device_view *device;
    nvmlReturn_t result = device_of(handle, &device, reading && arguments_valid);
    if (result == NVML_SUCCESS)
        *reading = value;
    return result;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t handle, int sensorType, unsigned int *temp)
{
    return steady_reading(handle, temp, SIM_TEMPERATURE_C, sensorType == NVML_TEMPERATURE_GPU);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t handle, unsigned int *power)
{
    return steady_reading(handle, power, SIM_POWER_MW, 1);
}
