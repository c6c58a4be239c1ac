// CollectiveCall: what every collective does before and after talking to the backend.
//
// It resolves the group (failing for a non-member), validates and stages the tensor (a contiguous
// buffer for strided tensors, a real view for complex ones) and translates global src/dst ranks.
// The staged buffer is what goes to the backend; finish() copies it back into the caller's tensor.
// One call per collective, on the issuing thread; not shared between threads.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "ddp/process_group.h"
#include "process_group/group_state.h"

namespace ddp::detail {

class CollectiveCall {
 public:
  CollectiveCall(std::string operation, const ProcessGroup& group);

  const std::string& operation() const { return operation_; }
  GroupState& group() { return *group_; }
  c10d::ProcessGroup& backend() { return *group_->backend; }

  /// The group rank of global rank `rank`, given as argument `what` ("src", "dst").
  int group_rank_of(int rank, const char* what) const;

  /// A dense tensor the backend can work on in place, sharing memory with `tensor` when possible.
  at::Tensor stage(const at::Tensor& tensor, const char* what = "tensor") const;
  /// Copies `staged` back into `tensor` when stage() had to copy.
  static void unstage(at::Tensor& tensor, const at::Tensor& staged);

  /// Checks that `tensor` matches `like` in dtype and shape (tensor lists of gather, scatter...).
  void check_same_shape(const at::Tensor& tensor, const at::Tensor& like,
                        const std::string& what) const;

  /// When the group verifies collectives (InitOptions().verify_collectives), checks that every
  /// member is making the same call: this operation, on a tensor of the same dtype and element
  /// count, with the same root and reduction. Throws the same error on every rank otherwise.
  /// `tensor` may be undefined (barrier); `root` and `reduce_op` are -1 where they do not apply.
  void verify_matching_call(const at::Tensor& tensor, int root = -1, int reduce_op = -1);

  [[noreturn]] void fail(const std::string& cause) const;

 private:
  std::string operation_;
  std::shared_ptr<GroupState> group_;
};

}  // namespace ddp::detail
