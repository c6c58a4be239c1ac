// allreduce_bench: all_reduce (or reduce_scatter_tensor) bandwidth over message sizes, after
// nccl-tests' all_reduce_perf and reduce_scatter_perf.
//
// Launch it on every rank (ddprun, torchrun, or by hand with RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT set):
//
//   build/tools/ddprun/ddprun --nproc-per-node 2 build/bench/allreduce_bench --backend gloo
//
// For each size min-bytes, min-bytes*step, ... (up to max-bytes), every rank: barriers, runs the
// warm-up calls, then times `iters` in-place all_reduce(SUM) calls on a float tensor. The mean time
// per call is reduced with MAX over ranks (the slowest rank defines the collective's time, as in
// nccl-tests), and rank 0 prints one JSON line, such as this one measured on a 2-core machine:
//
//   {"backend": "gloo", "world_size": 2, "bytes": 2048, "time_us": 86.80, "algbw_gbps": 0.0236,
//    "busbw_gbps": 0.0236, "wrong": 0, "iters": 20}
//
// algbw = bytes / time (1 GB = 1e9 bytes); busbw = algbw * 2(n-1)/n, the traffic a ring all-reduce
// puts on each link, comparable across world sizes. "wrong" is nccl-tests' #wrong: after the timed
// loop each rank fills its tensor with (rank+1) + i%7 (small integers, so float sums are exact),
// runs one more all_reduce, and counts the elements that differ from the expected sum; the counts
// are summed over ranks. The program exits 1 when any size had a wrong element.
//
// --collective reduce_scatter times reduce_scatter_tensor(output, input) instead: `bytes` is the
// input's size (rounded down to a multiple of the world size), each rank receives 1/n of it, and
// busbw = algbw * (n-1)/n, as in nccl-tests' reduce_scatter_perf; "wrong" counts the elements of
// each rank's output that differ from its part of the expected sum.
//
// See bench/README.md for the options and measured numbers.
#include <ATen/ATen.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "ddp/collectives.h"
#include "ddp/init.h"

namespace {

struct Options {
  std::string backend = "gloo";
  std::string collective = "all_reduce";  // or "reduce_scatter" (reduce_scatter_tensor)
  std::int64_t min_bytes = 8;
  std::int64_t max_bytes = 64LL << 20;
  std::int64_t step_factor = 4;
  int warmup = 5;
  int iters = 20;
  bool scale_iters = true;
  std::string dtype = "float";
  int threads = 1;
  bool verify = false;
};

// Unless --fixed-iters, the loops of large sizes are shortened so that one size moves at most
// kBytesPerSize bytes in its timed loop and as many in its warm-up, but never fewer than
// kMinScaledIters timed calls and one warm-up call. With the defaults (20 iterations, sizes up to
// 32 MiB) nothing is shortened and the whole sweep takes seconds; the cap only keeps --max-bytes 1G
// and above usable.
constexpr std::int64_t kBytesPerSize = 1LL << 30;
constexpr int kMinScaledIters = 3;

const char* const kUsage =
    "usage: allreduce_bench [options]\n"
    "\n"
    "Times ddp::all_reduce(SUM), or reduce_scatter_tensor, on float tensors of growing size; run\n"
    "it on every rank (ddprun, torchrun, or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by hand).\n"
    "Rank 0 prints one JSON line per size. Sizes take a K, M or G suffix (powers of 1024).\n"
    "\n"
    "options (`--name value` or `--name=value`):\n"
    "  --backend NAME       ddp::InitOptions().backend (default gloo)\n"
    "  --collective NAME    all_reduce (default) or reduce_scatter (reduce_scatter_tensor: the\n"
    "                       size is the input's, each rank receives 1/world of it)\n"
    "  --min-bytes N        smallest message (default 8; at least 4, one float)\n"
    "  --max-bytes N        largest message (default 64M); the sweep stops at the last size\n"
    "                       min-bytes * step^k that does not exceed it\n"
    "  --step-factor N      size multiplier between steps (default 4)\n"
    "  --warmup N           untimed calls per size (default 5)\n"
    "  --iters N            timed calls per size (default 20)\n"
    "  --fixed-iters        never shorten the loops (by default the timed loop and the warm-up\n"
    "                       of a size each move at most 1 GiB, with at least 3 timed calls and\n"
    "                       1 warm-up call: only sizes above 1G/iters are affected)\n"
    "  --dtype float        element type (only float)\n"
    "  --threads N          torch::set_num_threads (default 1)\n"
    "  --verify             keep verify_collectives on (off by default: it adds a round trip\n"
    "                       to every call)\n"
    "  -h, --help           print this text and exit\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "allreduce_bench: %s\n\n%s", message.c_str(), kUsage);
  std::exit(2);
}

std::int64_t parse_int(const std::string& name, const std::string& text, bool allow_suffix) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used, 10);
  } catch (const std::exception&) {
    usage_error("--" + name + " expects an integer, got '" + text + "'");
  }
  std::string suffix = text.substr(used);
  long long scale = 1;
  if (allow_suffix && suffix.size() == 1) {
    switch (suffix[0]) {
      case 'k':
      case 'K':
        scale = 1LL << 10;
        suffix.clear();
        break;
      case 'm':
      case 'M':
        scale = 1LL << 20;
        suffix.clear();
        break;
      case 'g':
      case 'G':
        scale = 1LL << 30;
        suffix.clear();
        break;
      default:
        break;
    }
  }
  if (!suffix.empty()) usage_error("--" + name + ": cannot parse '" + text + "'");
  if (value < 0) usage_error("--" + name + " must not be negative, got '" + text + "'");
  if (value > (1LL << 40) / scale) usage_error("--" + name + " is too large: '" + text + "'");
  return value * scale;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (arg.rfind("--", 0) != 0) usage_error("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto take_value = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) usage_error("--" + name + " needs a value");
      return argv[++i];
    };
    auto take_flag = [&]() {
      if (has_value) usage_error("--" + name + " takes no value");
    };
    if (name == "backend") {
      o.backend = take_value();
    } else if (name == "collective") {
      o.collective = take_value();
    } else if (name == "min-bytes") {
      o.min_bytes = parse_int(name, take_value(), true);
    } else if (name == "max-bytes") {
      o.max_bytes = parse_int(name, take_value(), true);
    } else if (name == "step-factor") {
      o.step_factor = parse_int(name, take_value(), false);
    } else if (name == "warmup") {
      o.warmup =
          static_cast<int>(std::min<std::int64_t>(parse_int(name, take_value(), false), 1 << 30));
    } else if (name == "iters") {
      o.iters =
          static_cast<int>(std::min<std::int64_t>(parse_int(name, take_value(), false), 1 << 30));
    } else if (name == "fixed-iters") {
      take_flag();
      o.scale_iters = false;
    } else if (name == "dtype") {
      o.dtype = take_value();
    } else if (name == "threads") {
      o.threads =
          static_cast<int>(std::min<std::int64_t>(parse_int(name, take_value(), false), 1024));
    } else if (name == "verify") {
      take_flag();
      o.verify = true;
    } else {
      usage_error("unknown option '" + arg + "'");
    }
  }
  if (o.collective != "all_reduce" && o.collective != "reduce_scatter") {
    usage_error("--collective: all_reduce or reduce_scatter, got '" + o.collective + "'");
  }
  if (o.dtype != "float") usage_error("--dtype: only 'float' is supported, got '" + o.dtype + "'");
  if (o.min_bytes < static_cast<std::int64_t>(sizeof(float))) {
    usage_error("--min-bytes must be at least 4 (one float)");
  }
  if (o.max_bytes < o.min_bytes) usage_error("--max-bytes must not be below --min-bytes");
  if (o.step_factor < 2) usage_error("--step-factor must be at least 2");
  if (o.iters < 1) usage_error("--iters must be at least 1");
  if (o.threads < 1) usage_error("--threads must be at least 1");
  return o;
}

// The loop lengths for one size: the requested ones, shortened (see kBytesPerSize) for messages
// so large that a loop would move more than 1 GiB, unless --fixed-iters.
int iters_for(const Options& o, std::int64_t bytes) {
  if (!o.scale_iters) return o.iters;
  const std::int64_t fit = kBytesPerSize / bytes;
  return static_cast<int>(
      std::min<std::int64_t>(o.iters, std::max<std::int64_t>(fit, kMinScaledIters)));
}
int warmup_for(const Options& o, std::int64_t bytes) {
  if (!o.scale_iters || o.warmup == 0) return o.warmup;
  const std::int64_t fit = kBytesPerSize / bytes;
  return static_cast<int>(std::min<std::int64_t>(o.warmup, std::max<std::int64_t>(fit, 1)));
}

struct Result {
  double time_us = 0;      // mean per call, max over ranks
  std::int64_t wrong = 0;  // summed over ranks
  int iters = 0;
};

// One call of the benchmarked collective on `buffer` (all_reduce: in place; reduce_scatter: into
// `output`, 1/world of it).
void run_once(const Options& o, at::Tensor& buffer, at::Tensor& output) {
  if (o.collective == "reduce_scatter") {
    ddp::reduce_scatter_tensor(output, buffer, ddp::ReduceOp::SUM);
  } else {
    ddp::all_reduce(buffer, ddp::ReduceOp::SUM);
  }
}

Result run_size(const Options& o, std::int64_t count, int rank, int world) {
  const std::int64_t bytes = count * static_cast<std::int64_t>(sizeof(float));
  // (rank+1) + i%7: small integers, so every partial sum is exact in float whatever the order.
  const at::Tensor ramp = at::arange(count, at::kLong).remainder_(7).to(at::kFloat);
  const at::Tensor pattern = ramp + static_cast<double>(rank + 1);
  const at::Tensor expected =
      ramp * static_cast<double>(world) + static_cast<double>(world) * (world + 1) / 2.0;

  // The timed all-reduces reduce in place, so the values grow by a factor of world per call (and
  // reach inf after enough calls): their results are never looked at, only the checked call's
  // below. A reduce-scatter leaves its input as it was.
  at::Tensor buffer = pattern.clone();
  const std::int64_t part = count / world;
  at::Tensor output = at::empty({part}, at::kFloat);
  Result result;
  result.iters = iters_for(o, bytes);

  ddp::barrier();
  for (int i = 0, n = warmup_for(o, bytes); i < n; ++i) run_once(o, buffer, output);
  ddp::barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < result.iters; ++i) run_once(o, buffer, output);
  const auto stop = std::chrono::steady_clock::now();
  const double local_us =
      std::chrono::duration<double, std::micro>(stop - start).count() / result.iters;

  buffer.copy_(pattern);
  run_once(o, buffer, output);
  const std::int64_t local_wrong =
      o.collective == "reduce_scatter"
          ? output.ne(expected.narrow(0, rank * part, part)).sum().item<std::int64_t>()
          : buffer.ne(expected).sum().item<std::int64_t>();

  at::Tensor time = at::full({1}, local_us, at::kDouble);
  ddp::all_reduce(time, ddp::ReduceOp::MAX);
  at::Tensor wrong = at::full({1}, local_wrong, at::kLong);
  ddp::all_reduce(wrong, ddp::ReduceOp::SUM);
  result.time_us = time.item<double>();
  result.wrong = wrong.item<std::int64_t>();
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  torch::set_num_threads(o.threads);
  int rank = -1;
  try {
    ddp::init_process_group(ddp::InitOptions().backend(o.backend).verify_collectives(o.verify));
    rank = ddp::get_rank();
    const int world = ddp::get_world_size();
    const std::string backend = ddp::get_backend();
    if (rank == 0) {
      std::fprintf(stderr,
                   "# allreduce_bench: %s, backend %s, %d ranks, float, sum, sizes %" PRId64
                   "..%" PRId64 " B x%" PRId64
                   ", warmup %d, iters %d (%s), threads %d, "
                   "verify_collectives %s\n",
                   o.collective.c_str(), backend.c_str(), world, o.min_bytes, o.max_bytes,
                   o.step_factor, o.warmup, o.iters,
                   o.scale_iters ? "fewer where a loop would move > 1 GiB" : "fixed", o.threads,
                   o.verify ? "on" : "off");
    }
    std::int64_t total_wrong = 0;
    for (std::int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.step_factor) {
      std::int64_t count = bytes / static_cast<std::int64_t>(sizeof(float));
      // A reduce-scatter's input holds world equal parts.
      if (o.collective == "reduce_scatter")
        count = std::max<std::int64_t>(count / world, 1) * world;
      const Result r = run_size(o, count, rank, world);
      total_wrong += r.wrong;
      if (rank == 0) {
        const std::int64_t used = count * static_cast<std::int64_t>(sizeof(float));
        const double algbw = static_cast<double>(used) / (r.time_us * 1e-6) / 1e9;
        const double busbw =
            algbw * (o.collective == "reduce_scatter" ? 1.0 : 2.0) * (world - 1) / world;
        std::printf(
            "{\"collective\": \"%s\", \"backend\": \"%s\", \"world_size\": %d, \"bytes\": %" PRId64
            ", \"time_us\": %.2f, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, "
            "\"wrong\": %" PRId64 ", \"iters\": %d}\n",
            o.collective.c_str(), backend.c_str(), world, used, r.time_us, algbw, busbw, r.wrong,
            r.iters);
        std::fflush(stdout);
      }
      if (bytes > o.max_bytes / o.step_factor) break;  // the next step would overflow or exceed
    }
    ddp::destroy_process_group();
    if (total_wrong != 0) {
      if (rank == 0) {
        std::fprintf(stderr, "allreduce_bench: FAILED: %" PRId64 " wrong elements\n", total_wrong);
      }
      return 1;
    }
    return 0;
  } catch (const std::exception& error) {
    // The library's messages name the rank already.
    std::fprintf(stderr, "allreduce_bench: %s\n", error.what());
    try {
      ddp::destroy_process_group();
    } catch (const std::exception&) {
    }
    return 1;
  }
}
