#include "reducer/orthogonalize.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "compat/libtorch_compat.h"

namespace ddp::detail {

void orthogonalize_gram_schmidt(at::Tensor& matrices, double epsilon) {
  const int64_t columns = matrices.size(2);
  for (int64_t i = 0; i < columns; ++i) {
    at::Tensor column = matrices.narrow(2, i, 1);
    at::Tensor norm = compat::norm_along(column, 1);
    column.div_(epsilon == 0 ? norm : norm + epsilon);
    if (i + 1 < columns) {
      at::Tensor rest = matrices.narrow(2, i + 1, columns - i - 1);
      rest.sub_(at::sum(column * rest, {1}, /*keepdim=*/true) * column);
    }
  }
}

void orthogonalize(at::Tensor& matrices, double epsilon) {
  TORCH_INTERNAL_ASSERT(matrices.dim() == 3 && matrices.size(2) <= matrices.size(1),
                        "orthogonalize expects [batch, n, r] with r <= n");
  const auto dtype = matrices.scalar_type();
  if (matrices.size(2) <= 2 || dtype == at::kHalf || dtype == at::kBFloat16) {
    orthogonalize_gram_schmidt(matrices, epsilon);
  } else {
    matrices.copy_(std::get<0>(at::linalg_qr(matrices)));
  }
}

}  // namespace ddp::detail
