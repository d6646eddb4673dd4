// rankscope.InvariantViolation for the extension's hand-written types, which
// return an error to Python instead of throwing through pybind11.
#pragma once

#include "absl/status/status.h"

/// Sets InvariantViolation(st.message()) as the current Python error.
void set_violation(const absl::Status& st);
