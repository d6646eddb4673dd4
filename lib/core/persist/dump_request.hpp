// Coordinated dumps: the first rank whose watchdog sees a stall asks every
// rank to dump its flight recorder and stacks, so the evidence of all ranks
// is from the same moment - not from whenever each rank's own (learned)
// timeout runs out, or never for a rank that keeps making some progress.
//
// The request goes where every rank can see it: the job's c10d store when
// there is one (set_dump_request_channel: rankscope.torch after
// init_process_group, rankscope::torch::publish_heartbeat_to in C++), polled
// every second (one non-blocking counter read), and a file in the run
// directory (`dump-request.json`, written atomically:
// {"rank","pid","reason","t","since"}), stat'ed every 250 ms - the only path
// without a store, and only within a node when run directories are
// node-local. One request per stall episode: a rank whose stall began before
// the newest request does not ask again.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace rankscope::detail {

// The store's two operations, called on the background thread; errors are
// the channel's to catch (a dead store never reaches the watchdog).
struct DumpRequestChannel {
  std::function<void(const std::string&)> put;     // publish a request
  std::function<std::optional<std::string>()> get;  // the newest request, if there is a new one
};
void set_dump_request_channel(DumpRequestChannel c) noexcept;  // any thread; empty functions: none

class DumpRequests {
 public:
  struct Request {
    long long rank = -1, pid = -1;
    std::uint64_t t = 0, since = 0;
    std::string reason;
  };
  void start(std::string run_dir, int rank, std::uint64_t session_wall_ns) noexcept;
  // This rank's stall began (progress stopped at since_wall_ns): ask the others.
  void ask(std::string_view reason, std::uint64_t since_wall_ns, std::uint64_t now_wall_ns) noexcept;
  // A new request from another process of this session: "rank 1 (stall)".
  std::optional<std::string> poll(std::uint64_t now_mono_ns) noexcept;

 private:
  std::optional<Request> read() const;
  std::optional<std::string> take(const std::optional<Request>& r);  // the dump reason, once per request

  std::string path_;
  int rank_ = 0;
  std::uint64_t session_wall_ns_ = 0;
  std::uint64_t next_poll_mono_ = 0, next_store_poll_mono_ = 0;
  std::int64_t seen_mtime_ns_ = -1;
  long long handled_pid_ = -1;  // the last request answered, by either path
  std::uint64_t handled_t_ = 0;
};

}  // namespace rankscope::detail
