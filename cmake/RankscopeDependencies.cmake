# Finds every dependency; an optional part switched ON whose dependency is
# missing stops configuration with what to install.
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(absl REQUIRED)
# elfutils' libdw (optional): stack frames of functions that only a module's
# full symbol table has (static and hidden ones, a program linked without
# -rdynamic). Without it, such frames read module+0xoffset.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(LIBDW QUIET IMPORTED_TARGET libdw)
endif()

function(rankscope_require found option what)
  if(NOT ${found})
    message(FATAL_ERROR "${option}=ON but ${what} was not found. Install it "
                        "(on Debian: `bash .ci/setup.sh` installs everything) or set ${option}=OFF.")
  endif()
endfunction()

# The CUDA toolkit lives outside the default search path on most machines.
set(_rankscope_cuda_hints $ENV{CUDA_HOME} $ENV{CUDA_PATH} /usr/local/cuda)

# The Python interpreter of the Python bindings, the tests and the examples: the
# project's virtualenv (.ci/setup.sh makes it, with the pinned torch), unless
# Python_EXECUTABLE is given (scikit-build-core gives the one pip runs).
if(NOT DEFINED Python_EXECUTABLE AND EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  set(Python_EXECUTABLE ${PROJECT_SOURCE_DIR}/.venv/bin/python)
endif()
find_package(Python COMPONENTS Interpreter QUIET)
set(RANKSCOPE_TEST_PYTHON "${Python_EXECUTABLE}" CACHE FILEPATH "Python interpreter the tests run (with torch)")

# libtorch: the one inside the interpreter's torch wheel, so the C++ side and the
# Python side run one torch. Only its CPU libraries (torch_cpu, c10) are linked:
# the wheel is a CUDA build whose own CMake config wants a GPU (or its exact
# toolkit) to configure, and libtorch.so would pull in libtorch_cuda and the
# wheel's NCCL, which clashes with the toolkit's NCCL our hooks link. A libtorch found by
# find_package(Torch) (Torch_DIR given) is used as it is.
function(rankscope_find_torch)
  if(Torch_DIR)
    find_package(Torch QUIET)
    set(RANKSCOPE_TORCH_FOUND ${Torch_FOUND} PARENT_SCOPE)
    set(TORCH_LIBRARIES ${TORCH_LIBRARIES} PARENT_SCOPE)
    set(TORCH_INCLUDE_DIRS ${TORCH_INCLUDE_DIRS} PARENT_SCOPE)
    set(TORCH_INSTALL_PREFIX ${TORCH_INSTALL_PREFIX} PARENT_SCOPE)
    return()
  endif()
  set(RANKSCOPE_TORCH_FOUND FALSE PARENT_SCOPE)
  if(NOT Python_EXECUTABLE)
    return()
  endif()
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c
      "import os, torch; print(os.path.dirname(torch.__file__), int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.__version__, sep=';', end='')"
    OUTPUT_VARIABLE _out RESULT_VARIABLE _rc ERROR_QUIET)
  if(NOT _rc EQUAL 0)
    return()
  endif()
  list(GET _out 0 _root)
  list(GET _out 1 _abi)
  list(GET _out 2 _version)
  find_library(RANKSCOPE_LIBTORCH_CPU torch_cpu PATHS ${_root}/lib NO_DEFAULT_PATH)
  find_library(RANKSCOPE_LIBC10 c10 PATHS ${_root}/lib NO_DEFAULT_PATH)
  if(NOT RANKSCOPE_LIBTORCH_CPU OR NOT RANKSCOPE_LIBC10)
    return()
  endif()
  if(NOT TARGET rankscope_libtorch)
    add_library(rankscope_libtorch INTERFACE IMPORTED GLOBAL)
    set_target_properties(rankscope_libtorch PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${_root}/include;${_root}/include/torch/csrc/api/include"
      INTERFACE_LINK_LIBRARIES "${RANKSCOPE_LIBTORCH_CPU};${RANKSCOPE_LIBC10}"
      # The wheel ships fmt's headers (a newer fmt than Debian's libfmt) in its
      # include directory, where they shadow the system's: whoever includes
      # torch uses that fmt header-only rather than link a library of another version.
      INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${_abi};FMT_HEADER_ONLY")
  endif()
  message(STATUS "rankscope: libtorch ${_version} from ${_root}")
  set(RANKSCOPE_TORCH_VERSION ${_version} PARENT_SCOPE)
  set(RANKSCOPE_TORCH_CXX11_ABI ${_abi} PARENT_SCOPE)
  set(RANKSCOPE_TORCH_FOUND TRUE PARENT_SCOPE)
  set(TORCH_LIBRARIES rankscope_libtorch PARENT_SCOPE)
  set(TORCH_INCLUDE_DIRS "${_root}/include;${_root}/include/torch/csrc/api/include" PARENT_SCOPE)
  set(TORCH_INSTALL_PREFIX ${_root} PARENT_SCOPE)
endfunction()
# AUTO (pip install .): the torch part is built when the build's interpreter can
# import torch (pip install --no-build-isolation), else left out.
# Our C++ passes std::string and friends across its library boundary, so the
# torch parts need a libtorch built with the same (C++11) std::string ABI: PyPI
# wheels since torch 2.7. Older wheels get the Python paths.
set(_rankscope_old_abi "it uses the pre-C++11 std::string ABI (PyPI torch < 2.7); rankscope's C++ torch parts need torch >= 2.7")
# AUTO (pip install .): the torch part is built when the build's interpreter can
# import a suitable torch (pip install --no-build-isolation), else left out and
# RANKSCOPE_TORCH_MISSING says why (rankscope.torch then uses Python hooks).
set(RANKSCOPE_TORCH_MISSING "")
if(RANKSCOPE_WITH_TORCH STREQUAL "AUTO")
  rankscope_find_torch()
  if(NOT RANKSCOPE_TORCH_FOUND)
    set(RANKSCOPE_WITH_TORCH OFF)
    set(RANKSCOPE_TORCH_MISSING "the build could not import torch (pip's build isolation hides it: pip install --no-build-isolation . builds the C++ part)")
  elseif(DEFINED RANKSCOPE_TORCH_CXX11_ABI AND NOT RANKSCOPE_TORCH_CXX11_ABI)
    set(RANKSCOPE_WITH_TORCH OFF)
    set(RANKSCOPE_TORCH_MISSING "torch ${RANKSCOPE_TORCH_VERSION}: ${_rankscope_old_abi}")
  else()
    set(RANKSCOPE_WITH_TORCH ON)
  endif()
  if(RANKSCOPE_TORCH_MISSING)
    message(STATUS "rankscope: no C++ torch part: ${RANKSCOPE_TORCH_MISSING}")
  endif()
endif()
if(RANKSCOPE_WITH_TORCH)
  rankscope_find_torch()
  rankscope_require(RANKSCOPE_TORCH_FOUND RANKSCOPE_WITH_TORCH
                    "libtorch (the torch wheel of ${Python_EXECUTABLE}: pip install -r requirements/torch.txt)")
  if(DEFINED RANKSCOPE_TORCH_CXX11_ABI AND NOT RANKSCOPE_TORCH_CXX11_ABI)
    message(FATAL_ERROR "RANKSCOPE_WITH_TORCH=ON but the libtorch of ${Python_EXECUTABLE} (torch ${RANKSCOPE_TORCH_VERSION}): "
                        "${_rankscope_old_abi}. Install a newer torch or set RANKSCOPE_WITH_TORCH=OFF.")
  endif()
  if(RANKSCOPE_BUILD_EXAMPLES OR RANKSCOPE_BUILD_TESTS OR RANKSCOPE_BUILD_BENCHMARKS)
    # The example trainer's ProcessGroupGloo.hpp includes gloo headers the wheel does not ship.
    find_path(RANKSCOPE_GLOO_INCLUDE_DIR gloo/algorithm.h)
    rankscope_require(RANKSCOPE_GLOO_INCLUDE_DIR RANKSCOPE_WITH_TORCH "gloo's headers (Debian: libgloo-dev)")
    if(TARGET rankscope_libtorch)
      set_property(TARGET rankscope_libtorch APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${RANKSCOPE_GLOO_INCLUDE_DIR})
    endif()
  endif()
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
  set(PYBIND11_FINDPYTHON ON)
  find_package(Python COMPONENTS Interpreter Development.Module QUIET)
  # pybind11 from the interpreter's site-packages (PyPI), else the system's.
  execute_process(COMMAND ${Python_EXECUTABLE} -c "import pybind11; print(pybind11.get_cmake_dir(), end='')"
                  OUTPUT_VARIABLE _pybind11_dir RESULT_VARIABLE _rc ERROR_QUIET)
  if(_rc EQUAL 0)
    set(pybind11_DIR ${_pybind11_dir})
  endif()
  find_package(pybind11 CONFIG QUIET)
  rankscope_require(pybind11_FOUND RANKSCOPE_WITH_PYTHON "pybind11 (pip install -r requirements/dev.txt)")
endif()
if(RANKSCOPE_WITH_OTLP)
  find_package(CURL QUIET)
  rankscope_require(CURL_FOUND RANKSCOPE_WITH_OTLP "libcurl (Debian: libcurl4-openssl-dev)")
  find_package(ZLIB QUIET)
  rankscope_require(ZLIB_FOUND RANKSCOPE_WITH_OTLP "zlib (Debian: zlib1g-dev)")
endif()

# The run-log reader (CLI, tests, later triage) parses with simdjson.
find_package(simdjson QUIET)
find_package(CLI11 CONFIG QUIET)
if(NOT simdjson_FOUND OR NOT CLI11_FOUND)
  message(FATAL_ERROR "the rankscope CLI needs simdjson and CLI11 (Debian: libsimdjson-dev libcli11-dev; "
                      "`bash .ci/setup.sh` installs them)")
endif()

if(RANKSCOPE_WITH_PROMETHEUS)
  find_package(prometheus-cpp CONFIG QUIET)
  if(NOT TARGET prometheus-cpp::core)
    set(prometheus-cpp_FOUND FALSE)
  endif()
  rankscope_require(prometheus-cpp_FOUND RANKSCOPE_WITH_PROMETHEUS "prometheus-cpp (Debian: prometheus-cpp-dev)")
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
