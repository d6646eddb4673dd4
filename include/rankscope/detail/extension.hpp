// rankscope/detail/extension.hpp — hooks for optional parts (the NCCL
// integration) into the background thread. Internal; not a public API.
// Thread-safety: the callbacks run on the background thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "rankscope/export/sink.hpp"

namespace rankscope::detail {

// A collective whose completion is measured on a device: returns true when
// the extension takes the event and emits it later from its poller.
using DeferCollective = bool (*)(const Event& host_part, const void* device_handle, std::uint64_t flight_id);
// Called on every background iteration; appends finished events.
using Poller = void (*)(std::vector<Event>& out);

void set_collective_extension(DeferCollective defer, Poller poll) noexcept;

// An exporter library registers how it builds itself from the environment
// when it is loaded; init() calls every factory (Config::exporters_from_env).
// A null sink means "not configured".
using EnvSinkFactory = absl::StatusOr<std::shared_ptr<Sink>> (*)();
bool register_env_sink(std::string_view name, EnvSinkFactory factory) noexcept;

struct EventTime {
  std::uint64_t mono_ns;
  std::uint64_t wall_ns;
};
// Converts clock ticks (detail::now_ticks) the way records are converted.
EventTime convert_ticks(std::uint64_t ticks) noexcept;
std::uint64_t ticks_to_ns(std::uint64_t dticks) noexcept;

}  // namespace rankscope::detail
