// The CUDA runtime of the process, found rather than linked.
//
// rankscope's core and its Python extension run on machines without CUDA, so
// they cannot link libcudart. On a machine with CUDA they must use the runtime
// the application already loaded (PyTorch's, or the trainer's own) and never
// create a CUDA context themselves: a context costs device memory and makes a
// later fork() unusable. So the runtime is looked up among the libraries
// already loaded (dlopen with RTLD_NOLOAD), and a span is device-timed only on
// a thread whose context is current (the driver's cuCtxGetCurrent, which
// creates nothing). RANKSCOPE_CUDA_RUNTIME names a library to load instead:
// tests load tests/fake_cudart.c's, which has the same call shape.
// Thread-safety: find_cuda_runtime() runs on one thread at a time (init, then
// the background thread); the table it publishes is immutable.
#pragma once

#include <string>

namespace rankscope::detail {

// The calls device timing makes, with CUDA's C signatures (cudaError_t and
// CUresult are ints; cudaEvent_t, cudaStream_t and CUcontext are pointers).
struct CudaRuntime {
  int (*get_device)(int* device);
  int (*event_create_with_flags)(void** event, unsigned flags);
  int (*event_record)(void* event, void* stream);
  int (*event_query)(void* event);
  int (*event_elapsed_time)(float* ms, void* start, void* end);
  int (*ctx_get_current)(void** context);  // the driver's cuCtxGetCurrent
  // Optional (null if absent): makes the idle stream a device-clock anchor is
  // recorded on (device_spans.cpp); without it spans have no device start.
  int (*stream_create_with_flags)(void** stream, unsigned flags);
  std::string library;                      // where it came from, for the environment summary
};

inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaErrorNotReady = 600;
inline constexpr unsigned kCudaEventDefault = 0;
inline constexpr unsigned kCudaStreamNonBlocking = 1;

// Looks for the process's CUDA runtime: the library RANKSCOPE_CUDA_RUNTIME
// names, else a libcudart and the driver already loaded. True once found (the
// table is then published). PyTorch loads libcudart at `import torch` but the
// driver only at its first CUDA call, which may come after rankscope.init():
// the background thread asks again, about once a second, until it is there.
bool find_cuda_runtime() noexcept;
// The table once found, else null.
const CudaRuntime* cuda_runtime() noexcept;

}  // namespace rankscope::detail
