// DataParallel on CPU replicas: outputs and gradients equal the plain module's.
#include "ddp/data_parallel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <set>
#include <thread>

#include "ddp/errors.h"

namespace {

torch::nn::Sequential make_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 3));
}

void expect_same_as_plain_module(int replicas, int64_t batch) {
  auto plain = make_net();
  auto net = make_net();
  ddp::DataParallel parallel(net, std::vector<c10::Device>(replicas, c10::Device(c10::kCPU)));
  torch::manual_seed(1);
  auto x = torch::randn({batch, 6});
  auto expected = plain->forward(x);
  auto output = parallel(x);
  ASSERT_EQ(output.sizes(), expected.sizes());
  EXPECT_TRUE(torch::allclose(output, expected, 1e-6, 1e-6));
  (expected * expected).sum().backward();
  (output * output).sum().backward();
  auto grads = net->parameters();
  auto expected_grads = plain->parameters();
  for (size_t i = 0; i < grads.size(); ++i) {
    ASSERT_TRUE(grads[i].grad().defined()) << i;
    EXPECT_TRUE(torch::allclose(grads[i].grad(), expected_grads[i].grad(), 1e-5, 1e-6))
        << "parameter " << i << " with " << replicas << " replicas, batch " << batch;
  }
}

}  // namespace

TEST(DataParallel, TwoAndThreeCpuReplicasGiveTheOutputsAndGradientsOfThePlainModule) {
  expect_same_as_plain_module(2, 8);
  expect_same_as_plain_module(3, 9);
}

TEST(DataParallel, UnevenAndSmallBatchesUseFewerOrSmallerChunks) {
  expect_same_as_plain_module(3, 7);  // chunks of 3, 3, 1
  expect_same_as_plain_module(4, 2);  // only 2 replicas get work
}

namespace {

std::mutex threads_mutex;
std::set<std::thread::id> forward_threads;

struct RecordThreadImpl : torch::nn::Cloneable<RecordThreadImpl> {
  RecordThreadImpl() { reset(); }
  void reset() override { linear = register_module("linear", torch::nn::Linear(2, 2)); }
  torch::Tensor forward(torch::Tensor x) {
    {
      std::lock_guard<std::mutex> lock(threads_mutex);
      forward_threads.insert(std::this_thread::get_id());
    }
    return linear->forward(x);
  }
  torch::nn::Linear linear{nullptr};
};

}  // namespace

TEST(DataParallel, ReplicasRunOnSeveralThreads) {
  auto net = std::make_shared<RecordThreadImpl>();
  ddp::DataParallel parallel(net, std::vector<c10::Device>(3, c10::Device(c10::kCPU)));
  parallel(torch::ones({6, 2})).sum().backward();
  EXPECT_EQ(forward_threads.size(), 3u);
  EXPECT_TRUE(net->linear->weight.grad().defined());
}

TEST(DataParallel, ModuleThatCannotBeClonedIsAClearError) {
  struct PlainImpl : torch::nn::Module {
    PlainImpl() { linear = register_module("linear", torch::nn::Linear(2, 2)); }
    torch::Tensor forward(torch::Tensor x) { return linear->forward(x); }
    torch::nn::Linear linear{nullptr};
  };
  auto net = std::make_shared<PlainImpl>();
  ddp::DataParallel parallel(net, std::vector<c10::Device>(2, c10::Device(c10::kCPU)));
  try {
    parallel(torch::ones({4, 2}));
    ADD_FAILURE() << "expected an error";
  } catch (const ddp::DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find("torch::nn::Cloneable"), std::string::npos) << e.what();
  }
}
