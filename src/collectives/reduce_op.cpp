#include "collectives/reduce_op.h"

namespace ddp::detail {

BackendReduce backend_reduce(ReduceOp op, const at::Tensor& tensor, const CollectiveCall& call,
                             const Backend& backend) {
  const auto dtype = tensor.scalar_type();
  const bool bitwise = op == ReduceOp::BAND || op == ReduceOp::BOR || op == ReduceOp::BXOR;
  if (bitwise && !c10::isIntegralType(dtype, /*includeBool=*/true)) {
    call.fail(std::string("ReduceOp::") + to_string(op) + " needs an integer tensor, got dtype " +
              c10::toString(dtype) + "; use SUM/MIN/MAX/PRODUCT/AVG for floating-point tensors");
  }
  if (tensor.is_complex() && op != ReduceOp::SUM && op != ReduceOp::AVG) {
    call.fail(std::string("ReduceOp::") + to_string(op) +
              " is not defined on complex tensors; only SUM and AVG are");
  }
  switch (op) {
    case ReduceOp::SUM:
      return {c10d::ReduceOp::SUM};
    case ReduceOp::AVG:
      // Integer averages truncate here, as documented; NCCL's own AVG is for floating types.
      if (backend.averages_natively() && c10::isFloatingType(dtype)) return {c10d::ReduceOp::AVG};
      return {c10d::ReduceOp::SUM, true};
    case ReduceOp::PRODUCT:
      return {c10d::ReduceOp::PRODUCT};
    case ReduceOp::MIN:
      return {c10d::ReduceOp::MIN};
    case ReduceOp::MAX:
      return {c10d::ReduceOp::MAX};
    case ReduceOp::BAND:
      return {c10d::ReduceOp::BAND};
    case ReduceOp::BOR:
      return {c10d::ReduceOp::BOR};
    case ReduceOp::BXOR:
      return {c10d::ReduceOp::BXOR};
  }
  call.fail("unknown ReduceOp value " + std::to_string(static_cast<int>(op)));
}

void divide_by(at::Tensor& tensor, int64_t size) {
  if (c10::isIntegralType(tensor.scalar_type(), /*includeBool=*/false)) {
    tensor.div_(size, "trunc");
  } else {
    tensor.div_(size);
  }
}

}  // namespace ddp::detail
