// RANKSCOPE_ENABLED=0: RANKSCOPE_NCCL(call) is the bare call (still made).
#include <catch2/catch.hpp>

#include "rankscope/integrations/nccl.hpp"

static_assert(RANKSCOPE_ENABLED == 0);

TEST_CASE("compiled out / the NCCL macro still makes the call", "[nccl][compiled_out]") {
  // The real ncclAllReduce with a null communicator fails fast without a GPU.
  float buf[1] = {0};
  const ncclResult_t r = RANKSCOPE_NCCL(ncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, nullptr, nullptr));
  CHECK(r != ncclSuccess);
}
