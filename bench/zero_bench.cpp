// zero_bench: ZeroRedundancyOptimizer's step against DDP with the plain optimizer, and its two
// parameter exchanges (a broadcast per owner; one flat all-gather) against each other.
//
// Launch it on every rank (ddprun, torchrun, or by hand with RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT set):
//
//   build/bench/zero_bench --backend shm --mode broadcast --width 1024 --layers 8
//
// The model is `layers` Linear(width, width) layers with tanh between (width*(width+1) parameters
// each) under DDP, trained with Adam (lr 1e-3) on random batches of 8 rows per rank. --mode ddp
// steps a plain torch::optim::Adam; broadcast and allgather a ZeroRedundancyOptimizer with that
// exchange. After `warmup` steps, `steps` timed steps (zero_grad, forward, backward, step); then,
// for the ZeRO modes, `steps` timed calls of the exchange alone (sync_parameters). Times are the
// mean per call, the MAX over ranks (the slowest rank sets the pace). Rank 0 prints one JSON line:
//
//   {"backend": "shm", "mode": "broadcast", "world_size": 2, "parameters": 8396800,
//    "step_ms": ..., "exchange_ms": ..., "state_bytes_per_rank": ...}
//
// state_bytes_per_rank is counted: the bytes of the optimizer's state tensors on the rank that
// holds the most (ZeRO: its partition's; ddp: the whole model's).
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ddp/ddp.h"

namespace {

struct BenchOptions {
  std::string backend = "shm";
  std::string mode = "broadcast";  // ddp, broadcast, allgather
  int64_t width = 1024;
  int layers = 8;
  int warmup = 2;
  int steps = 5;
};

BenchOptions parse(int argc, char** argv) {
  BenchOptions options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--backend") {
      options.backend = value;
    } else if (flag == "--mode") {
      options.mode = value;
    } else if (flag == "--width") {
      options.width = std::stoll(value);
    } else if (flag == "--layers") {
      options.layers = std::stoi(value);
    } else if (flag == "--warmup") {
      options.warmup = std::stoi(value);
    } else if (flag == "--steps") {
      options.steps = std::stoi(value);
    } else {
      std::fprintf(stderr, "zero_bench: unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  if (options.mode != "ddp" && options.mode != "broadcast" && options.mode != "allgather") {
    std::fprintf(stderr, "zero_bench: --mode is ddp, broadcast or allgather\n");
    std::exit(2);
  }
  return options;
}

double max_over_ranks(double value) {
  auto t = torch::tensor({value}, torch::kDouble);
  ddp::all_reduce(t, ddp::ReduceOp::MAX);
  return t.item<double>();
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  const BenchOptions options = parse(argc, argv);
  torch::set_num_threads(1);
  ddp::init_process_group(ddp::InitOptions().backend(options.backend));
  const int rank = ddp::get_rank();
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int i = 0; i < options.layers; ++i) {
    net->push_back(torch::nn::Linear(options.width, options.width));
    net->push_back(torch::nn::Tanh());
  }
  ddp::DistributedDataParallel model(net);
  std::unique_ptr<torch::optim::Optimizer> plain;
  std::unique_ptr<ddp::ZeroRedundancyOptimizer> zero;
  const auto adam = torch::optim::AdamOptions(1e-3);
  if (options.mode == "ddp") {
    plain = std::make_unique<torch::optim::Adam>(net->parameters(), adam);
  } else {
    zero = std::make_unique<ddp::ZeroRedundancyOptimizer>(
        net->parameters(), ddp::zero_optimizer<torch::optim::Adam>(adam),
        ddp::ZeroRedundancyOptimizerOptions().exchange(options.mode == "broadcast"
                                                           ? ddp::ZeroExchange::kBroadcast
                                                           : ddp::ZeroExchange::kAllGather));
  }
  torch::optim::Optimizer& optimizer =
      plain ? *plain : static_cast<torch::optim::Optimizer&>(*zero);
  auto one_step = [&] {
    optimizer.zero_grad();
    model(torch::randn({8, options.width})).pow(2).mean().backward();
    optimizer.step();
  };
  for (int i = 0; i < options.warmup; ++i) one_step();
  ddp::barrier();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < options.steps; ++i) one_step();
  const double step_ms = max_over_ranks(ms_since(start) / options.steps);
  double exchange_ms = 0;
  if (zero) {
    ddp::barrier();
    start = std::chrono::steady_clock::now();
    for (int i = 0; i < options.steps; ++i) zero->sync_parameters();
    exchange_ms = max_over_ranks(ms_since(start) / options.steps);
  }
  int64_t parameters = 0;
  for (const auto& p : net->parameters()) parameters += p.numel();
  double state_bytes = zero ? static_cast<double>(zero->local_state_bytes()) : 0.0;
  if (plain) {
    for (const auto& entry : plain->state()) {
      const auto& s = static_cast<const torch::optim::AdamParamState&>(*entry.second);
      state_bytes += s.exp_avg().nbytes() + s.exp_avg_sq().nbytes();
    }
  }
  const double most_state = max_over_ranks(state_bytes);
  if (rank == 0) {
    std::printf(
        "{\"backend\": \"%s\", \"mode\": \"%s\", \"world_size\": %d, \"parameters\": %lld, "
        "\"step_ms\": %.2f, \"exchange_ms\": %.2f, \"state_bytes_per_rank\": %.0f}\n",
        options.backend.c_str(), options.mode.c_str(), ddp::get_world_size(),
        static_cast<long long>(parameters), step_ms, exchange_ms, most_state);
  }
  ddp::destroy_process_group();
  return 0;
}
