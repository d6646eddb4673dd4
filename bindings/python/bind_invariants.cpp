// Invariant checks. A violation under fail=True raises InvariantViolation;
// under fail=False it is recorded and logged and the call returns.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "rankscope/exchange.hpp"
#include "rankscope/invariants.hpp"
#include "violation.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {
PyObject* g_violation = nullptr;

rankscope::OnViolation policy(bool fail) { return fail ? rankscope::OnViolation::kFail : rankscope::OnViolation::kWarn; }

void raise_if(const absl::Status& st) {
  if (st.ok()) return;
  set_violation(st);
  throw py::error_already_set();
}
}  // namespace

void set_violation(const absl::Status& st) { PyErr_SetString(g_violation, std::string(st.message()).c_str()); }

void bind_invariants(py::module_& m) {
  g_violation = PyErr_NewExceptionWithDoc("rankscope.InvariantViolation",
                                          "Ranks disagree, or a local invariant failed, under fail=True.",
                                          PyExc_RuntimeError, nullptr);
  m.add_object("InvariantViolation", g_violation);
  m.def(
      "check_batch_math",
      [](std::int64_t micro, std::int64_t accum, std::int64_t dp, std::int64_t global, bool fail) {
        raise_if(rankscope::check_batch_math({micro, accum, dp, global}, policy(fail)));
      },
      py::kw_only(), "micro_batch"_a, "grad_accum"_a = 1, "data_parallel"_a, "global_batch"_a, "fail"_a = false,
      "micro_batch x grad_accum x data_parallel must equal global_batch (at init and after resume).");
  m.def(
      "check_sampler",
      [](std::uint64_t seed, std::int64_t epoch, bool shuffle, std::uint64_t fingerprint, std::int64_t num_indices,
         int data_group, bool fail) {
        py::gil_scoped_release release;  // may wait on the exchange
        const absl::Status st =
            rankscope::check_sampler({seed, epoch, shuffle, fingerprint, num_indices, data_group}, policy(fail));
        py::gil_scoped_acquire acquire;
        raise_if(st);
      },
      py::kw_only(), "seed"_a, "epoch"_a, "shuffle"_a = true, "fingerprint"_a = 0, "num_indices"_a = 0,
      "data_group"_a = -1, "fail"_a = false,
      "Records the sampler state; with an exchange, ranks must agree on seed/epoch and not share shards.");
  m.def(
      "check_data",
      [](std::uint64_t fingerprint, int data_group, bool fail) {
        py::gil_scoped_release release;  // may wait on the exchange
        const absl::Status st = rankscope::check_data(fingerprint, data_group, policy(fail));
        py::gil_scoped_acquire acquire;
        raise_if(st);
      },
      "fingerprint"_a, "data_group"_a = -1, "fail"_a = false,
      "A batch's fingerprint: ranks of one data_group must agree, different groups must differ.");
  m.def(
      "fingerprint_indices",
      [](const std::vector<std::int64_t>& idx, std::size_t first_k) { return rankscope::fingerprint_indices(idx, first_k); },
      "indices"_a, "first_k"_a = 1024, "FNV-1a of the first first_k indices (int64 little-endian).");
  m.def(
      "fingerprint_bytes", [](py::bytes b) {
        const std::string s = b;
        return rankscope::fingerprint_bytes(s.data(), s.size());
      },
      "data"_a);
  auto meta = [](std::string id, std::int64_t step, std::int64_t consumed, std::int64_t world, std::int64_t global,
                 std::uint64_t config_hash, std::int64_t opt_step, std::uint64_t rng) {
    return rankscope::CheckpointMeta{std::move(id), step, consumed, world, global, config_hash, opt_step, rng};
  };
  m.def(
      "record_checkpoint_save",
      [meta](std::string id, std::int64_t step, std::int64_t consumed, std::int64_t world, std::int64_t global,
             std::uint64_t config_hash, std::int64_t opt_step, std::uint64_t rng) {
        rankscope::record_checkpoint_save(meta(std::move(id), step, consumed, world, global, config_hash, opt_step, rng));
      },
      py::kw_only(), "id"_a, "step"_a, "consumed_samples"_a, "world_size"_a, "global_batch"_a, "config_hash"_a = 0,
      "optimizer_step"_a, "rng_fingerprint"_a = 0);
  m.def(
      "record_checkpoint_failure",
      [](const std::string& op, const std::string& id, const std::string& error) {
        if (op != "save" && op != "load") throw py::value_error("op must be 'save' or 'load', not '" + op + "'");
        rankscope::record_checkpoint_failure(op == "save" ? rankscope::CheckpointOp::kSave : rankscope::CheckpointOp::kLoad,
                                             id, error);
      },
      "op"_a, "id"_a, "error"_a,
      "A checkpoint save or load that failed: the run log, rankscope_checkpoint_failures_total, triage. The\n"
      "checkpoint age keeps counting from the last good save. `with rankscope.checkpoint(...)` calls it for you.");
  m.def(
      "_replica_checksum",
      [](std::uintptr_t address, std::size_t bytes) {
        py::gil_scoped_release release;
        return static_cast<std::int64_t>(rankscope::replica_checksum(reinterpret_cast<const void*>(address), bytes));
      },
      "address"_a, "bytes"_a, "Internal: replica_checksum() of a contiguous CPU tensor's memory (its data_ptr()).");
  m.def(
      "record_replica_mismatch",
      [](const std::string& tensor, const std::vector<int>& ranks, const std::string& values_json) {
        rankscope::record_replica_mismatch(tensor, ranks, values_json);
      },
      "tensor"_a, "ranks"_a, "values_json"_a = "",
      "Data-parallel replicas disagree on a tensor: the ranks that differ from the majority (with no majority,\n"
      "all of them). rankscope.torch.ReplicaCheck finds them and calls this.");
  m.def(
      "check_resume",
      [meta](std::string id, std::int64_t step, std::int64_t consumed, std::int64_t world, std::int64_t global,
             std::uint64_t config_hash, std::int64_t opt_step, std::uint64_t rng, bool fail) {
        absl::Status st;
        {
          py::gil_scoped_release release;
          st = rankscope::check_resume(meta(std::move(id), step, consumed, world, global, config_hash, opt_step, rng),
                                       policy(fail));
        }
        raise_if(st);
      },
      py::kw_only(), "id"_a, "step"_a, "consumed_samples"_a, "world_size"_a, "global_batch"_a, "config_hash"_a = 0,
      "optimizer_step"_a, "rng_fingerprint"_a = 0, "fail"_a = false,
      "On resume: optimizer step == step, consumed == step x global batch; with an exchange, every rank\n"
      "loaded the same checkpoint.");
  py::class_<rankscope::BatchAccounting>(m, "BatchAccounting", "Batches per epoch against the sampler's count.")
      .def(py::init([](std::int64_t n, std::int64_t micro, std::int64_t dp, bool drop_last, bool fail) {
             return new rankscope::BatchAccounting({n, micro, dp, drop_last, policy(fail)});
           }),
           py::kw_only(), "dataset_size"_a, "micro_batch"_a, "data_parallel"_a, "drop_last"_a = false, "fail"_a = false)
      .def_property_readonly("expected_per_epoch", &rankscope::BatchAccounting::expected_per_epoch)
      .def("start_epoch", &rankscope::BatchAccounting::start_epoch, "epoch"_a, "resume_at"_a = 0)
      .def("on_batch", [](rankscope::BatchAccounting& a, std::int64_t index) { raise_if(a.on_batch(index)); },
           "index"_a = -1)
      .def("end_epoch", [](rankscope::BatchAccounting& a) {
        absl::Status st;
        {
          py::gil_scoped_release release;
          st = a.end_epoch();
        }
        raise_if(st);
      });
  m.def("violation_count", &rankscope::violation_count);
  m.def(
      "use_local_exchange", [](int size, int rank, double timeout_s) {
        static auto* groups = new std::map<int, std::shared_ptr<rankscope::LocalExchangeGroup>>;
        auto& g = (*groups)[size];
        if (!g) g = std::make_shared<rankscope::LocalExchangeGroup>(size);
        rankscope::set_exchange(g->member(rank), std::chrono::milliseconds(static_cast<long>(timeout_s * 1e3)));
      },
      "size"_a, "rank"_a, "timeout_s"_a = 60.0,
      "In-process exchange (tests, single-process runs); the torch.distributed exchange comes with rankscope.torch.");
  m.def("clear_exchange", [] { rankscope::set_exchange(nullptr); });
}
