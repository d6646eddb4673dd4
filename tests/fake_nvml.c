/* A stand-in for libnvidia-ml with NVML's call shape: two fake GPUs. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

/* Memory: 80 GiB devices, 10 GiB used, of which this process holds 123 MiB. */
typedef struct { unsigned long long total, free, used; } fake_memory;
typedef struct { unsigned pid; unsigned long long used; } fake_process;
int nvmlDeviceGetMemoryInfo(void* d, fake_memory* m) {
  (void)d;
  m->total = 80ull << 30;
  m->used = 10ull << 30;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetComputeRunningProcesses(void* d, unsigned* n, fake_process* p) {
  (void)d;
  if (*n < 2) { *n = 2; return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */ }
  p[0].pid = 1; p[0].used = 1ull << 30;
  p[1].pid = (unsigned)getpid(); p[1].used = 123ull << 20;
  *n = 2;
  return 0;
}
