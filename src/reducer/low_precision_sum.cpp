#include "reducer/low_precision_sum.h"

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "collectives/unverified.h"

namespace ddp::detail {

Work sum_over_ranks_async(at::Tensor& tensor, const ProcessGroup& group) {
  if (reduces_natively(group, tensor)) {
    return all_reduce_async(tensor, ReduceOp::SUM, group, /*verify=*/false);
  }
  at::Tensor bytes = tensor.view(at::kByte);
  auto gathered = std::make_shared<std::vector<at::Tensor>>();
  at::Tensor target = tensor;
  return all_gather_async(bytes, *gathered, group, /*verify=*/false)
      .then([target, gathered]() mutable {
        at::Tensor sum = at::zeros(target.sizes(), target.options().dtype(at::kFloat));
        for (const auto& part : *gathered) {
          sum.add_(part.view(target.scalar_type()).view(target.sizes()).to(at::kFloat));
        }
        target.copy_(sum);
      });
}

}  // namespace ddp::detail
