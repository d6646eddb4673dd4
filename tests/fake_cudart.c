/* A stand-in for the CUDA runtime (and the one driver call device timing
 * makes) with their call shape: one device, stream-ordered work whose device
 * time and completion the test controls. What tests/fake_nvml.c is for NVML.
 *
 * The device model: every stream is a queue. fake_cuda_launch(stream, ns)
 * enqueues a kernel that runs for `ns` of device time; fake_cuda_block(stream)
 * enqueues one that runs until fake_cuda_release(stream) (a collective waiting
 * for a peer); cudaEventRecord marks a point in a stream's queue. An event is
 * complete once nothing blocked is ahead of it in its stream; its device time
 * is the sum of the kernel times before it in that stream, so
 * cudaEventElapsedTime between two events of one stream is the kernel time
 * enqueued between them, exactly. Host time plays no part: tests are exact on
 * any machine.
 *
 * Knobs from the environment (for processes a test starts):
 *   FAKE_CUDA_NO_CONTEXT=1     cuCtxGetCurrent reports no current context
 *   FAKE_CUDA_NO_STREAMS=1     cudaStreamCreateWithFlags fails
 *   FAKE_CUDA_PHASE_KERNEL_NS=<ns>  every event recorded on the legacy default
 *                              stream (0) is preceded by a kernel of that length:
 *                              a phase's work without the test launching it */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

enum { kSuccess = 0, kNotReady = 600, kInvalidHandle = 400, kMaxStreams = 64, kMaxEvents = 1 << 16 };

typedef struct {
  void* handle;
  uint64_t device_ns;     /* device time at the queue's tail */
  uint64_t blocks;        /* blocking kernels enqueued so far */
  uint64_t released;      /* of which released */
} fake_stream;

typedef struct {
  int stream;             /* index into streams, -1 before its first record */
  uint64_t device_ns;
  uint64_t after_blocks;  /* blocking kernels ahead of it in its stream */
} fake_event;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t released_cv = PTHREAD_COND_INITIALIZER; /* a blocking kernel finished */
static fake_stream streams[kMaxStreams];
static int nstreams;
static fake_event events[kMaxEvents];
static int nevents;
static int context_token;

static uint64_t env_u64(const char* name) {
  const char* v = getenv(name);
  return v && *v ? strtoull(v, NULL, 10) : 0;
}

static fake_stream* stream_of(void* handle) { /* mu held */
  for (int i = 0; i < nstreams; ++i) {
    if (streams[i].handle == handle) return &streams[i];
  }
  if (nstreams == kMaxStreams) return NULL;
  streams[nstreams].handle = handle;
  return &streams[nstreams++];
}

/* ---- the runtime's calls ---------------------------------------------------- */
int cudaGetDeviceCount(int* n) { *n = 1; return kSuccess; }
int cudaGetDevice(int* d) { *d = 0; return kSuccess; }
int cuCtxGetCurrent(void** ctx) {
  *ctx = env_u64("FAKE_CUDA_NO_CONTEXT") ? NULL : &context_token;
  return kSuccess;
}
/* A new stream, idle: an event recorded on it has device time 0, the device's
 * "now" (the device clock never moves by itself here: kernels only queue), so
 * the time from such an event to one on a busy stream is that stream's backlog. */
int cudaStreamCreateWithFlags(void** stream, unsigned flags) {
  static char handles[kMaxStreams];
  (void)flags;
  pthread_mutex_lock(&mu);
  int rc = 2; /* cudaErrorMemoryAllocation */
  if (env_u64("FAKE_CUDA_NO_STREAMS")) {
    rc = 1; /* cudaErrorInvalidValue: a runtime that makes no streams for us */
  } else if (nstreams < kMaxStreams) {
    fake_stream* s = stream_of(&handles[nstreams]);
    *stream = s->handle;
    rc = kSuccess;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}
int cudaEventCreateWithFlags(void** event, unsigned flags) {
  (void)flags;
  pthread_mutex_lock(&mu);
  int rc = kSuccess;
  if (nevents == kMaxEvents) {
    rc = 2; /* cudaErrorMemoryAllocation */
  } else {
    events[nevents].stream = -1;
    *event = (void*)(intptr_t)(nevents + 1); /* never null */
    ++nevents;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}
static fake_event* event_of(void* e) { /* mu held */
  intptr_t i = (intptr_t)e - 1;
  return i >= 0 && i < nevents ? &events[i] : NULL;
}
int cudaEventRecord(void* e, void* stream) {
  static uint64_t phase_kernel_ns = (uint64_t)-1;
  pthread_mutex_lock(&mu);
  if (phase_kernel_ns == (uint64_t)-1) phase_kernel_ns = env_u64("FAKE_CUDA_PHASE_KERNEL_NS");
  fake_event* ev = event_of(e);
  fake_stream* s = stream_of(stream);
  int rc = kInvalidHandle;
  if (ev != NULL && s != NULL) {
    if (stream == NULL) s->device_ns += phase_kernel_ns;
    ev->stream = (int)(s - streams);
    ev->device_ns = s->device_ns;
    ev->after_blocks = s->blocks;
    rc = kSuccess;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}
int cudaEventQuery(void* e) {
  pthread_mutex_lock(&mu);
  fake_event* ev = event_of(e);
  int rc = kInvalidHandle;
  if (ev != NULL) {
    rc = kSuccess; /* never recorded: complete, as CUDA says */
    if (ev->stream >= 0 && streams[ev->stream].released < ev->after_blocks) rc = kNotReady;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}
int cudaEventElapsedTime(float* ms, void* start, void* end) {
  pthread_mutex_lock(&mu);
  fake_event* a = event_of(start);
  fake_event* b = event_of(end);
  int rc = kInvalidHandle;
  if (a != NULL && b != NULL && a->stream >= 0 && b->stream >= 0) {
    if (streams[a->stream].released < a->after_blocks || streams[b->stream].released < b->after_blocks) {
      rc = kNotReady;
    } else {
      *ms = (float)((double)((int64_t)(b->device_ns - a->device_ns)) / 1e6);
      rc = kSuccess;
    }
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

/* ---- what a test controls ---------------------------------------------------- */
/* Enqueues a kernel of `ns` device time on `stream`. */
void fake_cuda_launch(void* stream, uint64_t ns) {
  pthread_mutex_lock(&mu);
  fake_stream* s = stream_of(stream);
  if (s != NULL) s->device_ns += ns;
  pthread_mutex_unlock(&mu);
}
/* Enqueues a kernel that runs until fake_cuda_release(stream). */
void fake_cuda_block(void* stream) {
  pthread_mutex_lock(&mu);
  fake_stream* s = stream_of(stream);
  if (s != NULL) ++s->blocks;
  pthread_mutex_unlock(&mu);
}
/* Lets the oldest blocking kernel of `stream` finish. */
void fake_cuda_release(void* stream) {
  pthread_mutex_lock(&mu);
  fake_stream* s = stream_of(stream);
  if (s != NULL && s->released < s->blocks) ++s->released;
  pthread_cond_broadcast(&released_cv);
  pthread_mutex_unlock(&mu);
}
/* The host waits for everything enqueued on `stream` so far, as
 * cudaStreamSynchronize does (a copy to the host, `.item()`). */
void fake_cuda_synchronize(void* stream) {
  pthread_mutex_lock(&mu);
  fake_stream* s = stream_of(stream);
  const uint64_t target = s != NULL ? s->blocks : 0;
  while (s != NULL && s->released < target) pthread_cond_wait(&released_cv, &mu);
  pthread_mutex_unlock(&mu);
}
/* Events created so far (pools reuse theirs). */
int fake_cuda_events_created(void) {
  pthread_mutex_lock(&mu);
  int n = nevents;
  pthread_mutex_unlock(&mu);
  return n;
}
