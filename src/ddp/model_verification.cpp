#include "ddp/model_verification.h"

#include <ATen/ATen.h>

#include <cstring>
#include <functional>
#include <map>

#include "collectives/unverified.h"
#include "common/error_context.h"
#include "ddp/collectives.h"

namespace ddp::detail {
namespace {

constexpr const char* kVerification = "DistributedDataParallel";

std::string describe(const std::string& kind, const std::string& name, const at::Tensor& t) {
  return kind + " '" + name + "' " + c10::toString(t.scalar_type()) + " " + c10::str(t.sizes());
}

int64_t fingerprint(const std::string& description) {
  return static_cast<int64_t>(std::hash<std::string>{}(description));
}

// Every rank contributes a string; returns them all, in group-rank order.
std::vector<std::string> all_gather_strings(const std::string& mine, const ProcessGroup& group) {
  constexpr int64_t kBytes = 512;
  auto buffer = at::zeros({kBytes}, at::kByte);
  std::memcpy(buffer.data_ptr<uint8_t>(), mine.data(), std::min<size_t>(mine.size(), kBytes - 1));
  std::vector<std::string> all;
  for (const auto& part : all_gather(buffer, group)) {
    all.emplace_back(reinterpret_cast<const char*>(part.data_ptr<uint8_t>()));
  }
  return all;
}

}  // namespace

void verify_model_across_ranks(const NamedTensors& parameters, const NamedTensors& buffers,
                               const ProcessGroup& group) {
  std::vector<std::string> descriptions;
  for (size_t i = 0; i < parameters.tensors.size(); ++i) {
    descriptions.push_back(describe("parameter", parameters.names[i], parameters.tensors[i]));
  }
  for (size_t i = 0; i < buffers.tensors.size(); ++i) {
    descriptions.push_back(describe("buffer", buffers.names[i], buffers.tensors[i]));
  }
  const auto ranks = group.ranks();
  auto counts = at::tensor({static_cast<int64_t>(parameters.tensors.size()),
                            static_cast<int64_t>(buffers.tensors.size())});
  auto all_counts = all_gather(counts, group);
  for (size_t r = 1; r < all_counts.size(); ++r) {
    if (!at::equal(all_counts[r], all_counts[0])) {
      fail<MismatchError>(kVerification,
                          "expects the same model on every rank, but rank " +
                              std::to_string(ranks[r]) + " has " +
                              std::to_string(all_counts[r][0].item<int64_t>()) +
                              " parameters (requiring grad) and " +
                              std::to_string(all_counts[r][1].item<int64_t>()) +
                              " buffers, while rank " + std::to_string(ranks[0]) + " has " +
                              std::to_string(all_counts[0][0].item<int64_t>()) + " and " +
                              std::to_string(all_counts[0][1].item<int64_t>()));
    }
  }
  if (descriptions.empty()) return;
  auto prints = at::empty({static_cast<int64_t>(descriptions.size())}, at::kLong);
  for (size_t i = 0; i < descriptions.size(); ++i) {
    prints.data_ptr<int64_t>()[i] = fingerprint(descriptions[i]);
  }
  auto all_prints = all_gather(prints, group);
  int64_t first_difference = -1;
  for (size_t r = 1; r < all_prints.size(); ++r) {
    auto differs = at::nonzero(all_prints[r] != all_prints[0]);
    if (differs.numel() > 0) {
      int64_t index = differs[0][0].item<int64_t>();
      if (first_difference < 0 || index < first_difference) first_difference = index;
    }
  }
  // all_prints is the same on every rank, so every rank found the same index.
  if (first_difference < 0) return;
  auto sides = all_gather_strings(descriptions[first_difference], group);
  std::string detail;
  for (size_t r = 0; r < sides.size(); ++r) {
    if (r > 0 && sides[r] == sides[0]) continue;
    detail += (detail.empty() ? "" : "; ") + std::string("rank ") + std::to_string(ranks[r]) +
              " has " + sides[r];
  }
  fail<MismatchError>(kVerification,
                      "expects the same model on every rank, but tensor " +
                          std::to_string(first_difference) + " differs: " + detail +
                          ". Build the same model on every rank (same layers, same order).");
}

void broadcast_coalesced(const std::vector<at::Tensor>& tensors, const ProcessGroup& group,
                         int src) {
  constexpr int64_t kBucketBytes = 250ll << 20;
  c10::NoGradGuard no_grad;
  std::map<c10::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, members] : by_dtype) {
    size_t begin = 0;
    while (begin < members.size()) {
      size_t end = begin;
      int64_t bytes = 0;
      std::vector<at::Tensor> flat;
      while (end < members.size() && (end == begin || bytes < kBucketBytes)) {
        bytes += members[end].numel() * members[end].element_size();
        flat.push_back(members[end].reshape(-1));
        ++end;
      }
      at::Tensor buffer = at::cat(flat);
      broadcast_async(buffer, src, group, /*verify=*/false, Launch::kWaitNow).wait();
      int64_t offset = 0;
      for (size_t i = begin; i < end; ++i) {
        members[i].copy_(buffer.narrow(0, offset, members[i].numel()).view_as(members[i]));
        offset += members[i].numel();
      }
      begin = end;
    }
  }
}

}  // namespace ddp::detail
