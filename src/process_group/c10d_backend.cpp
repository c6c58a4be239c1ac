#include "process_group/c10d_backend.h"

namespace ddp::detail {

bool C10dBackend::takes(Collective collective, const at::Tensor& like) const {
  switch (collective) {
    case Collective::kBarrier:
      return traits_.barrier;
    case Collective::kReduceScatter:
      if (!traits_.reduce_scatters) return false;
      break;
    case Collective::kAllGatherIntoTensor:
      if (!traits_.flat_calls) return false;
      break;
    case Collective::kAllReduceLists:
    case Collective::kAllReduceNarrowBetweenHosts:
      return false;
    default:
      break;
  }
  return like.defined() && like.device().type() == traits_.device;
}

BackendWork C10dBackend::all_reduce(at::Tensor& tensor, RedOp op, Launch) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp(op);
  return group_->allreduce(tensors, options);
}

BackendWork C10dBackend::broadcast(at::Tensor& tensor, int root, Launch) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  return group_->broadcast(tensors, options);
}

BackendWork C10dBackend::all_gather(std::vector<at::Tensor>& outputs, at::Tensor& input, Launch) {
  std::vector<std::vector<at::Tensor>> gathered{outputs};
  std::vector<at::Tensor> inputs{input};
  return group_->allgather(gathered, inputs);
}

BackendWork C10dBackend::barrier(Launch) {
  c10d::BarrierOptions options;
  if (traits_.barrier_device >= 0) options.device_ids = {traits_.barrier_device};
  return group_->barrier(options);
}

BackendWork C10dBackend::reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& inputs,
                                        RedOp op, Launch) {
  std::vector<at::Tensor> outputs{output};
  std::vector<std::vector<at::Tensor>> sources{inputs};
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp(op);
  return group_->reduce_scatter(outputs, sources, options);
}

BackendWork C10dBackend::all_gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                Launch launch) {
  if (!traits_.flat_calls) return Backend::all_gather_into_tensor(output, input, launch);
  return group_->_allgather_base(output, input);
}

BackendWork C10dBackend::reduce_scatter_tensor(at::Tensor& output, at::Tensor& input, RedOp op,
                                               Launch launch) {
  if (!traits_.flat_calls) return Backend::reduce_scatter_tensor(output, input, op, launch);
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp(op);
  return group_->_reduce_scatter_base(output, input, options);
}

BackendWork C10dBackend::reduce(at::Tensor& tensor, int root, RedOp op) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::ReduceOptions options;
  options.rootRank = root;
  options.reduceOp = c10d::ReduceOp(op);
  return group_->reduce(tensors, options);
}

BackendWork C10dBackend::gather(std::vector<at::Tensor>& outputs, at::Tensor& input, int root) {
  std::vector<std::vector<at::Tensor>> gathered;
  if (!outputs.empty()) gathered.push_back(outputs);
  std::vector<at::Tensor> inputs{input};
  c10d::GatherOptions options;
  options.rootRank = root;
  return group_->gather(gathered, inputs, options);
}

BackendWork C10dBackend::scatter(at::Tensor& output, std::vector<at::Tensor>& inputs, int root) {
  std::vector<at::Tensor> outputs{output};
  std::vector<std::vector<at::Tensor>> sources;
  if (!inputs.empty()) sources.push_back(inputs);
  c10d::ScatterOptions options;
  options.rootRank = root;
  return group_->scatter(outputs, sources, options);
}

BackendWork C10dBackend::send(at::Tensor& tensor, int peer, int tag) {
  std::vector<at::Tensor> tensors{tensor};
  return group_->send(tensors, peer, tag);
}

BackendWork C10dBackend::recv(at::Tensor& tensor, int peer, int tag) {
  std::vector<at::Tensor> tensors{tensor};
  return group_->recv(tensors, peer, tag);
}

}  // namespace ddp::detail
