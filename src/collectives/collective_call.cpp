#include "collectives/collective_call.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <iterator>

#include "common/error_context.h"
#include "process_group/work_state.h"
#include "trace/flight_recorder.h"

namespace ddp::detail {

CollectiveCall::CollectiveCall(std::string operation, Collective collective,
                               const ProcessGroup& group)
    : operation_(std::move(operation)), collective_(collective), group_(group.state()) {
  if (!group_->is_member()) {
    fail("this rank is not a member of group '" + group_->name + "' (ranks " +
         join_ints(group_->global_ranks) + "); only members may call its collectives");
  }
  FlightRecorder* recorder = group_->recorder.get();
  if (!recorder) return;
  // DDP's step check exchanges nothing where the group does not verify: no entry for it.
  if (collective_ == Collective::kAllGather && !group_->verify_collectives &&
      (operation_ == kDdpForwardStep || operation_ == kDdpBackwardStep)) {
    return;
  }
  TraceSlot* enclosing = ActiveTraceScope::current();
  if (enclosing && enclosing->recorder == recorder && !enclosing->handed_to_work) {
    trace_ = enclosing;  // the same collective, its backend being chosen
    return;
  }
  own_trace_.recorder = recorder;
  own_trace_.sequence = own_trace_.recorder->open(operation_, TraceLabel::current());
  trace_ = &own_trace_;
  uncaught_at_start_ = std::uncaught_exceptions();
  active_.emplace(&own_trace_);
}

CollectiveCall::~CollectiveCall() {
  if (trace_ != &own_trace_) return;
  active_.reset();
  if (std::uncaught_exceptions() > uncaught_at_start_) {
    // Its kind is known where a TimeoutError, PeerLostError or MismatchError was raised
    // (note_failure); any other leaves it "other".
    own_trace_.recorder->mark_failed(own_trace_, TraceFailure::kOther);
  } else if (!own_trace_.handed_to_work) {
    own_trace_.recorder->mark_completed(own_trace_);
  }
}

Work make_work(CollectiveCall& call, c10::intrusive_ptr<c10d::Work> work,
               std::function<void()> on_success) {
  auto state =
      std::make_shared<WorkState>(std::move(work), call.operation(), std::move(on_success));
  state->poll_limit = call.completion_poll_limit();
  return Work(std::move(state));
}

void CollectiveCall::mark_started() {
  if (trace_) trace_->recorder->mark_started(*trace_);
}

void CollectiveCall::record_tensor(const at::Tensor& tensor) const {
  if (!trace_ || tensor_recorded_ || !tensor.defined()) return;
  tensor_recorded_ = true;
  trace_->changed = true;
  TraceTensor& described = trace_->tensor;
  described.dtype = static_cast<int8_t>(tensor.scalar_type());
  described.numel = tensor.numel();
  described.dims = static_cast<int8_t>(std::min<int64_t>(tensor.dim(), TraceTensor::kMaxDims));
  for (int i = 0; i < described.dims; ++i) described.sizes[i] = tensor.size(i);
}

void CollectiveCall::record_backend(const Backend& backend) const {
  if (!trace_ || backend_recorded_) return;
  backend_recorded_ = true;
  trace_->backend = backend.lasting_name();
  trace_->changed = true;
}

int CollectiveCall::group_rank_of(int rank, const char* what) const {
  int group_rank = group_->to_group_rank(rank);
  if (group_rank < 0) {
    fail(std::string(what) + "=" + std::to_string(rank) + " is not a member of group '" +
         group_->name + "' (global ranks " + join_ints(group_->global_ranks) +
         "); src and dst are global ranks");
  }
  return group_rank;
}

at::Tensor CollectiveCall::stage(const at::Tensor& tensor, const char* what) const {
  if (!tensor.defined()) fail(std::string(what) + " is an undefined tensor");
  record_tensor(tensor);
  if (tensor.layout() != c10::kStrided) {
    fail(std::string(what) + " has layout " + c10::str(tensor.layout()) +
         "; only dense tensors are supported (call .to_dense())");
  }
  at::Tensor staged = tensor.is_contiguous() ? tensor : tensor.contiguous();
  // Complex tensors travel as pairs of reals, as in torch.distributed.
  if (staged.is_complex()) staged = at::view_as_real(staged);
  // A device tensor that no backend takes where it is (a CUDA tensor in a group without NCCL)
  // goes through the host, as gloo's own CUDA support does.
  if (!staged.device().is_cpu() && !group_->backend_for(collective_, staged)) {
    at::Tensor on_host = staged.to(c10::kCPU);
    if (group_->backend_for(collective_, on_host)) return on_host;
  }
  return staged;
}

Backend& CollectiveCall::backend(const at::Tensor& staged) const {
  return backend_for(collective_, staged);
}

std::chrono::milliseconds CollectiveCall::completion_poll_limit() const {
  return completes_on_device_ ? group_->timeout : std::chrono::milliseconds(0);
}

Backend& CollectiveCall::backend_for(Collective collective, const at::Tensor& staged) const {
  if (Backend* chosen = group_->backend_for(collective, staged)) {
    completes_on_device_ = completes_on_device_ || chosen->completes_on_device();
    record_tensor(staged);
    record_backend(*chosen);
    return *chosen;
  }
  std::string names;
  for (const auto& backend : group_->backends) {
    names += (names.empty() ? "" : ", ") + backend->name();
  }
  fail("no backend of group '" + group_->name + "' (" + names + ") carries it on " +
       (staged.defined() ? c10::str(staged.device(), " tensors of dtype ", staged.scalar_type())
                         : std::string("this group")) +
       "; move the tensor to the CPU, or create the group with a backend for its device "
       "(\"nccl\" for CUDA tensors)");
}

void CollectiveCall::unstage(at::Tensor& tensor, const at::Tensor& staged) {
  at::Tensor result = tensor.is_complex() ? at::view_as_complex(staged) : staged;
  if (!result.is_same(tensor)) tensor.copy_(result);
}

void CollectiveCall::check_same_shape(const at::Tensor& tensor, const at::Tensor& like,
                                      const std::string& what) const {
  if (!tensor.defined()) fail(what + " is an undefined tensor");
  if (tensor.scalar_type() != like.scalar_type()) {
    fail(what + " has dtype " + std::string(c10::toString(tensor.scalar_type())) +
         " but the output has dtype " + c10::toString(like.scalar_type()) +
         "; all tensors of one call must share a dtype");
  }
  if (tensor.sizes() != like.sizes()) {
    fail(what + " has shape " + c10::str(tensor.sizes()) + " but the output has shape " +
         c10::str(like.sizes()) + "; they must match");
  }
}

namespace {

// Collectives by number, for the fingerprint; the index is what travels. DDP's own steps have
// their numbers too, so that a rank that left DDP's loop early is told apart from a wrong call.
const char* const kOperations[] = {"?",
                                   "all_reduce",
                                   "broadcast",
                                   "reduce",
                                   "all_gather",
                                   "gather",
                                   "scatter",
                                   "barrier",
                                   "reduce_scatter",
                                   kDdpForwardStep,
                                   kDdpBackwardStep,
                                   "all_gather_into_tensor",
                                   "reduce_scatter_tensor"};

int64_t operation_number(const std::string& operation) {
  for (int64_t i = 1; i < static_cast<int64_t>(std::size(kOperations)); ++i) {
    if (operation == kOperations[i]) return i;
  }
  return 0;
}

bool is_ddp_step(int64_t number) {
  return number == operation_number(kDdpForwardStep) ||
         number == operation_number(kDdpBackwardStep);
}

std::string describe_call(const int64_t* print) {
  const int64_t number = print[0] < static_cast<int64_t>(std::size(kOperations)) ? print[0] : 0;
  std::string text = kOperations[number];
  if (number == operation_number(kDdpForwardStep)) {
    text = "DistributedDataParallel's buffer broadcast (forward)";
  } else if (number == operation_number(kDdpBackwardStep)) {
    text = "DistributedDataParallel's gradient all-reduce (backward)";
  }
  if (print[1] >= 0) {
    text += " of " + std::to_string(print[2]) + " " +
            c10::toString(static_cast<c10::ScalarType>(print[1])) + " elements";
  }
  if (print[3] >= 0) text += ", root " + std::to_string(print[3]);
  if (print[4] >= 0) text += std::string(", op ") + to_string(static_cast<ReduceOp>(print[4]));
  return text;
}

}  // namespace

const char* const kUnevenInputsAdvice =
    "Give every rank the same number of batches "
    "(ddp::DistributedSampler does, with drop_last), or wrap the training loop in ddp::Join, "
    "whose finish() lets the ranks that are done shadow the collectives of those still training.";

void CollectiveCall::verify_matching_call(const at::Tensor& tensor, int root, int reduce_op) {
  verify_matching_fingerprint(tensor.defined() ? tensor.scalar_type() : c10::ScalarType::Undefined,
                              tensor.defined() ? tensor.numel() : 0, root, reduce_op);
}

void CollectiveCall::verify_matching_fingerprint(c10::ScalarType dtype, int64_t elements,
                                                 int root, int reduce_op) {
  if (trace_ && !tensor_recorded_) {  // DDP's step: what it is about to reduce or broadcast
    tensor_recorded_ = true;
    if (dtype != c10::ScalarType::Undefined) {
      trace_->changed = true;
      trace_->tensor.dtype = static_cast<int8_t>(dtype);
      trace_->tensor.numel = elements;
      trace_->tensor.dims = 1;
      trace_->tensor.sizes[0] = elements;
    }
  }
  if (!group_->verify_collectives || group_->size() == 1) return;
  // A rank that waits here for the others has its entry described in a dump (SIGUSR1).
  if (trace_) trace_->recorder->describe(*trace_);
  constexpr int kFields = 5;
  auto mine = at::empty({kFields}, at::kLong);
  auto* print = mine.data_ptr<int64_t>();
  print[0] = operation_number(operation_);
  print[1] = dtype != c10::ScalarType::Undefined ? static_cast<int64_t>(dtype) : -1;
  print[2] = elements;
  print[3] = root;
  print[4] = reduce_op;
  // The flat all-gather where a backend takes it natively: across hosts the hierarchy's, whose
  // failures name a lost host with its ranks (gloo's all-gather of lists would only name a rank).
  at::Tensor all = at::empty({group_->size() * kFields}, at::kLong);
  Backend* flat = group_->backend_for(Collective::kAllGatherIntoTensor, mine);
  Backend& backend = flat ? *flat : backend_for(Collective::kAllGather, mine);
  try {
    wait_for_backend_work(*backend.all_gather_into_tensor(all, mine, Launch::kWaitNow),
                          completion_poll_limit());
  } catch (const std::exception& error) {
    rethrow_backend_failure(operation_, error);
  }
  const int64_t* first = all.data_ptr<int64_t>();
  for (int i = 1; i < group_->size(); ++i) {
    const int64_t* other = first + i * kFields;
    if (!std::equal(first, first + kFields, other)) {
      // One side in DDP's step and the other elsewhere: a rank left the training loop early.
      const bool uneven = is_ddp_step(first[0]) != is_ddp_step(other[0]);
      fail<MismatchError>(
          "the ranks are not making the same call: rank " +
          std::to_string(group_->global_ranks[0]) + " calls " + describe_call(first) +
          ", but rank " + std::to_string(group_->global_ranks[i]) + " calls " +
          describe_call(other) + ". " +
          (uneven ? std::string("This is what uneven inputs look like: a rank ran out of batches "
                                "and went on while the others were still training. ") +
                        kUnevenInputsAdvice
                  : std::string("Every rank of a group must issue the same collectives, in the "
                                "same order, on tensors of the same size and dtype.")));
    }
  }
}

}  // namespace ddp::detail
