// fashion_mnist: trains a CNN on Fashion-MNIST with DistributedDataParallel, one process per rank.
//
//   build/tools/ddprun/ddprun --standalone --nproc-per-node 2
//   build/examples/fashion_mnist
//
// Each rank trains on its DistributedSampler shard (a new order each epoch), gradients are
// averaged by DDP, test accuracy is computed across ranks after each epoch (each rank evaluates
// its share; the counts are all-reduced), rank 0 saves a checkpoint after each epoch and writes
// the metrics (per epoch, and the training loss every few steps, as CSV) and a plot (SVG). The
// last line is a JSON summary. With GPUs, each rank
// trains on its own (cuda:LOCAL_RANK, --device), and "auto" gives CUDA tensors to NCCL:
//
//   build/tools/ddprun/ddprun --standalone --nproc-per-node 4 build/examples/fashion_mnist
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "ddp_stats_log.h"
#include "idx_reader.h"
#include "progress.h"
#include "training_history.h"

namespace {

struct Options {
  std::string data = "/usr/share/datasets/fashion-mnist";
  int epochs = 2;
  int batch_size = 64;  // per rank
  std::string optimizer = "adam";
  double lr = 1e-3;
  uint64_t seed = 0;
  std::string checkpoint = "fashion_mnist.pt";
  bool resume = false;
  std::string metrics = "fashion_mnist_metrics.csv";
  std::string loss_csv = "fashion_mnist_loss.csv";
  std::string plot = "fashion_mnist.svg";
  int log_every = 10;  // steps between two points of the loss curve
  int threads = 0;     // 0: keep OMP_NUM_THREADS / libtorch's default
  // "auto": cuda:LOCAL_RANK where this rank has a GPU of its own, else the CPU.
  std::string device = "auto";
  std::string backend = "auto";
  double timeout = 1800;  // seconds: the group's bound on the rendezvous and every collective
  std::string comm_hook = "none";
  int64_t powersgd_rank = 4;
  int64_t powersgd_start = -1;           // -1: a tenth of the run's steps
  std::string mixed_precision = "none";  // none | bf16 | fp16
  bool sync_bn = false;                  // SyncBatchNorm after each convolution
  int max_steps = 0;                     // per epoch; 0: the whole sampler's share
  std::string shard = "none";            // "zero": ZeroRedundancyOptimizer; "full": fully_shard
  std::string stats_csv;                 // DDP's statistics per step (rank 0); "": none
};

const char* kUsage =
    "usage: fashion_mnist [--data DIR] [--epochs N] [--batch-size B] [--optimizer adam|sgd]\n"
    "                     [--lr LR] [--seed S] [--checkpoint PATH] [--resume]\n"
    "                     [--metrics FILE.csv] [--loss-csv FILE.csv] [--log-every N]\n"
    "                     [--plot FILE.svg] [--threads N]\n"
    "                     [--device auto|cpu|cuda] [--backend auto|shm|gloo|nccl]\n"
    "                     [--timeout SECONDS]\n"
    "                     [--comm-hook none|fp16|bf16|fp16-hosts|bf16-hosts|powersgd]\n"
    "                     [--powersgd-rank R] [--powersgd-start-iter N] [--shard none|zero|full]\n"
    "                     [--mixed-precision none|bf16|fp16] [--sync-bn] [--max-steps N]\n"
    "                     [--stats-csv FILE.csv]\n"
    "Run one process per rank, e.g. ddprun --standalone --nproc-per-node 2 fashion_mnist.\n"
    "Defaults: --data /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist),\n"
    "--epochs 2, --batch-size 64 per rank, --optimizer adam, --lr 0.001 (sgd: use about 0.05),\n"
    "--checkpoint fashion_mnist.pt (written after every epoch; --checkpoint '' for none),\n"
    "--metrics fashion_mnist_metrics.csv (per epoch), --loss-csv fashion_mnist_loss.csv (the\n"
    "training loss every --log-every 10 steps), --plot fashion_mnist.svg. --resume continues\n"
    "from the checkpoint exactly as if the run had not stopped, and continues the CSV files\n"
    "and the plot with it (the history is kept in the checkpoint); a group that ddprun\n"
    "restarted (--max-restarts) resumes by itself. --device auto (the default) trains on\n"
    "cuda:LOCAL_RANK where this rank has a GPU of its own, else on the CPU. --backend auto\n"
    "(the default) is shm on one host, the hierarchy across hosts, NCCL for CUDA tensors.\n"
    "--timeout 1800 bounds the rendezvous and every collective (a lost peer is seen sooner).\n"
    "--comm-hook none (the default: DDP averages) | fp16 | bf16 (compressed all-reduce) |\n"
    "fp16-hosts | bf16-hosts (compressed only between hosts, full precision inside each) |\n"
    "powersgd (PyTorch's PowerSGD: --powersgd-rank 4, plain averaging for the first\n"
    "--powersgd-start-iter steps, by default a tenth of the run's; its state is not in the\n"
    "checkpoint, so a resumed run starts it again). DDP refuses comm hooks with\n"
    "--mixed-precision, whose buckets are already of the low-precision dtype.\n"
    "--mixed-precision none (the default) | bf16 | fp16: forward and backward on bfloat16 or\n"
    "float16 copies of float32 master weights, gradients averaged in that dtype (DDP's\n"
    "mixed_precision; fp16 on the CPU needs a libtorch 2.x). --sync-bn adds a SyncBatchNorm\n"
    "after each convolution (its running statistics are float32; under --mixed-precision they\n"
    "are updated in the forward's dtype). The test accuracy is that of the float32 weights.\n"
    "--max-steps N ends each epoch after N steps (0, the default: the whole training set), for\n"
    "short runs: bfloat16 on a CPU without bfloat16 instructions is many times slower.\n"
    "--shard zero splits the optimizer state across the ranks (ddp::ZeroRedundancyOptimizer);\n"
    "--shard full splits the parameters, gradients and optimizer state (ddp::fully_shard: each\n"
    "layer a unit, without DDP, so without DDP's statistics; not with --comm-hook,\n"
    "--mixed-precision or --sync-bn). Either checkpoint holds the whole state and resumes at\n"
    "any number of ranks.\n"
    "After each epoch rank 0 prints DDP's statistics (model.stats(): mean forward, backward\n"
    "compute and exposed communication times, bytes reduced, buckets); --stats-csv FILE.csv\n"
    "writes rank 0's, one row per step (none by default; a resumed run appends).\n";

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value\n" + kUsage);
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (arg == "--data") {
      o.data = value();
    } else if (arg == "--epochs") {
      o.epochs = std::stoi(value());
    } else if (arg == "--batch-size") {
      o.batch_size = std::stoi(value());
    } else if (arg == "--optimizer") {
      o.optimizer = value();
    } else if (arg == "--lr") {
      o.lr = std::stod(value());
    } else if (arg == "--seed") {
      o.seed = std::stoull(value());
    } else if (arg == "--checkpoint") {
      o.checkpoint = value();
    } else if (arg == "--resume") {
      o.resume = true;
    } else if (arg == "--metrics") {
      o.metrics = value();
    } else if (arg == "--loss-csv") {
      o.loss_csv = value();
    } else if (arg == "--log-every") {
      o.log_every = std::stoi(value());
    } else if (arg == "--plot") {
      o.plot = value();
    } else if (arg == "--threads") {
      o.threads = std::stoi(value());
    } else if (arg == "--timeout") {
      o.timeout = std::stod(value());
    } else if (arg == "--backend") {
      o.backend = value();
    } else if (arg == "--device") {
      o.device = value();
    } else if (arg == "--comm-hook") {
      o.comm_hook = value();
    } else if (arg == "--powersgd-rank") {
      o.powersgd_rank = std::stoll(value());
    } else if (arg == "--powersgd-start-iter") {
      o.powersgd_start = std::stoll(value());
    } else if (arg == "--mixed-precision") {
      o.mixed_precision = value();
    } else if (arg == "--sync-bn") {
      o.sync_bn = true;
    } else if (arg == "--max-steps") {
      o.max_steps = std::stoi(value());
    } else if (arg == "--stats-csv") {
      o.stats_csv = value();
    } else if (arg == "--shard") {
      o.shard = value();
    } else {
      throw std::runtime_error("unknown argument '" + arg + "'\n" + kUsage);
    }
  }
  if (o.optimizer != "adam" && o.optimizer != "sgd") {
    throw std::runtime_error("--optimizer must be adam or sgd, got '" + o.optimizer + "'");
  }
  if (o.resume && o.checkpoint.empty()) throw std::runtime_error("--resume needs --checkpoint");
  if (o.log_every < 1) throw std::runtime_error("--log-every must be at least 1");
  if (o.max_steps < 0) throw std::runtime_error("--max-steps must be 0 (no limit) or more");
  if (!(o.timeout > 0)) throw std::runtime_error("--timeout must be a positive number of seconds");
  if (o.comm_hook != "none" && o.comm_hook != "fp16" && o.comm_hook != "bf16" &&
      o.comm_hook != "fp16-hosts" && o.comm_hook != "bf16-hosts" && o.comm_hook != "powersgd") {
    throw std::runtime_error(
        "--comm-hook must be none, fp16, bf16, fp16-hosts, bf16-hosts or powersgd, got '" +
        o.comm_hook + "'");
  }
  if (o.mixed_precision != "none" && o.mixed_precision != "bf16" && o.mixed_precision != "fp16") {
    throw std::runtime_error("--mixed-precision must be none, bf16 or fp16, got '" +
                             o.mixed_precision + "'");
  }
  if (o.shard != "none" && o.shard != "zero" && o.shard != "full") {
    throw std::runtime_error("--shard must be none, zero or full, got '" + o.shard + "'");
  }
  if (o.shard == "full" && (o.comm_hook != "none" || o.mixed_precision != "none" || o.sync_bn)) {
    throw std::runtime_error(
        "--shard full trains without DDP: --comm-hook (DDP's all-reduce), --mixed-precision and "
        "--sync-bn are not available with it");
  }
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda") {
    throw std::runtime_error("--device must be auto, cpu or cuda, got '" + o.device + "'");
  }
  return o;
}

// This rank's device, made current before the process group (as torch.cuda.set_device).
torch::Device pick_device(const std::string& choice) {
  if (choice == "cpu") return torch::kCPU;
  const char* local = std::getenv("LOCAL_RANK");
  if (choice == "auto" && (local ? std::atoi(local) : 0) >= ddp::cuda_device_count()) {
    return torch::kCPU;  // no GPU of its own for this rank
  }
  const torch::Device device = ddp::set_device();  // cuda:LOCAL_RANK
  if (!device.is_cuda()) throw std::runtime_error("--device cuda, but this process sees no GPU");
  return device;
}

// The reference CNN of the benchmarks: two convolutions, max-pooling, two linear layers; with
// --sync-bn a SyncBatchNorm after each convolution (statistics of the whole batch across ranks).
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool sync_bn)
      : conv1(register_module("conv1", torch::nn::Conv2d(1, 32, 3))),
        conv2(register_module("conv2", torch::nn::Conv2d(32, 64, 3))),
        fc1(register_module("fc1", torch::nn::Linear(9216, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {
    if (sync_bn) {
      bn1 = register_module("bn1", ddp::SyncBatchNorm2d(torch::nn::BatchNormOptions(32)));
      bn2 = register_module("bn2", ddp::SyncBatchNorm2d(torch::nn::BatchNormOptions(64)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = layer(conv1, 0, x);
    if (bn1) x = bn1->forward(x);
    x = layer(conv2, 1, torch::relu(x));
    if (bn2) x = bn2->forward(x);
    x = torch::max_pool2d(torch::relu(x), 2);
    return layer(fc2, 3, torch::relu(layer(fc1, 2, torch::flatten(x, 1))));
  }
  // --shard full: each layer a unit of ddp::fully_shard (collective). The layers are members that
  // forward calls by name, so forward calls their units instead from then on.
  void fully_shard() {
    units = {ddp::FullyShardedUnit(torch::nn::AnyModule(conv1)),
             ddp::FullyShardedUnit(torch::nn::AnyModule(conv2)),
             ddp::FullyShardedUnit(torch::nn::AnyModule(fc1)),
             ddp::FullyShardedUnit(torch::nn::AnyModule(fc2))};
    const char* names[] = {"conv1", "conv2", "fc1", "fc2"};
    for (size_t i = 0; i < units.size(); ++i) replace_module(names[i], units[i].ptr());
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
  ddp::SyncBatchNorm2d bn1{nullptr}, bn2{nullptr};
  std::vector<ddp::FullyShardedUnit> units;  // --shard full

 private:
  template <typename Layer>
  torch::Tensor layer(Layer& plain, size_t unit, const torch::Tensor& x) {
    return units.empty() ? plain->forward(x) : units[unit]->forward(x);
  }
};
TORCH_MODULE(Net);

// Each rank evaluates test samples rank, rank + world, ...; the counts are summed over ranks.
double test_accuracy(Net& net, const fashion_mnist::Split& test, int rank, int world) {
  torch::NoGradGuard no_grad;
  net->eval();
  auto mine = torch::arange(rank, test.images.size(0), world, test.labels.options());
  int64_t correct = 0;
  // Batches of 100: the convolutions unfold their input (im2col) into a buffer of about 0.7 MB
  // per image, which for 1000 images no longer fits any cache: 6.5x slower on this VM, measured
  // with python3-torch at one thread (20 s against 3.1 s for 5,000 images).
  constexpr int64_t kEvalBatch = 100;
  for (int64_t begin = 0; begin < mine.size(0); begin += kEvalBatch) {
    auto batch = mine.narrow(0, begin, std::min<int64_t>(kEvalBatch, mine.size(0) - begin));
    auto predicted = net->forward(test.images.index_select(0, batch)).argmax(1);
    correct += predicted.eq(test.labels.index_select(0, batch)).sum().item<int64_t>();
  }
  net->train();
  auto counts = torch::tensor({correct, mine.size(0)});  // on the CPU: the group's CPU backend
  ddp::all_reduce(counts);
  return static_cast<double>(counts[0].item<int64_t>()) / counts[1].item<int64_t>();
}

// The training history travels in the checkpoint as two tensors of doubles (readable from Python
// too: checkpoint["history_epochs"] has a row per epoch), so a resumed run continues its curves.
ddp::ExtraState history_to_extra(const fashion_mnist::TrainingHistory& history) {
  auto tensor_of = [](std::vector<double> rows, int64_t fields) {
    const int64_t count = static_cast<int64_t>(rows.size()) / fields;
    return torch::tensor(rows, torch::kDouble).view({count, fields});
  };
  using History = fashion_mnist::TrainingHistory;
  return {{"history_epochs", tensor_of(history.epoch_rows(), History::kEpochFields)},
          {"history_losses", tensor_of(history.loss_rows(), History::kLossFields)}};
}

fashion_mnist::TrainingHistory history_from(const ddp::ExtraState& extra) {
  auto rows_of = [&](const char* key) {
    auto found = extra.find(key);
    if (found == extra.end()) return std::vector<double>{};  // a checkpoint of an older example
    auto tensor = found->second.toTensor().to(torch::kDouble).contiguous();
    return std::vector<double>(tensor.data_ptr<double>(),
                               tensor.data_ptr<double>() + tensor.numel());
  };
  return fashion_mnist::TrainingHistory::from_rows(rows_of("history_epochs"),
                                                   rows_of("history_losses"));
}

void write_outputs(const Options& o, const fashion_mnist::TrainingHistory& history) {
  fashion_mnist::write_epochs_csv(o.metrics, history);
  fashion_mnist::write_losses_csv(o.loss_csv, history);
  fashion_mnist::write_plot(o.plot, history);
}

// --comm-hook. PowerSGD starts after a tenth of the run by default, PyTorch's advice for
// start_powerSGD_iter: the first steps, when gradients change fastest, are averaged exactly.
template <typename Model>
void register_comm_hook(Model& model, const Options& o, int64_t total_steps) {
  if (o.comm_hook == "fp16") model.register_comm_hook(ddp::comm_hooks::fp16_compress());
  if (o.comm_hook == "bf16") model.register_comm_hook(ddp::comm_hooks::bf16_compress());
  if (o.comm_hook == "fp16-hosts") {
    model.register_comm_hook(ddp::comm_hooks::fp16_compress_between_hosts());
  }
  if (o.comm_hook == "bf16-hosts") {
    model.register_comm_hook(ddp::comm_hooks::bf16_compress_between_hosts());
  }
  if (o.comm_hook != "powersgd") return;
  const int64_t start =
      o.powersgd_start >= 0 ? o.powersgd_start : std::max<int64_t>(2, total_steps / 10);
  model.register_comm_hook(ddp::comm_hooks::powerSGD(ddp::PowerSGDOptions()
                                                         .matrix_approximation_rank(o.powersgd_rank)
                                                         .start_powerSGD_iter(start)));
  if (ddp::get_rank() == 0) {
    std::printf("comm hook: PowerSGD, rank %lld, from step %lld\n",
                static_cast<long long>(o.powersgd_rank), static_cast<long long>(start));
  }
}

int run(const Options& o) {
  const torch::Device device = pick_device(o.device);
  ddp::init_process_group(ddp::InitOptions().backend(o.backend).timeout(
      std::chrono::milliseconds(static_cast<int64_t>(o.timeout * 1000))));
  const int rank = ddp::get_rank();
  const int world = ddp::get_world_size();
  if (o.threads > 0) torch::set_num_threads(o.threads);
  auto train = fashion_mnist::load_split(o.data, "train");
  auto test = fashion_mnist::load_split(o.data, "t10k");
  // The whole set fits on a GPU (188 MB): batches are then picked there.
  for (auto* split : {&train, &test}) {
    split->images = split->images.to(device);
    split->labels = split->labels.to(device);
  }

  torch::manual_seed(o.seed);
  Net net(o.sync_bn);
  net->to(device);
  const bool fully_sharded = o.shard == "full";
  if (fully_sharded) net->fully_shard();  // from here net->parameters() are this rank's shards
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (o.shard == "zero") {
    // Each rank keeps the optimizer state of its partition of the parameters only.
    optimizer = std::make_unique<ddp::ZeroRedundancyOptimizer>(
        net->parameters(),
        o.optimizer == "adam"
            ? ddp::zero_optimizer<torch::optim::Adam>(torch::optim::AdamOptions(o.lr))
            : ddp::zero_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(o.lr).momentum(0.9)));
  } else if (o.optimizer == "adam") {
    optimizer =
        std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(o.lr));
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(net->parameters(),
                                                    torch::optim::SGDOptions(o.lr).momentum(0.9));
  }
  int first_epoch = 0;
  fashion_mnist::TrainingHistory history;
  // A group that ddprun (or torchrun) restarted after a failure continues from the last
  // checkpoint, as PyTorch's elastic recipe does; a first attempt resumes only when asked.
  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const bool restarted = restarts != nullptr && std::atoi(restarts) > 0 && !o.checkpoint.empty() &&
                         std::ifstream(o.checkpoint).good();
  if (o.resume || restarted) {
    auto extra = ddp::load_checkpoint(o.checkpoint, *net, optimizer.get());
    first_epoch = static_cast<int>(extra.at("epoch").toInt());
    history = history_from(extra);
    if (rank == 0) {
      std::printf("resumed from %s after epoch %d\n", o.checkpoint.c_str(), first_epoch);
      // The files may be older than the checkpoint (a run stopped between its save and their
      // writing), or gone: they are rewritten from its history before training goes on.
      write_outputs(o, history);
    }
  }
  // After loading: DDP's construction broadcasts rank 0's parameters anyway.
  auto ddp_options = ddp::DDPOptions().device_ids({device});
  // Forward and backward on bfloat16 or float16 copies; the float32 masters are what the
  // optimizer updates, what the checkpoint holds and what test_accuracy evaluates.
  if (o.mixed_precision != "none") {
    ddp_options.mixed_precision(ddp::MixedPrecision().param_dtype(
        o.mixed_precision == "bf16" ? torch::kBFloat16 : torch::kHalf));
  }
  std::optional<ddp::DistributedDataParallel<Net>> model;  // none under --shard full
  if (!fully_sharded) model.emplace(net, ddp_options);
  auto forward = [&](torch::Tensor x) { return model ? (*model)(x) : net->forward(x); };
  ddp::DistributedSampler sampler(train.images.size(0), ddp::SamplerOptions().seed(o.seed));
  int steps = static_cast<int>((sampler.num_samples() + o.batch_size - 1) / o.batch_size);
  if (o.max_steps > 0) steps = std::min(steps, o.max_steps);
  if (model) register_comm_hook(*model, o, int64_t(o.epochs) * steps);
  std::optional<fashion_mnist::StatsCsv> stats_csv;
  if (rank == 0 && !o.stats_csv.empty()) stats_csv.emplace(o.stats_csv, o.resume || restarted);
  if (rank == 0) {
    std::printf("training on %d ranks (%s): %d epochs of %d steps, %d images per step\n", world,
                device.str().c_str(), o.epochs, steps, o.batch_size * world);
  }
  double train_seconds = 0;
  double accuracy = history.epochs.empty() ? 0 : history.epochs.back().test_accuracy;
  for (int epoch = first_epoch; epoch < o.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    auto indices = torch::tensor(sampler.indices()).to(device);
    fashion_mnist::Progress progress(epoch + 1, o.epochs, steps, o.batch_size * world, rank == 0);
    const auto start = std::chrono::steady_clock::now();
    if (model) model->reset_stats();  // the epoch's means
    double loss_sum = 0;
    double window_sum = 0;  // the losses since the last point of the loss curve
    int window_steps = 0;
    for (int step = 0; step < steps; ++step) {
      auto batch =
          indices.narrow(0, step * o.batch_size,
                         std::min<int64_t>(o.batch_size, indices.size(0) - step * o.batch_size));
      optimizer->zero_grad();
      // The loss in float32 whatever the forward's dtype (--mixed-precision).
      auto logits = forward(train.images.index_select(0, batch)).to(torch::kFloat);
      auto loss = torch::nn::functional::cross_entropy(logits, train.labels.index_select(0, batch));
      loss.backward();
      if (stats_csv && model) {
        stats_csv->add(epoch + 1, int64_t(epoch) * steps + step + 1, model->stats().last_step);
      }
      optimizer->step();
      const double value = loss.item<double>();
      loss_sum += value;
      window_sum += value;
      ++window_steps;
      if (window_steps == o.log_every || step + 1 == steps) {
        // Every rank reaches this at the same step: the curve is the mean over all ranks' batches.
        auto mean = torch::tensor({window_sum / window_steps}, torch::kDouble);
        ddp::all_reduce(mean, ddp::ReduceOp::AVG);
        history.losses.push_back({int64_t(epoch) * steps + step + 1,
                                  epoch + double(step + 1) / steps, mean.item<double>()});
        window_sum = 0;
        window_steps = 0;
      }
      progress.update(step + 1, loss_sum / (step + 1));
    }
    progress.finish();
    const std::optional<ddp::DDPStats> epoch_stats =
        model ? std::optional<ddp::DDPStats>(model->stats()) : std::nullopt;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    train_seconds += seconds;
    auto mean_loss = torch::tensor({loss_sum / steps}, torch::kDouble);
    ddp::all_reduce(mean_loss, ddp::ReduceOp::AVG);
    accuracy = test_accuracy(net, test, rank, world);
    history.epochs.push_back({epoch + 1, mean_loss.item<double>(), accuracy,
                              steps * o.batch_size * world / seconds, seconds});
    if (!o.checkpoint.empty()) {
      auto extra = history_to_extra(history);
      extra["epoch"] = epoch + 1;
      // A sharded optimizer's state is gathered onto rank 0, which writes it (collective).
      if (auto* zero = dynamic_cast<ddp::ZeroRedundancyOptimizer*>(optimizer.get())) {
        zero->consolidate_state_dict(0);
      }
      ddp::save_checkpoint(o.checkpoint, *net, optimizer.get(), extra);
    }
    if (rank == 0) {
      std::printf("epoch %d: train loss %.4f, test accuracy %.4f, %.1f s\n", epoch + 1,
                  history.epochs.back().train_loss, accuracy, seconds);
      if (epoch_stats) {
        std::printf("%s\n", fashion_mnist::describe_epoch_stats(epoch + 1, *epoch_stats).c_str());
      }
      write_outputs(o, history);
    }
  }
  if (rank == 0) {
    std::printf(
        "{\"test_accuracy\": %.4f, \"epochs\": %d, \"world_size\": %d, "
        "\"train_seconds\": %.1f, \"device\": \"%s\", \"metrics\": \"%s\", \"plot\": \"%s\"}\n",
        accuracy, o.epochs, world, train_seconds, device.str().c_str(), o.metrics.c_str(),
        o.plot.c_str());
  }
  ddp::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "fashion_mnist: %s\n", error.what());
    return 1;
  }
}
