// CollectiveCall: what every collective does before and after talking to the backend.
//
// It resolves the group (failing for a non-member), validates and stages the tensor (a contiguous
// buffer for strided tensors, a real view for complex ones, a CPU copy of a device tensor that no
// backend of the group takes on its device) and translates global src/dst ranks. The staged
// buffer is what goes to the backend, the group's first that takes the collective on it;
// unstage() copies it back into the caller's tensor. One call per collective, on the issuing
// thread; not shared between threads.
//
// It is also where the flight recorder (trace/flight_recorder.h) sees every collective: the call
// opens the group's next entry when it is made, records the first tensor it stages and the backend
// it picks, marks the entry started when the collective is handed to the backend (mark_started, or
// a Work made in its scope), and failed when an error leaves it; a call that ends cleanly without
// handing its entry to a Work marks it completed. A second call for the same group made while the
// first is being prepared on the same thread (a flat collective choosing its backend) shares the
// first's entry: one collective, one sequence number.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>

#include "common/error_context.h"
#include "ddp/process_group.h"
#include "process_group/backend.h"
#include "process_group/group_state.h"
#include "trace/flight_recorder.h"

namespace ddp::detail {

/// The operations of DDP's once-per-step fingerprint (verify_ddp_step in unverified.h).
inline constexpr const char* kDdpForwardStep = "DistributedDataParallel forward";
inline constexpr const char* kDdpBackwardStep = "DistributedDataParallel backward";
/// What uneven inputs look like and what to do: appended where a rank is seen to have left DDP's
/// loop while others are still in it.
extern const char* const kUnevenInputsAdvice;

class CollectiveCall {
 public:
  CollectiveCall(std::string operation, Collective collective, const ProcessGroup& group);
  ~CollectiveCall();
  CollectiveCall(const CollectiveCall&) = delete;
  CollectiveCall& operator=(const CollectiveCall&) = delete;

  /// Marks the flight-recorder entry started: the collective is being handed to the backend.
  void mark_started();

  const std::string& operation() const { return operation_; }
  Collective collective() const { return collective_; }
  GroupState& group() { return *group_; }
  /// The backend that carries this collective on tensors like `staged` (undefined: a barrier).
  /// Throws DistributedError when none of the group's does.
  Backend& backend(const at::Tensor& staged) const;
  /// How long waiting for this call's work polls its completion: the group's timeout where a
  /// backend chosen for it completes on a device (NCCL), else 0 (its wait() is the completion).
  std::chrono::milliseconds completion_poll_limit() const;

  /// The group rank of global rank `rank`, given as argument `what` ("src", "dst").
  int group_rank_of(int rank, const char* what) const;

  /// A dense tensor the backend can work on in place, sharing memory with `tensor` when possible:
  /// contiguous, complex numbers as pairs of reals, and on the CPU where no backend of the group
  /// takes the collective on `tensor`'s device but one takes it on the CPU.
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
  /// The same, said by dtype (Undefined where there is no tensor) and element count.
  void verify_matching_fingerprint(c10::ScalarType dtype, int64_t elements, int root = -1,
                                   int reduce_op = -1);

  /// Throws Error (an InvalidArgumentError by default: most checks here are of the caller's
  /// arguments) for this operation.
  template <typename Error = InvalidArgumentError>
  [[noreturn]] void fail(const std::string& cause) const {
    detail::fail<Error>(operation_, cause);
  }

 private:
  Backend& backend_for(Collective collective, const at::Tensor& staged) const;

  void record_tensor(const at::Tensor& tensor) const;
  void record_backend(const Backend& backend) const;

  std::string operation_;
  mutable bool completes_on_device_ = false;  // set by backend_for
  Collective collective_;
  std::shared_ptr<GroupState> group_;
  // The flight recorder's entry: own_trace_ where this call opened it (and ends it), else an
  // enclosing call's; null when the group records nothing.
  mutable TraceSlot own_trace_;
  TraceSlot* trace_ = nullptr;
  mutable bool tensor_recorded_ = false;
  mutable bool backend_recorded_ = false;
  int uncaught_at_start_ = 0;
  std::optional<ActiveTraceScope> active_;
};

/// The user's handle to `work`, the backend's work for `call`: its wait polls completion as long
/// as the call's completion_poll_limit(), its errors name the call's operation, and `on_success`
/// (may be null: nothing to copy back) runs once the work has completed.
Work make_work(CollectiveCall& call, c10::intrusive_ptr<c10d::Work> work,
               std::function<void()> on_success);

}  // namespace ddp::detail
