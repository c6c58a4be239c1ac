// C10dBackend: one of c10d's own process groups (ProcessGroupGloo, ProcessGroupNCCL) behind our
// Backend interface.
//
// c10d's class is a c10d::ProcessGroup in libtorch 1.13 and a c10d::Backend in 2.x
// (compat::C10dBackendPtr); both take the same calls, which this adapter makes with c10d's option
// structs. What the wrapped group carries is fixed at construction (C10dTraits): gloo takes CPU
// tensors and every collective but the native reduce-scatter; NCCL takes the tensors of its CUDA
// device, reduce-scatters and averages natively, runs barriers on its GPU, and completes on the
// device (its wait only orders the caller's stream).
// Thread-safety: that of the wrapped group.
#pragma once

#include <c10/core/DeviceType.h>

#include "compat/libtorch_compat.h"
#include "process_group/backend.h"

namespace ddp::detail {

struct C10dTraits {
  std::string name;                               // "gloo", "nccl"
  c10::DeviceType device = c10::DeviceType::CPU;  // the tensors it takes
  bool reduce_scatters = false;                   // natively
  bool averages = false;                          // ReduceOp AVG natively
  bool barrier = true;                            // takes barriers
  int barrier_device = -1;                        // the GPU a barrier runs on (NCCL), -1: none
  bool completes_on_device = false;               // Backend::completes_on_device
  bool bfloat16 = true;                           // reduces bfloat16
  bool flat_calls = false;  // c10d's _allgather_base/_reduce_scatter_base (NCCL; gloo lacks them)
};

class C10dBackend : public Backend {
 public:
  C10dBackend(compat::C10dBackendPtr group, C10dTraits traits)
      : group_(std::move(group)), traits_(std::move(traits)) {}

  std::string name() const override { return traits_.name; }
  bool takes(Collective collective, const at::Tensor& like) const override;
  bool averages_natively() const override { return traits_.averages; }
  bool completes_on_device() const override { return traits_.completes_on_device; }
  bool reduces(c10::ScalarType dtype) const override {
    return dtype != c10::kBFloat16 || traits_.bfloat16;
  }

  BackendWork all_reduce(at::Tensor& tensor, RedOp op, Launch launch) override;
  BackendWork broadcast(at::Tensor& tensor, int root, Launch launch) override;
  BackendWork all_gather(std::vector<at::Tensor>& outputs, at::Tensor& input,
                         Launch launch) override;
  BackendWork barrier(Launch launch) override;
  BackendWork reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& inputs, RedOp op,
                             Launch launch) override;
  BackendWork all_gather_into_tensor(at::Tensor& output, at::Tensor& input, Launch launch) override;
  BackendWork reduce_scatter_tensor(at::Tensor& output, at::Tensor& input, RedOp op,
                                    Launch launch) override;
  BackendWork reduce(at::Tensor& tensor, int root, RedOp op) override;
  BackendWork gather(std::vector<at::Tensor>& outputs, at::Tensor& input, int root) override;
  BackendWork scatter(at::Tensor& output, std::vector<at::Tensor>& inputs, int root) override;
  BackendWork send(at::Tensor& tensor, int peer, int tag) override;
  BackendWork recv(at::Tensor& tensor, int peer, int tag) override;
  void set_sequence_number_for_group() override {
    if (compat::kGroupsAgreeOnSequenceNumbers) group_->setSequenceNumberForGroup();
  }

  /// The wrapped group, for what only c10d's interface offers (a hierarchy's leaders' store).
  const compat::C10dBackendPtr& c10d_group() const { return group_; }

 private:
  compat::C10dBackendPtr group_;
  C10dTraits traits_;
};

}  // namespace ddp::detail
