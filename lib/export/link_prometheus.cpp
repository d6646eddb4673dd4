// Compiled into every target that links rankscope::prometheus (INTERFACE_SOURCES):
// one reference from the program's own objects keeps the library loaded
// under an as-needed linker (Debian's default), so its exporter registers
// itself and init() configures it from the environment even when the
// program calls nothing in it.
extern "C" const int rankscope_prometheus_linked;
[[gnu::used]] static const int* const rankscope_keep_prometheus = &rankscope_prometheus_linked;
