// The ring file's bytes (ring_file.hpp): a header - the run log to append
// to, clock anchors, the table of ring blocks, the names table - then the
// blocks, each a ThreadState page, its metric slots and its records (the
// same layout in private memory when there is no file). Written by the
// owning process, read by ring_recovery.cpp after it died; both sides are the
// same build, which `layout` checks.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "rankscope/detail/record.hpp"
#include "rankscope/detail/thread_state.hpp"

namespace rankscope::detail {

inline constexpr char kRingFileMagic[8] = {'r', 's', 'r', 'i', 'n', 'g', '1', '\0'};
inline constexpr const char* kRingFileSuffix = ".rings";
inline constexpr std::uint32_t kMaxRingBlocks = 64;   // rings beyond these use private memory

// What the reader must agree on to read the writer's structs as they are.
// A process of another build (an older rankscope still running on the host)
// must leave a file it cannot read alone, not take it for empty.
struct RingLayout {
  std::uint32_t version, state_bytes, thread_state, record, published, written, committing, mask, tid;
  bool operator==(const RingLayout&) const = default;
};
inline constexpr std::size_t kThreadStateBytes = 4096;  // a block's ThreadState page
// Then its metric slots: in the block, so nothing else points out of it (a
// leak checker does not look inside shared mappings).
inline constexpr std::size_t kRingStateBytes = kThreadStateBytes + kMaxMetricSlots * sizeof(double);
static_assert(sizeof(ThreadState) <= kThreadStateBytes);
static_assert(kRingStateBytes % 4096 == 0);
inline RingLayout ring_layout() {
  // 3: step ends hold their counts and may begin the next step; 4: collectives carry waits (record.hpp);
  // 5: run-log writes are committed (RingCommit); 6: a commit names its piece by head, tail and length
  return {6,
          static_cast<std::uint32_t>(kRingStateBytes),
          static_cast<std::uint32_t>(sizeof(ThreadState)),
          static_cast<std::uint32_t>(sizeof(Record)),
          static_cast<std::uint32_t>(offsetof(ThreadState, published)),
          static_cast<std::uint32_t>(offsetof(ThreadState, written)),
          static_cast<std::uint32_t>(offsetof(ThreadState, committing)),
          static_cast<std::uint32_t>(offsetof(ThreadState, mask)),
          static_cast<std::uint32_t>(offsetof(ThreadState, tid))};
}

struct RingBlockEntry {
  std::atomic<std::uint32_t> in_use;
  std::uint32_t pad;
  std::uint64_t offset, bytes;
};

struct RingAnchor {
  std::uint64_t ticks, mono_ns, wall_ns;
  double ns_per_tick;
};

// A names-table entry, followed by its two strings (s1: the name, or a
// source location's file; s2: the function), padded to 8 bytes.
enum : std::uint8_t { kNameSite = 1, kNameCommunicator = 2, kNameSource = 3, kNameLogger = 4 };
struct RingName {
  std::uint32_t bytes;  // the whole entry
  std::uint8_t type, kind;  // kind: a site's PhaseKind
  std::uint16_t n1;
  std::uint64_t key;  // the pointer value (a logger: its id)
  std::uint32_t a;    // a communicator's id, a source's line
  std::int32_t b, c;  // a communicator's size and rank
  std::uint16_t n2, pad;
};

// The run-log write under way. A SIGKILL can land after the write(2) of some
// lines and before their rings' `written` moves past them; a recovery that
// started at `written` then appended those lines a second time. So before
// each piece of a write: kPreparing, every ring with lines in it gets
// `committing` (the position after its last record there), then the piece -
// its first and last bytes and its length - and where the file ended, then
// kReady; after it, `written` = `committing` and kIdle. A recoverer that finds
// kReady and that piece in the run log after `file_from` (its head at some
// offset, its tail where its length puts it) knows the write landed and starts
// each ring at `committing`. The head holds the first line's timestamps, so a
// line that ends like another (the same source location) is not taken for it.
enum : std::uint32_t { kCommitIdle = 0, kCommitPreparing = 1, kCommitReady = 2 };
inline constexpr std::size_t kCommitEdgeBytes = 64;
struct RingCommit {
  std::atomic<std::uint32_t> state;
  std::uint32_t edge_bytes;  // of head and of tail: min(piece_bytes, kCommitEdgeBytes)
  std::int64_t file_from;
  std::uint64_t piece_bytes;
  char head[kCommitEdgeBytes];
  char tail[kCommitEdgeBytes];
};
// Names the piece `p` of `n` (> 0) bytes, to be written where the file ends at `file_from`.
inline void describe_piece(RingCommit& c, std::int64_t file_from, const char* p, std::size_t n) noexcept {
  const std::size_t edge = n < kCommitEdgeBytes ? n : kCommitEdgeBytes;
  for (std::size_t i = 0; i < edge; ++i) {
    c.head[i] = p[i];
    c.tail[i] = p[n - edge + i];
  }
  c.edge_bytes = static_cast<std::uint32_t>(edge);
  c.piece_bytes = n;
  c.file_from = file_from;
}

struct RingFileHeader {
  char magic[8];
  RingLayout layout;
  std::int64_t pid;
  std::int32_t rank;
  std::atomic<std::uint32_t> recording;  // 1: a session's records may not all be in its run log
  char run_log[4096];
  std::atomic<std::uint64_t> anchor_index;  // anchors[anchor_index & 1] is whole
  RingAnchor anchors[2];
  RingCommit commit;
  std::atomic<std::uint32_t> blocks_made;
  RingBlockEntry blocks[kMaxRingBlocks];
  std::atomic<std::uint32_t> names_used;
  char names[256 << 10];
};
inline constexpr std::size_t kRingHeaderBytes = (sizeof(RingFileHeader) + 4095) / 4096 * 4096;

}  // namespace rankscope::detail
