// Coordinated dumps: the first rank whose watchdog sees a stall asks every
// rank to dump its flight recorder and stacks, so the evidence of all ranks
// is from the same moment - not from whenever each rank's own (learned)
// timeout runs out, or never for a rank that keeps making some progress.
//
// The request is a file in the run directory (`dump-request.json`, written
// atomically: {"rank","pid","reason","t","since"}); every rank's background
// thread stats it every 250 ms (one stat(2), nothing else while it is
// unchanged). The run directory is what every rank of a job already shares;
// ranks on nodes with node-local run directories see the requests of their
// own node only. One request per stall episode: a rank whose stall began
// before the newest request does not ask again.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace rankscope::detail {

class DumpRequests {
 public:
  void start(std::string run_dir, int rank, std::uint64_t session_wall_ns) noexcept;
  // This rank's stall began (progress stopped at since_wall_ns): ask the others.
  void ask(std::string_view reason, std::uint64_t since_wall_ns, std::uint64_t now_wall_ns) noexcept;
  // A new request from another process of this session: "rank 1 (stall)".
  std::optional<std::string> poll(std::uint64_t now_mono_ns) noexcept;

 private:
  struct Request {
    long long rank = -1, pid = -1;
    std::uint64_t t = 0, since = 0;
    std::string reason;
  };
  std::optional<Request> read() const;

  std::string path_;
  int rank_ = 0;
  std::uint64_t session_wall_ns_ = 0;
  std::uint64_t next_poll_mono_ = 0;
  std::int64_t seen_mtime_ns_ = -1;
};

}  // namespace rankscope::detail
