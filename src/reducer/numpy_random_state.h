// NumpyRandomState: the part of numpy's legacy np.random.RandomState that PyTorch's PowerSGD
// draws its seeds from, so that our random initial Qs equal PyTorch's.
//
// RandomState(seed) for an integer seed is MT19937 seeded with init_genrand(seed), which is what
// std::mt19937(seed) does. Its legacy randint(high) for a range below 2^32 draws 32-bit outputs,
// masks them with the smallest 2^k - 1 covering high - 1, and retries until the result is below
// high (numpy's buffered_bounded_masked_uint32). A unit test checks both against numpy itself.
// Not thread-safe: one generator, one owner.
#pragma once

#include <cstdint>
#include <random>

namespace ddp::detail {

class NumpyRandomState {
 public:
  /// REQUIRES: 0 <= seed < 2^32 (numpy refuses other seeds).
  explicit NumpyRandomState(uint32_t seed) : engine_(seed) {}

  /// np.random.RandomState.randint(high): uniform in [0, high). REQUIRES: 1 <= high <= 2^32.
  int64_t randint(uint64_t high) {
    const uint64_t largest = high - 1;
    if (largest == 0) return 0;  // numpy draws nothing for a range of one value
    uint64_t mask = largest;
    for (int shift = 1; shift < 64; shift <<= 1) mask |= mask >> shift;
    uint64_t value;
    do {
      value = static_cast<uint64_t>(engine_()) & mask;
    } while (value > largest);
    return static_cast<int64_t>(value);
  }

 private:
  std::mt19937 engine_;
};

}  // namespace ddp::detail
