// The rules of reducer/gradient_routes.h against the autograd of the libtorch this is built with.
//
// The routes read what autograd holds of a gradient from reference counts, which are libtorch's
// internals. These tests pin down the behaviour the rules rely on, in one process and without a
// reducer: what .grad looks like when a gradient accumulator's post hook runs (where the reducer
// decides a route), and after backward (where it hands the average over). A libtorch that
// changes any of it fails here first, by name.
#include "reducer/gradient_routes.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "compat/libtorch_compat.h"
#include "reducer/call_after_accumulation.h"

namespace {

using ddp::detail::GradBefore;
using ddp::detail::Route;

// Runs one backward of a Linear(3, 4) and returns the route each parameter's .grad takes when
// its accumulator's post hook runs (weight, bias), as the reducer would see it.
struct Observed {
  std::vector<Route> routes;
  std::vector<torch::Tensor> grads_at_hook;  // the .grad handles the hook saw
};

Observed backward_through(torch::nn::Linear& linear, const std::vector<GradBefore>& before,
                          const std::function<void()>& also_at_hook = nullptr) {
  auto parameters = linear->parameters();
  Observed observed;
  observed.routes.resize(parameters.size(), Route::kBucket);
  observed.grads_at_hook.resize(parameters.size());
  std::vector<std::pair<ddp::compat::AutogradNodePtr, uintptr_t>> hooks;
  for (size_t i = 0; i < parameters.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters[i]);
    hooks.emplace_back(
        accumulator,
        accumulator->add_post_hook(std::make_unique<ddp::detail::CallAfterAccumulation>([&, i] {
          const torch::Tensor& grad = parameters[i].grad();
          observed.routes[i] = route_of(parameters[i], grad, before[i]);
          observed.grads_at_hook[i] = grad;
          if (also_at_hook) also_at_hook();
        })));
  }
  linear->forward(torch::ones({2, 3})).sum().backward();
  for (auto& [accumulator, key] : hooks) accumulator->del_post_hook(key);
  return observed;
}

std::vector<GradBefore> grads_before(torch::nn::Linear& linear) {
  std::vector<GradBefore> before;
  for (const auto& p : linear->parameters()) before.push_back(GradBefore::of(p.grad()));
  return before;
}

TEST(GradientRoutes, AGradMadeByBackwardIsReadWhereAutogradLeftIt) {
  torch::nn::Linear linear(3, 4);
  for (auto& p : linear->parameters()) p.mutable_grad().reset();  // zero_grad(set_to_none)
  auto observed = backward_through(linear, grads_before(linear));
  EXPECT_EQ(observed.routes, std::vector<Route>({Route::kReadGrad, Route::kReadGrad}));
}

TEST(GradientRoutes, AGradThatExistedBeforeIsReducedWhereItIs) {
  torch::nn::Linear linear(3, 4);
  linear->forward(torch::ones({2, 3})).sum().backward();  // makes the .grads
  for (auto& p : linear->parameters()) p.mutable_grad().zero_();
  auto before = grads_before(linear);
  EXPECT_TRUE(before[0].exclusive && before[1].exclusive);
  auto observed = backward_through(linear, before);
  EXPECT_EQ(observed.routes, std::vector<Route>({Route::kInGrad, Route::kInGrad}));
  // Accumulated into in place: the same tensor as before backward.
  EXPECT_EQ(linear->weight.grad().unsafeGetTensorImpl(), before[0].grad.unsafeGetTensorImpl());
}

TEST(GradientRoutes, AGradSomebodyElseHoldsGoesThroughTheBucket) {
  torch::nn::Linear linear(3, 4);
  linear->forward(torch::ones({2, 3})).sum().backward();
  std::vector<torch::Tensor> kept;  // a user's handles: the memory is not exclusive
  for (auto& p : linear->parameters()) kept.push_back(p.grad().view(-1));
  auto before = grads_before(linear);
  EXPECT_FALSE(before[0].exclusive || before[1].exclusive);
  auto observed = backward_through(linear, before);
  EXPECT_EQ(observed.routes, std::vector<Route>({Route::kBucket, Route::kBucket}));
}

TEST(GradientRoutes, NonContiguousAndForeignGradsGoThroughTheBucket) {
  torch::nn::Linear linear(3, 4);
  linear->weight.mutable_grad() = torch::zeros({3, 4}).t();         // transposed: not contiguous
  linear->bias.mutable_grad() = torch::zeros({4}, torch::kDouble);  // not the parameter's dtype
  auto before = grads_before(linear);
  EXPECT_EQ(route_of(linear->weight, linear->weight.grad(), before[0]), Route::kBucket);
  EXPECT_EQ(route_of(linear->bias, linear->bias.grad(), before[1]), Route::kBucket);
}

TEST(GradientRoutes, TheAverageReplacesGradOnlyWhileNobodyElseSawIt) {
  torch::nn::Linear linear(3, 4);
  for (auto& p : linear->parameters()) p.mutable_grad().reset();
  auto observed = backward_through(linear, grads_before(linear));
  // After backward autograd holds nothing: .grad and the reducer's handle are all there is.
  EXPECT_TRUE(ddp::detail::can_replace_grad(linear->weight.grad(), observed.grads_at_hook[0]));
  EXPECT_TRUE(ddp::detail::can_replace_grad(linear->bias.grad(), observed.grads_at_hook[1]));
  // Somebody took .grad (a user's hook, a logger): the average must be copied into it instead.
  torch::Tensor taken = linear->bias.grad();
  EXPECT_FALSE(ddp::detail::can_replace_grad(linear->bias.grad(), observed.grads_at_hook[1]));
  taken = torch::Tensor();
  // .grad replaced by somebody else since the hook: not the tensor the reducer read.
  linear->weight.mutable_grad() = torch::zeros_like(linear->weight);
  EXPECT_FALSE(ddp::detail::can_replace_grad(linear->weight.grad(), observed.grads_at_hook[0]));
}

TEST(GradientRoutes, AnAverageIsReusedOnlyOnceNobodyButTheReducerHoldsIt) {
  auto grad = torch::ones({4});
  torch::Tensor average = torch::empty({4});
  EXPECT_TRUE(ddp::detail::can_reuse_average(average, grad));
  torch::Tensor as_grad = average;  // still somebody's .grad
  EXPECT_FALSE(ddp::detail::can_reuse_average(average, grad));
  as_grad = average.view({2, 2});  // a view of its memory
  EXPECT_FALSE(ddp::detail::can_reuse_average(average, grad));
  as_grad = torch::Tensor();
  EXPECT_TRUE(ddp::detail::can_reuse_average(average, grad));
  EXPECT_FALSE(ddp::detail::can_reuse_average(average, torch::ones({5})));  // another shape
  EXPECT_FALSE(ddp::detail::can_reuse_average(torch::Tensor(), grad));
}

}  // namespace
