// Gradient routes: how a gradient reaches a reduction that works on tensors where they are.
//
// Where a group's backend reduces lists of tensors in place with a pre-multiplier (shm on one
// host: unverified.h's reduces_lists_in_place), DDP's reducer need not copy each gradient into a
// flat bucket and back. Each gradient then takes one of three routes:
//   kInGrad    the .grad that existed before backward, accumulated into in place, in memory
//              nothing else holds: reduced in .grad itself, no copy either way;
//   kReadGrad  a .grad made by this backward (after zero_grad with set_to_none): only read where
//              autograd left it; the average goes to a tensor of the reducer's, which then
//              replaces .grad (or is copied into it when someone else can see .grad);
//   kBucket    anything else: copied into its bucket view, reduced there, copied back.
// The decisions rest on what autograd holds of a gradient, read from reference counts. Those are
// libtorch's internals: an upgrade that changes them must fail tests, not silently copy (slower)
// or, worse, write a tensor someone else still reads. So every rule lives here, and
// tests/unit/gradient_routes_test.cpp pins down the behaviour of the libtorch it is built with.
// CPU tensors only (the only ones a list-reducing backend takes). Thread-compatible: pure
// functions of their arguments.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ddp::detail {

enum class Route : uint8_t {
  kBucket,    // copied into its bucket view (or aliased by it), reduced there, copied back
  kReadGrad,  // read from .grad, made by this backward; the average replaces it (or is copied)
  kInGrad,    // reduced in .grad itself: no copy either way
};

/// A parameter's .grad as it was before backward (at prepare_for_backward). Held, so that a
/// tensor autograd makes later cannot take a freed one's address.
struct GradBefore {
  at::Tensor grad;
  bool exclusive = false;  // nothing but .grad held its memory

  static GradBefore of(const at::Tensor& grad);
};

/// The route of `grad`, the parameter's .grad as the accumulator's post hook sees it.
Route route_of(const at::Tensor& parameter, const at::Tensor& grad, const GradBefore& before);

/// kReadGrad: true when `average`, the reducer's tensor from an earlier step, may take this
/// step's average of `grad`: nothing but the reducer holds it or its memory (zero_grad dropped it
/// from .grad, and nobody kept it), so nobody can see it being written.
bool can_reuse_average(const at::Tensor& average, const at::Tensor& grad);

/// kReadGrad, after backward: true when the average may replace `grad`, the parameter's .grad
/// now, rather than be copied into it: it is still the tensor the hook saw, held only by .grad
/// and the reducer, in memory nothing else holds, so nobody can tell the two apart.
bool can_replace_grad(const at::Tensor& grad, const at::Tensor& grad_at_hook);

}  // namespace ddp::detail
