// Multi-process test fixture: runs a test body in N forked ranks and waits for all of them with a
// bounded timeout, so that a broken collective fails the test instead of hanging CI.
//
// Each rank is a fork of the test process. The parent never touches libtorch before forking (so no
// thread pool is inherited half-initialised); each child sets its own rendezvous environment, runs
// the body, and exits 0 when no gtest expectation failed, 1 when one did, 3 on an uncaught
// exception (printed with its rank). On timeout every rank still running is killed.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace ddp::testing {

struct RankOutcome {
  int rank = -1;
  int exit_code = -1;  // valid when signal == 0 and !timed_out
  int signal = 0;
  bool timed_out = false;
  std::string describe() const;
};

struct Launch {
  int world_size = 2;
  std::chrono::milliseconds timeout = std::chrono::seconds(45);
  // Environment set in each child before the body runs: MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE
  // (on a fresh free port) unless set_rendezvous_env is false.
  bool set_rendezvous_env = true;
};

/// Runs body(rank) in world_size processes; returns one outcome per rank, in rank order.
std::vector<RankOutcome> run_ranks(const Launch& launch, const std::function<void(int rank)>& body);

/// Shorthand: runs the body and EXPECTs every rank to exit 0.
void run_ranks_ok(int world_size, const std::function<void(int rank)>& body,
                  std::chrono::milliseconds timeout = std::chrono::seconds(45));

/// A TCP port that was free a moment ago (bound to port 0, read back, closed).
int free_port();

/// A path in a fresh temporary folder that does not exist yet ("file://" + path for init_method).
/// The folders are removed when the test process exits.
std::string fresh_path(const std::string& name = "rendezvous");

/// Milliseconds since `start`.
double elapsed_ms(std::chrono::steady_clock::time_point start);

/// A Python interpreter with torch: $DDP_TEST_PYTHON, else /usr/bin/python3 (Debian's
/// python3-torch); empty when it cannot import torch (tests then skip).
const std::string& torch_python();

/// Replaces this (forked) rank with torch_python() running `program`. Its torch.distributed keeps
/// the classic store client (USE_LIBUV=0): Debian 13's python3-torch is built without libuv and
/// otherwise refuses every env:// and tcp:// rendezvous.
[[noreturn]] void exec_python(const char* program);

/// The GPUs a rank would see, asked in a forked child: a test process must not initialise CUDA
/// before it forks its ranks (CUDA does not survive a fork). 0 on CPU builds of libtorch.
int cuda_devices();

}  // namespace ddp::testing
