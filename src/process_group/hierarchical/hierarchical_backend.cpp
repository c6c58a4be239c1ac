#include "process_group/hierarchical/hierarchical_backend.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "common/error_context.h"
#include "process_group/shm/op_queue.h"
#include "process_group/shm/shm_backend.h"
#include "process_group/shm/shm_reduce.h"
#include "process_group/shm/shm_sync.h"

namespace ddp::detail {
namespace {

// In the leaders' store: why the first host to fail did (see run_across_hosts).
const char* const kHostFailureKey = "host_failure";
// In the leaders' store, after an exchange failed: host H's leader is still here.
std::string still_here_key(int host) { return "still_here/" + std::to_string(host); }
// How long the leaders that are still here wait for each other before they call the others lost:
// all of them see the failure within moments (their connections close or fail together).
constexpr auto kRollCallWait = std::chrono::seconds(2);
// The reduce-scatter's blocks cross between the leaders in pieces of this size.
constexpr int64_t kExchangePieceBytes = 1 << 20;

// The first host's failure as kHostFailureKey keeps it, "<kind> <lost rank> <what>": the other
// hosts raise the type it raised (a rank lost on one host is lost to all), as a host's shm abort
// does for its own ranks.
std::vector<uint8_t> encode_host_failure(const std::exception& error) {
  const auto* lost = dynamic_cast<const PeerLostError*>(&error);
  const std::string text = std::to_string(static_cast<int>(failure_kind_of(error))) + " " +
                           std::to_string(lost ? lost->lost_rank() : -1) + " " + error.what();
  return {text.begin(), text.end()};
}

// How the all-gather and the reduce-scatter lay the ranks' parts of `numel` elements out between
// hosts: one block per host, in host order, each as long as the widest host's parts; in a block,
// the host's ranks in local-rank order, then padding.
struct HostBlocks {
  HostBlocks(const HostTopology& topology, int64_t numel) : topology(topology), numel(numel) {
    size_t widest = 0;
    for (const auto& members : topology.members) widest = std::max(widest, members.size());
    block = static_cast<int64_t>(widest) * numel;
  }

  // Where local rank `j`'s part starts in host `host`'s block.
  int64_t offset(int host, size_t j) const {
    return host * block + static_cast<int64_t>(j) * numel;
  }

  // Calls visit(group rank, offset of its part) for every rank, host by host.
  template <typename Visit>
  void for_each_part(Visit&& visit) const {
    for (int host = 0; host < topology.hosts(); ++host) {
      const auto& ranks = topology.members[host];
      for (size_t j = 0; j < ranks.size(); ++j) visit(ranks[j], offset(host, j));
    }
  }

  const HostTopology& topology;
  int64_t numel;
  int64_t block = 0;  // elements per host
};

[[noreturn]] void fail_like_host_failure(const char* operation, const std::string& stored) {
  int kind = 0;
  int lost_rank = -1;
  int consumed = 0;
  std::string what = stored;
  if (std::sscanf(stored.c_str(), "%d %d %n", &kind, &lost_rank, &consumed) == 2) {
    what = stored.substr(consumed);
  }
  fail_of_kind(static_cast<ShmFailure>(kind), operation,
               "another host failed, so this one stops too: " + what, lost_rank);
}

}  // namespace

HierarchicalBackend::HierarchicalBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         HierarchySetup setup, const std::string& operation)
    : rank_(rank), topology_(std::move(setup.topology)), global_ranks_(setup.global_ranks) {
  host_ = topology_.host_of[rank];
  if (topology_.leader(host_) == rank) {
    const int leader_index = host_;  // hosts are numbered in the order of their leaders
    leaders_store_ = c10::make_intrusive<c10d::PrefixStore>("shm_leaders", store);
    leaders_ = setup.make_gloo(leaders_store_, leader_index, topology_.hosts());
  }
  const auto& members = topology_.members[host_];
  if (members.size() > 1) {
    ShmGroupSetup shm = setup.shm;
    // A host's other ranks wait for their leader while it exchanges with the other hosts, which
    // may take the whole timeout, then the roll call: they wait a little longer, so that the
    // leader, which knows what went wrong between the hosts, is the one that reports it.
    shm.timeout += std::chrono::duration_cast<std::chrono::milliseconds>(kRollCallWait) +
                   std::chrono::seconds(3);
    shm.host_index = host_;
    shm.local_rank = topology_.local_rank(rank);
    shm.global_ranks.clear();
    for (int member : members) shm.global_ranks.push_back(setup.global_ranks[member]);
    local_ = std::make_unique<ShmCommunicator>(*store, shm, operation);
  }
  queue_ = OpQueue::start();
}

HierarchicalBackend::~HierarchicalBackend() {
  queue_->shut_down("ddp: the process group was destroyed before this collective ran");
}

bool HierarchicalBackend::takes(Collective collective, const at::Tensor& like) const {
  switch (collective) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
    case Collective::kAllGatherIntoTensor:
    case Collective::kReduceScatter:
      return fits_shm(like);
    case Collective::kAllReduceNarrowBetweenHosts:
      return fits_shm(like) && at::isFloatingType(like.scalar_type());
    default:
      return false;
  }
}

BackendWork HierarchicalBackend::all_reduce(at::Tensor& tensor, RedOp op, Launch launch) {
  check_reducible(tensor.scalar_type(), op, "all_reduce");
  return queue_->submit(
      rank_, c10d::OpType::ALLREDUCE, [this, tensor, op] { all_reduce_now(tensor, op); }, launch);
}

BackendWork HierarchicalBackend::broadcast(at::Tensor& tensor, int root, Launch launch) {
  if (root < 0 || root >= static_cast<int>(topology_.host_of.size())) {
    fail("broadcast", "root rank " + std::to_string(root) + " is outside the group of " +
                          std::to_string(topology_.host_of.size()));
  }
  return queue_->submit(
      rank_, c10d::OpType::BROADCAST, [this, tensor, root] { broadcast_now(tensor, root); },
      launch);
}

void HierarchicalBackend::all_reduce_now(const at::Tensor& tensor, RedOp op) {
  const char* operation = "all_reduce";
  run_across_hosts(operation, [&] {
    if (local_) {
      local_->all_reduce(tensor.data_ptr(), tensor.numel(), tensor.scalar_type(), op, operation);
    }
    if (leaders_) {
      at::Tensor across = tensor;
      wait_for_leaders(operation, leaders_->all_reduce(across, op, Launch::kWaitNow),
                       across.nbytes());
    }
    if (local_) local_->broadcast(tensor.data_ptr(), tensor.nbytes(), 0, operation);
  });
}

BackendWork HierarchicalBackend::all_reduce_narrow_between_hosts(at::Tensor& tensor,
                                                                 c10::ScalarType wire,
                                                                 int64_t divisor, Launch launch) {
  if (wire != c10::kHalf && wire != c10::kBFloat16) {
    fail<InvalidArgumentError>("all_reduce", std::string("cannot narrow to ") +
                                                 c10::toString(wire) +
                                                 " between hosts (float16 or bfloat16 can)");
  }
  return queue_->submit(
      rank_, c10d::OpType::ALLREDUCE,
      [this, tensor, wire, divisor] { all_reduce_narrow_now(tensor, wire, divisor); }, launch);
}

void HierarchicalBackend::all_reduce_narrow_now(at::Tensor tensor, c10::ScalarType wire,
                                                int64_t divisor) {
  const char* operation = "all_reduce";
  run_across_hosts(operation, [&] {
    if (local_) {
      local_->all_reduce(tensor.data_ptr(), tensor.numel(), tensor.scalar_type(),
                         c10d::ReduceOp::SUM, operation);
    }
    if (leaders_) add_up_across_leaders(tensor, tensor.div(divisor).to(wire), operation);
    if (local_) local_->broadcast(tensor.data_ptr(), tensor.nbytes(), 0, operation);
  });
}

void HierarchicalBackend::add_up_across_leaders(at::Tensor& tensor, at::Tensor narrow,
                                                const char* operation) {
  // Every host's bytes are gathered and added up here, in host order, so that every leader
  // computes the same sum in the tensor's dtype (gloo cannot add bfloat16 at all, and its
  // float16 sum rounds every partial sum).
  at::Tensor bytes = narrow.view(at::kByte);
  std::vector<at::Tensor> parts;
  for (int host = 0; host < topology_.hosts(); ++host) parts.push_back(at::empty_like(bytes));
  wait_for_leaders(operation, leaders_->all_gather(parts, bytes, Launch::kWaitNow), bytes.nbytes());
  tensor.zero_();
  for (const at::Tensor& part : parts) tensor.add_(part.view(narrow.scalar_type()));
}

void HierarchicalBackend::broadcast_now(const at::Tensor& tensor, int root) {
  const char* operation = "broadcast";
  const int root_host = topology_.host_of[root];
  run_across_hosts(operation, [&] {
    if (host_ == root_host && local_) {
      local_->broadcast(tensor.data_ptr(), tensor.nbytes(), topology_.local_rank(root));
    }
    if (leaders_) {
      at::Tensor across = tensor;
      // The leader index is the host index.
      wait_for_leaders(operation, leaders_->broadcast(across, root_host, Launch::kWaitNow),
                       host_ == root_host ? across.nbytes() : 0);
    }
    if (host_ != root_host && local_) local_->broadcast(tensor.data_ptr(), tensor.nbytes(), 0);
  });
}

BackendWork HierarchicalBackend::all_gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                        Launch launch) {
  if (!fits_shm(output) ||
      output.numel() != input.numel() * static_cast<int64_t>(topology_.host_of.size())) {
    fail<InvalidArgumentError>("all_gather_into_tensor",
                               "the hierarchical backend takes a dense CPU output of the group "
                               "size times the input's elements");
  }
  return queue_->submit(
      rank_, c10d::OpType::ALLGATHER,
      [this, output, input] { all_gather_into_tensor_now(output, input); }, launch);
}

void HierarchicalBackend::all_gather_into_tensor_now(const at::Tensor& output,
                                                     const at::Tensor& input) {
  const char* operation = "all_gather_into_tensor";
  const int64_t numel = input.numel();
  const HostBlocks layout(topology_, numel);
  const int64_t block = layout.block;
  at::Tensor line = input.reshape(-1);
  run_across_hosts(operation, [&] {
    // This host's ranks, in local-rank order, padded to the widest host.
    at::Tensor host_block = at::zeros({block}, input.options());
    const auto& members = topology_.members[host_];
    if (local_) {
      std::vector<void*> slots;
      for (size_t j = 0; j < members.size(); ++j) {
        slots.push_back(host_block.narrow(0, layout.offset(0, j), numel).data_ptr());
      }
      local_->all_gather(line.data_ptr(), line.nbytes(), slots);
    } else {
      host_block.narrow(0, 0, numel).copy_(line);
    }
    at::Tensor every_host = at::empty({block * topology_.hosts()}, input.options());
    if (leaders_) {
      std::vector<at::Tensor> blocks;
      for (int host = 0; host < topology_.hosts(); ++host) {
        blocks.push_back(every_host.narrow(0, host * block, block));
      }
      wait_for_leaders(operation, leaders_->all_gather(blocks, host_block, Launch::kWaitNow),
                       host_block.nbytes());
    }
    if (local_) local_->broadcast(every_host.data_ptr(), every_host.nbytes(), 0, operation);
    at::Tensor out = output.view(-1);
    layout.for_each_part([&](int rank, int64_t offset) {
      out.narrow(0, rank * numel, numel).copy_(every_host.narrow(0, offset, numel));
    });
  });
}

BackendWork HierarchicalBackend::reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& inputs,
                                                RedOp op, Launch launch) {
  check_reducible(output.scalar_type(), op, "reduce_scatter");
  if (!fits_shm(output) || inputs.size() != topology_.host_of.size()) {
    fail<InvalidArgumentError>("reduce_scatter",
                               "the hierarchical backend takes a dense CPU output and one input "
                               "like it per group rank");
  }
  for (const at::Tensor& input : inputs) {
    if (input.numel() != output.numel() || input.scalar_type() != output.scalar_type() ||
        !input.device().is_cpu()) {
      fail<InvalidArgumentError>("reduce_scatter",
                                 "the hierarchical backend takes inputs of the output's elements, "
                                 "dtype and device (CPU)");
    }
  }
  return queue_->submit(
      rank_, c10d::OpType::REDUCE_SCATTER,
      [this, output, inputs, op] { reduce_scatter_now(output, inputs, op); }, launch);
}

void HierarchicalBackend::reduce_scatter_now(const at::Tensor& output,
                                             const std::vector<at::Tensor>& inputs, RedOp op) {
  const char* operation = "reduce_scatter";
  const int64_t numel = output.numel();
  const HostBlocks layout(topology_, numel);
  const int64_t block = layout.block;
  run_across_hosts(operation, [&] {
    // The inputs laid out as one block per host, each host's ranks in local-rank order, padded
    // to the widest host with zeros (reduced, never read): a copy, as the inputs must stay as
    // they were.
    at::Tensor blocks = at::empty({block * topology_.hosts()}, output.options());
    layout.for_each_part([&](int rank, int64_t offset) {
      blocks.narrow(0, offset, numel).copy_(inputs[rank].reshape(-1));
    });
    for (int host = 0; host < topology_.hosts(); ++host) {
      const int64_t padding = layout.offset(host, topology_.members[host].size());
      blocks.narrow(0, padding, (host + 1) * block - padding).zero_();
    }
    if (local_) {
      local_->all_reduce(blocks.data_ptr(), blocks.numel(), blocks.scalar_type(), op, operation);
    }
    at::Tensor mine = blocks.narrow(0, host_ * block, block);
    if (leaders_) mine = reduce_blocks_across_leaders(blocks, op, operation);
    if (local_) local_->broadcast(mine.data_ptr(), mine.nbytes(), 0, operation);
    const int64_t local_rank = topology_.local_rank(rank_);
    output.copy_(mine.narrow(0, local_rank * numel, numel).view(output.sizes()));
  });
}

at::Tensor HierarchicalBackend::reduce_blocks_across_leaders(const at::Tensor& blocks, RedOp op,
                                                             const char* operation) {
  const int hosts = topology_.hosts();
  const int64_t block = blocks.numel() / hosts;
  // Each block travels in pieces, every send and receive posted before any is waited for: the
  // leaders exchange in any order, and the link stays busy (one message of the whole block
  // reached half of a shaped link's rate, bench/README.md). Piece p has tag p: the leaders'
  // group runs one collective at a time, so the tags are free.
  const int64_t piece = std::max<int64_t>(kExchangePieceBytes / blocks.element_size(), 1);
  std::vector<at::Tensor> received(hosts);
  std::vector<BackendWork> sends;
  std::vector<BackendWork> receives;  // receives[i] pairs with sends[i]
  std::vector<size_t> sent_bytes;     // sends[i]'s
  try {
    for (int host = 0; host < hosts; ++host) {
      if (host == host_) continue;
      received[host] = at::empty({block}, blocks.options());
      at::Tensor theirs = blocks.narrow(0, host * block, block);
      for (int64_t start = 0, tag = 0; start < block; start += piece, ++tag) {
        const int64_t length = std::min(piece, block - start);
        at::Tensor out = theirs.narrow(0, start, length);
        at::Tensor in = received[host].narrow(0, start, length);
        sends.push_back(leaders_->send(out, host, static_cast<int>(tag)));
        sent_bytes.push_back(out.nbytes());
        receives.push_back(leaders_->recv(in, host, static_cast<int>(tag)));
      }
    }
  } catch (const std::exception& error) {
    // gloo posts a send at once: on a connection that another leader closed, it throws here.
    fail_between_hosts(operation, error);
  }
  for (size_t i = 0; i < sends.size(); ++i) {
    wait_for_leaders(operation, sends[i], sent_bytes[i]);
    wait_for_leaders(operation, receives[i], 0);
  }
  // This host's block, reduced over the hosts in host order, in place.
  at::Tensor mine = blocks.narrow(0, host_ * block, block);
  std::vector<const void*> sources;
  for (int host = 0; host < hosts; ++host) {
    sources.push_back(host == host_ ? mine.data_ptr() : received[host].data_ptr());
  }
  reduce_into(mine.data_ptr(), sources.data(), hosts, static_cast<size_t>(block),
              blocks.scalar_type(), op);
  return mine;
}

template <typename Body>
void HierarchicalBackend::run_across_hosts(const char* operation, Body&& body) {
  if (!broken_.empty()) {
    fail(operation, "this group is broken since an earlier collective failed (" + broken_ +
                        "); destroy it and make a new one");
  }
  try {
    body();
  } catch (const std::exception& error) {
    // The group is broken for good: this host's ranks must not wait for this one, and the other
    // hosts must not wait for this host. A leader closes its connections to the other leaders by
    // destroying its gloo group of them: their gloo call fails at once (instead of when this
    // process exits, or at the timeout), and each of them breaks its own host's group in turn.
    broken_ = error.what();
    if (local_) {
      const auto* lost = dynamic_cast<const PeerLostError*>(&error);
      local_->abort(std::string(operation) + " across hosts: " + error.what(),
                    failure_kind_of(error), lost ? lost->lost_rank() : -1);
    }
    if (leaders_) {
      try {
        // The first cause stays (its text names this rank): a leader that fails only because
        // another host failed does not overwrite it.
        leaders_store_->compareSet(kHostFailureKey, {}, encode_host_failure(error));
      } catch (const std::exception&) {
        // The store is gone too: the closed connections alone tell the other leaders.
      }
      leaders_.reset();
    }
    throw;
  }
}

void HierarchicalBackend::wait_for_leaders(const char* operation, const BackendWork& work,
                                           size_t bytes_handed) {
  bytes_between_hosts_.fetch_add(bytes_handed, std::memory_order_relaxed);
  try {
    work->wait();
  } catch (const std::exception& error) {
    fail_between_hosts(operation, error);
  }
}

void HierarchicalBackend::fail_between_hosts(const char* operation, const std::exception& error) {
  // Most likely another host's leader closed its connections after a failure on its host:
  // name that failure rather than only the closed connection.
  std::string cause;
  try {
    if (leaders_store_->check({kHostFailureKey})) {
      std::vector<uint8_t> why = leaders_store_->get(kHostFailureKey);
      cause.assign(why.begin(), why.end());
    }
  } catch (const std::exception&) {
  }
  std::vector<int> silent;
  if (cause.empty()) silent = hosts_gone_silent(cause);
  if (!cause.empty()) fail_like_host_failure(operation, cause);
  if (silent.empty()) rethrow_backend_failure(std::string(operation) + " between hosts", error);
  std::string hosts;
  for (int host : silent) hosts += (hosts.empty() ? "" : ", ") + describe_host(host);
  std::string what = error.what();
  what = what.substr(0, what.find('\n'));
  fail_peer_lost(operation,
                 "lost " + hosts + ": " + (silent.size() > 1 ? "their leaders" : "its leader") +
                     " stopped answering between hosts (" + what +
                     "). Its processes exited or were killed, or the network between the "
                     "hosts is down: look at that host's output for the first error.",
                 global_ranks_[topology_.leader(silent.front())]);
}

std::vector<int> HierarchicalBackend::hosts_gone_silent(std::string& cause) {
  std::vector<int> silent;
  try {
    leaders_store_->set(still_here_key(host_), std::vector<uint8_t>{1});
    const auto deadline = std::chrono::steady_clock::now() + kRollCallWait;
    for (;;) {
      silent.clear();
      for (int host = 0; host < topology_.hosts(); ++host) {
        if (host != host_ && !leaders_store_->check({still_here_key(host)})) silent.push_back(host);
      }
      if (leaders_store_->check({kHostFailureKey})) {
        std::vector<uint8_t> why = leaders_store_->get(kHostFailureKey);
        cause.assign(why.begin(), why.end());
        return {};
      }
      if (silent.empty() || std::chrono::steady_clock::now() >= deadline) return silent;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception&) {
    return {};  // the store is out of reach too (it lives on the lost host, or behind the link)
  }
}

std::string HierarchicalBackend::describe_host(int host) const {
  std::vector<int> ranks;
  for (int member : topology_.members[host]) ranks.push_back(global_ranks_[member]);
  return "host " + std::to_string(host) + " (rank" + (ranks.size() > 1 ? "s " : " ") +
         join_ints(ranks) + ")";
}

}  // namespace ddp::detail
