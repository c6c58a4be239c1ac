// Orthogonalization of a batch of tall matrices, as PyTorch's PowerSGD hook does it: the columns
// of each matrix become orthonormal, in place.
#pragma once

#include <ATen/core/Tensor.h>

namespace ddp::detail {

/// matrices: [batch, n, r] with r <= n, orthogonalized in place. Gram-Schmidt for r <= 2 and for
/// half-precision dtypes (QR has no half kernels), Householder QR (linalg.qr's Q) otherwise,
/// which is faster at higher ranks: the same choice and arithmetic as PyTorch's _orthogonalize.
/// `epsilon` is added to each column norm before dividing (0: an all-zero column becomes NaN).
void orthogonalize(at::Tensor& matrices, double epsilon);

/// The Gram-Schmidt branch alone (PyTorch's _orthogonalize_gram_schmidt).
void orthogonalize_gram_schmidt(at::Tensor& matrices, double epsilon);

}  // namespace ddp::detail
