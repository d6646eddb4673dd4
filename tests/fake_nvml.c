/* A stand-in for libnvidia-ml with NVML's call shape: two fake GPUs. */
#include <stdio.h>
#include <string.h>

static int devices[2];
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned* n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** d) {
  if (i >= 2) return 2;
  *d = &devices[i];
  return 0;
}
int nvmlDeviceGetName(void* d, char* out, unsigned len) {
  snprintf(out, len, "Fake GPU %d", (int)((int*)d - devices));
  return 0;
}
int nvmlDeviceGetUUID(void* d, char* out, unsigned len) {
  snprintf(out, len, "GPU-fake-%d", (int)((int*)d - devices));
  return 0;
}
int nvmlSystemGetDriverVersion(char* out, unsigned len) {
  snprintf(out, len, "999.1");
  return 0;
}
