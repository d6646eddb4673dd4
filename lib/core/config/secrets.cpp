#include "secrets.hpp"

#include "absl/strings/ascii.h"

namespace rankscope::detail {
namespace {

// Where an authority (or a scheme-less address) ends: a path, query,
// fragment, or a separator of the list the value may be.
bool ends_authority(char c) {
  return c == '/' || c == '?' || c == '#' || c == ',' || c == ';' || c == ' ' || c == '\t' || c == '\n' || c == '"' ||
         c == '\'';
}

}  // namespace

std::string strip_userinfo(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  bool any_scheme = false;
  std::size_t i = 0;
  while (i < value.size()) {
    const std::size_t s = value.find("://", i);
    if (s == std::string_view::npos) break;
    any_scheme = true;
    const std::size_t host = s + 3;
    std::size_t end = host;
    while (end < value.size() && !ends_authority(value[end])) ++end;
    const std::size_t at = value.substr(host, end - host).rfind('@');
    const std::size_t keep = at == std::string_view::npos ? host : host + at + 1;  // the host on
    out.append(value.substr(i, host - i));  // up to and with "://"
    out.append(value.substr(keep, end - keep));
    i = end;
  }
  out.append(value.substr(i));
  if (any_scheme) return out;
  // No URL: an address such as MASTER_ADDR=user:pw@host. Only "name:password@": an
  // e-mail address in a knob is no credential.
  std::size_t begin = 0;
  std::string cut;
  while (begin <= out.size()) {
    std::size_t end = begin;
    while (end < out.size() && !ends_authority(out[end])) ++end;
    const std::string_view token = std::string_view(out).substr(begin, end - begin);
    const std::size_t at = token.rfind('@');
    if (at != std::string_view::npos && token.substr(0, at).find(':') != std::string_view::npos) {
      cut.append(token.substr(at + 1));
    } else {
      cut.append(token);
    }
    if (end < out.size()) cut.push_back(out[end]);
    begin = end + 1;
  }
  return cut;
}

bool looks_secret(std::string_view name) {
  const std::string u = absl::AsciiStrToUpper(std::string(name));
  for (const char* w : {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH", "HEADERS", "COOKIE"}) {
    if (u.find(w) != std::string::npos) return true;
  }
  return false;
}

std::string shown_value(std::string_view name, std::string_view value) {
  return looks_secret(name) ? std::string("<redacted>") : strip_userinfo(value);
}

}  // namespace rankscope::detail
