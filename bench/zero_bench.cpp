// zero_bench: sharded training against DDP with the plain optimizer: ZeroRedundancyOptimizer's
// step and its two parameter exchanges (a broadcast per owner; one flat all-gather), and
// fully_shard's step (--mode fsdp).
//
// Launch it on every rank (ddprun, torchrun, or by hand with RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT set):
//
//   build/bench/zero_bench --backend shm --mode broadcast --model transformer
//
// --model mlp (the default): `layers` Linear(width, width) layers with tanh between
// (width*(width+1) parameters each), on random batches of 8 rows per rank. --model transformer:
// the fixed transformer (ddp_bench's TinyGPT at vocabulary 8192, d_model 768, 12 blocks,
// 12 heads, MLP 3072, sequence 64: 97,696,256 parameters), 2 random sequences per rank,
// cross-entropy on the next token; bench/zero_peer.py is PyTorch's side of it.
// Both train under DDP with Adam (lr 1e-3). --mode ddp steps a plain torch::optim::Adam;
// broadcast and allgather a ZeroRedundancyOptimizer with that exchange; fsdp trains the model
// sharded by ddp::fully_shard (no DDP; each transformer block a unit, the embeddings, final norm
// and head units of their own; each Linear of the mlp a unit) with Adam on its shards
// (--reshard-after-forward 0 keeps units whole from forward to backward). After `warmup` steps,
// `steps` timed steps (zero_grad, forward, backward, step); then, for the ZeRO modes, `steps`
// timed calls of the exchange alone (sync_parameters). Times are the mean per call, the MAX over
// ranks (the slowest rank sets the pace). Rank 0 prints one JSON line:
//
//   {"impl": "ours", "model": "transformer", "backend": "shm", "mode": "broadcast",
//    "world_size": 2, "parameters": 97685504, "step_ms": ..., "exchange_ms": ...,
//    "state_bytes_per_rank": ..., "peak_growth_bytes": ..., "shared_memory_bytes": ...}
//
// state_bytes_per_rank is counted: the bytes of the optimizer's state tensors on the rank that
// holds the most (ZeRO: its partition's; ddp: the whole model's; fsdp: its shards').
// model_state_bytes_per_rank adds the parameters and gradients this rank keeps between steps
// (fsdp: its shards; the others: whole). peak_growth_bytes is measured:
// the process's peak resident memory (VmHWM) less its resident memory once the model, DDP and the
// optimizer were built, less the growth of its resident shared memory (the shm backend's
// segments, reported apart as shared_memory_bytes); the most of any rank.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "ddp/ddp.h"
#include "ddp_bench/reference_models.h"

namespace {

struct BenchOptions {
  std::string backend = "shm";
  std::string mode = "broadcast";  // ddp, broadcast, allgather, fsdp
  std::string model = "mlp";       // mlp, transformer
  int64_t width = 1024;
  int layers = 8;
  int warmup = 2;
  int steps = 5;
  bool reshard_after_forward = true;
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
    } else if (flag == "--model") {
      options.model = value;
    } else if (flag == "--width") {
      options.width = std::stoll(value);
    } else if (flag == "--layers") {
      options.layers = std::stoi(value);
    } else if (flag == "--warmup") {
      options.warmup = std::stoi(value);
    } else if (flag == "--steps") {
      options.steps = std::stoi(value);
    } else if (flag == "--reshard-after-forward") {
      options.reshard_after_forward = value != "0";
    } else {
      std::fprintf(stderr, "zero_bench: unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  if (options.mode != "ddp" && options.mode != "broadcast" && options.mode != "allgather" &&
      options.mode != "fsdp") {
    std::fprintf(stderr, "zero_bench: --mode is ddp, broadcast, allgather or fsdp\n");
    std::exit(2);
  }
  if (options.model != "mlp" && options.model != "transformer") {
    std::fprintf(stderr, "zero_bench: --model is mlp or transformer\n");
    std::exit(2);
  }
  return options;
}

// The --model mlp network: `layers` Linear(width, width) with tanh after each.
class StackOfLinears : public ddp_bench::BenchModel {
 public:
  StackOfLinears(int64_t width, int layers) {
    for (int i = 0; i < layers; ++i) {
      layers_->push_back(torch::nn::Linear(width, width));
      layers_->push_back(torch::nn::Tanh());
    }
    register_module("layers", layers_);
  }
  torch::Tensor forward(torch::Tensor x) override { return layers_->forward(x); }
  void fully_shard(const ddp::FullyShardOptions& options) override {
    ddp::fully_shard(layers_, options);
    replace_module("layers", layers_.ptr());
  }

 private:
  torch::nn::Sequential layers_;
};

// The fields of /proc/self/status that are sizes in kB, in bytes.
std::map<std::string, double> memory_status() {
  std::map<std::string, double> fields;
  std::ifstream status("/proc/self/status");
  std::string name;
  double kilobytes;
  std::string unit;
  while (status >> name) {
    if (name == "VmHWM:" || name == "VmRSS:" || name == "RssShmem:") {
      status >> kilobytes >> unit;
      fields[name.substr(0, name.size() - 1)] = kilobytes * 1024;
    }
  }
  return fields;
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
  std::shared_ptr<ddp_bench::BenchModel> net;
  if (options.model == "transformer") {
    net = ddp_bench::zero_transformer();
  } else {
    net = std::make_shared<StackOfLinears>(options.width, options.layers);
  }
  const int64_t parameters = ddp_bench::parameter_count(*net);  // whole, before any sharding
  const bool sharded = options.mode == "fsdp";
  std::unique_ptr<ddp::DistributedDataParallel<std::shared_ptr<ddp_bench::BenchModel>>> ddp_model;
  if (sharded) {
    net->fully_shard(ddp::FullyShardOptions().reshard_after_forward(options.reshard_after_forward));
  } else {
    ddp_model =
        std::make_unique<ddp::DistributedDataParallel<std::shared_ptr<ddp_bench::BenchModel>>>(net);
  }
  auto model = [&](torch::Tensor x) { return sharded ? net->forward(x) : (*ddp_model)(x); };
  std::unique_ptr<torch::optim::Optimizer> plain;
  std::unique_ptr<ddp::ZeroRedundancyOptimizer> zero;
  const auto adam = torch::optim::AdamOptions(1e-3);
  if (options.mode == "ddp") {
    plain = std::make_unique<torch::optim::Adam>(net->parameters(), adam);
  } else if (sharded) {
    plain = std::make_unique<torch::optim::Adam>(ddp::sharded_parameters(*net), adam);
  } else {
    zero = std::make_unique<ddp::ZeroRedundancyOptimizer>(
        net->parameters(), ddp::zero_optimizer<torch::optim::Adam>(adam),
        ddp::ZeroRedundancyOptimizerOptions().exchange(options.mode == "broadcast"
                                                           ? ddp::ZeroExchange::kBroadcast
                                                           : ddp::ZeroExchange::kAllGather));
  }
  torch::optim::Optimizer& optimizer =
      plain ? *plain : static_cast<torch::optim::Optimizer&>(*zero);
  const auto after_init = memory_status();
  auto one_step = [&] {
    optimizer.zero_grad();
    if (options.model == "transformer") {
      auto tokens = torch::randint(0, 8192, {2, 65}, torch::kLong);
      auto logits = model(tokens.slice(1, 0, 64));
      torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                           tokens.slice(1, 1, 65).reshape({-1}))
          .backward();
    } else {
      model(torch::randn({8, options.width})).pow(2).mean().backward();
    }
    optimizer.step();
  };
  for (int i = 0; i < options.warmup; ++i) one_step();
  ddp::barrier();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < options.steps; ++i) one_step();
  const double step_ms = max_over_ranks(ms_since(start) / options.steps);
  const auto after_steps = memory_status();
  const double shared_growth = after_steps.at("RssShmem") - after_init.at("RssShmem");
  const double peak_growth =
      max_over_ranks(after_steps.at("VmHWM") - after_init.at("VmRSS") - shared_growth);
  const double shared_memory = max_over_ranks(after_steps.at("RssShmem"));
  double exchange_ms = 0;
  if (zero) {
    ddp::barrier();
    start = std::chrono::steady_clock::now();
    for (int i = 0; i < options.steps; ++i) zero->sync_parameters();
    exchange_ms = max_over_ranks(ms_since(start) / options.steps);
  }
  double kept_bytes = 0;  // the parameters and gradients this rank keeps (shards under fsdp)
  for (const auto& p : net->parameters()) {
    kept_bytes += p.nbytes() + (p.grad().defined() ? p.grad().nbytes() : 0);
  }
  double state_bytes = zero ? static_cast<double>(zero->local_state_bytes()) : 0.0;
  if (plain) {
    for (const auto& entry : plain->state()) {
      const auto& s = static_cast<const torch::optim::AdamParamState&>(*entry.second);
      state_bytes += s.exp_avg().nbytes() + s.exp_avg_sq().nbytes();
    }
  }
  const double most_state = max_over_ranks(state_bytes);
  const double most_model_state = max_over_ranks(state_bytes + kept_bytes);
  if (rank == 0) {
    std::printf(
        "{\"impl\": \"ours\", \"model\": \"%s\", \"backend\": \"%s\", \"mode\": \"%s\", "
        "\"world_size\": %d, \"parameters\": %lld, \"step_ms\": %.2f, \"exchange_ms\": %.2f, "
        "\"state_bytes_per_rank\": %.0f, \"model_state_bytes_per_rank\": %.0f, "
        "\"peak_growth_bytes\": %.0f, \"shared_memory_bytes\": %.0f}\n",
        options.model.c_str(), options.backend.c_str(), options.mode.c_str(), ddp::get_world_size(),
        static_cast<long long>(parameters), step_ms, exchange_ms, most_state, most_model_state,
        peak_growth, shared_memory);
  }
  ddp::destroy_process_group();
  return 0;
}
