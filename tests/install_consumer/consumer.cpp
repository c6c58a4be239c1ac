// Written against the public API only: every rank contributes its rank + 1.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <iostream>

int main() {
  ddp::init_process_group();
  const int rank = ddp::get_rank();
  const int world = ddp::get_world_size();
  auto t = torch::full({4}, rank + 1.0);
  ddp::all_reduce(t);
  const float expected = world * (world + 1) / 2.0f;
  torch::nn::Sequential net(torch::nn::Linear(4, 2));
  ddp::DistributedDataParallel model(net);
  model(torch::ones({3, 4})).sum().backward();
  ddp::destroy_process_group();
  if (t[0].item<float>() != expected) {
    std::cerr << "rank " << rank << ": wrong sum " << t[0].item<float>() << "\n";
    return 1;
  }
  if (rank == 0) std::cout << "consumer: OK on " << world << " ranks\n";
  return 0;
}
