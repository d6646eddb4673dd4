/* A stand-in for libnvidia-ml with NVML's call shape: two fake GPUs. */
#include <stdio.h>
#include <stdlib.h>
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
static void hang_for(const char* knob);
int nvmlDeviceGetName(void* d, char* out, unsigned len) {
  hang_for("FAKE_NVML_HANG_NAME_MS"); /* the GPU list at init (environment.cpp) */
  const char* name = getenv("FAKE_NVML_NAME");  /* a real model's name (MFU's peak from the GPU model) */
  if (name) snprintf(out, len, "%s", name);
  else snprintf(out, len, "Fake GPU %d", (int)((int*)d - devices));
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
  /* This process, unless FAKE_NVML_PROCESS_MIB=0 (a rank training on the CPU beside the GPUs). */
  const char* mib = getenv("FAKE_NVML_PROCESS_MIB");
  if (mib && strcmp(mib, "0") == 0) { *n = 1; return 0; }
  p[1].pid = (unsigned)getpid(); p[1].used = 123ull << 20;
  *n = 2;
  return 0;
}

/* Resource snapshots (resources.cpp). Knobs for the tests, from the environment:
 *   FAKE_NVML_UTIL=<percent>   utilisation (default 100: a GPU spinning in an NCCL kernel looks busy)
 *   FAKE_NVML_POWER_W=<watts>  power draw (default 70 of 700: spinning, not computing); "70,350": per GPU
 *   FAKE_NVML_HANG_MS=<ms>     nvmlDeviceGetPowerUsage blocks that long (a wedged driver)
 *   FAKE_NVML_HANG_NAME_MS=<ms> nvmlDeviceGetName blocks that long (the GPU list at init)
 *   FAKE_NVML_NAME=<name>      every GPU's name (default "Fake GPU <index>", a model no table knows)
 *   FAKE_NVML_XID=<code>       one critical XID event of that code, on the next wait (once per
 *                              code: a test process can set another code for its next run)
 *   FAKE_NVML_ECC=<n>,<m>      uncorrected, corrected volatile ECC errors (default 0,0)
 *   FAKE_NVML_PCIE_REPLAYS=<n> PCIe replays (default 0)
 *   FAKE_NVML_NVLINK_ERRORS=<n> NVLink CRC data errors on GPU 0 (default 0; the other error totals 1 each) */
#include <stdlib.h>
#include <time.h>
static unsigned env_or(const char* name, unsigned fallback) {
  const char* v = getenv(name);
  return v && *v ? (unsigned)strtoul(v, NULL, 10) : fallback;
}
typedef struct { unsigned gpu, memory; } fake_util;
int nvmlDeviceGetUtilizationRates(void* d, fake_util* u) {
  (void)d;
  u->gpu = env_or("FAKE_NVML_UTIL", 100);
  u->memory = 5;
  return 0;
}
static void hang_for(const char* knob) {
  unsigned hang = env_or(knob, 0);
  if (hang) {
    struct timespec ts = {hang / 1000, (long)(hang % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
}
int nvmlDeviceGetPowerUsage(void* d, unsigned* mw) {
  hang_for("FAKE_NVML_HANG_MS");
  /* A comma-separated list gives each GPU its own: "70,350" */
  const char* list = getenv("FAKE_NVML_POWER_W");
  unsigned w = 70;
  if (list && *list) {
    int idx = (int)((int*)d - devices);
    const char* p = list;
    for (int i = 0; i < idx && strchr(p, ','); ++i) p = strchr(p, ',') + 1;
    w = (unsigned)strtoul(p, NULL, 10);
  }
  *mw = w * 1000;
  return 0;
}
int nvmlDeviceGetTemperature(void* d, int sensor, unsigned* c) { (void)d; (void)sensor; *c = 61; return 0; }
int nvmlDeviceGetClockInfo(void* d, int type, unsigned* mhz) { (void)d; (void)type; *mhz = 1410; return 0; }
int nvmlDeviceGetCurrentClocksThrottleReasons(void* d, unsigned long long* bits) { (void)d; *bits = 0; return 0; }
int nvmlDeviceGetTotalEccErrors(void* d, int type, int counter, unsigned long long* n) {
  (void)d; (void)counter;
  const char* v = getenv("FAKE_NVML_ECC");
  *n = 0;
  if (v && *v) {
    const char* comma = strchr(v, ',');
    *n = type == 1 ? strtoull(v, NULL, 10) : comma ? strtoull(comma + 1, NULL, 10) : 0; /* 1: uncorrected */
  }
  return 0;
}
int nvmlDeviceGetPcieReplayCounter(void* d, unsigned* n) { (void)d; *n = env_or("FAKE_NVML_PCIE_REPLAYS", 0); return 0; }
int nvmlDeviceGetPcieThroughput(void* d, int counter, unsigned* kbs) { (void)d; *kbs = counter ? 2048 : 1024; return 0; }
typedef struct { void* device; unsigned long long type, data; unsigned gi, ci; } fake_event;
static int event_set;
static unsigned xid_sent;
int nvmlEventSetCreate(void** set) { *set = &event_set; return 0; }
int nvmlDeviceRegisterEvents(void* d, unsigned long long types, void* set) { (void)d; (void)types; (void)set; return 0; }
int nvmlEventSetWait_v2(void* set, fake_event* e, unsigned timeout_ms) {
  (void)set; (void)timeout_ms;
  unsigned xid = env_or("FAKE_NVML_XID", 0);
  if (!xid || xid == xid_sent) return 10; /* NVML_ERROR_TIMEOUT */
  xid_sent = xid;
  e->device = &devices[0];
  e->type = 0x8;
  e->data = xid;
  return 0;
}

/* NVLink through field values, GPU 0 only (none on GPU 1): data counters 4 MiB sent, 8 MiB received;
 * error totals (CRC flit 38, CRC data 45, replay 52, recovery 59): 1 each, CRC data FAKE_NVML_NVLINK_ERRORS. */
typedef struct { unsigned field_id, scope_id; long long timestamp, latency_us; int value_type, result; unsigned long long value; } fake_field;
int nvmlDeviceGetFieldValues(void* d, int n, fake_field* f) {
  int gpu = (int)((int*)d - devices);
  for (int i = 0; i < n; ++i) {
    const unsigned id = f[i].field_id;
    const int known = id == 138 || id == 139 || id == 38 || id == 45 || id == 52 || id == 59;
    if (gpu != 0 || !known) { f[i].result = 3; continue; } /* NOT_SUPPORTED */
    f[i].result = 0;
    f[i].value_type = 1; /* unsigned long long */
    f[i].value = id == 138 ? 4096 : id == 139 ? 8192 : id == 45 ? env_or("FAKE_NVML_NVLINK_ERRORS", 0) : 1;
  }
  return 0;
}
