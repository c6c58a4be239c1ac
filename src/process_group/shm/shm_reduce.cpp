#include "process_group/shm/shm_reduce.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "common/error_context.h"

namespace ddp::detail {
namespace {

using Op = c10d::ReduceOp::RedOpType;

template <typename T, typename Combine>
void combine_loop(T* dst, const T* a, const T* b, size_t n, Combine combine) {
  for (size_t i = 0; i < n; ++i) dst[i] = combine(a[i], b[i]);
}

// Half and bfloat16 are combined in float and rounded once per pair, as gloo does.
template <typename T>
struct Arithmetic {
  using Compute = T;
};
template <>
struct Arithmetic<c10::Half> {
  using Compute = float;
};
template <>
struct Arithmetic<c10::BFloat16> {
  using Compute = float;
};

template <typename T>
void combine(T* dst, const T* a, const T* b, size_t n, Op op) {
  using C = typename Arithmetic<T>::Compute;
  switch (op) {
    case Op::SUM:
      return combine_loop(dst, a, b, n, [](T x, T y) { return T(C(x) + C(y)); });
    case Op::PRODUCT:
      return combine_loop(dst, a, b, n, [](T x, T y) { return T(C(x) * C(y)); });
    case Op::MIN:
      return combine_loop(dst, a, b, n, [](T x, T y) { return C(y) < C(x) ? y : x; });
    case Op::MAX:
      return combine_loop(dst, a, b, n, [](T x, T y) { return C(y) > C(x) ? y : x; });
    default:
      break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case Op::BAND:
        return combine_loop(dst, a, b, n, [](T x, T y) { return T(x & y); });
      case Op::BOR:
        return combine_loop(dst, a, b, n, [](T x, T y) { return T(x | y); });
      case Op::BXOR:
        return combine_loop(dst, a, b, n, [](T x, T y) { return T(x ^ y); });
      default:
        break;
    }
  }
}

// bool: sums and maxima are "any", products and minima "all".
void combine_bool(bool* dst, const bool* a, const bool* b, size_t n, Op op) {
  switch (op) {
    case Op::SUM:
    case Op::MAX:
    case Op::BOR:
      return combine_loop(dst, a, b, n, [](bool x, bool y) { return x || y; });
    case Op::PRODUCT:
    case Op::MIN:
    case Op::BAND:
      return combine_loop(dst, a, b, n, [](bool x, bool y) { return x && y; });
    case Op::BXOR:
      return combine_loop(dst, a, b, n, [](bool x, bool y) { return x != y; });
    default:
      break;
  }
}

template <typename T>
void combine_any(T* dst, const T* a, const T* b, size_t n, Op op) {
  if constexpr (std::is_same_v<T, bool>) {
    combine_bool(dst, a, b, n, op);
  } else {
    combine<T>(dst, a, b, n, op);
  }
}

template <typename T>
void reduce_typed(void* dst, const void* const* sources, int count, size_t n, Op op) {
  T* out = static_cast<T*>(dst);
  const T* first = static_cast<const T*>(sources[0]);
  if (count == 1) {
    if (out != first) std::memmove(out, first, n * sizeof(T));
    return;
  }
  if (count == 2) {  // element-wise, so dst may alias either source
    combine_any<T>(out, first, static_cast<const T*>(sources[1]), n, op);
    return;
  }
  // More sources: dst may alias a later source, which a first pass over dst would overwrite
  // before it is read. Combine block by block in a buffer that stays in L1, then store.
  constexpr size_t kBlock = 2048 / sizeof(T) > 0 ? 2048 / sizeof(T) : 1;
  T block[kBlock];
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t len = std::min(kBlock, n - begin);
    combine_any<T>(block, first + begin, static_cast<const T*>(sources[1]) + begin, len, op);
    for (int k = 2; k < count; ++k) {
      combine_any<T>(block, block, static_cast<const T*>(sources[k]) + begin, len, op);
    }
    std::memcpy(out + begin, block, len * sizeof(T));
  }
}

// PREMUL_SUM: dst = s0 * f + s1 * f + ..., each product rounded to T before it is added, in rank
// order: the products of PyTorch's reducer (a multiplication while copying into the bucket).
template <typename T>
void premul_sum(T* out, const void* const* sources, int count, size_t n, T factor) {
  auto source = [sources](int k) { return static_cast<const T*>(sources[k]); };
  if (count == 1) {
    for (size_t i = 0; i < n; ++i) out[i] = source(0)[i] * factor;
    return;
  }
  if (count == 2) {  // element-wise, so dst may alias either source
    const T* a = source(0);
    const T* b = source(1);
    for (size_t i = 0; i < n; ++i) out[i] = a[i] * factor + b[i] * factor;
    return;
  }
  constexpr size_t kBlock = 2048 / sizeof(T);  // as in reduce_typed: dst may alias a later source
  T block[kBlock];
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t len = std::min(kBlock, n - begin);
    const T* a = source(0) + begin;
    const T* b = source(1) + begin;
    for (size_t i = 0; i < len; ++i) block[i] = a[i] * factor + b[i] * factor;
    for (int k = 2; k < count; ++k) {
      const T* c = source(k) + begin;
      for (size_t i = 0; i < len; ++i) block[i] += c[i] * factor;
    }
    std::memcpy(out + begin, block, len * sizeof(T));
  }
}

}  // namespace

void check_reducible(c10::ScalarType dtype, Op op, const char* operation) {
  const bool bitwise = op == Op::BAND || op == Op::BOR || op == Op::BXOR;
  const bool known = op == Op::SUM || op == Op::PRODUCT || op == Op::MIN || op == Op::MAX ||
                     op == Op::PREMUL_SUM || bitwise;
  if (!known) {
    fail(operation, "the shm backend has no reduction " + std::to_string(static_cast<int>(op)) +
                        " (it supports SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR, as gloo does, "
                        "and PREMUL_SUM on float and double)");
  }
  if (op == Op::PREMUL_SUM && dtype != c10::kFloat && dtype != c10::kDouble) {
    fail(operation,
         std::string("PREMUL_SUM takes float or double tensors, got ") + c10::toString(dtype));
  }
  switch (dtype) {
    case c10::kFloat:
    case c10::kDouble:
    case c10::kHalf:
    case c10::kBFloat16:
      if (bitwise) {
        fail(operation,
             std::string("bitwise reductions need an integer tensor, got ") + c10::toString(dtype));
      }
      return;
    case c10::kChar:
    case c10::kByte:
    case c10::kShort:
    case c10::kInt:
    case c10::kLong:
    case c10::kBool:
      return;
    default:
      fail(operation,
           std::string("the shm backend cannot reduce tensors of dtype ") + c10::toString(dtype));
  }
}

void reduce_into(void* dst, const void* const* sources, int count, size_t n, c10::ScalarType dtype,
                 Op op, double factor) {
  if (op == Op::PREMUL_SUM) {
    if (dtype == c10::kFloat) {
      return premul_sum(static_cast<float*>(dst), sources, count, n, static_cast<float>(factor));
    }
    return premul_sum(static_cast<double*>(dst), sources, count, n, factor);
  }
  switch (dtype) {
    case c10::kFloat:
      return reduce_typed<float>(dst, sources, count, n, op);
    case c10::kDouble:
      return reduce_typed<double>(dst, sources, count, n, op);
    case c10::kHalf:
      return reduce_typed<c10::Half>(dst, sources, count, n, op);
    case c10::kBFloat16:
      return reduce_typed<c10::BFloat16>(dst, sources, count, n, op);
    case c10::kChar:
      return reduce_typed<int8_t>(dst, sources, count, n, op);
    case c10::kByte:
      return reduce_typed<uint8_t>(dst, sources, count, n, op);
    case c10::kShort:
      return reduce_typed<int16_t>(dst, sources, count, n, op);
    case c10::kInt:
      return reduce_typed<int32_t>(dst, sources, count, n, op);
    case c10::kLong:
      return reduce_typed<int64_t>(dst, sources, count, n, op);
    case c10::kBool:
      return reduce_typed<bool>(dst, sources, count, n, op);
    default:
      break;
  }
}

}  // namespace ddp::detail
