// save_checkpoint / load_checkpoint: rank 0 writes atomically while the others wait, failures reach
// every rank, the files are torch.save's format both ways (checked with Debian's python3-torch),
// SGD and Adam resume bit-identically, and every bad file or mismatch is a clear error.
#include "ddp/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "compat/libtorch_compat.h"
#include "ddp/ddp.h"
#include "support/multiprocess.h"

namespace {

namespace fs = std::filesystem;

// The architecture the Python side rebuilds: nn.Sequential(Linear(4, 8), BatchNorm1d(8), ReLU(),
// Linear(8, 3)), with parameters and buffers (running stats, num_batches_tracked).
torch::nn::Sequential make_model(int seed) {
  torch::manual_seed(seed);
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                              torch::nn::Linear(8, 3));
  model->train();
  model->forward(torch::randn({16, 4}));  // moves the running statistics off their defaults
  return model;
}

std::map<std::string, at::Tensor> state_of(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> state;
  for (const auto& item : module.named_parameters()) state[item.key()] = item.value().detach();
  for (const auto& item : module.named_buffers()) state[item.key()] = item.value().detach();
  return state;
}

void expect_same_state(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto sa = state_of(a), sb = state_of(b);
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [name, tensor] : sa) {
    ASSERT_EQ(sb.count(name), 1u) << name;
    EXPECT_TRUE(torch::equal(tensor, sb[name])) << name;
  }
}

// Runs `body` in one forked process, so that this gtest process never touches libtorch itself
// (the fork-based tests that follow must not inherit its thread pools).
void in_child(const std::function<void()>& body) {
  ddp::testing::run_ranks_ok(
      1, [&](int) { body(); }, std::chrono::seconds(60));
}

// Fails unless `call` throws an Error (DistributedError or a subclass) whose message contains
// every one of `parts`; an error of another type escapes and fails the process.
template <typename Error = ddp::DistributedError>
void expect_error(const std::function<void()>& call, const std::vector<std::string>& parts) {
  try {
    call();
    ADD_FAILURE() << "no DistributedError; expected one mentioning " << parts.front();
  } catch (const Error& error) {
    std::string message = error.what();
    for (const auto& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "\"" << part << "\" is not in: " << message;
    }
  }
}

std::vector<std::string> files_in(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

// Runs a Python program with arguments; returns its stdout and EXPECTs exit status 0. The program
// must not contain single quotes.
std::string python_output(const std::string& program, const std::string& args) {
  std::string command = ddp::testing::torch_python() + " -c '" + program + "' " + args;
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string output;
  char chunk[4096];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), pipe)) > 0) output.append(chunk, n);
  EXPECT_EQ(::pclose(pipe), 0) << "python failed; its output:\n" << output;
  return output;
}

// "name value" lines -> map.
std::map<std::string, double> parse_sums(const std::string& output) {
  std::map<std::string, double> sums;
  std::istringstream lines(output);
  std::string name;
  double value;
  while (lines >> name >> value) sums[name] = value;
  return sums;
}

void expect_sums(const torch::nn::Module& module, const std::map<std::string, double>& sums) {
  auto state = state_of(module);
  EXPECT_LT(state.size(), sums.size());  // + the "epoch" line (and others)
  for (const auto& [name, tensor] : state) {
    auto it = sums.find(name);
    ASSERT_NE(it, sums.end()) << name << " not printed by Python";
    EXPECT_NEAR(it->second, tensor.to(torch::kDouble).sum().item<double>(), 1e-5) << name;
  }
}

}  // namespace

TEST(Checkpoint, RankZeroWritesOneFileWhileRankOneWaitsAndBothLoadIt) {
  const std::string path = ddp::testing::fresh_path("ckpt.pt");
  const std::string folder = fs::path(path).parent_path().string();
  ddp::testing::run_ranks_ok(2, [&](int rank) {
    ddp::init_process_group(ddp::InitOptions().timeout(std::chrono::seconds(30)));
    auto model = make_model(/*seed=*/rank);  // the ranks differ: only rank 0's is saved
    ddp::save_checkpoint(path, *model, nullptr, {{"epoch", int64_t{3}}});
    // Back from save, the file is complete on every rank.
    auto names = files_in(folder);
    ASSERT_EQ(names.size(), 1u);
    EXPECT_EQ(names[0], "ckpt.pt");
    auto fresh = make_model(/*seed=*/100 + rank);
    auto extra = ddp::load_checkpoint(path, *fresh);
    ASSERT_EQ(extra.count("epoch"), 1u);
    EXPECT_EQ(extra["epoch"].toInt(), 3);
    auto flat = torch::cat({fresh[0]->as<torch::nn::Linear>()->weight.detach().flatten(),
                            fresh[1]->as<torch::nn::BatchNorm1d>()->running_mean.flatten()});
    auto all = ddp::all_gather(flat);
    EXPECT_TRUE(torch::equal(all[0], all[1])) << "the ranks loaded different values";
    if (rank == 0) expect_same_state(*model, *fresh);
    ddp::barrier();
    ddp::destroy_process_group();
  });
  EXPECT_EQ(files_in(folder), std::vector<std::string>{"ckpt.pt"});
}

TEST(Checkpoint, PythonTorchLoadReadsOursModelSgdAndAdamState) {
  if (ddp::testing::torch_python().empty()) {
    GTEST_SKIP() << "no Python with torch (python3-torch, or DDP_TEST_PYTHON)";
  }
  constexpr const char* kRead = R"(
import sys, torch, torch.nn as nn
# weights_only=True, the default since PyTorch 2.6: only tensors and plain containers, nothing
# that runs code. The safe unpickler of 1.13 cannot read floats at all (any optimizer state).
safe = int(torch.__version__.split(".")[0]) >= 2
ck = torch.load(sys.argv[1], weights_only=safe)
assert sorted(ck.keys()) == ["epoch", "model", "optimizer"], ck.keys()
m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
m.load_state_dict(ck["model"], strict=True)
opt = torch.optim.SGD(m.parameters(), lr=1.0, momentum=0.5)
opt.load_state_dict(ck["optimizer"])
g = opt.param_groups[0]
assert g["lr"] == 0.25 and g["momentum"] == 0.9 and g["nesterov"], g
assert len(opt.state) == 6, len(opt.state)
for name, t in m.state_dict().items():
  print(name, repr(t.double().sum().item()))
print("epoch", ck["epoch"])
ck = torch.load(sys.argv[2], weights_only=safe)
adam = torch.optim.Adam(m.parameters())
adam.load_state_dict(ck["optimizer"])
g = adam.param_groups[0]
assert g["lr"] == 0.5 and g["betas"] == (0.5, 0.75) and g["amsgrad"], g
assert adam.state[m[0].weight]["step"].item() == 1, adam.state[m[0].weight]
m(torch.randn(16, 4)).sum().backward()
adam.step()
)";
  in_child([&] {
    const std::string path = ddp::testing::fresh_path("ours.pt");
    auto model = make_model(0);
    torch::optim::SGD sgd(model->parameters(),
                          torch::optim::SGDOptions(0.25).momentum(0.9).nesterov(true));
    model->forward(torch::randn({16, 4})).sum().backward();
    sgd.step();
    ddp::save_checkpoint(path, *model, &sgd, {{"epoch", int64_t{5}}});
    const std::string adam_path = ddp::testing::fresh_path("adam.pt");
    auto other = make_model(1);
    torch::optim::Adam adam(
        other->parameters(),
        torch::optim::AdamOptions(0.5).betas(std::make_tuple(0.5, 0.75)).amsgrad(true));
    other->forward(torch::randn({16, 4})).sum().backward();
    adam.step();
    ddp::save_checkpoint(adam_path, *other, &adam);
    auto sums = parse_sums(python_output(kRead, path + " " + adam_path));
    EXPECT_EQ(sums["epoch"], 5);
    expect_sums(*model, sums);
  });
}

TEST(Checkpoint, LoadsPythonsPlainAndDdpPrefixedStateDicts) {
  if (ddp::testing::torch_python().empty()) {
    GTEST_SKIP() << "no Python with torch (python3-torch, or DDP_TEST_PYTHON)";
  }
  constexpr const char* kWrite = R"(
import sys, torch, torch.nn as nn
torch.manual_seed(7)
m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
opt = torch.optim.SGD(m.parameters(), lr=0.125, momentum=0.75)
m(torch.randn(16, 4)).sum().backward()
opt.step()
sd = m.state_dict()
torch.save(sd, sys.argv[1])
prefixed = {"module." + k: v for k, v in sd.items()}
torch.save({"model": prefixed, "optimizer": opt.state_dict(), "epoch": 7}, sys.argv[2])
for name, t in sd.items():
  print(name, repr(t.double().sum().item()))
print("epoch", 7)
print("momentum_of_0.weight", repr(opt.state[m[0].weight]["momentum_buffer"].double().sum().item()))
)";
  in_child([&] {
    const std::string plain = ddp::testing::fresh_path("plain.pt");
    const std::string prefixed = ddp::testing::fresh_path("ddp.pt");
    auto sums = parse_sums(python_output(kWrite, plain + " " + prefixed));
    auto a = make_model(1);
    auto extra_a = ddp::load_checkpoint(plain, *a);
    EXPECT_TRUE(extra_a.empty());
    expect_sums(*a, sums);
    auto b = make_model(2);
    torch::optim::SGD sgd(b->parameters(), torch::optim::SGDOptions(1.0));
    auto extra_b = ddp::load_checkpoint(prefixed, *b, &sgd);
    ASSERT_EQ(extra_b.count("epoch"), 1u);
    EXPECT_EQ(extra_b["epoch"].toInt(), 7);
    expect_same_state(*a, *b);
    // Python's optimizer state_dict: options and momentum buffers.
    const auto& group =
        static_cast<const torch::optim::SGDOptions&>(sgd.param_groups()[0].options());
    EXPECT_EQ(group.lr(), 0.125);
    EXPECT_EQ(group.momentum(), 0.75);
    ASSERT_EQ(sgd.state().size(), 6u);
    const auto& weight = b[0]->as<torch::nn::Linear>()->weight;
    const auto* weight_state = ddp::compat::optimizer_state_of(sgd, weight);
    ASSERT_NE(weight_state, nullptr);
    const auto& state = static_cast<const torch::optim::SGDParamState&>(*weight_state);
    EXPECT_NEAR(state.momentum_buffer().to(torch::kDouble).sum().item<double>(),
                sums.at("momentum_of_0.weight"), 1e-6);
  });
}

namespace {

// Trains `steps` steps from step `first` on batches that depend only on the step number.
void train(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int first, int steps) {
  for (int step = first; step < first + steps; ++step) {
    torch::manual_seed(1000 + step);
    auto x = torch::randn({8, 4});
    auto y = torch::randn({8, 3});
    optimizer.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    optimizer.step();
  }
}

// k steps, save, a fresh model and optimizer (other initial values, other options), load, m more
// steps: must equal k + m uninterrupted steps bit for bit.
template <typename Make>
void expect_exact_resume(Make make_optimizer, Make make_other_optimizer) {
  constexpr int k = 5, m = 7;
  const std::string path = ddp::testing::fresh_path("resume.pt");
  auto reference = make_model(0);
  auto reference_opt = make_optimizer(*reference);
  train(reference, *reference_opt, 0, k + m);

  auto first = make_model(0);
  auto first_opt = make_optimizer(*first);
  train(first, *first_opt, 0, k);
  ddp::save_checkpoint(path, *first, first_opt.get(), {{"step", int64_t{k}}});

  auto resumed = make_model(99);
  auto resumed_opt = make_other_optimizer(*resumed);
  auto extra = ddp::load_checkpoint(path, *resumed, resumed_opt.get());
  ASSERT_EQ(extra.at("step").toInt(), k);
  train(resumed, *resumed_opt, static_cast<int>(extra.at("step").toInt()), m);
  expect_same_state(*reference, *resumed);
}

}  // namespace

TEST(Checkpoint, SgdWithMomentumResumesBitIdentically) {
  using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(torch::nn::Module&)>;
  in_child([] {
    expect_exact_resume<Make>(
        [](torch::nn::Module& model) {
          return std::make_unique<torch::optim::SGD>(
              model.parameters(),
              torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3));
        },
        [](torch::nn::Module& model) {
          return std::make_unique<torch::optim::SGD>(model.parameters(),
                                                     torch::optim::SGDOptions(0.5));
        });
    expect_exact_resume<Make>(
        [](torch::nn::Module& model) {
          return std::make_unique<torch::optim::SGD>(
              model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.8).dampening(0.1));
        },
        [](torch::nn::Module& model) {
          return std::make_unique<torch::optim::SGD>(model.parameters(),
                                                     torch::optim::SGDOptions(0.5).momentum(0.3));
        });
  });
}

TEST(Checkpoint, AdamResumesBitIdentically) {
  using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(torch::nn::Module&)>;
  in_child([] {
    for (bool amsgrad : {false, true}) {
      expect_exact_resume<Make>(
          [amsgrad](torch::nn::Module& model) {
            return std::make_unique<torch::optim::Adam>(model.parameters(),
                                                        torch::optim::AdamOptions(1e-2)
                                                            .betas(std::make_tuple(0.8, 0.99))
                                                            .eps(1e-6)
                                                            .weight_decay(1e-3)
                                                            .amsgrad(amsgrad));
          },
          [](torch::nn::Module& model) {
            return std::make_unique<torch::optim::Adam>(model.parameters(),
                                                        torch::optim::AdamOptions(1e-3));
          });
    }
  });
}

TEST(Checkpoint, MissingFileIsAnErrorNamingThePath) {
  in_child([] {
    const std::string path = ddp::testing::fresh_path("absent.pt");
    auto model = make_model(0);
    expect_error<ddp::InvalidArgumentError>([&] { ddp::load_checkpoint(path, *model); },
                                            {"ddp::load_checkpoint", path, "cannot open"});
  });
}

TEST(Checkpoint, AFolderIsAnInvalidArgumentNamingThePath) {
  in_child([] {
    const std::string path = ddp::testing::fresh_path("folder.pt");
    fs::create_directory(path);
    auto model = make_model(0);
    expect_error<ddp::InvalidArgumentError>([&] { ddp::load_checkpoint(path, *model); },
                                            {"ddp::load_checkpoint", path, "is a directory"});
  });
}

TEST(Checkpoint, TruncatedAndGarbageFilesAreErrorsNamingThePath) {
  in_child([] {
    const std::string path = ddp::testing::fresh_path("whole.pt");
    auto model = make_model(0);
    ddp::save_checkpoint(path, *model);
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 100u);
    const std::string half = ddp::testing::fresh_path("half.pt");
    std::ofstream(half, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    expect_error<ddp::InvalidArgumentError>(
        [&] { ddp::load_checkpoint(half, *model); },
        {"ddp::load_checkpoint", half, "not a checkpoint", "truncated"});
    // Wherever the cut falls (in the zip's entries, its directory, its last byte), the error is
    // one of ours naming the file, never a bare libtorch exception.
    for (size_t keep : {size_t{1}, size_t{10}, size_t{100}, bytes.size() - 100, bytes.size() - 22,
                        bytes.size() - 1}) {
      const std::string cut = ddp::testing::fresh_path("cut.pt");
      std::ofstream(cut, std::ios::binary) << bytes.substr(0, keep);
      expect_error<ddp::InvalidArgumentError>([&] { ddp::load_checkpoint(cut, *model); },
                                              {"ddp::load_checkpoint", cut});
    }
    const std::string garbage = ddp::testing::fresh_path("garbage.pt");
    std::ofstream(garbage, std::ios::binary) << "this is not a checkpoint at all\n";
    expect_error([&] { ddp::load_checkpoint(garbage, *model); },
                 {"ddp::load_checkpoint", garbage, "not a checkpoint"});
    const std::string empty = ddp::testing::fresh_path("empty.pt");
    std::ofstream(empty, std::ios::binary).flush();
    expect_error([&] { ddp::load_checkpoint(empty, *model); }, {empty, "not a checkpoint"});
  });
}

TEST(Checkpoint, MissingAndUnexpectedKeysAreListed) {
  in_child([] {
    const std::string path = ddp::testing::fresh_path("two.pt");
    torch::nn::Sequential two(torch::nn::Linear(4, 8), torch::nn::Linear(8, 3));
    ddp::save_checkpoint(path, *two);
    torch::nn::Sequential three(torch::nn::Linear(4, 8), torch::nn::Linear(8, 3),
                                torch::nn::Linear(3, 2));
    expect_error([&] { ddp::load_checkpoint(path, *three); },
                 {"ddp::load_checkpoint", path, "missing keys: 2.weight, 2.bias", "strict(false)"});
    torch::nn::Sequential one(torch::nn::Linear(4, 8));
    expect_error([&] { ddp::load_checkpoint(path, *one); }, {"unexpected keys: 1.bias, 1.weight"});
  });
}

TEST(Checkpoint, LenientLoadTakesWhatMatches) {
  in_child([] {
    const std::string path = ddp::testing::fresh_path("two.pt");
    torch::nn::Sequential two(torch::nn::Linear(4, 8), torch::nn::Linear(8, 3));
    ddp::save_checkpoint(path, *two);
    torch::nn::Sequential three(torch::nn::Linear(4, 8), torch::nn::Linear(8, 3),
                                torch::nn::Linear(3, 2));
    auto untouched = three[2]->as<torch::nn::Linear>()->weight.detach().clone();
    ddp::load_checkpoint(path, *three, nullptr, ddp::LoadOptions().strict(false));
    EXPECT_TRUE(torch::equal(three[0]->as<torch::nn::Linear>()->weight,
                             two[0]->as<torch::nn::Linear>()->weight));
    EXPECT_TRUE(torch::equal(three[1]->as<torch::nn::Linear>()->bias,
                             two[1]->as<torch::nn::Linear>()->bias));
    EXPECT_TRUE(torch::equal(three[2]->as<torch::nn::Linear>()->weight, untouched));
    torch::nn::Sequential one(torch::nn::Linear(4, 8));
    ddp::load_checkpoint(path, *one, nullptr, /*strict=*/false);
    EXPECT_TRUE(
        torch::equal(one[0]->as<torch::nn::Linear>()->bias, two[0]->as<torch::nn::Linear>()->bias));
  });
}

TEST(Checkpoint, ShapeMismatchNamesTheKeyAndBothShapes) {
  in_child([] {
    const std::string path = ddp::testing::fresh_path("two.pt");
    torch::nn::Sequential two(torch::nn::Linear(4, 8), torch::nn::Linear(8, 3));
    ddp::save_checkpoint(path, *two);
    torch::nn::Sequential wider(torch::nn::Linear(4, 8), torch::nn::Linear(8, 5));
    for (bool strict : {true, false}) {
      expect_error([&] { ddp::load_checkpoint(path, *wider, nullptr, strict); },
                   {"ddp::load_checkpoint", "\"1.weight\"", "[3, 8]", "[5, 8]"});
    }
  });
}

TEST(Checkpoint, SaveIntoAMissingFolderFailsOnEveryRankQuicklyAndLeavesNoFile) {
  const std::string base = ddp::testing::fresh_path("no_such_folder");
  const std::string path = base + "/ckpt.pt";
  ddp::testing::run_ranks_ok(
      2,
      [&](int rank) {
        ddp::init_process_group(ddp::InitOptions().timeout(std::chrono::seconds(30)));
        torch::nn::Linear model(4, 2);
        auto start = std::chrono::steady_clock::now();
        expect_error<ddp::InvalidArgumentError>(
            [&] { ddp::save_checkpoint(path, *model); },
            {"[rank " + std::to_string(rank) + "] ddp::save_checkpoint", path,
             rank == 0 ? "failed to write" : "rank 0 failed to write", "No such file"});
        EXPECT_LT(ddp::testing::elapsed_ms(start), 5000);
        // The ranks are still in step: the group works.
        auto t = torch::ones({2});
        ddp::all_reduce(t);
        EXPECT_EQ(t[0].item<float>(), 2.0f);
        ddp::destroy_process_group();
      },
      std::chrono::seconds(30));
  EXPECT_TRUE(files_in(fs::path(base).parent_path().string()).empty());
}

TEST(Checkpoint, AFailedRenameLeavesNoTemporaryFile) {
  in_child([] {
    // The final name is a non-empty folder: the temporary file is written, the rename fails.
    const std::string path = ddp::testing::fresh_path("taken");
    fs::create_directory(path);
    std::ofstream(path + "/keep") << "x";
    torch::nn::Linear model(4, 2);
    expect_error([&] { ddp::save_checkpoint(path, *model); },
                 {"ddp::save_checkpoint", "cannot rename", path});
    EXPECT_EQ(files_in(fs::path(path).parent_path().string()), std::vector<std::string>{"taken"});
  });
}

// A save killed mid-write leaves "<path>.tmp.<pid>..." behind: the next save of that path removes
// it once its writer is gone, and leaves a live writer's alone.
TEST(Checkpoint, SaveRemovesStaleTemporaryFilesOfDeadWritersOnly) {
  in_child([] {
    const std::string path = ddp::testing::fresh_path("ckpt.pt");
    pid_t dead = ::fork();
    if (dead == 0) ::_exit(0);
    ASSERT_GT(dead, 0);
    ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);  // reaped: no process has this pid now
    const pid_t alive = ::getppid();               // the test runner, alive throughout
    const std::string stale = path + ".tmp." + std::to_string(dead) + ".123.0";
    const std::string live = path + ".tmp." + std::to_string(alive) + ".456.0";
    const std::string other = path + "x.tmp." + std::to_string(dead) + ".789.0";  // not ours
    for (const auto& name : {stale, live, other}) std::ofstream(name) << "partial";
    torch::nn::Linear model(4, 2);
    ddp::save_checkpoint(path, *model);
    EXPECT_FALSE(fs::exists(stale));
    EXPECT_TRUE(fs::exists(live));
    EXPECT_TRUE(fs::exists(other));
    EXPECT_TRUE(fs::exists(path));
  });
}
