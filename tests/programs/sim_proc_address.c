/*
 * cuGetProcAddress against the exports of the simulated libcuda.so.1, for
 * tests/sim.
 *
 *   sim_proc_address   reads "name base version per_thread" lines
 * (native/sim/cuda/driver_api.def) on stdin and prints one line for each: name
 * served|wrong|missing|absent STATUS [CALL] served: cuGetProcAddress_v2(base,
 * version, per-thread flag) gives the very address dlsym finds for name;
 * absent: neither has it (newer than the driver's version); CALL: what the
 * entry point answers when called with no arguments, for names given a fifth
 * field "call" (not-modelled ones only). Then "driver_version N".
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "vgpu/cuda_abi.h"

int main(void) {
  void *library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    fprintf(stderr, "sim_proc_address: %s\n", dlerror());
    return 1;
  }
  __typeof__(cuGetProcAddress_v2) *get =
      (__typeof__(cuGetProcAddress_v2) *)dlsym(library, "cuGetProcAddress_v2");
  __typeof__(cuDriverGetVersion) *driver_version =
      (__typeof__(cuDriverGetVersion) *)dlsym(library, "cuDriverGetVersion");
  if (!get || !driver_version)
    return 1;
  char line[512], name[200], base[200], call[16];
  int version, per_thread;
  while (fgets(line, sizeof line, stdin)) {
    call[0] = 0;
    if (sscanf(line, "%199s %199s %d %d %15s", name, base, &version,
               &per_thread, call) < 4)
      continue;
    void *exported = dlsym(library, name);
    void *served = NULL;
    CUdriverProcAddressQueryResult status = -1;
    CUresult result =
        get(base, &served, version,
            per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0,
            &status);
    const char *verdict = result == CUDA_SUCCESS && served == exported
                              ? "served"
                          : !exported && result != CUDA_SUCCESS ? "absent"
                          : result != CUDA_SUCCESS              ? "missing"
                                                                : "wrong";
    printf("%s %s %d", name, verdict, (int)status);
    if (strcmp(call, "call") == 0 && exported)
      printf(" %d", ((CUresult (*)(void))exported)());
    printf("\n");
  }
  int reported = 0;
  driver_version(&reported);
  printf("driver_version %d\n", reported);
  return 0;
}
