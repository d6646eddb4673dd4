// rankscope/integrations/nccl.hpp — NCCL calls as collective spans, same shape.
//
//   RANKSCOPE_NCCL(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream));
//   ncclResult_t r = RANKSCOPE_NCCL(ncclBroadcast(buf, buf, n, ncclBfloat16, 0, comm, stream));
//
// The macro calls a wrapper with the same name and signature in
// rankscope::nccl::hooks: it takes the communicator's next sequence number,
// enters the flight recorder, records CUDA events on the call's stream around
// the call (events come from a per-thread pool, reused by the next thread on
// the same device once its thread exits; the background thread polls
// them with cudaEventQuery, nothing ever synchronizes the stream), and returns
// the call's result unchanged, never touching its arguments. Failures are
// recorded with ncclGetErrorString / ncclGetLastError and counted; async
// communicator errors (ncclCommGetAsyncError) are polled by the background
// thread and reported once per communicator. Communicator init/destroy hooks
// keep the live-communicator count honest (leaks after restores show).
// Without a CUDA device the spans fall back to host timing with one log line.
// Compiled out (RANKSCOPE_ENABLED=0) the macro is the bare call.
// Thread-safety: as NCCL's. Cost: a collective span plus two cudaEventRecord.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "rankscope/collective.hpp"
#include "rankscope/config.hpp"

namespace rankscope::nccl {

/// Everything the hooks call, as a table of function pointers: the real NCCL
/// and CUDA runtime by default. Tests install a backend with the same call
/// shape (no GPU needed).
struct Api {
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*all_to_all)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*group_start)();
  ncclResult_t (*group_end)();
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*comm_abort)(ncclComm_t);
  ncclResult_t (*comm_count)(const ncclComm_t, int*);
  ncclResult_t (*comm_user_rank)(const ncclComm_t, int*);
  ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t*);
  const char* (*get_error_string)(ncclResult_t);
  const char* (*get_last_error)(ncclComm_t);
  cudaError_t (*get_device_count)(int*);
  cudaError_t (*event_create)(cudaEvent_t*, unsigned int);
  cudaError_t (*event_record)(cudaEvent_t, cudaStream_t);
  cudaError_t (*event_query)(cudaEvent_t);
  cudaError_t (*event_elapsed_ms)(float*, cudaEvent_t, cudaEvent_t);
  cudaError_t (*get_device)(int*);
};

/// The real NCCL / CUDA runtime.
const Api& real_api() noexcept;
/// Installs `api` (nullptr restores the real one). Call before the first hook.
void set_api(const Api* api) noexcept;
/// Collectives that returned an error so far.
std::uint64_t failed_collectives() noexcept;
/// CUDA event pools created so far: one per thread that issued device-timed
/// collectives, reused by later threads on the same device once it exits.
std::size_t event_pools() noexcept;
DType to_dtype(ncclDataType_t t) noexcept;

namespace hooks {
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) noexcept;
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) noexcept;
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) noexcept;
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) noexcept;
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) noexcept;
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream) noexcept;
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) noexcept;
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) noexcept;
ncclResult_t ncclGroupStart() noexcept;
ncclResult_t ncclGroupEnd() noexcept;
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) noexcept;
ncclResult_t ncclCommDestroy(ncclComm_t comm) noexcept;
ncclResult_t ncclCommAbort(ncclComm_t comm) noexcept;
}  // namespace hooks

}  // namespace rankscope::nccl

#if RANKSCOPE_ENABLED
/// Wraps one NCCL call: RANKSCOPE_NCCL(ncclAllReduce(...)). Returns its result.
#define RANKSCOPE_NCCL(call) ::rankscope::nccl::hooks::call
#else
#define RANKSCOPE_NCCL(call) call
#endif
