#include "terminal_text.hpp"

#include <fmt/format.h>

namespace rankscope::reader {

std::string terminal_safe(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      fmt::format_to(std::back_inserter(out), "\\x{:02x}", c);
    } else if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {  // U+0080..U+009F: C1 controls (CSI is U+009B)
      fmt::format_to(std::back_inserter(out), "\\x{:02x}", static_cast<unsigned char>(text[++i]));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

}  // namespace rankscope::reader
