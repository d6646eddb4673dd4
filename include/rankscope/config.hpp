// rankscope/config.hpp — version and compile-time switches.
//
// RANKSCOPE_ENABLED is set by the CMake option of the same name, as a PUBLIC
// definition of rankscope::core. With RANKSCOPE_ENABLED=0 every instrumentation
// macro expands to nothing and evaluates none of its arguments.
// Thread-safety: n/a. Cost: none.
#pragma once

#define RANKSCOPE_VERSION_MAJOR 0
#define RANKSCOPE_VERSION_MINOR 1
#define RANKSCOPE_VERSION_PATCH 0
#define RANKSCOPE_VERSION_STRING "0.1.0"

#ifndef RANKSCOPE_ENABLED
#define RANKSCOPE_ENABLED 1
#endif

// Schema version of the JSONL run log (`rank-<R>.jsonl`) and `run.json`.
// 2: a step begun by step() has no step_begin line (step_end.next_step).
// 3: a collective the thread waited for at its end carries that wait ("wait",
//    "wait_phase") in place of a nested phase line (DDP's gradient all-reduce).
#define RANKSCOPE_SCHEMA_VERSION 3

#if defined(__GNUC__)
#define RANKSCOPE_DETAIL_LIKELY(x) __builtin_expect(!!(x), 1)
#define RANKSCOPE_DETAIL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define RANKSCOPE_DETAIL_NOINLINE __attribute__((noinline))
#else
#define RANKSCOPE_DETAIL_LIKELY(x) (x)
#define RANKSCOPE_DETAIL_UNLIKELY(x) (x)
#define RANKSCOPE_DETAIL_NOINLINE
#endif

#define RANKSCOPE_DETAIL_CONCAT_(a, b) a##b
#define RANKSCOPE_DETAIL_CONCAT(a, b) RANKSCOPE_DETAIL_CONCAT_(a, b)
