// DistributedDataParallel::stats(): exposed communication against a reduction slowed on purpose,
// the phases adding up to the step, the bytes against the buckets, rebuilds, what is counted.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <thread>

#include "ddp/ddp.h"
#include "support/multiprocess.h"

using ddp::testing::run_ranks_ok;
using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::duration duration) {
  return std::chrono::duration<double, std::milli>(duration).count();
}

// A link on which each bucket's reduction takes `delay`, one bucket after the other: a bucket
// handed over at t completes no earlier than `delay` after max(t, the previous bucket's end). The
// delay is in the reduction itself: the bucket's Work does not complete before then (the real
// all-reduce runs meanwhile). Records when each bucket was handed over and its bytes.
struct SlowLink {
  std::chrono::milliseconds delay{0};
  Clock::time_point free_at;
  std::vector<Clock::time_point> launches;  // this step's, in bucket order
  std::vector<int64_t> bucket_bytes;        // this step's

  ddp::CommHook hook() {
    return [this, allreduce = ddp::comm_hooks::allreduce()](const ddp::ProcessGroup& group,
                                                            ddp::GradBucket& bucket) {
      const auto now = Clock::now();
      launches.push_back(now);
      bucket_bytes.push_back(static_cast<int64_t>(bucket.buffer().nbytes()));
      free_at = std::max(now, free_at) + delay;
      const auto done = free_at;
      return allreduce(group, bucket).then([done] { std::this_thread::sleep_until(done); });
    };
  }
  void start_step() {
    launches.clear();
    bucket_bytes.clear();
  }
};

// Three 64x64 layers; with a 0.01 MiB cap each is a bucket of its own ([bias, weight]). Backward
// sleeps `compute_sleep` after the last layer's gradients (bucket 0) are ready and before the
// others': compute that hides bucket 0's reduction.
struct ThreeLayersImpl : torch::nn::Module {
  ThreeLayersImpl() {
    torch::manual_seed(0);
    for (int i = 0; i < 3; ++i) {
      layers.push_back(register_module("layer" + std::to_string(i), torch::nn::Linear(64, 64)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(layers[0]->forward(x));
    h = torch::relu(layers[1]->forward(h));
    if (compute_sleep.count() > 0) {
      h.register_hook([this](torch::Tensor grad) {
        std::this_thread::sleep_for(compute_sleep);
        return grad;
      });
    }
    return layers[2]->forward(h);
  }
  std::vector<torch::nn::Linear> layers;
  std::chrono::milliseconds compute_sleep{0};
};
TORCH_MODULE(ThreeLayers);

int64_t sum_of(const std::vector<int64_t>& values) {
  return std::accumulate(values.begin(), values.end(), int64_t{0});
}

}  // namespace

TEST(DDPStats, ExposedCommunicationGrowsByTheDelayOfEachBucketBackwardCannotHide) {
  run_ranks_ok(
      2,
      [](int) {
        ddp::init_process_group(ddp::InitOptions().backend("gloo"));
        constexpr auto kDelay = std::chrono::milliseconds(200);
        const double delay_ms = ms(kDelay);
        ThreeLayers net;
        ddp::DistributedDataParallel model(
            net, ddp::DDPOptions().bucket_cap_mb(0.01).first_bucket_cap_mb(0.01));
        SlowLink link;
        model.register_comm_hook(link.hook());
        EXPECT_EQ(model.stats().rebuilds, 0);
        EXPECT_EQ(model.stats().steps, 0);

        // One step; returns the test's own time around forward and backward.
        auto step = [&] {
          link.start_step();
          const auto start = Clock::now();
          model(torch::randn({8, 64})).sum().backward();
          return ms(Clock::now() - start);
        };
        // Every step: the bytes are the buckets' sizes exactly, and the phases add up to it.
        auto check_step = [&](double step_ms, const char* phase) {
          const ddp::DDPStats stats = model.stats();
          const auto& last = stats.last_step;
          EXPECT_EQ(stats.bucket_count, 3) << phase;
          EXPECT_EQ(stats.bucket_sizes_bytes, link.bucket_bytes) << phase;
          EXPECT_EQ(last.bytes_reduced, sum_of(stats.bucket_sizes_bytes)) << phase;
          EXPECT_EQ(last.bytes_reduced, stats.parameter_bytes) << phase;  // all float32
          EXPECT_EQ(last.buckets_reduced, 3) << phase;
          EXPECT_EQ(stats.rebuilds, 1) << phase;
          if (step_ms >= 100) {  // the delayed steps: well above the clock's and threads' noise
            const double sum =
                last.forward_ms + last.backward_compute_ms + last.exposed_communication_ms;
            EXPECT_NEAR(sum, step_ms, 0.1 * step_ms) << phase;
          }
          // Once the buckets are rebuilt, every bucket is handed over before backward ends.
          if (stats.steps > 1) {
            EXPECT_GE(last.communication_ms, last.exposed_communication_ms) << phase;
          }
          return stats;
        };

        // The first step reduces only once backward has ended, in the rebuilt buckets.
        check_step(step(), "first step");
        EXPECT_EQ(model.stats().steps, 1);

        // Undelayed: how much communication backward leaves exposed on its own.
        for (int i = 0; i < 3; ++i) check_step(step(), "undelayed");

        // Each bucket takes kDelay and nothing hides it: the last one ends no earlier than
        // 3 * kDelay after the first was handed over, and backward's compute ended (the last
        // gradient ready) no later than the last was handed over.
        link.delay = kDelay;
        for (int i = 0; i < 3; ++i) {
          const double step_ms = step();
          const auto stats = check_step(step_ms, "delayed");
          ASSERT_EQ(link.launches.size(), 3u);
          const double spread = ms(link.launches[2] - link.launches[0]);
          EXPECT_GE(stats.last_step.exposed_communication_ms, 3 * delay_ms - spread)
              << "bucket launches spread over " << spread << " ms";
        }

        // Backward computes for 2 * kDelay after bucket 0 was handed over: that hides bucket 0's
        // delay, but not those of buckets 1 and 2, handed over at the end of backward.
        net->compute_sleep = 2 * kDelay;
        double least_exposed = 1e9;
        for (int i = 0; i < 3; ++i) {
          const double step_ms = step();
          const auto stats = check_step(step_ms, "delayed, bucket 0 hidden");
          ASSERT_EQ(link.launches.size(), 3u);
          const double spread = ms(link.launches[2] - link.launches[1]);
          EXPECT_GE(stats.last_step.exposed_communication_ms, 2 * delay_ms - spread)
              << "buckets 1 and 2 handed over " << spread << " ms apart";
          EXPECT_GE(stats.last_step.backward_compute_ms, 2 * delay_ms);
          least_exposed = std::min(least_exposed, stats.last_step.exposed_communication_ms);
        }
        // Hidden: well under the 3 * kDelay that three unhidden buckets expose (the least of
        // three steps, so that one descheduled step does not decide).
        EXPECT_LT(least_exposed, 2.5 * delay_ms);

        const ddp::DDPStats stats = model.stats();
        EXPECT_EQ(stats.steps, 10);
        EXPECT_EQ(stats.total_bytes_reduced, 10 * sum_of(stats.bucket_sizes_bytes));
        EXPECT_EQ(stats.average.bytes_reduced, sum_of(stats.bucket_sizes_bytes));
        EXPECT_TRUE(stats.has_comm_hook);
        EXPECT_EQ(stats.world_size, 2);
        ddp::destroy_process_group();
      },
      std::chrono::seconds(60));
}

namespace {

// `extra` is used only when asked: with find_unused_parameters it is marked ready unused.
struct TwoBranchesImpl : torch::nn::Module {
  TwoBranchesImpl() {
    torch::manual_seed(0);
    used = register_module("used", torch::nn::Linear(16, 16));
    extra = register_module("extra", torch::nn::Linear(16, 16));
  }
  torch::Tensor forward(torch::Tensor x, bool use_extra) {
    auto h = used->forward(x);
    return use_extra ? extra->forward(h) : h;
  }
  torch::nn::Linear used{nullptr}, extra{nullptr};
};
TORCH_MODULE(TwoBranches);

int64_t float_bytes(torch::nn::Module& module, int64_t element_size) {
  int64_t bytes = 0;
  for (const auto& p : module.parameters()) bytes += p.numel() * element_size;
  return bytes;
}

}  // namespace

TEST(DDPStats, BytesReducedAreTheBucketsSizesOnEveryRouteAndOnlySynchronizedStepsCount) {
  // gloo reduces each bucket's flat buffer; shm reads gradients where autograd left them (a list
  // per bucket); mixed precision's buckets are bfloat16.
  for (const char* backend : {"gloo", "shm"}) {
    run_ranks_ok(2, [backend](int rank) {
      ddp::init_process_group(ddp::InitOptions().backend(backend));
      TwoBranches net;
      ddp::DistributedDataParallel model(net, ddp::DDPOptions().bucket_cap_mb(0.001));
      for (int step = 0; step < 4; ++step) model(torch::randn({4, 16}), true).sum().backward();
      ddp::DDPStats stats = model.stats();
      EXPECT_EQ(stats.steps, 4) << backend;
      EXPECT_EQ(stats.rebuilds, 1) << backend;
      EXPECT_GE(stats.bucket_count, 2) << backend;
      EXPECT_EQ(sum_of(stats.bucket_sizes_bytes), float_bytes(*net, 4)) << backend;
      EXPECT_EQ(stats.last_step.bytes_reduced, float_bytes(*net, 4)) << backend;
      EXPECT_EQ(stats.total_bytes_reduced, 4 * float_bytes(*net, 4)) << backend;
      EXPECT_EQ(stats.parameter_count, 4) << backend;
      EXPECT_EQ(stats.rank, rank);

      // no_sync and grad-free forwards are not steps; the next synchronized one is.
      {
        auto guard = model.no_sync();
        model(torch::randn({4, 16}), true).sum().backward();
      }
      {
        torch::NoGradGuard no_grad;
        model(torch::randn({4, 16}), true);
      }
      EXPECT_EQ(model.stats().steps, 4) << backend;
      model(torch::randn({4, 16}), true).sum().backward();
      EXPECT_EQ(model.stats().steps, 5) << backend;

      model.reset_stats();
      stats = model.stats();
      EXPECT_EQ(stats.steps, 0);
      EXPECT_EQ(stats.total_bytes_reduced, 0);
      EXPECT_EQ(stats.last_step.bytes_reduced, 0);
      EXPECT_EQ(stats.rebuilds, 1) << "rebuilds count since construction";
      model(torch::randn({4, 16}), true).sum().backward();
      EXPECT_EQ(model.stats().steps, 1);
      EXPECT_EQ(model.stats().total_bytes_reduced, float_bytes(*net, 4));
      ddp::destroy_process_group();
    });
  }

  run_ranks_ok(2, [](int) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo"));
    TwoBranches net;
    ddp::DistributedDataParallel model(
        net,
        ddp::DDPOptions().mixed_precision(ddp::MixedPrecision().param_dtype(torch::kBFloat16)));
    for (int step = 0; step < 2; ++step) model(torch::randn({4, 16}), true).sum().backward();
    const ddp::DDPStats stats = model.stats();
    EXPECT_EQ(sum_of(stats.bucket_sizes_bytes), float_bytes(*net, 2));  // bfloat16 buckets
    EXPECT_EQ(stats.last_step.bytes_reduced, float_bytes(*net, 2));
    EXPECT_EQ(stats.parameter_bytes, float_bytes(*net, 4));  // the float32 masters
    ddp::destroy_process_group();
  });
}

TEST(DDPStats, FindUnusedParametersCountsThemAndKeepsTheBucketsOfConstruction) {
  run_ranks_ok(2, [](int) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo"));
    TwoBranches net;
    ddp::DistributedDataParallel model(
        net, ddp::DDPOptions().find_unused_parameters(true).bucket_cap_mb(0.001));
    for (int step = 0; step < 3; ++step) model(torch::randn({4, 16}), false).sum().backward();
    ddp::DDPStats stats = model.stats();
    EXPECT_EQ(stats.steps, 3);
    EXPECT_EQ(stats.rebuilds, 0);
    EXPECT_TRUE(stats.find_unused_parameters);
    EXPECT_EQ(stats.last_step.unused_parameters, 2);  // extra's weight and bias
    // Unused parameters' slots are reduced too (zeros): every bucket goes to the backend.
    EXPECT_EQ(stats.last_step.bytes_reduced, float_bytes(*net, 4));
    model(torch::randn({4, 16}), true).sum().backward();
    EXPECT_EQ(model.stats().last_step.unused_parameters, 0);
    ddp::destroy_process_group();
  });
}
