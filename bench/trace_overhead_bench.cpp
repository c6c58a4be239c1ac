// trace_overhead_bench: what the flight recorder (on by default) adds to a small all_reduce.
//
//   build/tools/ddprun/ddprun --standalone --nproc-per-node 2 build/bench/trace_overhead_bench
//
// Alternates blocks of timed all_reduces with the recorder on (InitOptions().trace_buffer(2000))
// and off (0), in pairs whose order alternates, in the same processes, re-initialising the group
// between blocks: on a shared,
// noisy machine runs of separate processes differ by more than the recorder costs, blocks side by
// side much less. Rank 0 prints one JSON line: the median and lower quartile of each mode's
// per-call time over its blocks, and the median of the per-pair ratios on/off.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct Options {
  std::string backend = "shm";
  int blocks = 20;    // per mode
  int iters = 20000;  // timed calls per block
  int64_t bytes = 8;  // float elements: bytes / 4
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i];
    const char* value = argv[i + 1];
    if (name == "--backend") {
      options.backend = value;
    } else if (name == "--blocks") {
      options.blocks = std::atoi(value);
    } else if (name == "--iters") {
      options.iters = std::atoi(value);
    } else if (name == "--bytes") {
      options.bytes = std::atoll(value);
    } else {
      std::fprintf(stderr,
                   "usage: trace_overhead_bench [--backend shm] [--blocks 20] [--iters 20000] "
                   "[--bytes 8]\n");
      std::exit(2);
    }
  }
  if (options.blocks < 1 || options.iters < 1 || options.bytes < 4) {
    std::fprintf(stderr, "trace_overhead_bench: --blocks, --iters >= 1 and --bytes >= 4\n");
    std::exit(2);
  }
  return options;
}

double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(q * static_cast<double>(values.size() - 1) + 0.5)];
}

// Mean microseconds per call over one block, in a group made with `trace_buffer`.
double time_block(const Options& options, int64_t trace_buffer) {
  ddp::init_process_group(ddp::InitOptions()
                              .backend(options.backend)
                              .verify_collectives(false)
                              .trace_buffer(trace_buffer));
  auto tensor = torch::ones({options.bytes / 4});
  for (int i = 0; i < options.iters / 10; ++i) ddp::all_reduce(tensor);
  ddp::barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < options.iters; ++i) ddp::all_reduce(tensor);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ddp::destroy_process_group();
  return seconds * 1e6 / options.iters;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  torch::set_num_threads(1);
  std::vector<double> on, off, ratio;
  for (int block = 0; block < options.blocks; ++block) {
    // Which mode goes first alternates too: a block right after another may differ.
    if (block % 2 == 0) {
      on.push_back(time_block(options, 2000));
      off.push_back(time_block(options, 0));
    } else {
      off.push_back(time_block(options, 0));
      on.push_back(time_block(options, 2000));
    }
    ratio.push_back(on.back() / off.back());
  }
  const char* rank = std::getenv("RANK");
  if (rank == nullptr || std::string(rank) == "0") {
    std::printf(
        "{\"backend\": \"%s\", \"bytes\": %lld, \"blocks\": %d, \"iters\": %d, "
        "\"on_median_us\": %.3f, \"off_median_us\": %.3f, \"on_q1_us\": %.3f, \"off_q1_us\": "
        "%.3f, \"ratio_median\": %.3f}\n",
        options.backend.c_str(), static_cast<long long>(options.bytes), options.blocks,
        options.iters, quantile(on, 0.5), quantile(off, 0.5), quantile(on, 0.25),
        quantile(off, 0.25), quantile(ratio, 0.5));
  }
}
