// comm_hooks::powerSGD (include/ddp/powersgd_hook.h): PyTorch's powerSGD_hook, step for step.
//
// Where the collectives run. A hook is called during backward, bucket by bucket in the same order
// on every rank; the Work it returns is waited for by DDP at the end of backward, again in bucket
// order, on one thread (Reducer::finalize_backward). So the hook starts the all-reduces of the
// uncompressed gradients and of P at once, and the continuation, which runs inside that wait,
// starts Q's all-reduce after P's: every rank issues uncompressed_0, P_0, uncompressed_1, P_1,
// ..., then Q_0, Q_1, ... in that order. (PyTorch starts P's all-reduce only once the
// uncompressed one is done; the sums are the same, ours overlaps a little more.)
#include "ddp/powersgd_hook.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <memory>
#include <unordered_map>
#include <utility>

#include "collectives/unverified.h"
#include "common/error_context.h"
#include "reducer/numpy_random_state.h"
#include "reducer/orthogonalize.h"

namespace ddp::comm_hooks {
namespace {

constexpr const char* kOperation = "comm_hooks::powerSGD";
// PyTorch seeds each random initialization of a bucket's Qs with rng.randint(1_000_000_000).
constexpr uint64_t kSeedRange = 1'000'000'000;

struct PowerSGDState {
  explicit PowerSGDState(const PowerSGDOptions& options)
      : options(options), rng(static_cast<uint32_t>(options.random_seed())) {}

  const PowerSGDOptions options;
  detail::NumpyRandomState rng;
  int64_t iteration = 0;  // counted at the last bucket, as PyTorch's state.iter
  bool checked_kernels = false;
  // By bucket index.
  std::unordered_map<size_t, at::Tensor> errors;      // use_error_feedback
  std::unordered_map<size_t, at::Tensor> p_memories;  // warm_start
  std::unordered_map<size_t, at::Tensor> q_memories;  // warm_start
};

// A gradient that is compressed: its matrix [1, n, m] (a view into the bucket), P [1, n, r] and
// Q [1, m, r] (views into the bucket's P and Q memories).
struct LowRank {
  at::Tensor matrix;
  at::Tensor p;
  at::Tensor q;
};

// How a bucket's gradients split, in PyTorch's order: the compressed matrices grouped by shape
// (shapes in first-seen order), which is also the layout of the P and Q memories.
struct Split {
  std::vector<at::Tensor> uncompressed;  // views into the bucket, in bucket order
  std::vector<at::Tensor> matrices;      // [1, n, m] views into the bucket
  int64_t p_numel = 0;
  int64_t q_numel = 0;
};

int64_t rank_for(int64_t n, int64_t m, int64_t rank) { return std::min({n, m, rank}); }

Split split(const GradBucket& bucket, const PowerSGDOptions& options) {
  Split result;
  std::vector<std::pair<int64_t, int64_t>> shapes;  // first-seen order
  std::map<std::pair<int64_t, int64_t>, std::vector<at::Tensor>> by_shape;
  for (const at::Tensor& gradient : bucket.gradients()) {
    // A scalar or an empty gradient has no matrix view (PyTorch's hook fails on them).
    if (gradient.dim() == 0 || gradient.numel() == 0) {
      result.uncompressed.push_back(gradient);
      continue;
    }
    const at::Tensor matrix = gradient.view({gradient.size(0), -1});
    const int64_t n = matrix.size(0), m = matrix.size(1);
    const int64_t r = rank_for(n, m, options.matrix_approximation_rank());
    // PyTorch's _should_compress.
    if (static_cast<double>((n + m) * r) * options.min_compression_rate() <
        static_cast<double>(n * m)) {
      auto [it, inserted] = by_shape.try_emplace({n, m});
      if (inserted) shapes.push_back({n, m});
      it->second.push_back(matrix.unsqueeze(0));
      result.p_numel += n * r;
      result.q_numel += m * r;
    } else {
      result.uncompressed.push_back(gradient);
    }
  }
  for (const auto& shape : shapes) {
    for (auto& matrix : by_shape[shape]) result.matrices.push_back(std::move(matrix));
  }
  return result;
}

// P and Q views for each matrix, laid out one after the other.
std::vector<LowRank> low_rank_views(const std::vector<at::Tensor>& matrices,
                                    const at::Tensor& p_memory, const at::Tensor& q_memory,
                                    int64_t rank) {
  std::vector<LowRank> parts;
  int64_t p_offset = 0, q_offset = 0;
  for (const at::Tensor& matrix : matrices) {
    const int64_t n = matrix.size(1), m = matrix.size(2);
    const int64_t r = rank_for(n, m, rank);
    parts.push_back({matrix, p_memory.narrow(0, p_offset, n * r).view({1, n, r}),
                     q_memory.narrow(0, q_offset, m * r).view({1, m, r})});
    p_offset += n * r;
    q_offset += m * r;
  }
  return parts;
}

// PyTorch's default hook (default_hooks._allreduce_fut): divide first, then sum.
Work average(at::Tensor buffer, const ProcessGroup& group) {
  buffer.div_(group.size());
  return detail::all_reduce_async(buffer, ReduceOp::SUM, group, /*verify=*/false);
}

// Fresh Qs: torch.manual_seed(rng.randint(10^9)), then torch.randn for each Q in turn, on the CPU.
void randomize(std::vector<LowRank>& parts, PowerSGDState& state) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(
      static_cast<uint64_t>(state.rng.randint(kSeedRange)));
  for (auto& part : parts) {
    part.q.copy_(at::randn(part.q.sizes(), generator, part.q.options().device(at::kCPU)));
    detail::orthogonalize(part.q, state.options.orthogonalization_epsilon());
  }
}

Work compress_and_reduce(const std::shared_ptr<PowerSGDState>& state, const ProcessGroup& group,
                         GradBucket& bucket) {
  const PowerSGDOptions& options = state->options;
  at::Tensor input = bucket.buffer();
  const size_t index = bucket.index();
  at::Tensor input_before;  // the gradient plus the carried error, before the approximation
  if (options.use_error_feedback()) {
    auto found = state->errors.find(index);
    if (found == state->errors.end()) {
      state->errors.emplace(index, at::zeros_like(input));
    } else {
      if (found->second.numel() != input.numel()) {
        detail::fail(kOperation, "bucket " + std::to_string(index) + " holds " +
                                     std::to_string(input.numel()) +
                                     " elements, but its error feedback was recorded for " +
                                     std::to_string(found->second.numel()) +
                                     ". Register a fresh comm_hooks::powerSGD() with each "
                                     "DistributedDataParallel model.");
      }
      input.add_(found->second);
    }
    input_before = input.clone();
  }

  Split parts_of = split(bucket, options);
  std::vector<at::Tensor> flat_uncompressed;
  for (const auto& view : parts_of.uncompressed) flat_uncompressed.push_back(view.view(-1));
  at::Tensor uncompressed =
      flat_uncompressed.empty() ? at::empty({0}, input.options()) : at::cat(flat_uncompressed);

  const bool fresh = !options.warm_start() || !state->p_memories.count(index);
  at::Tensor p_memory, q_memory;
  if (fresh) {
    p_memory = at::empty({parts_of.p_numel}, input.options());
    q_memory = at::empty({parts_of.q_numel}, input.options());
    if (options.warm_start()) {
      state->p_memories[index] = p_memory;
      state->q_memories[index] = q_memory;
    }
  } else {
    p_memory = state->p_memories[index];
    q_memory = state->q_memories[index];
  }
  std::vector<LowRank> parts =
      low_rank_views(parts_of.matrices, p_memory, q_memory, options.matrix_approximation_rank());
  if (fresh) {
    randomize(parts, *state);
  } else {
    for (auto& part : parts) detail::orthogonalize(part.q, options.orthogonalization_epsilon());
  }
  for (auto& part : parts) at::bmm_out(part.p, part.matrix, part.q);  // P = M Q

  std::vector<Work> started;
  if (uncompressed.numel() > 0) {
    started.push_back(
        detail::all_reduce_async(uncompressed, ReduceOp::SUM, group, /*verify=*/false));
  }
  if (p_memory.numel() > 0) {
    started.push_back(detail::all_reduce_async(p_memory, ReduceOp::SUM, group, /*verify=*/false));
  }
  if (started.empty()) return average(input, group);  // only empty gradients: nothing to compress

  const int world_size = group.size();
  const double epsilon = options.orthogonalization_epsilon();
  auto finish = [state, group, world_size, epsilon, index, input, input_before, uncompressed,
                 views = std::move(parts_of.uncompressed), parts = std::move(parts), q_memory,
                 rest = std::vector<Work>(started.begin() + 1, started.end())]() mutable {
    for (auto& work : rest) work.wait();
    if (uncompressed.numel() > 0) {
      uncompressed.div_(world_size);
      int64_t offset = 0;
      for (auto& view : views) {
        view.copy_(uncompressed.narrow(0, offset, view.numel()).view_as(view));
        offset += view.numel();
      }
    }
    if (!parts.empty()) {
      for (auto& part : parts) detail::orthogonalize(part.p, epsilon);
      for (auto& part : parts) at::bmm_out(part.q, part.matrix.transpose(1, 2), part.p);
      // Started here, inside DDP's in-order wait: see the note at the top of this file.
      detail::all_reduce_async(q_memory, ReduceOp::SUM, group, /*verify=*/false).wait();
      q_memory.div_(world_size);
      for (auto& part : parts) at::bmm_out(part.matrix, part.p, part.q.transpose(1, 2));
    }
    if (input_before.defined()) state->errors[index] = input_before - input;
  };
  return started.front().then(std::move(finish));
}

void check_options(const PowerSGDOptions& options) {
  auto refuse = [](const std::string& cause) {
    detail::fail<InvalidArgumentError>(kOperation, cause);
  };
  if (options.matrix_approximation_rank() < 1) {
    refuse("matrix_approximation_rank must be at least 1, got " +
           std::to_string(options.matrix_approximation_rank()) +
           " (1 to 4 suits most models; higher ranks compress less)");
  }
  if ((options.use_error_feedback() || options.warm_start()) &&
      options.start_powerSGD_iter() <= 1) {
    refuse("start_powerSGD_iter must be at least 2 with use_error_feedback or warm_start, got " +
           std::to_string(options.start_powerSGD_iter()) +
           ": DDP rebuilds its buckets after the first iteration, which would not match the "
           "memories kept per bucket. Set start_powerSGD_iter(2) or more, or turn both off.");
  }
  if (!(options.min_compression_rate() >= 0)) {
    refuse("min_compression_rate must be >= 0, got " +
           std::to_string(options.min_compression_rate()));
  }
  if (!(options.orthogonalization_epsilon() >= 0)) {
    refuse("orthogonalization_epsilon must be >= 0, got " +
           std::to_string(options.orthogonalization_epsilon()) +
           " (1e-8 avoids NaN from "
           "all-zero columns)");
  }
  if (options.random_seed() < 0 || options.random_seed() > 0xFFFFFFFFLL) {
    refuse("random_seed must be between 0 and 2^32 - 1 (numpy's RandomState range), got " +
           std::to_string(options.random_seed()));
  }
}

}  // namespace

// Floating-point buckets whose dtype this libtorch cannot multiply on their device (float16 on
// the CPU in 1.13) are refused at the first compressed bucket, naming the dtype, rather than
// failing deep inside a matrix product.
void check_matrix_product(const at::Tensor& buffer) {
  const at::Tensor one = at::ones({1, 1, 1}, buffer.options());
  try {
    at::bmm(one, one);
  } catch (const c10::Error&) {
    detail::fail<InvalidArgumentError>(
        kOperation, std::string("this libtorch has no ") + c10::toString(buffer.scalar_type()) +
                        " matrix product on " + buffer.device().str() +
                        ", which PowerSGD needs. Train in float32 there, or use "
                        "comm_hooks::fp16_compress() to halve the bytes instead.");
  }
}

CommHook powerSGD(PowerSGDOptions options) {
  check_options(options);
  auto state = std::make_shared<PowerSGDState>(options);
  return [state](const ProcessGroup& group, GradBucket& bucket) {
    const auto dtype = bucket.buffer().scalar_type();
    if (!at::isFloatingType(dtype)) {
      detail::fail<InvalidArgumentError>(
          kOperation, "bucket " + std::to_string(bucket.index()) + " holds " +
                          std::string(c10::toString(dtype)) +
                          " gradients; PowerSGD approximates floating-point gradients only. "
                          "Use comm_hooks::allreduce() for this model.");
    }
    const bool compress = state->iteration >= state->options.start_powerSGD_iter();
    if (bucket.is_last()) ++state->iteration;
    if (compress && !state->checked_kernels) {
      check_matrix_product(bucket.buffer());
      state->checked_kernels = true;
    }
    return compress ? compress_and_reduce(state, group, bucket) : average(bucket.buffer(), group);
  };
}

}  // namespace ddp::comm_hooks
