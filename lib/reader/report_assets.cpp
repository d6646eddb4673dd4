// The report page's template and Chart.js, in the binary (assembled in with
// .incbin at build time), so `rankscope report` needs no files at run time.
#include <string_view>

#define RANKSCOPE_STR2(x) #x
#define RANKSCOPE_STR(x) RANKSCOPE_STR2(x)
#define RANKSCOPE_INCBIN(name, path)                  \
  __asm__(".section .rodata\n"                        \
          ".global " #name "_begin\n"                 \
          ".hidden " #name "_begin\n"                 \
          ".type " #name "_begin, @object\n"          \
          #name "_begin:\n"                           \
          ".incbin \"" path "\"\n"                    \
          ".global " #name "_end\n"                   \
          ".hidden " #name "_end\n"                   \
          #name "_end:\n"                             \
          ".byte 0\n"                                 \
          ".previous\n")

RANKSCOPE_INCBIN(rankscope_report_page, RANKSCOPE_STR(RANKSCOPE_REPORT_PAGE));
extern "C" const char rankscope_report_page_begin[], rankscope_report_page_end[];
#ifdef RANKSCOPE_CHARTJS
RANKSCOPE_INCBIN(rankscope_chartjs, RANKSCOPE_STR(RANKSCOPE_CHARTJS));
extern "C" const char rankscope_chartjs_begin[], rankscope_chartjs_end[];
#endif

namespace rankscope::reader::assets {
std::string_view report_page() {
  return {rankscope_report_page_begin, static_cast<std::size_t>(rankscope_report_page_end - rankscope_report_page_begin)};
}
std::string_view chartjs() {
#ifdef RANKSCOPE_CHARTJS
  return {rankscope_chartjs_begin, static_cast<std::size_t>(rankscope_chartjs_end - rankscope_chartjs_begin)};
#else
  return {};
#endif
}
}  // namespace rankscope::reader::assets
