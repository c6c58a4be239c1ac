// ddp_bench: training-step time of ddp::DistributedDataParallel on the reference models, the
// counterpart of the peer benchmark /work/shared/peers/pytorch_ddp_bench.py (PyTorch's own DDP).
// Same models, same flags, same JSON line, so the two can be run side by side
// (bench/run_ddp_bench.sh).
//
//   ddprun --nproc-per-node 2 build/bench/ddp_bench --model mlp|cnn|resnet|transformer
//       [--steps 30] [--warmup 5] [--batch B] [--bucket-cap-mb 25] [--threads 1]
//       [--comm-hook allreduce|fp16|bf16|fp16-hosts|bf16-hosts|powersgd|none]
//       [--powersgd-rank 4] [--powersgd-start-iter N (default: --warmup)] [--backend auto|shm|gloo]
//       [--no-ddp | --lockstep | --paired] [--gradient-as-bucket-view] [--zero-grad none|zero]
//       [--device cpu|cuda]
//
// Without RANK in the environment, or with --no-ddp, it runs one process without DDP (the
// compute-only limit). With --lockstep the ranks train without DDP but all_reduce one float after
// each backward, where DDP waits for its buckets: the cost of stepping in lockstep (each step
// waits for the slower rank) without any gradient traffic, the floor of synchronous data-parallel
// training. With --paired the ranks alternate a DDP step and a lockstep step in the same processes,
// so that both see the same state of a noisy machine: the median of the per-pair differences is
// DDP's own cost over stepping in lockstep. Rank 0 prints one JSON line:
//   {"impl": "ddp-cpp", "model": ..., "world_size": ..., "params": ..., "batch_per_rank": ...,
//    "step_ms_median": ..., "step_ms_min": ..., "samples_per_s": ..., "mode": ...,
//    "forward_ms_median": ..., "backward_ms_median": ..., "optimizer_ms_median": ...,
//    "backend": ... [, "comm_hook": ...] [, "gradient_as_bucket_view": true]
//    [, "zero_grad": "zero"], "device": ...}
// "mode" is "ddp", "lockstep", "paired" or "no_ddp"; paired adds "lockstep_step_ms_median",
// "ddp_minus_lockstep_ms_median" and "ddp_minus_lockstep_backward_ms_median", and its other times
// are those of the DDP steps; "backend" is the resolved one ("shm" or "gloo"),
// absent without a process group. The phases are medians of their own: forward includes
// zero_grad and the loss, backward includes DDP's wait for its buckets (or lockstep's all_reduce).
// --zero-grad zero keeps the gradients and zeroes them, as libtorch 1.13's Optimizer::zero_grad()
// does, instead of setting them to none as the peer's zero_grad(set_to_none=True) does.
// --device cuda puts each rank on cuda:LOCAL_RANK (ddp::set_device), its model and batch there,
// DDP with device_ids, and times each step from a synchronized GPU to a synchronized GPU, as the
// peer's --device cuda does; "auto" then gives CUDA tensors to NCCL where every rank has a GPU.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference_models.h"

namespace {

struct Args {
  std::string model = "mlp";
  int steps = 30;
  int warmup = 5;
  int64_t batch = 0;  // 0 = the model's default
  double bucket_cap_mb = 25.0;
  bool no_ddp = false;
  bool lockstep = false;
  bool paired = false;
  bool gradient_as_bucket_view = false;  // DDPOptions' default, as in PyTorch
  std::string zero_grad = "none";        // "none": set_to_none, as the peer; "zero": zero_()
  int threads = 1;
  std::string comm_hook = "none";
  int64_t powersgd_rank = 4;
  int64_t powersgd_start_iter = -1;  // -1: --warmup, so that every measured step compresses
  std::string backend = "auto";  // the library's default
  std::string device = "cpu";    // "cuda": cuda:LOCAL_RANK, DDP with device_ids (NCCL by "auto")
};

constexpr const char* kUsage =
    "usage: ddp_bench [--model mlp|cnn|resnet|transformer] [--steps N] [--warmup N]\n"
    "                 [--batch B (0 = model default)] [--bucket-cap-mb MB] [--threads N]\n"
    "                 [--comm-hook allreduce|fp16|bf16|fp16-hosts|bf16-hosts|powersgd|none]\n"
    "                 [--powersgd-rank R] [--powersgd-start-iter N]\n"
    "                 [--backend auto|shm|gloo]\n"
    "                 [--no-ddp | --lockstep | --paired] [--gradient-as-bucket-view]\n"
    "                 [--zero-grad none|zero] [--device cpu|cuda]\n";

// The hooks --comm-hook names (PowerSGD with --powersgd-rank, compressing from step
// `powersgd_start_iter`: at least 2, as the hook requires with error feedback).
ddp::CommHook make_hook(const std::string& name, int64_t powersgd_rank = 4,
                        int64_t powersgd_start_iter = 2) {
  if (name == "powersgd") {
    return ddp::comm_hooks::powerSGD(ddp::PowerSGDOptions()
                                         .matrix_approximation_rank(powersgd_rank)
                                         .start_powerSGD_iter(std::max<int64_t>(2, powersgd_start_iter)));
  }
  if (name == "allreduce") return ddp::comm_hooks::allreduce();
  if (name == "fp16") return ddp::comm_hooks::fp16_compress();
  if (name == "bf16") return ddp::comm_hooks::bf16_compress();
  if (name == "fp16-hosts") return ddp::comm_hooks::fp16_compress_between_hosts();
  if (name == "bf16-hosts") return ddp::comm_hooks::bf16_compress_between_hosts();
  return nullptr;
}

bool hook_named(const std::string& name) { return make_hook(name) != nullptr; }

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::optional<std::string> inline_value;
    if (auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    auto switch_on = [&] {  // a flag without a value
      if (inline_value) throw std::invalid_argument(flag + " takes no value");
      return true;
    };
    if (flag == "-h" || flag == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (flag == "--model") {
      a.model = value();
    } else if (flag == "--steps") {
      a.steps = std::stoi(value());
    } else if (flag == "--warmup") {
      a.warmup = std::stoi(value());
    } else if (flag == "--batch") {
      a.batch = std::stoll(value());
    } else if (flag == "--bucket-cap-mb") {
      a.bucket_cap_mb = std::stod(value());
    } else if (flag == "--threads") {
      a.threads = std::stoi(value());
    } else if (flag == "--comm-hook") {
      a.comm_hook = value();
    } else if (flag == "--powersgd-rank") {
      a.powersgd_rank = std::stoll(value());
    } else if (flag == "--powersgd-start-iter") {
      a.powersgd_start_iter = std::stoll(value());
    } else if (flag == "--backend") {
      a.backend = value();
    } else if (flag == "--no-ddp") {
      a.no_ddp = switch_on();
    } else if (flag == "--lockstep") {
      a.lockstep = switch_on();
    } else if (flag == "--paired") {
      a.paired = switch_on();
    } else if (flag == "--gradient-as-bucket-view") {
      a.gradient_as_bucket_view = switch_on();
    } else if (flag == "--zero-grad") {
      a.zero_grad = value();
    } else if (flag == "--device") {
      a.device = value();
    } else {
      throw std::invalid_argument("unknown argument '" + std::string(argv[i]) + "'\n" + kUsage);
    }
  }
  if (a.device != "cpu" && a.device != "cuda") {
    throw std::invalid_argument("--device must be cpu or cuda");
  }
  if (a.steps < 1 || a.warmup < 0 || a.batch < 0 || a.threads < 1 || a.bucket_cap_mb <= 0)
    throw std::invalid_argument(
        "--steps and --threads must be >= 1, --warmup and --batch >= 0, "
        "--bucket-cap-mb > 0");
  if (a.comm_hook != "none" && !hook_named(a.comm_hook))
    throw std::invalid_argument(
        "--comm-hook must be allreduce, fp16, bf16, fp16-hosts, bf16-hosts, powersgd or none");
  if (a.zero_grad != "none" && a.zero_grad != "zero")
    throw std::invalid_argument("--zero-grad must be none (set_to_none) or zero");
  if (a.no_ddp + a.lockstep + a.paired > 1)
    throw std::invalid_argument("--no-ddp, --lockstep and --paired exclude each other");
  if ((a.no_ddp || a.lockstep) && (a.comm_hook != "none" || a.gradient_as_bucket_view))
    throw std::invalid_argument(
        "--comm-hook and --gradient-as-bucket-view are DDP's: drop them, "
        "or --no-ddp / --lockstep");
  if ((a.lockstep || a.paired) && std::getenv("RANK") == nullptr)
    throw std::invalid_argument(std::string(a.lockstep ? "--lockstep" : "--paired") +
                                " needs ranks: start it with ddprun --nproc-per-node 2 (or set "
                                "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)");
  return a;
}

// optimizer.zero_grad(set_to_none=True), as the peer does; or, with `keep`, libtorch 1.13's
// Optimizer::zero_grad(), which zeroes each .grad in place.
void zero_grad(torch::nn::Module& module, bool keep) {
  for (auto& p : module.parameters()) {
    if (!keep) {
      p.mutable_grad().reset();
    } else if (p.grad().defined()) {
      p.mutable_grad().detach_();
      p.mutable_grad().zero_();
    }
  }
}

// The times of one step's phases, in ms.
struct StepTimes {
  double forward = 0;  // zero_grad, forward and loss
  double backward = 0;
  double optimizer = 0;
  double total() const { return forward + backward + optimizer; }
};

double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Waits for the GPU's queued work (nothing on the CPU): a step's time is its work's, as the
// peer measures it.
void synchronize(const torch::Tensor& on) {
  if (on.is_cuda()) torch::cuda::synchronize(on.device().index());
}

// One step: zero_grad, forward, loss, backward, after_backward(), optimizer step. On a GPU the
// phases' times are those of queueing the work, the total that of the work.
template <typename Net, typename AfterBackward>
StepTimes train_step(Net& net, torch::nn::Module& module, torch::optim::SGD& opt,
                     const torch::Tensor& x, const torch::Tensor& y, bool keep_grads,
                     AfterBackward&& after_backward) {
  synchronize(x);
  const auto t0 = std::chrono::steady_clock::now();
  zero_grad(module, keep_grads);
  auto out = net(x);
  auto loss = torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape(-1));
  const auto t1 = std::chrono::steady_clock::now();
  loss.backward();
  after_backward();
  const auto t2 = std::chrono::steady_clock::now();
  opt.step();
  synchronize(x);
  const auto t3 = std::chrono::steady_clock::now();
  return {ms_between(t0, t1), ms_between(t1, t2), ms_between(t2, t3)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}


int run(const Args& a) {
  torch::set_num_threads(a.threads);
  // --paired runs DDP steps too (and lockstep steps between them).
  const bool use_ddp = !a.no_ddp && !a.lockstep && std::getenv("RANK") != nullptr;
  const bool use_group = use_ddp || a.lockstep;
  const bool lockstep_steps = a.lockstep || a.paired;
  int rank = 0;
  int world_size = 1;
  // Before the group, as torch.cuda.set_device: NCCL takes the current device.
  const c10::Device device = a.device == "cuda" ? ddp::set_device() : c10::Device(c10::kCPU);
  if (a.device == "cuda" && !device.is_cuda()) {
    throw std::invalid_argument("--device cuda, but this process sees no GPU");
  }
  if (use_group) {
    // Lockstep's one all_reduce per step goes without the fingerprint exchange, as DDP's bucket
    // all_reduces do.
    ddp::init_process_group(
        ddp::InitOptions().backend(a.backend).verify_collectives(!lockstep_steps));
    rank = ddp::get_rank();
    world_size = ddp::get_world_size();
  }
  torch::manual_seed(0);
  auto built = ddp_bench::build(a.model);
  auto model = built.model;
  model->to(device);
  const int64_t batch = a.batch ? a.batch : built.default_batch;
  const int64_t params = ddp_bench::parameter_count(*model);

  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1234 + rank);
  auto [x_host, y_host] = ddp_bench::make_batch(a.model, batch, generator);
  const torch::Tensor x = x_host.to(device), y = y_host.to(device);

  // The DDP (or only) steps' times; with --paired, the lockstep steps' and the pairs' differences.
  std::vector<double> times, forward_times, backward_times, optimizer_times;
  std::vector<double> lockstep_times, pair_differences, pair_backward_differences;
  auto plain = [&](const torch::Tensor& in) { return model->forward(in); };
  std::unique_ptr<ddp::DistributedDataParallel<std::shared_ptr<ddp_bench::BenchModel>>> ddp_net;
  if (use_ddp) {
    ddp_net =
        std::make_unique<ddp::DistributedDataParallel<std::shared_ptr<ddp_bench::BenchModel>>>(
            model, ddp::DDPOptions()
                       .bucket_cap_mb(a.bucket_cap_mb)
                       .gradient_as_bucket_view(a.gradient_as_bucket_view)
                       .device_ids({device}));
    if (a.comm_hook != "none") {
      ddp_net->register_comm_hook(make_hook(
          a.comm_hook, a.powersgd_rank,
          a.powersgd_start_iter >= 0 ? a.powersgd_start_iter : a.warmup));
    }
  }
  auto wrapped = [&](const torch::Tensor& in) { return (*ddp_net)(in); };
  auto token = torch::zeros({1}, torch::TensorOptions().device(device));
  auto nothing = [] {};
  auto in_step = [&] { ddp::all_reduce(token); };
  const bool keep = a.zero_grad == "zero";
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    const StepTimes t = use_ddp      ? train_step(wrapped, *model, opt, x, y, keep, nothing)
                        : a.lockstep ? train_step(plain, *model, opt, x, y, keep, in_step)
                                     : train_step(plain, *model, opt, x, y, keep, nothing);
    // The lockstep half of a pair: DDP's hooks see a backward it did not prepare and leave the
    // gradients alone.
    const StepTimes l =
        a.paired ? train_step(plain, *model, opt, x, y, keep, in_step) : StepTimes{};
    if (i < a.warmup) continue;
    times.push_back(t.total());
    forward_times.push_back(t.forward);
    backward_times.push_back(t.backward);
    optimizer_times.push_back(t.optimizer);
    if (!a.paired) continue;
    lockstep_times.push_back(l.total());
    pair_differences.push_back(t.total() - l.total());
    pair_backward_differences.push_back(t.backward - l.backward);
  }

  if (rank == 0) {
    const double med = median(times);
    const double mn = *std::min_element(times.begin(), times.end());
    const char* mode = a.paired ? "paired" : use_ddp ? "ddp" : a.lockstep ? "lockstep" : "no_ddp";
    std::string extra;
    if (a.paired) {
      char text[200];
      std::snprintf(text, sizeof text,
                    ", \"lockstep_step_ms_median\": %.3f, \"ddp_minus_lockstep_ms_median\": %.3f, "
                    "\"ddp_minus_lockstep_backward_ms_median\": %.3f",
                    median(lockstep_times), median(pair_differences),
                    median(pair_backward_differences));
      extra = text;
    }
    if (use_group) extra += ", \"backend\": \"" + ddp::get_backend() + "\"";
    if (use_ddp && a.comm_hook != "none") extra += ", \"comm_hook\": \"" + a.comm_hook + "\"";
    if (use_ddp && ddp_net->options().gradient_as_bucket_view()) {
      extra += ", \"gradient_as_bucket_view\": true";  // as DDP holds it, not as parsed
    }
    if (keep) extra += ", \"zero_grad\": \"zero\"";
    extra += ", \"device\": \"" + a.device + "\"";
    std::printf(
        "{\"impl\": \"ddp-cpp\", \"model\": \"%s\", \"world_size\": %d, \"params\": %lld, "
        "\"batch_per_rank\": %lld, \"step_ms_median\": %.3f, \"step_ms_min\": %.3f, "
        "\"samples_per_s\": %.1f, \"mode\": \"%s\", \"forward_ms_median\": %.3f, "
        "\"backward_ms_median\": %.3f, \"optimizer_ms_median\": %.3f%s}\n",
        a.model.c_str(), world_size, static_cast<long long>(params), static_cast<long long>(batch),
        med, mn, static_cast<double>(batch) * world_size * 1000.0 / med, mode,
        median(forward_times), median(backward_times), median(optimizer_times), extra.c_str());
    std::fflush(stdout);
  }
  ddp_net.reset();
  if (use_group) ddp::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_bench: %s\n", e.what());
    return 1;
  }
}
