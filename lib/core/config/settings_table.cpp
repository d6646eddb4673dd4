#include "settings_table.hpp"

#include <cstdlib>

namespace rankscope::detail {

// The one getenv() of a RANKSCOPE_* variable (resolve_context reads the
// identity variables through its injectable getenv, for its tests).
const char* env_raw(Env e) noexcept { return std::getenv(env_spec(e).name.data()); }

}  // namespace rankscope::detail
