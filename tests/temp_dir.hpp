// A fresh directory per test, removed at scope exit.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace rankscope::test {
struct TempDir {
  TempDir() {
    static std::atomic<int> n{0};
    path = (std::filesystem::temp_directory_path() /
            ("rankscope-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++)))
               .string();
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

// The whole file as a string ("" if it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Sets an environment variable for the scope.
struct ScopedEnv {
  ScopedEnv(const char* n, const char* v) : name(n) {  // v nullptr: unset
    if (const char* old = std::getenv(n)) prev = old, had = true;
    if (v != nullptr) ::setenv(n, v, 1);
    else ::unsetenv(n);
  }
  ~ScopedEnv() {
    if (had) ::setenv(name.c_str(), prev.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
  std::string name, prev;
  bool had = false;
};
}  // namespace rankscope::test
