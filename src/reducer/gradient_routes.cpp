#include "reducer/gradient_routes.h"

namespace ddp::detail {

GradBefore GradBefore::of(const at::Tensor& grad) {
  return {grad, grad.defined() && grad.storage().use_count() == 1};
}

Route route_of(const at::Tensor& parameter, const at::Tensor& grad, const GradBefore& before) {
  const bool dense = grad.is_contiguous() && grad.layout() == at::kStrided &&
                     grad.scalar_type() == parameter.scalar_type() &&
                     grad.device() == parameter.device() && grad.device().is_cpu();
  if (!dense) return Route::kBucket;
  const bool same =
      before.grad.defined() && before.grad.unsafeGetTensorImpl() == grad.unsafeGetTensorImpl();
  // Accumulated into, in place, by this backward, in memory nothing else held before it: nobody
  // but the reducer touches it until the end of backward.
  if (same && before.exclusive) return Route::kInGrad;
  // Made by this backward (autograd stole the incoming gradient, or copied it), and held by
  // nothing but .grad. It may share memory with gradients still flowing back, or with another
  // parameter's .grad, so the backend must not write it before backward ends; but autograd only
  // ever reads such memory, so the backend may read it while backward goes on.
  if (!same && grad.use_count() == 1) return Route::kReadGrad;
  return Route::kBucket;  // anything else (a .grad shared with other tensors) is copied at once
}

bool can_reuse_average(const at::Tensor& average, const at::Tensor& grad) {
  return average.defined() && average.use_count() == 1 && average.storage().use_count() == 1 &&
         average.sizes() == grad.sizes();
}

bool can_replace_grad(const at::Tensor& grad, const at::Tensor& grad_at_hook) {
  // use_count 2: .grad itself and the reducer's copy of the handle taken at the hook.
  return grad.unsafeGetTensorImpl() == grad_at_hook.unsafeGetTensorImpl() &&
         grad.use_count() == 2 && grad.storage().use_count() == 1 && !grad.requires_grad();
}

}  // namespace ddp::detail
