// DistributedDataParallel: equivalence with one process, no_sync, unused parameters, buffers,
// model checks, comm hooks and the overlap of communication with backward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "collectives/unverified.h"
#include "ddp/ddp.h"
#include "reducer/call_after_accumulation.h"
#include "reducer/reducer.h"
#include "support/multiprocess.h"

using ddp::testing::run_ranks_ok;

namespace {

constexpr int kBatchPerRank = 8;
constexpr int kSteps = 10;

torch::nn::Sequential make_mlp() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(20, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 5));
}

// The second convolution has 16 output channels, not fewer: Debian 13's libtorch 2.6 computes the
// input gradient of a CPU convolution with under 16 output channels wrongly through oneDNN, and
// now and then from memory it never wrote (NaN). README, "Known problems of libtorch builds".
torch::nn::Sequential make_cnn() {
  torch::manual_seed(0);
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)), torch::nn::ReLU(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 16, 3)), torch::nn::ReLU(),
      torch::nn::Flatten(), torch::nn::Linear(16 * 6 * 6, 5));
}

// The whole batch of one step: world * kBatchPerRank samples, the same on every rank.
std::pair<torch::Tensor, torch::Tensor> global_batch(bool images, int world, int step) {
  torch::manual_seed(1000 + step);
  auto x = images ? torch::randn({world * kBatchPerRank, 1, 10, 10})
                  : torch::randn({world * kBatchPerRank, 20});
  return {x, torch::randint(0, 5, {world * kBatchPerRank})};
}

torch::Tensor rank_slice(const torch::Tensor& t, int rank) {
  return t.narrow(0, rank * kBatchPerRank, kBatchPerRank);
}

torch::Tensor flat_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : module.parameters()) flat.push_back(p.detach().reshape(-1));
  return torch::cat(flat);
}

// zero_grad with set_to_none (PyTorch's default since 2.0): every .grad is made anew by backward.
void reset_grads(torch::nn::Module& module) {
  for (auto& p : module.parameters()) p.mutable_grad().reset();
}

// N ranks with kBatchPerRank each against one process with the whole batch, SGD with momentum.
// `set_to_none` resets the DDP model's gradients instead of zeroing them.
void expect_equivalent_to_one_process(bool images, int world, int rank, ddp::DDPOptions options,
                                      ddp::CommHook hook = nullptr, double tolerance = 2e-5,
                                      bool set_to_none = false) {
  auto reference = images ? make_cnn() : make_mlp();
  auto net = images ? make_cnn() : make_mlp();
  ddp::DistributedDataParallel model(net, options);
  if (hook) model.register_comm_hook(hook);
  torch::optim::SGD reference_optimizer(reference->parameters(),
                                        torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(images, world, step);
    reference_optimizer.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    reference_optimizer.step();
    if (set_to_none) {
      reset_grads(*net);
    } else {
      optimizer.zero_grad();
    }
    torch::nn::functional::cross_entropy(model(rank_slice(x, rank)), rank_slice(y, rank))
        .backward();
    optimizer.step();
  }
  auto mine = flat_parameters(*net);
  EXPECT_TRUE(torch::allclose(mine, flat_parameters(*reference), 0, tolerance))
      << "max difference " << (mine - flat_parameters(*reference)).abs().max().item<double>();
  // Replicas stay bit-identical: every rank applied the same averaged gradients.
  auto all = ddp::all_gather(mine);
  for (size_t r = 1; r < all.size(); ++r) EXPECT_TRUE(torch::equal(all[0], all[r]));
}

}  // namespace

TEST(DistributedDataParallel, MlpOnTwoAndThreeRanksEqualsOneProcessWithTheWholeBatch) {
  for (int world : {2, 3}) {
    run_ranks_ok(world, [world](int rank) {
      ddp::init_process_group();
      // A 0.01 MiB cap splits the ~10 KiB-to-17 KiB layers into several buckets.
      auto several_buckets = ddp::DDPOptions().bucket_cap_mb(0.01).first_bucket_cap_mb(0.005);
      expect_equivalent_to_one_process(false, world, rank, several_buckets);
      expect_equivalent_to_one_process(false, world, rank,
                                       several_buckets.gradient_as_bucket_view(true));
      expect_equivalent_to_one_process(false, world, rank, several_buckets, nullptr, 2e-5,
                                       /*set_to_none=*/true);
      ddp::destroy_process_group();
    });
  }
}

TEST(DistributedDataParallel, CnnWithGradientAsBucketViewEqualsOneProcess) {
  for (int world : {2, 3}) {
    run_ranks_ok(world, [world](int rank) {
      ddp::init_process_group();
      expect_equivalent_to_one_process(
          true, world, rank, ddp::DDPOptions().bucket_cap_mb(0.004).gradient_as_bucket_view(true));
      expect_equivalent_to_one_process(true, world, rank, ddp::DDPOptions().bucket_cap_mb(0.004));
      ddp::destroy_process_group();
    });
  }
}

namespace {

// An MLP whose layers are registered in the opposite order of their use: backward makes its
// gradients ready in registration order, not in the reverse order DDP's first buckets assume, so
// the buckets rebuilt after the first backward differ from those of construction.
struct BackwardsMlpImpl : torch::nn::Module {
  BackwardsMlpImpl() {
    torch::manual_seed(0);
    last = register_module("last", torch::nn::Linear(64, 5));
    middle = register_module("middle", torch::nn::Linear(64, 64));
    first = register_module("first", torch::nn::Linear(20, 64));
  }
  torch::Tensor forward(torch::Tensor x) {
    return last->forward(torch::relu(middle->forward(torch::relu(first->forward(x)))));
  }
  torch::nn::Linear last{nullptr}, middle{nullptr}, first{nullptr};
};
TORCH_MODULE(BackwardsMlp);

}  // namespace

TEST(DistributedDataParallel, ResumedTrainingIsBitIdenticalToUninterruptedAtThreeRanks) {
  // A run restarted from a checkpoint constructs a fresh DDP. gloo's ring at 3 ranks sums an
  // element in an order set by where it lies in its bucket ((a+b)+c or a+(b+c)), so the fresh
  // DDP's first reduction must use the layout that the uninterrupted run uses at that step: the
  // one built from the gradients' ready order, never the reverse-registration guess. (At 2 ranks
  // a sum is exact whatever the layout, and shm sums in rank order: both must stay exact too.)
  for (std::string backend : {"gloo", "shm"}) {
    run_ranks_ok(3, [backend](int rank) {
      ddp::init_process_group(ddp::InitOptions().backend(backend));
      const ddp::DDPOptions variants[] = {
          ddp::DDPOptions(), ddp::DDPOptions().bucket_cap_mb(0.01).first_bucket_cap_mb(0.005),
          ddp::DDPOptions().gradient_as_bucket_view(true), ddp::DDPOptions().static_graph(true),
          ddp::DDPOptions().static_graph(true).find_unused_parameters(true)};
      constexpr int kResumeAt = 2;
      for (const auto& options : variants) {
        auto train = [&](BackwardsMlp& net, int from, int to) {
          ddp::DistributedDataParallel model(net, options);
          torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05));
          for (int step = from; step < to; ++step) {
            auto [x, y] = global_batch(false, 3, step);
            optimizer.zero_grad();
            torch::nn::functional::cross_entropy(model(rank_slice(x, rank)), rank_slice(y, rank))
                .backward();
            optimizer.step();
          }
        };
        BackwardsMlp uninterrupted;
        train(uninterrupted, 0, kSteps);
        BackwardsMlp first;
        train(first, 0, kResumeAt);
        BackwardsMlp resumed;  // the restarted process: a new model loads the checkpoint
        {
          torch::NoGradGuard no_grad;
          auto from = first->parameters();
          auto to = resumed->parameters();
          for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
        }
        train(resumed, kResumeAt, kSteps);
        auto expected = flat_parameters(*uninterrupted);
        auto got = flat_parameters(*resumed);
        EXPECT_TRUE(torch::equal(got, expected))
            << backend << ", bucket_cap_mb " << options.bucket_cap_mb()
            << ", gradient_as_bucket_view " << options.gradient_as_bucket_view()
            << ", static_graph " << options.static_graph() << ", find_unused_parameters "
            << options.find_unused_parameters() << ": max difference "
            << (got - expected).abs().max().item<double>();
      }
      ddp::destroy_process_group();
    });
  }
}

TEST(DistributedDataParallel, EveryBackwardReducesInTheBucketsBuiltFromTheReadyOrder) {
  // The comm hook sees each bucket's parameters: the same buckets in every backward, the first
  // one included, and the first bucket holds the gradients ready first (`last`'s, registered
  // first), not those that construction's reverse-registration guess puts there (`first`'s).
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group();
    BackwardsMlp net;
    // 0.01 MiB: `middle`'s 16 KiB weight closes a bucket of its own.
    ddp::DistributedDataParallel model(
        net, ddp::DDPOptions().bucket_cap_mb(0.01).first_bucket_cap_mb(0.001));
    std::vector<std::vector<const void*>> buckets;  // this backward's, in reduction order
    auto allreduce = ddp::comm_hooks::allreduce();
    model.register_comm_hook([&](const ddp::ProcessGroup& group, ddp::GradBucket& bucket) {
      EXPECT_EQ(bucket.index(), buckets.size());
      std::vector<const void*> members;
      for (const auto& p : bucket.parameters()) members.push_back(p.data_ptr());
      buckets.push_back(members);
      return allreduce(group, bucket);
    });
    std::vector<std::vector<const void*>> first_backward;
    for (int step = 0; step < 3; ++step) {
      buckets.clear();
      model(torch::randn({4, 20}) * (rank + 1)).sum().backward();
      if (step == 0) {
        first_backward = buckets;
        ASSERT_GE(buckets.size(), 2u);
        EXPECT_EQ(buckets[0], std::vector<const void*>(
                                  {net->last->bias.data_ptr(), net->last->weight.data_ptr()}));
      }
      EXPECT_EQ(buckets, first_backward) << "step " << step;
    }
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, GradientsAreMultipliedByOneOverWorldSizeThenSummedAtThreeRanks) {
  // PyTorch's DDP multiplies each gradient by 1/world_size, rounded, and sums; at 3 ranks that is
  // not what dividing gives. On one host shm reads the gradients where autograd left them and
  // reduces them there once .grad exists before backward (default options; steps 1 and 2), or in
  // the buckets (gradient_as_bucket_view, several buckets), or both (find_unused_parameters):
  // each must give the all-reduce of the premultiplied local gradients, summed in rank order.
  run_ranks_ok(3, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("shm"));
    const ddp::DDPOptions variants[] = {
        ddp::DDPOptions(),
        ddp::DDPOptions().bucket_cap_mb(0.01).first_bucket_cap_mb(0.005).gradient_as_bucket_view(
            true),
        ddp::DDPOptions().find_unused_parameters(true)};
    for (const auto& options : variants) {
      auto reference = make_mlp();
      auto net = make_mlp();
      ddp::DistributedDataParallel model(net, options);
      for (int step = 0; step < 3; ++step) {  // the buckets are rebuilt after the first
        auto [x, y] = global_batch(false, 3, step);
        reset_grads(*reference);
        torch::nn::functional::cross_entropy(reference->forward(rank_slice(x, rank)),
                                             rank_slice(y, rank))
            .backward();
        std::vector<torch::Tensor> local;
        for (const auto& p : reference->parameters()) local.push_back(p.grad().reshape(-1));
        auto expected = torch::cat(local) * (1.0 / 3);
        ddp::all_reduce(expected);
        for (auto& p : net->parameters()) {
          if (p.grad().defined()) p.mutable_grad().zero_();
        }
        torch::nn::functional::cross_entropy(model(rank_slice(x, rank)), rank_slice(y, rank))
            .backward();
        std::vector<torch::Tensor> averaged;
        for (const auto& p : net->parameters()) averaged.push_back(p.grad().reshape(-1));
        ASSERT_TRUE(torch::equal(torch::cat(averaged), expected))
            << "step " << step << ", gradient_as_bucket_view " << options.gradient_as_bucket_view()
            << ", find_unused_parameters " << options.find_unused_parameters();
      }
    }
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, ShmOnOneHostReducesGradientsWhereAutogradLeftThem) {
  // The copies into a bucket and back cost two passes over every gradient. Shm on one host skips
  // the first for each parameter that got a gradient, and the second too once .grad exists
  // before backward; not for one the outputs do not reach (its .grad must stay as it was if no
  // rank used it), not under a comm hook (it gets a bucket), not on gloo.
  using Route = ddp::detail::Reducer::Route;
  for (std::string backend : {"shm", "gloo"}) {
    run_ranks_ok(2, [backend](int) {
      ddp::init_process_group(ddp::InitOptions().backend(backend));
      torch::nn::Linear used(20, 8), unused(8, 2);
      auto parameters = used->parameters();
      for (const auto& p : unused->parameters()) parameters.push_back(p);
      const std::vector<std::string> names{"used.weight", "used.bias", "unused.weight",
                                           "unused.bias"};
      auto backward_through = [&](ddp::detail::Reducer& reducer) {
        reducer.prepare_for_forward();
        auto loss = used->forward(torch::randn({4, 20})).sum();
        reducer.prepare_for_backward({loss});
        loss.backward();
      };
      for (bool hook : {false, true}) {
        for (auto& p : parameters) p.mutable_grad().reset();
        ddp::detail::ReducerOptions options;
        options.find_unused_parameters = true;
        ddp::detail::Reducer reducer(parameters, names, ddp::ProcessGroup(), options);
        if (hook) reducer.register_comm_hook(ddp::comm_hooks::allreduce());
        const bool lists = backend == "shm" && !hook;
        backward_through(reducer);  // .grad made by this backward: read, its average replaces it
        const Route made = lists ? Route::kReadGrad : Route::kBucket;
        EXPECT_EQ(reducer.routes(),
                  std::vector<Route>({made, made, Route::kBucket, Route::kBucket}))
            << backend << ", hook " << hook;
        for (auto& p : used->parameters()) p.mutable_grad().zero_();
        backward_through(reducer);  // .grad accumulated into: reduced where it is
        const Route kept = lists ? Route::kInGrad : Route::kBucket;
        EXPECT_EQ(reducer.routes(),
                  std::vector<Route>({kept, kept, Route::kBucket, Route::kBucket}))
            << backend << ", hook " << hook;
        // A transposed .grad cannot be read as a run of elements: it goes through its bucket.
        used->weight.mutable_grad() = torch::zeros({20, 8}).t();
        backward_through(reducer);
        EXPECT_EQ(reducer.routes(),
                  std::vector<Route>({Route::kBucket, kept, Route::kBucket, Route::kBucket}))
            << backend << ", hook " << hook;
      }
      ddp::destroy_process_group();
    });
  }
}

TEST(DistributedDataParallel, GradientsThatShareMemoryAreAveragedEachOnce) {
  // Autograd may leave one buffer as the .grad of two parameters (AddBackward hands the same
  // tensor to two ViewBackward nodes, and AccumulateGrad keeps each view): reduced where they
  // are, the second would be averaged again from the first's result.
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("shm"));
    auto w1 = torch::zeros({4}, torch::requires_grad());
    auto w2 = torch::zeros({4}, torch::requires_grad());
    ddp::detail::Reducer reducer({w1, w2}, {"w1", "w2"}, ddp::ProcessGroup(), {});
    for (int step = 0; step < 2; ++step) {  // made by backward, then accumulated into
      reducer.prepare_for_forward();
      auto loss = ((w1.view({2, 2}) + w2.view({2, 2})) * (rank + 1)).sum();
      reducer.prepare_for_backward({loss});
      loss.backward();
      // The average of 1 and 2; then, as without DDP, both parameters' gradients accumulate into
      // the one buffer: 1.5 + (rank + 1) twice, averaged.
      const double expected = step == 0 ? 1.5 : 4.5;
      EXPECT_TRUE(torch::equal(w1.grad(), torch::full({4}, expected))) << w1.grad();
      EXPECT_TRUE(torch::equal(w2.grad(), torch::full({4}, expected))) << w2.grad();
      // Made by backward: only read. Then the .grad shares memory: copied, never written early.
      using Route = ddp::detail::Reducer::Route;
      const Route route = step == 0 ? Route::kReadGrad : Route::kBucket;
      EXPECT_EQ(reducer.routes(), std::vector<Route>({route, route})) << "step " << step;
    }
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, AGradientStillFlowingBackIsNotOverwrittenByItsAverage) {
  // w's .grad is the very buffer that backward still passes on to the Linear layer: the backend
  // may read it during backward but not write the average into it. The hook on x holds backward
  // there for 100 ms, so that w's bucket (its own, launched first) has long been reduced before
  // the Linear layer's gradients are computed from that buffer.
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("shm"));
    torch::manual_seed(0);
    torch::nn::Linear linear(3, 4);
    auto w = torch::zeros({4}, torch::requires_grad());
    auto parameters = linear->parameters();
    parameters.push_back(w);
    ddp::detail::ReducerOptions options;
    options.first_bucket_cap_bytes = 1;  // one bucket per parameter
    options.bucket_cap_bytes = 1;
    ddp::detail::Reducer reducer(parameters, {"linear.weight", "linear.bias", "w"},
                                 ddp::ProcessGroup(), options);
    reducer.prepare_for_forward();
    const double k = rank == 0 ? 1 : 3;
    auto x = linear->forward(torch::ones({1, 3}) * (rank + 1));
    x.register_hook([](torch::Tensor grad) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return grad;
    });
    auto loss = ((x + w.view({1, 4})) * k).sum();
    reducer.prepare_for_backward({loss});
    loss.backward();
    // Local gradients: bias and w k each, weight k * (rank + 1): averages 2, 2 and 3.5.
    EXPECT_TRUE(torch::equal(linear->bias.grad(), torch::full({4}, 2.0))) << linear->bias.grad();
    EXPECT_TRUE(torch::equal(linear->weight.grad(), torch::full({4, 3}, 3.5)))
        << linear->weight.grad();
    EXPECT_TRUE(torch::equal(w.grad(), torch::full({4}, 2.0))) << w.grad();
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, AGradMadeByBackwardIsReplacedByItsAverageReusedOnceDropped) {
  // After zero_grad with set_to_none each backward makes new gradients. On shm the backend writes
  // their averages into tensors of the reducer's, which replace them as .grad (no copy back), and
  // which it writes again in a later backward only once nobody else holds them.
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("shm"));
    torch::nn::Linear linear(3, 4);
    auto parameters = linear->parameters();
    ddp::detail::Reducer reducer(parameters, {"weight", "bias"}, ddp::ProcessGroup(), {});
    auto step = [&](double scale) {  // every gradient is scale * (rank + 1): averages 1.5 scale
      for (auto& p : parameters) p.mutable_grad().reset();
      reducer.prepare_for_forward();
      auto loss = linear->forward(torch::ones({1, 3})).sum() * (scale * (rank + 1));
      reducer.prepare_for_backward({loss});
      loss.backward();
    };
    step(1);
    EXPECT_EQ(reducer.bucket_bytes(), 0u);  // no gradient went through the bucket: freed
    std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> firsts;
    for (const auto& p : parameters) firsts.emplace_back(p.grad().getIntrusivePtr());
    step(2);
    for (size_t i = 0; i < parameters.size(); ++i) {
      EXPECT_EQ(parameters[i].grad().unsafeGetTensorImpl(), firsts[i].lock().get()) << i;
      EXPECT_TRUE(torch::equal(parameters[i].grad(), torch::full_like(parameters[i], 3.0)));
    }
    // Kept by the user past zero_grad: never overwritten; the next average goes elsewhere.
    std::vector<torch::Tensor> kept;
    for (const auto& p : parameters) kept.push_back(p.grad());
    step(4);
    for (size_t i = 0; i < parameters.size(); ++i) {
      EXPECT_TRUE(torch::equal(kept[i], torch::full_like(parameters[i], 3.0))) << kept[i];
      EXPECT_TRUE(torch::equal(parameters[i].grad(), torch::full_like(parameters[i], 6.0)));
      EXPECT_FALSE(parameters[i].grad().is_alias_of(kept[i])) << i;
    }
    // A .grad that someone else took during backward: the average is copied into it.
    torch::Tensor taken;
    auto accumulator = torch::autograd::impl::grad_accumulator(linear->bias);
    accumulator->add_post_hook(
        std::make_unique<ddp::detail::CallAfterAccumulation>([&] { taken = linear->bias.grad(); }));
    step(8);
    EXPECT_EQ(taken.unsafeGetTensorImpl(), linear->bias.grad().unsafeGetTensorImpl());
    EXPECT_TRUE(torch::equal(taken, torch::full({4}, 12.0))) << taken;
    // A transposed .grad goes through the bucket, which comes back for it (weight and bias).
    linear->weight.mutable_grad() = torch::zeros({3, 4}).t();
    linear->bias.mutable_grad().reset();
    reducer.prepare_for_forward();
    auto loss = linear->forward(torch::ones({1, 3})).sum() * (rank + 1.0);
    reducer.prepare_for_backward({loss});
    loss.backward();
    EXPECT_EQ(reducer.bucket_bytes(), (12u + 4u) * sizeof(float));
    EXPECT_TRUE(torch::equal(linear->weight.grad(), torch::full({4, 3}, 1.5)));
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, GradientAsBucketViewMakesGradAViewOfTheBucket) {
  run_ranks_ok(2, [](int) {
    ddp::init_process_group();
    auto net = make_mlp();
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().gradient_as_bucket_view(true));
    for (int step = 0; step < 3; ++step) {
      model(torch::randn({4, 20})).sum().backward();
    }
    // One bucket holds every gradient (the default 25 MiB cap): the grads share its storage.
    auto params = net->parameters();
    const auto* storage = params[0].grad().storage().data();
    for (const auto& p : params) EXPECT_EQ(p.grad().storage().data(), storage);
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, NoSyncAccumulatesAndTheNextSyncAveragesTheWhole) {
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group();
    auto reference = make_mlp();
    auto net = make_mlp();
    ddp::DistributedDataParallel model(net);
    auto [x0, y0] = global_batch(false, 2, 0);
    auto [x1, y1] = global_batch(false, 2, 1);
    {
      auto guard = model.no_sync();
      torch::nn::functional::cross_entropy(model(rank_slice(x0, rank)), rank_slice(y0, rank))
          .backward();
    }
    // Inside no_sync nothing was communicated: the gradient is this rank's own.
    torch::nn::functional::cross_entropy(model(rank_slice(x1, rank)), rank_slice(y1, rank))
        .backward();
    torch::nn::functional::cross_entropy(reference->forward(x0), y0).backward();
    torch::nn::functional::cross_entropy(reference->forward(x1), y1).backward();
    auto params = net->parameters();
    auto expected = reference->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(params[i].grad(), expected[i].grad(), 1e-5, 1e-6)) << i;
    }
    ddp::destroy_process_group();
  });
}

namespace {

// A model whose forward uses `extra` only when asked.
struct BranchyImpl : torch::nn::Module {
  BranchyImpl() {
    torch::manual_seed(0);
    used = register_module("used", torch::nn::Linear(6, 3));
    extra = register_module("extra", torch::nn::Linear(6, 3));
  }
  torch::Tensor forward(torch::Tensor x, bool use_extra) {
    auto out = used->forward(x);
    return use_extra ? out + extra->forward(x) : out;
  }
  torch::nn::Linear used{nullptr}, extra{nullptr};
};
TORCH_MODULE(Branchy);

}  // namespace

TEST(DistributedDataParallel, UnusedParametersOnEveryRankKeepTheirGradUntouched) {
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group();
    Branchy net;
    Branchy reference;
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().find_unused_parameters(true));
    for (int step = 0; step < 3; ++step) {
      torch::manual_seed(step);
      auto x = torch::randn({4, 6});
      net->zero_grad();
      reference->zero_grad();
      model(x.narrow(0, rank * 2, 2), false).mean().backward();
      reference->forward(x, false).mean().backward();
      EXPECT_FALSE(net->extra->weight.grad().defined());
      EXPECT_TRUE(
          torch::allclose(net->used->weight.grad(), reference->used->weight.grad(), 1e-6, 1e-7));
    }
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, ParameterUsedOnOneRankOnlyGetsTheAverage) {
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group();
    Branchy net;
    Branchy reference;
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().find_unused_parameters(true));
    auto x = torch::ones({2, 6}) * (rank + 1);
    model(x, /*use_extra=*/rank == 0).sum().backward();
    // Rank 0's gradient of `extra` divided by 2 (rank 1 contributed zero).
    reference->forward(torch::ones({2, 6}), true).sum().backward();
    EXPECT_TRUE(torch::allclose(net->extra->weight.grad(), reference->extra->weight.grad() / 2));
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, UnusedParameterWithoutTheOptionErrorsAtTheNextForward) {
  run_ranks_ok(2, [](int) {
    ddp::init_process_group(ddp::InitOptions().timeout(std::chrono::seconds(10)));
    Branchy net;
    ddp::DistributedDataParallel model(net);
    auto x = torch::randn({2, 6});
    model(x, false).sum().backward();
    auto start = std::chrono::steady_clock::now();
    try {
      model(x, false);
      ADD_FAILURE() << "expected an error";
    } catch (const ddp::DistributedError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("expected to have finished reduction in the prior iteration"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("'extra.weight'"), std::string::npos) << what;
      EXPECT_NE(what.find("find_unused_parameters(true)"), std::string::npos) << what;
    }
    EXPECT_LT(ddp::testing::elapsed_ms(start), 5000);
    ddp::destroy_process_group();
  });
}

namespace {

// Keeps a tensor computed from `aux` outside its output: the graph walk cannot see it.
struct SideOutputImpl : torch::nn::Module {
  SideOutputImpl() {
    main = register_module("main", torch::nn::Linear(4, 2));
    aux = register_module("aux", torch::nn::Linear(4, 2));
  }
  torch::Tensor forward(torch::Tensor x) {
    side = aux->forward(x);
    return main->forward(x);
  }
  torch::nn::Linear main{nullptr}, aux{nullptr};
  torch::Tensor side;
};
TORCH_MODULE(SideOutput);

}  // namespace

TEST(DistributedDataParallel, ParameterMarkedReadyTwiceIsAClearError) {
  run_ranks_ok(2, [](int) {
    ddp::init_process_group(ddp::InitOptions().timeout(std::chrono::seconds(10)));
    SideOutput net;
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().find_unused_parameters(true));
    auto out = model(torch::randn({3, 4}));
    try {
      (out.sum() + net->side.sum()).backward();
      ADD_FAILURE() << "expected an error";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("marked as ready twice"), std::string::npos) << e.what();
    }
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, BuffersEqualRankZerosAfterAForwardInEvalMode) {
  run_ranks_ok(3, [](int rank) {
    ddp::init_process_group();
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4));
    ddp::DistributedDataParallel model(net);
    // Training steps on rank-specific data: each rank's running statistics drift apart...
    model(torch::randn({8, 4}) * (rank + 1) + rank).sum().backward();
    net->eval();
    {
      torch::NoGradGuard no_grad;
      model(torch::randn({2, 4}));
    }
    // ...until the next forward broadcasts rank 0's.
    for (const auto& buffer : net->buffers()) {
      auto all = ddp::all_gather(buffer.to(torch::kDouble));
      for (size_t r = 1; r < all.size(); ++r) EXPECT_TRUE(torch::equal(all[0], all[r]));
    }
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, ModelThatDiffersOnOneRankErrorsAtConstruction) {
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().timeout(std::chrono::seconds(10)));
    torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::Linear(8, rank == 0 ? 2 : 3));
    try {
      ddp::DistributedDataParallel model(net);
      ADD_FAILURE() << "expected an error";
    } catch (const ddp::MismatchError& e) {
      EXPECT_EQ(e.rank(), rank);
      EXPECT_EQ(e.operation(), "DistributedDataParallel");
      std::string what = e.what();
      EXPECT_NE(what.find("'1.weight' Float [2, 8]"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 1 has parameter '1.weight' Float [3, 8]"), std::string::npos)
          << what;
    }
    torch::nn::Sequential shorter(torch::nn::Linear(4, 8));
    if (rank == 1) shorter->push_back(torch::nn::Linear(8, 2));
    EXPECT_THROW(ddp::DistributedDataParallel{shorter}, ddp::MismatchError);
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, DeviceIdsNameTheModulesOneDeviceAndInputsGoThere) {
  run_ranks_ok(1, [](int) {
    ddp::init_process_group();
    auto net = make_mlp();
    // The CPU, as ddp::set_device() gives on a machine without GPUs: the same program runs.
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().device_ids({torch::kCPU}));
    EXPECT_EQ(model(torch::ones({2, 20})).sizes(), (std::vector<int64_t>{2, 5}));
    auto error_of = [&](ddp::DDPOptions options) {
      try {
        ddp::DistributedDataParallel wrapped(net, options);
      } catch (const ddp::DistributedError& error) {
        return std::string(error.what());
      }
      return std::string("no error");
    };
    EXPECT_NE(error_of(ddp::DDPOptions().device_ids({torch::kCPU, torch::kCPU}))
                  .find("device_ids takes one device"),
              std::string::npos);
    EXPECT_NE(error_of(ddp::DDPOptions().device_ids({torch::Device("cuda:1")}))
                  .find("device_ids says cuda:1 but the module's parameters are on cpu"),
              std::string::npos);
    EXPECT_NE(error_of(ddp::DDPOptions().output_device(torch::Device("cuda:0")))
                  .find("output_device cuda:0 differs from the module's device cpu"),
              std::string::npos);
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, ModuleWithoutTrainableParametersIsAnError) {
  run_ranks_ok(1, [](int) {
    ddp::init_process_group();
    torch::nn::Sequential net(torch::nn::Linear(2, 2));
    for (auto& p : net->parameters()) p.set_requires_grad(false);
    try {
      ddp::DistributedDataParallel model(net);
      ADD_FAILURE();
    } catch (const ddp::DistributedError& e) {
      EXPECT_NE(std::string(e.what()).find("doesn't have any parameter that requires a gradient"),
                std::string::npos);
    }
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, SharedPointerModulesAndTupleOutputsWork) {
  struct TwoHeadsImpl : torch::nn::Module {
    TwoHeadsImpl() {
      torch::manual_seed(0);
      a = register_module("a", torch::nn::Linear(3, 2));
      b = register_module("b", torch::nn::Linear(3, 2));
    }
    std::tuple<torch::Tensor, std::vector<torch::Tensor>> forward(torch::Tensor x) {
      return {a->forward(x), {b->forward(x)}};
    }
    torch::nn::Linear a{nullptr}, b{nullptr};
  };
  run_ranks_ok(2, [](int) {
    ddp::init_process_group();
    auto net = std::make_shared<TwoHeadsImpl>();
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().find_unused_parameters(true));
    auto [first, rest] = model(torch::ones({2, 3}));
    (first.sum() + rest[0].sum()).backward();
    EXPECT_TRUE(net->a->weight.grad().defined());
    EXPECT_TRUE(net->b->weight.grad().defined());  // found through the vector in the tuple
    EXPECT_EQ(model.module().get(), net.get());
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, CompressionHooksTrainWithinTolerance) {
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group();
    auto options = ddp::DDPOptions().bucket_cap_mb(0.01);
    expect_equivalent_to_one_process(false, 2, rank, options, ddp::comm_hooks::allreduce(), 2e-5);
    expect_equivalent_to_one_process(false, 2, rank, options, ddp::comm_hooks::fp16_compress(),
                                     5e-3);
    expect_equivalent_to_one_process(false, 2, rank, options, ddp::comm_hooks::bf16_compress(),
                                     3e-2);
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, Bf16HookReducesInSharedMemoryAndSumsTheSameAsOverGloo) {
  // Shared memory reduces bfloat16 itself: the hook all-reduces there instead of all-gathering
  // every rank's bucket as it must on gloo. Two ranks' sum is rounded once either way, so the
  // bits agree (with more ranks the all-reduce rounds once per pair, as gloo and NCCL do).
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("shm"));
    auto gloo = ddp::new_group({0, 1}, "gloo");
    const auto bf16 = torch::zeros({1}, torch::kBFloat16);
    EXPECT_TRUE(ddp::detail::reduces_natively(ddp::ProcessGroup(), bf16));
    EXPECT_FALSE(ddp::detail::reduces_natively(gloo, bf16));
    EXPECT_TRUE(ddp::detail::reduces_natively(gloo, torch::zeros({1})));
    auto hook = ddp::comm_hooks::bf16_compress();
    for (int64_t numel : {int64_t(1000), int64_t(300000)}) {  // one phase, and several rounds
      torch::manual_seed(rank);
      auto values = torch::randn({numel});
      ddp::GradBucket on_shm(0, 1, values.clone(), {});
      ddp::GradBucket on_gloo(0, 1, values.clone(), {});
      hook(ddp::ProcessGroup(), on_shm).wait();
      hook(gloo, on_gloo).wait();
      EXPECT_TRUE(torch::equal(on_shm.buffer(), on_gloo.buffer())) << numel;
    }
    ddp::destroy_process_group();
  });
}

namespace {

// Rank r's bucket in the between-hosts tests.
torch::Tensor bucket_of(int rank, int64_t numel) {
  torch::manual_seed(rank);
  return torch::randn({numel});
}

}  // namespace

TEST(DistributedDataParallel, CompressionBetweenHostsRoundsOnlyEachHostsAverage) {
  // Four ranks posing as two hosts, interleaved: host "a" is ranks 0 and 2 (its leader, rank 0,
  // comes first), host "b" ranks 1 and 3. Each host's average is exact inside the host and
  // rounded once, to cross between the hosts.
  run_ranks_ok(4, [](int rank) {
    ::setenv("DDP_CPP_HOST_ID", rank % 2 == 0 ? "a" : "b", 1);
    ddp::init_process_group();
    ASSERT_EQ(ddp::get_backend(), "hierarchical");
    auto gloo = ddp::new_group({0, 1, 2, 3}, "gloo");
    auto host_a = ddp::new_group({0, 2});  // one host: shared memory
    for (auto wire : {torch::kBFloat16, torch::kHalf}) {
      auto hook = wire == torch::kBFloat16 ? ddp::comm_hooks::bf16_compress_between_hosts()
                                           : ddp::comm_hooks::fp16_compress_between_hosts();
      for (int64_t numel : {int64_t(1000), int64_t(300000)}) {
        std::vector<torch::Tensor> x;
        for (int r = 0; r < 4; ++r) x.push_back(bucket_of(r, numel));
        auto crossing = [&](const torch::Tensor& a, const torch::Tensor& b) {
          return ((a + b) / 4).to(wire).to(torch::kFloat);
        };
        torch::Tensor expected = torch::zeros({numel}) + crossing(x[0], x[2]) + crossing(x[1], x[3]);
        ddp::GradBucket bucket(0, 1, x[rank].clone(), {});
        hook(ddp::ProcessGroup(), bucket).wait();
        EXPECT_TRUE(torch::equal(bucket.buffer(), expected)) << c10::toString(wire) << " x" << numel;
        // Rounding every rank's part, as the hooks that compress everything do, gives other bits.
        torch::Tensor every_rank_rounded = torch::zeros({numel});
        for (int r = 0; r < 4; ++r) every_rank_rounded += (x[r] / 4).to(wire).to(torch::kFloat);
        EXPECT_FALSE(torch::equal(bucket.buffer(), every_rank_rounded));

        // Where every rank's bytes cross a network (flat gloo), everything is compressed.
        ddp::GradBucket on_gloo(0, 1, x[rank].clone(), {});
        ddp::GradBucket compressed(0, 1, x[rank].clone(), {});
        hook(gloo, on_gloo).wait();
        auto everywhere = wire == torch::kBFloat16 ? ddp::comm_hooks::bf16_compress()
                                                   : ddp::comm_hooks::fp16_compress();
        everywhere(gloo, compressed).wait();
        EXPECT_TRUE(torch::equal(on_gloo.buffer(), compressed.buffer()));

        // On one host nothing crosses a network: the plain average, to the bit.
        if (rank % 2 == 0) {
          ddp::GradBucket local(0, 1, x[rank].clone(), {});
          hook(host_a, local).wait();
          EXPECT_TRUE(torch::equal(local.buffer(), (x[0] + x[2]) / 2));
        }
      }
    }
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, CompressionBetweenHostsTrainsWithinTolerance) {
  run_ranks_ok(4, [](int rank) {
    ::setenv("DDP_CPP_HOST_ID", rank < 2 ? "a" : "b", 1);
    ddp::init_process_group();
    ASSERT_EQ(ddp::get_backend(), "hierarchical");
    auto options = ddp::DDPOptions().bucket_cap_mb(0.01);
    expect_equivalent_to_one_process(false, 4, rank, options,
                                     ddp::comm_hooks::fp16_compress_between_hosts(), 5e-3);
    expect_equivalent_to_one_process(true, 4, rank, options,
                                     ddp::comm_hooks::bf16_compress_between_hosts(), 3e-2);
    ddp::destroy_process_group();
  });
}

TEST(DistributedDataParallel, RegisterCommHookTwiceOrAfterBackwardIsAnError) {
  run_ranks_ok(1, [](int) {
    ddp::init_process_group();
    auto net = make_mlp();
    ddp::DistributedDataParallel model(net);
    model.register_comm_hook(ddp::comm_hooks::allreduce());
    EXPECT_THROW(model.register_comm_hook(ddp::comm_hooks::allreduce()), ddp::DistributedError);
    auto other = make_mlp();
    ddp::DistributedDataParallel second(other);
    second(torch::randn({2, 20})).sum().backward();
    try {
      second.register_comm_hook(ddp::comm_hooks::fp16_compress());
      ADD_FAILURE();
    } catch (const ddp::DistributedError& e) {
      EXPECT_NE(std::string(e.what()).find("before the first backward"), std::string::npos);
    }
    ddp::destroy_process_group();
  });
}

namespace {

// Records the order in which bucket reductions start and the first layer's gradient is computed.
struct EventLog {
  std::mutex mutex;
  std::vector<std::string> events;
  void add(const std::string& event) {
    std::lock_guard<std::mutex> lock(mutex);
    events.push_back(event);
  }
  size_t position(const std::string& event) {
    std::lock_guard<std::mutex> lock(mutex);
    return std::find(events.begin(), events.end(), event) - events.begin();
  }
};

struct DeepImpl : torch::nn::Module {
  explicit DeepImpl(EventLog* log) : log(log) {
    torch::manual_seed(0);
    for (int i = 0; i < 6; ++i) {
      layers.push_back(register_module("layer" + std::to_string(i), torch::nn::Linear(64, 64)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(layers[0]->forward(x));
    // Runs when backward reaches the first layer: after every later layer's gradients.
    h.register_hook([this](torch::Tensor grad) {
      log->add("first layer reached");
      return grad;
    });
    for (size_t i = 1; i < layers.size(); ++i) h = torch::relu(layers[i]->forward(h));
    return h;
  }
  EventLog* log;
  std::vector<torch::nn::Linear> layers;
};

}  // namespace

TEST(DistributedDataParallel, FirstBucketIsOnTheWireBeforeBackwardFinishes) {
  run_ranks_ok(2, [](int) {
    ddp::init_process_group();
    EventLog log;
    auto net = std::make_shared<DeepImpl>(&log);
    // 16.6 KiB per layer: a 0.02 MiB cap gives one bucket per layer or so.
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().bucket_cap_mb(0.02));
    auto allreduce = ddp::comm_hooks::allreduce();
    model.register_comm_hook([&](const ddp::ProcessGroup& group, ddp::GradBucket& bucket) {
      log.add("bucket " + std::to_string(bucket.index()) + " launched");
      return allreduce(group, bucket);
    });
    for (int step = 0; step < 3; ++step) {
      log.events.clear();
      model(torch::randn({4, 64})).sum().backward();
      log.add("backward returned");
      if (step == 0) {
        // The first backward records the order in which gradients become ready, and reduces
        // once it ends, in the buckets built from that order.
        EXPECT_LT(log.position("first layer reached"), log.position("bucket 0 launched"));
        EXPECT_LT(log.position("bucket 0 launched"), log.position("backward returned"));
      } else {
        EXPECT_LT(log.position("bucket 0 launched"), log.position("first layer reached"))
            << "step " << step;
        EXPECT_LT(log.position("first layer reached"), log.position("backward returned"));
      }
    }
    ddp::destroy_process_group();
  });
}
