# Finds every dependency; an optional part switched ON whose dependency is
# missing stops configuration with what to install.
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(absl REQUIRED)

function(rankscope_require found option what)
  if(NOT ${found})
    message(FATAL_ERROR "${option}=ON but ${what} was not found. Install it "
                        "(on Debian: `bash .ci/setup.sh` installs everything) or set ${option}=OFF.")
  endif()
endfunction()

# The CUDA toolkit lives outside the default search path on most machines.
set(_rankscope_cuda_hints $ENV{CUDA_HOME} $ENV{CUDA_PATH} /usr/local/cuda)

if(RANKSCOPE_WITH_TORCH)
  find_package(Torch QUIET)
  rankscope_require(Torch_FOUND RANKSCOPE_WITH_TORCH "libtorch (Debian: libtorch-dev libgloo-dev)")
endif()

if(RANKSCOPE_WITH_NVTX OR RANKSCOPE_WITH_CUDA OR RANKSCOPE_WITH_NCCL)
  find_path(RANKSCOPE_NVTX_INCLUDE_DIR nvtx3/nvToolsExt.h HINTS ${_rankscope_cuda_hints} PATH_SUFFIXES include)
endif()
if(RANKSCOPE_WITH_NVTX)
  rankscope_require(RANKSCOPE_NVTX_INCLUDE_DIR RANKSCOPE_WITH_NVTX
                    "nvtx3/nvToolsExt.h (the CUDA toolkit, or Debian: libnvtx3-dev)")
endif()
if(RANKSCOPE_WITH_CUDA OR RANKSCOPE_WITH_NCCL)
  list(APPEND CMAKE_PREFIX_PATH ${_rankscope_cuda_hints})
  find_package(CUDAToolkit QUIET)
  rankscope_require(CUDAToolkit_FOUND "RANKSCOPE_WITH_CUDA/NCCL" "the CUDA toolkit (nvcc, cudart)")
endif()
if(RANKSCOPE_WITH_NCCL)
  find_path(RANKSCOPE_NCCL_INCLUDE_DIR nccl.h HINTS ${_rankscope_cuda_hints} PATH_SUFFIXES include)
  find_library(RANKSCOPE_NCCL_LIBRARY nccl HINTS ${_rankscope_cuda_hints} PATH_SUFFIXES lib lib64)
  rankscope_require(RANKSCOPE_NCCL_INCLUDE_DIR RANKSCOPE_WITH_NCCL "nccl.h (CUDA toolkit or libnccl-dev)")
  rankscope_require(RANKSCOPE_NCCL_LIBRARY RANKSCOPE_WITH_NCCL "libnccl.so (CUDA toolkit or libnccl2)")
endif()
if(RANKSCOPE_WITH_PYTHON)
  find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
  find_package(pybind11 CONFIG QUIET)
  rankscope_require(pybind11_FOUND RANKSCOPE_WITH_PYTHON "pybind11 (Debian: pybind11-dev python3-dev)")
endif()
if(RANKSCOPE_WITH_OTLP)
  find_package(CURL QUIET)
  rankscope_require(CURL_FOUND RANKSCOPE_WITH_OTLP "libcurl (Debian: libcurl4-openssl-dev)")
endif()

# The run-log reader (CLI, tests, later triage) parses with simdjson.
find_package(simdjson QUIET)
find_package(CLI11 CONFIG QUIET)
if(NOT simdjson_FOUND OR NOT CLI11_FOUND)
  message(FATAL_ERROR "the rankscope CLI needs simdjson and CLI11 (Debian: libsimdjson-dev libcli11-dev; "
                      "`bash .ci/setup.sh` installs them)")
endif()

if(RANKSCOPE_BUILD_TESTS)
  find_package(Catch2 2 QUIET)
  rankscope_require(Catch2_FOUND RANKSCOPE_BUILD_TESTS "Catch2 v2 (Debian: catch2)")
endif()
if(RANKSCOPE_BUILD_BENCHMARKS)
  find_package(benchmark QUIET)
  rankscope_require(benchmark_FOUND RANKSCOPE_BUILD_BENCHMARKS "Google Benchmark (Debian: libbenchmark-dev)")
  find_package(prometheus-cpp CONFIG QUIET)
  find_package(spdlog CONFIG QUIET)
endif()
