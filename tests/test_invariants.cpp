#include <catch2/catch.hpp>

#include <thread>

#include "attribute_codec.hpp"
#include "invariant_rules.hpp"
#include "rankscope/rankscope.hpp"
#include "rank_config.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using namespace std::chrono_literals;
using namespace rankscope::test;  // the helpers of tests/*.hpp

namespace {
Config inv_config(const std::string& dir) { return rank_config(dir, 0, 4); }

detail::RankFact fact(int rank, std::vector<std::pair<std::string, std::string>> values, int group = -1) {
  detail::RankFact f;
  f.rank = rank;
  f.data_group = group;
  f.values = std::move(values);
  return f;
}

// Plays the other ranks of an exchange: returns this rank's payload plus
// `others`, each produced from ours by `edit(rank, payload)`.
class ScriptedPeers final : public Exchange {
 public:
  ScriptedPeers(int size, std::function<std::string(int, std::string)> edit) : size_(size), edit_(std::move(edit)) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  absl::StatusOr<std::vector<std::string>> all_gather(std::string_view key, std::string_view payload,
                                                      std::chrono::milliseconds) override {
    keys.emplace_back(key);
    std::vector<std::string> out{std::string(payload)};
    for (int r = 1; r < size_; ++r) out.push_back(edit_(r, std::string(payload)));
    return out;
  }
  std::vector<std::string> keys;

 private:
  int size_;
  std::function<std::string(int, std::string)> edit_;
};

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto p = s.find(from);
  if (p != std::string::npos) s.replace(p, from.size(), to);
  return s;
}
}  // namespace

TEST_CASE("rules: the minority of ranks that disagree is named with every value", "[invariants]") {
  std::vector<detail::RankFact> f;
  for (int r = 0; r < 4; ++r) f.push_back(fact(r, {{"seed", r == 2 ? "99" : "1234"}, {"epoch", "1"}}));
  const auto found = detail::compare_facts("sampler", f);
  REQUIRE(found.size() == 1);
  CHECK(found[0].what == "seed");
  CHECK(found[0].ranks == std::vector<int>{2});
  CHECK(found[0].values_json == R"({"seed":{"1234":[0,1,3],"99":[2]}})");
  CHECK(found[0].message == "sampler: rank 2 disagrees on seed (rank 2 has 99; ranks 0,1,3 have 1234)");
  fmt::memory_buffer members;
  detail::attributes_json_to(detail::finding_attributes(found[0]), members);
  CHECK(fmt::to_string(members) ==
        R"("check":"sampler","what":"seed","ranks":[2],"values":{"seed":{"1234":[0,1,3],"99":[2]}})");
  // One culprit on several keys is one finding; another culprit is another.
  std::vector<detail::RankFact> resume;
  for (int r = 0; r < 4; ++r) {
    resume.push_back(fact(r, {{"id", r == 1 ? "ckpt-10" : "ckpt-20"},
                              {"step", r == 1 ? "10" : "20"},
                              {"config_hash", r == 3 ? "beef" : "cafe"}}));
  }
  const auto two = detail::compare_facts("resume", resume);
  REQUIRE(two.size() == 2);
  CHECK(two[0].what == "id,step");
  CHECK(two[0].ranks == std::vector<int>{1});
  CHECK(two[0].message == "resume: rank 1 disagrees on id (rank 1 has ckpt-10; ranks 0,2,3 have ckpt-20), "
                          "step (rank 1 has 10; ranks 0,2,3 have 20)");
  CHECK(two[1].what == "config_hash");
  CHECK(two[1].ranks == std::vector<int>{3});
  // A tie (two ranks that differ, a 2-2 split): no majority, no invented culprit: everyone is named.
  const auto tie = detail::compare_facts("resume", {fact(0, {{"step", "20"}}), fact(1, {{"step", "10"}})});
  REQUIRE(tie.size() == 1);
  CHECK(tie[0].ranks == std::vector<int>{0, 1});
  CHECK(tie[0].message ==
        "resume: ranks 0,1 disagree on step (rank 1 has 10; rank 0 has 20: no majority says which is right)");
  std::vector<detail::RankFact> split;
  for (int r = 0; r < 4; ++r) split.push_back(fact(r, {{"seed", r < 2 ? "1" : "2"}}));
  const auto two_two = detail::compare_facts("sampler", split);
  REQUIRE(two_two.size() == 1);
  CHECK(two_two[0].ranks == std::vector<int>{0, 1, 2, 3});
  CHECK(detail::compare_facts("resume", {fact(0, {{"step", "20"}}), fact(1, {{"step", "20"}})}).empty());
  CHECK(detail::compare_facts("unknown_check", f).empty());
}

TEST_CASE("rules: values with quotes and newlines give valid values JSON", "[invariants]") {
  const std::string value = "12\"34\n";
  std::vector<detail::RankFact> f;
  for (int r = 0; r < 3; ++r) f.push_back(fact(r, {{"seed", r == 1 ? "99" : value}}));
  const auto found = detail::compare_facts("sampler", f);
  REQUIRE(found.size() == 1);
  CHECK(found[0].values_json == R"({"seed":{"12\"34\n":[0,2],"99":[1]}})");
}

TEST_CASE("rules: shards must differ across data groups and agree within one", "[invariants]") {
  // Four data-parallel ranks, ranks 1 and 3 reading the same shard.
  std::vector<detail::RankFact> dp;
  for (int r = 0; r < 4; ++r) dp.push_back(fact(r, {{"fingerprint", r == 3 ? "b" : std::string(1, 'a' + r)}}));
  auto found = detail::compare_facts("sampler", dp);
  REQUIRE(found.size() == 1);
  CHECK(found[0].what == "identical_shards");
  CHECK(found[0].ranks == std::vector<int>{1, 3});
  // Two tensor-parallel groups {0,1} {2,3}: equal inside, different across.
  std::vector<detail::RankFact> tp = {fact(0, {{"fingerprint", "a"}}, 0), fact(1, {{"fingerprint", "a"}}, 0),
                                      fact(2, {{"fingerprint", "c"}}, 1), fact(3, {{"fingerprint", "c"}}, 1)};
  CHECK(detail::compare_facts("data", tp).empty());
  tp[1].values[0].second = "x";
  found = detail::compare_facts("data", tp);
  REQUIRE(found.size() == 1);
  CHECK(found[0].what == "fingerprint");
  CHECK(found[0].ranks == std::vector<int>{0, 1});  // a group of two that differs: no majority, both named
  CHECK_THAT(found[0].message, Catch::Contains("data group 0"));
}

TEST_CASE("batch math: a violation is recorded / logged and returned by policy", "[invariants]") {
  TempDir tmp;
  REQUIRE(init(inv_config(tmp.path)).ok());
  const auto before = violation_count();
  CHECK(check_batch_math({.micro_batch = 8, .grad_accum = 2, .data_parallel = 4, .global_batch = 64}).ok());
  const absl::Status st = check_batch_math({.micro_batch = 8, .grad_accum = 2, .data_parallel = 2, .global_batch = 64},
                                           OnViolation::kFail);
  CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(st.message()), Catch::Contains("8 x grad-accum 2 x data-parallel 2 = 32") &&
                                            Catch::Contains("configured as 64"));
  CHECK(check_batch_math({.micro_batch = 8, .grad_accum = 2, .data_parallel = 2, .global_batch = 64}).ok());  // default: warn
  CHECK(violation_count() == before + 2);
  shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  CHECK_THAT(log, Catch::Contains(R"("kind":"fact")") && Catch::Contains(R"("name":"batch_math","fields":{"seq":)") &&
                      Catch::Contains(R"("micro_batch":8,"grad_accum":2,"data_parallel":2,"global_batch":64})"));
  CHECK_THAT(log, Catch::Contains(R"("kind":"violation")") && Catch::Contains(R"("level":"error")") &&
                      Catch::Contains(R"("level":"warn")") &&
                      Catch::Contains(R"("check":"batch_math","what":"global_batch","ranks":[0])"));
  // Violations are written inline (durable before the call returns) and not duplicated by the drain.
  std::size_t n = 0;
  for (auto p = log.find(R"("kind":"violation")"); p != std::string::npos; p = log.find(R"("kind":"violation")", p + 1)) ++n;
  CHECK(n == 2);
}

TEST_CASE("batch accounting: expected count / skipped and repeated batches / epoch totals", "[invariants]") {
  // DistributedSampler semantics: 1000 samples over 4 ranks = 250 each; batches of 64.
  CHECK(BatchAccounting({.dataset_size = 1000, .micro_batch = 64, .data_parallel = 4}).expected_per_epoch() == 4);
  CHECK(BatchAccounting({.dataset_size = 1000, .micro_batch = 64, .data_parallel = 4, .drop_last = true})
            .expected_per_epoch() == 3);
  CHECK(BatchAccounting({.dataset_size = 1002, .micro_batch = 1, .data_parallel = 4}).expected_per_epoch() == 251);

  TempDir tmp;
  REQUIRE(init(inv_config(tmp.path)).ok());
  BatchAccounting acc({.dataset_size = 1024, .micro_batch = 64, .data_parallel = 4, .on = OnViolation::kFail});
  acc.start_epoch(0);  // 4 batches per epoch
  for (int i = 0; i < 4; ++i) CHECK(acc.on_batch(i).ok());
  CHECK(acc.end_epoch().ok());
  acc.start_epoch(1);
  begin_step(5);
  CHECK(acc.on_batch(0).ok());
  begin_step(6);
  const absl::Status skip = acc.on_batch(2);  // batch 1 swallowed by the loader
  CHECK(skip.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(skip.message()), Catch::Contains("rank 0 skipped batch 1 of epoch 1 (got batch 2) at step 6"));
  begin_step(7);
  CHECK(acc.on_batch(3).ok());
  const absl::Status short_epoch = acc.end_epoch();
  CHECK_THAT(std::string(short_epoch.message()),
             Catch::Contains("consumed 3 batches in epoch 1, expected 4") && Catch::Contains("step 6"));
  acc.start_epoch(2);
  CHECK(acc.on_batch(0).ok());
  CHECK_THAT(std::string(acc.on_batch(0).message()), Catch::Contains("repeated batch 0 of epoch 2"));
  // Resumed mid-epoch: counting starts at the batches already consumed.
  acc.start_epoch(3, 2);
  CHECK(acc.on_batch(2).ok());
  CHECK(acc.on_batch(3).ok());
  CHECK(acc.end_epoch().ok());
  shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  CHECK_THAT(log, Catch::Contains(R"("name":"epoch_batches","fields":{"seq":1,"data_group":0,"epoch":1,"batches":3,)"
                                  R"("expected":4,"skipped":1,"repeated":0,"first_divergence_step":6})"));
  CHECK_THAT(log, Catch::Contains(R"("what":"skipped_batch","ranks":[0],"values":{"epoch":1,"expected_index":1,)"));
}

TEST_CASE("batch accounting without start_epoch(): one warning naming the call / epochs inferred / no violation",
          "[invariants]") {
  TempDir tmp;
  REQUIRE(init(inv_config(tmp.path)).ok());
  const auto before = violation_count();
  // The README's loop as a user first writes it: on_batch() only, even under kFail.
  BatchAccounting acc({.dataset_size = 256, .micro_batch = 64, .data_parallel = 2, .on = OnViolation::kFail});
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int i = 0; i < 2; ++i) CHECK(acc.on_batch(i).ok());
  }
  CHECK(violation_count() == before);
  // A real repeat inside an inferred epoch is still caught.
  CHECK(acc.on_batch(1).code() == absl::StatusCode::kFailedPrecondition);
  shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  std::size_t n = 0;
  for (auto p = log.find("start_epoch() was not called"); p != std::string::npos;
       p = log.find("start_epoch() was not called", p + 1)) {
    ++n;
  }
  CHECK(n == 1);  // said once, as a warning, not a violation
  CHECK_THAT(log, Catch::Contains("repeated batch 1 of epoch 2"));
}

TEST_CASE("online checks: peers that disagree are named - the exchange key is per check and call", "[invariants]") {
  TempDir tmp;
  REQUIRE(init(inv_config(tmp.path)).ok());
  auto peers = std::make_shared<ScriptedPeers>(4, [](int r, std::string p) {
    return r == 3 ? replace(std::move(p), "seed=1234", "seed=77") : replace(std::move(p), "0\n", std::to_string(r) + "\n");
  });
  set_exchange(peers, 1s);
  // Rank 3 has another seed; ranks 0 and 3 also share a fingerprint (rank 3's
  // data group stayed 0 in the script: the same data group, so that is fine).
  const absl::Status st = check_sampler({.seed = 1234, .epoch = 2, .fingerprint = 42, .num_indices = 256},
                                        OnViolation::kFail);
  CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(st.message()), Catch::Contains("rank 3 has 77; ranks 0-2 have 1234"));
  // Ranks 1 and 2 (own data groups) read the same shard as rank 0's group.
  CHECK_THAT(std::string(st.message()), Catch::Contains("identical data"));
  CHECK(peers->keys.size() == 1);
  CHECK_THAT(peers->keys[0], Catch::StartsWith("sampler/"));

  // Resume: every peer agrees except rank 2, which loaded an older checkpoint.
  set_exchange(std::make_shared<ScriptedPeers>(4, [](int r, std::string p) {
                 return r == 2 ? replace(replace(std::move(p), "step=20\n", "step=10\n"), "id=ckpt-20", "id=ckpt-10") : p;
               }),
               1s);
  const absl::Status resume = check_resume({.id = "ckpt-20", .step = 20, .consumed_samples = 20 * 256,
                                            .world_size = 4, .global_batch = 256, .optimizer_step = 20},
                                           OnViolation::kFail);
  CHECK_THAT(std::string(resume.message()), Catch::Contains("rank 2 has ckpt-10") && Catch::Contains("rank 2 has 10;"));
  // Local rules need no peers.
  set_exchange(nullptr);
  const absl::Status local = check_resume({.id = "ckpt-5", .step = 5, .consumed_samples = 999, .world_size = 4,
                                           .global_batch = 256, .optimizer_step = 4},
                                          OnViolation::kFail);
  CHECK_THAT(std::string(local.message()), Catch::Contains("optimizer step 4 does not match its model step 5") &&
                                               Catch::Contains("999 consumed samples, but step 5 x global batch 256"));
  shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  CHECK_THAT(log, Catch::Contains(R"("check":"resume","what":"id,step","ranks":[2],"values":{)"
                                  R"("id":{"ckpt-10":[2],"ckpt-20":[0,1,3]},"step":{"10":[2],"20":[0,1,3]}})"));
}

TEST_CASE("local exchange group: all ranks gather - a missing rank is named after the timeout", "[invariants]") {
  LocalExchangeGroup group(3);
  CHECK(group.member(3) == nullptr);
  std::vector<absl::StatusOr<std::vector<std::string>>> got(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {  // 60 s: a hang guard for threads that meet within milliseconds
    threads.emplace_back([&, r] { got[r] = group.member(r)->all_gather("k/0", "p" + std::to_string(r), 60s); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    REQUIRE(got[r].ok());
    CHECK(*got[r] == std::vector<std::string>{"p0", "p1", "p2"});
  }
  // Rank 1 never arrives. One after the other, so that who is missing when
  // does not depend on when each thread runs: rank 2 first, told both others
  // are missing; then rank 0, which finds rank 2's payload left in the round
  // and is told rank 1 alone is missing.
  got[2] = group.member(2)->all_gather("k/1", "x", 0ms);
  CHECK(got[2].status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(missing_ranks(got[2].status()) == std::vector<int>{0, 1});
  got[0] = group.member(0)->all_gather("k/1", "x", 200ms);
  CHECK(got[0].status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(missing_ranks(got[0].status()) == std::vector<int>{1});
  CHECK_THAT(std::string(got[0].status().message()), Catch::Contains("rank 1 did not arrive"));
  CHECK(missing_ranks(absl::OkStatus()).empty());
}

TEST_CASE("an exchange timeout is itself a violation naming the missing ranks", "[invariants]") {
  TempDir tmp;
  REQUIRE(init(inv_config(tmp.path)).ok());
  LocalExchangeGroup group(2);
  set_exchange(group.member(0), 100ms);
  const absl::Status st = check_sampler({.seed = 1, .epoch = 0}, OnViolation::kFail);
  CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(st.message()), Catch::Contains("rank 1 did not arrive"));
  set_exchange(nullptr);
  shutdown();
  CHECK_THAT(slurp(tmp.path + "/rank-0.jsonl"), Catch::Contains(R"("what":"exchange_timeout","ranks":[1])"));
}

TEST_CASE("checks before init or without a run log still apply their local rules", "[invariants]") {
  CHECK(!initialized());
  CHECK(check_batch_math({.micro_batch = 2, .data_parallel = 2, .global_batch = 5}, OnViolation::kFail).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(check_sampler({.seed = 1}).ok());
  record_checkpoint_save({.id = "x"});
  CHECK(fingerprint_bytes("abc", 3) == 0xe71fa2190541574bull);  // FNV-1a 64 of "abc"
  const std::int64_t idx[] = {5, 1, 9, 3};
  CHECK(fingerprint_indices(idx, 2) == fingerprint_bytes(idx, 2 * sizeof(std::int64_t)));
  CHECK(fingerprint_indices(idx) != fingerprint_indices(idx, 2));
}
