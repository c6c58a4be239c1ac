// collectives_demo: a tour of ddp-cpp's collectives for newcomers. Run it on 2 or more ranks:
//
//   build/tools/ddprun/ddprun --nproc-per-node 2 build/examples/collectives_demo
//
// Every rank runs this same program. ddprun starts the processes and sets RANK, WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT, which init_process_group() reads (the "env://" init method).
// Each step checks its result; rank 0 prints "collectives demo: OK on N ranks" only when every
// check passed on every rank, and the program exits non-zero otherwise.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "ddp/collectives.h"
#include "ddp/errors.h"
#include "ddp/init.h"

namespace {

int rank = -1;
bool all_checks_passed = true;

// Records a check; a failure is printed by the rank that saw it.
void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("rank %d: WRONG: %s\n", rank, what.c_str());
    all_checks_passed = false;
  }
}

}  // namespace

int main() {
  // Under a launcher stdout is a pipe, hence fully buffered: flush every line, so that nothing is
  // lost if the launcher stops this rank because another one failed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    // 1. Join the job. Every rank must call this; it returns once all of them have.
    ddp::init_process_group();  // backend "gloo", init method "env://"
    rank = ddp::get_rank();
    const int world = ddp::get_world_size();
    std::printf("rank %d of %d, backend %s\n", rank, world, ddp::get_backend().c_str());
    if (world < 2)
      std::printf("rank %d: note: run on 2 or more ranks to see anything move\n", rank);

    // 2. all_reduce: every rank contributes rank+1; afterwards every rank holds the sum
    //    1 + 2 + ... + world, in place.
    torch::Tensor t = torch::full({4}, rank + 1, torch::kFloat);
    ddp::all_reduce(t, ddp::ReduceOp::SUM);
    const float sum = world * (world + 1) / 2.0f;
    check(torch::equal(t, torch::full({4}, sum)), "all_reduce SUM");
    if (rank == 0) std::printf("all_reduce(SUM) of rank+1: %g on every rank\n", sum);

    // 3. broadcast: rank 0's tensor overwrites everyone else's.
    torch::Tensor b = rank == 0 ? torch::arange(5, torch::kFloat) * 10 : torch::zeros({5});
    ddp::broadcast(b, /*src=*/0);
    check(torch::equal(b, torch::arange(5, torch::kFloat) * 10), "broadcast from rank 0");
    if (rank == 0) std::printf("broadcast from rank 0: [0, 10, 20, 30, 40] on every rank\n");

    // 4. all_gather: each rank sends one tensor and receives everyone's, in rank order.
    std::vector<torch::Tensor> gathered = ddp::all_gather(torch::full({2}, rank, torch::kLong));
    check(static_cast<int>(gathered.size()) == world, "all_gather returns one tensor per rank");
    for (int r = 0; r < static_cast<int>(gathered.size()); ++r) {
      check(torch::equal(gathered[r], torch::full({2}, r, torch::kLong)),
            "all_gather slot " + std::to_string(r));
    }
    if (rank == 0) std::printf("all_gather of the ranks: %d tensors, in rank order\n", world);

    // 5. A sub-group of the last two ranks. new_group is collective over the WORLD: every rank
    //    calls it, members or not. Collectives on the group involve its members only; ranks given
    //    as src/dst are GLOBAL ranks, while group.rank() is the rank within the group.
    const std::vector<int> members = {world - 2, world - 1};
    if (world >= 2) {
      ddp::ProcessGroup pair = ddp::new_group(members);
      if (pair.is_member()) {
        torch::Tensor p = torch::full({3}, rank + 1, torch::kFloat);
        ddp::all_reduce(p, ddp::ReduceOp::SUM, pair);  // (world-1) + world
        check(torch::equal(p, torch::full({3}, 2.0f * world - 1)), "all_reduce in the sub-group");
        torch::Tensor q = torch::full({3}, rank, torch::kFloat);
        ddp::broadcast(q, /*src=*/world - 1, pair);  // global rank world-1 = group rank 1
        check(torch::equal(q, torch::full({3}, world - 1.0f)), "broadcast in the sub-group");
        check(pair.rank() == rank - (world - 2), "group rank of a member");
        std::printf("rank %d: member of sub-group {%d, %d} as group rank %d; sum there %g\n", rank,
                    members[0], members[1], pair.rank(), p[0].item<float>());
      } else {
        check(pair.rank() == -1 && ddp::get_rank(pair) == -1, "non-member's group rank is -1");
        std::printf("rank %d: not in sub-group {%d, %d}, skipping its collectives\n", rank,
                    members[0], members[1]);
      }
    }

    // 6. monitored_barrier: like barrier, but if a rank fails to arrive in time, rank 0's error
    //    names every missing rank instead of just hanging.
    ddp::monitored_barrier(std::chrono::seconds(30));
    if (rank == 0) std::printf("monitored_barrier: all %d ranks arrived\n", world);

    // 7. Agree on the outcome: the MIN over ranks of "my checks passed" is 1 only if all passed.
    torch::Tensor ok = torch::full({1}, all_checks_passed ? 1 : 0, torch::kInt);
    ddp::all_reduce(ok, ddp::ReduceOp::MIN);
    const bool everyone_ok = ok.item<int>() == 1;

    // 8. Leave the job. Every rank should call this before exiting.
    ddp::destroy_process_group();

    if (!everyone_ok) {
      if (rank == 0) std::printf("collectives demo: FAILED (see the WRONG lines)\n");
      return 1;
    }
    if (rank == 0) std::printf("collectives demo: OK on %d ranks\n", world);
    return 0;
  } catch (const ddp::DistributedError& error) {
    // Every failure ddp-cpp reports (a dead peer, a timeout, a bad option) is a DistributedError
    // whose message names the rank, the operation and the cause.
    std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: unexpected error: %s\n", rank, error.what());
    return 1;
  }
}
