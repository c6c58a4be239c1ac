// Backend: the one interface between the layers above src/process_group/ and a transport.
//
// Every transport implements it: gloo (c10d's ProcessGroupGloo, any host), shm (the ranks of one
// host, through shared memory), hierarchical (shm inside each host, gloo between one leader per
// host) and NCCL (CUDA tensors, on CUDA builds of libtorch). A group holds an ordered list of
// backends (group_state.h) and gives each call to the first that takes it (takes()): CUDA tensors
// to NCCL, dense CPU tensors to shm, everything else to gloo. The collectives and the reducer
// never name a backend; they ask what the group can do (takes(), averages_natively()) and call
// it through this interface. The interface is ours, not c10d's, so that libtorch's own (a
// c10d::ProcessGroup in 1.13, a c10d::Backend behind a dispatching front in 2.x) can change
// without reaching above this layer.
//
// Every call is asynchronous: it returns a c10d::Work that completes when the tensors hold the
// result. Tensors are dense and contiguous (the caller stages them), of the device the backend
// said it takes. Ranks are group ranks. Thread-safety: as c10d's process groups; calls may come
// from several threads, and each backend runs its own calls in the order they were issued.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace ddp::detail {

using BackendWork = c10::intrusive_ptr<c10d::Work>;
using RedOp = c10d::ReduceOp::RedOpType;

/// How the caller of a collective will wait for it.
enum class Launch : uint8_t {
  /// The caller goes on (an async collective, a DDP bucket): the op must progress on its own.
  kAsync,
  /// The caller waits for it at once (a synchronous collective): a backend that runs its ops on a
  /// thread of its own may run this one on the caller's thread instead. Waking a thread costs
  /// tens of microseconds on a machine whose cores are all busy with ranks, more than a small
  /// collective.
  kWaitNow,
};

/// The calls of the interface, for takes().
enum class Collective : uint8_t {
  kAllReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,  // natively: each rank reduces only its own part
  kBarrier,
  kReduce,
  kGather,
  kScatter,
  kSendRecv,
  kAllReduceLists,  // lists reduced where they are, PREMUL_SUM with a factor (DDP's buckets)
  kAllReduceNarrowBetweenHosts,  // an average whose bytes between hosts travel narrower
  kAllGatherIntoTensor,  // the flat all-gather natively (NCCL; hierarchical: each host's bytes
                         // cross once); where no backend takes it, the flat call goes to the
                         // one that takes kAllGather
};

class Backend {
 public:
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  /// "gloo", "shm", "hierarchical", "nccl": what get_backend() and messages say.
  virtual std::string name() const = 0;
  /// name() as a string that lives as long as the process, looked up once: what the flight
  /// recorder writes into every entry without building a string per collective.
  const char* lasting_name() const;
  /// True when this backend carries `collective` on tensors like `like` (its device, dtype and
  /// layout; undefined for a barrier). The group asks its backends in order.
  virtual bool takes(Collective collective, const at::Tensor& like) const = 0;
  /// True when ReduceOp AVG runs in the backend itself; otherwise the layer above sums and
  /// divides.
  virtual bool averages_natively() const { return false; }
  /// True when the works it returns complete on a device: their wait() only makes the caller's
  /// stream wait (NCCL), so completion and failure are learned by polling them (work.cpp).
  virtual bool completes_on_device() const { return false; }
  /// True when this backend reduces tensors of `dtype` (gloo has no bfloat16: DDP's bf16 hook
  /// then moves the bytes and sums them itself).
  virtual bool reduces(c10::ScalarType dtype) const {
    (void)dtype;
    return true;
  }

  // The calls. Each backend overrides those it takes (takes() says which): the group never gives
  // a backend a call it does not take, and the defaults say so, as a bug, if it ever did.
  virtual BackendWork all_reduce(at::Tensor& tensor, RedOp op, Launch launch);
  virtual BackendWork broadcast(at::Tensor& tensor, int root, Launch launch);
  /// outputs[r] receives group rank r's input; one per group rank, each like input.
  virtual BackendWork all_gather(std::vector<at::Tensor>& outputs, at::Tensor& input,
                                 Launch launch);
  virtual BackendWork barrier(Launch launch);
  /// output = op over ranks of inputs[this rank] (kReduceScatter: natively).
  virtual BackendWork reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& inputs, RedOp op,
                                     Launch launch);
  /// The flat forms (all_gather_into_tensor, reduce_scatter_tensor): `output` (all_gather) or
  /// `input` (reduce_scatter) holds group size runs of the other's element count, in group-rank
  /// order. The defaults hand views of those runs to all_gather and reduce_scatter (no copy where
  /// the backend writes into its outputs in place, as shm does); NCCL overrides them with c10d's
  /// flat calls. Taken where kAllGather and kReduceScatter are.
  virtual BackendWork all_gather_into_tensor(at::Tensor& output, at::Tensor& input, Launch launch);
  virtual BackendWork reduce_scatter_tensor(at::Tensor& output, at::Tensor& input, RedOp op,
                                            Launch launch);
  virtual BackendWork reduce(at::Tensor& tensor, int root, RedOp op);
  /// outputs: one per group rank on the root, empty elsewhere.
  virtual BackendWork gather(std::vector<at::Tensor>& outputs, at::Tensor& input, int root);
  /// inputs: one per group rank on the root, empty elsewhere.
  virtual BackendWork scatter(at::Tensor& output, std::vector<at::Tensor>& inputs, int root);
  virtual BackendWork send(at::Tensor& tensor, int peer, int tag);
  virtual BackendWork recv(at::Tensor& tensor, int peer, int tag);
  /// outputs[i] = the sum over ranks of inputs[i] * factor (PREMUL_SUM: each product rounded,
  /// summed in rank order) or op over ranks of inputs[i], the lists reduced as one run of
  /// elements. The inputs are only read, and only while the op runs; outputs[i] may be inputs[i].
  virtual BackendWork all_reduce_lists(std::vector<at::Tensor> inputs,
                                       std::vector<at::Tensor> outputs, RedOp op, double factor,
                                       Launch launch);
  /// tensor (floating point) becomes the average over ranks, computed as: each host sums its
  /// ranks' tensors in full precision and divides by `divisor`; that is rounded to `wire`
  /// (float16 or bfloat16) to cross to the other hosts; the hosts' parts are added up in the
  /// tensor's dtype, in host order, identically on every rank. Only what crosses a network is
  /// narrowed: on one host it is the plain sum divided by `divisor`.
  virtual BackendWork all_reduce_narrow_between_hosts(at::Tensor& tensor, c10::ScalarType wire,
                                                      int64_t divisor, Launch launch);

  /// torch.distributed's handshake after a group is made: rank 0 publishes the collective
  /// sequence number through the store, and Python ranks of the job wait for it.
  virtual void set_sequence_number_for_group() {}

 protected:
  Backend() = default;

 private:
  /// A call the backend does not take: a bug above this layer.
  [[noreturn]] void not_taken(const char* call) const;

  mutable std::atomic<const char*> lasting_name_{nullptr};  // lasting_name(), once looked up
};

}  // namespace ddp::detail
