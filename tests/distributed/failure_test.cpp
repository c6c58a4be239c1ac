// Failures: every one is a DistributedError that names what happened, within its bound, never a
// hang, and whose type says what kind of failure it was (TimeoutError, PeerLostError, ...). Each
// test bounds itself twice: a short group timeout and the fixture's process deadline.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <future>
#include <memory>
#include <new>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "compat/libtorch_compat.h"
#include "ddp/ddp.h"
#include "support/multiprocess.h"

using ddp::testing::elapsed_ms;
using ddp::testing::Launch;
using ddp::testing::run_ranks;
using ddp::testing::run_ranks_ok;

namespace {

constexpr auto kShortTimeout = std::chrono::seconds(4);

// Runs `action`, expects an Error (DistributedError or a subclass) containing every one of
// `parts`, and returns a copy of it (or of a default one, after recording the failure). An error
// of another type escapes and fails the rank.
template <typename Error = ddp::DistributedError, typename Action>
Error expect_error(Action&& action, std::initializer_list<const char*> parts) {
  try {
    action();
    ADD_FAILURE() << "expected a " << typeid(Error).name();
  } catch (const Error& e) {
    for (const char* part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "missing '" << part << "' in: " << e.what();
    }
    return e;
  }
  return Error("none");
}

// A pid that the ranks (forks of this process, made after this call) share: 0 until one stores
// its own. Null when it cannot be mapped. Unmapped at exit.
std::atomic<int>* shared_pid() {
  void* shared = ::mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return nullptr;
  return new (shared) std::atomic<int>(0);
}

std::string this_host() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

TEST(Failure, RankThatNeverArrivesIsReportedAfterTheTimeout) {
  Launch launch;
  launch.world_size = 3;
  auto outcomes = run_ranks(launch, [](int rank) {
    if (rank == 2) return;  // never calls init_process_group
    auto start = std::chrono::steady_clock::now();
    auto error = expect_error<ddp::TimeoutError>(
        [] { ddp::init_process_group(ddp::InitOptions().timeout(kShortTimeout)); },
        {"only 2 of 3 ranks arrived", "missing group ranks: 2"});
    EXPECT_EQ(error.rank(), rank);
    EXPECT_EQ(error.operation(), "init_process_group");
    EXPECT_LT(elapsed_ms(start), 15000);
  });
  for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();
}

// Both transports name the lost rank: gloo from the address of the connection that broke (each
// rank published who is behind each of its connections when the group was made: all on
// 127.0.0.1 here, told apart by their ports) or, on one host, from the process that is gone; shm
// from the process that is gone (also on the rank that only learns it from the other survivor's
// abort). On gloo, a survivor that reported its error and exited closes its connections too: the
// last survivor may be told of it instead, and only if it did report first.
TEST(Failure, PeerThatDiesDuringACollectiveFailsTheSurvivors) {
  // One flag per rank, shared by the forked ranks: "this rank has its error and may exit".
  auto* reported = static_cast<std::atomic<int>*>(::mmap(nullptr, 3 * sizeof(std::atomic<int>),
                                                         PROT_READ | PROT_WRITE,
                                                         MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(reported, MAP_FAILED);
  for (std::string backend : {"gloo", "shm"}) {
    for (int r = 0; r < 3; ++r) reported[r].store(0);
    Launch launch;
    launch.world_size = 3;
    auto outcomes = run_ranks(launch, [backend, reported](int rank) {
      ddp::init_process_group(
          ddp::InitOptions().backend(backend).timeout(std::chrono::seconds(20)));
      auto t = torch::ones({1 << 20});
      ddp::all_reduce(t);
      if (rank == 1) ::raise(SIGKILL);  // dies between two collectives of the others
      auto start = std::chrono::steady_clock::now();
      auto error = expect_error<ddp::PeerLostError>(
          [&] {
            for (int i = 0; i < 50; ++i) ddp::all_reduce(t);
          },
          {"] ddp::all_", "exited"});
      EXPECT_EQ(error.rank(), rank);
      EXPECT_EQ(error.operation(), "all_reduce");
      // Every gloo error that names a connection's address ("[127.0.0.1]:PORT") names its rank.
      const bool names_an_address = std::string(error.what()).find("]:") != std::string::npos;
      const int other_survivor = 2 - rank;
      const bool told_of_a_survivor_that_left = backend == "gloo" &&
                                                error.lost_rank() == other_survivor &&
                                                reported[other_survivor].load();
      if ((backend == "shm" || names_an_address) && !told_of_a_survivor_that_left) {
        EXPECT_EQ(error.lost_rank(), 1) << error.what();
      }
      reported[rank].store(1);
      if (names_an_address) {
        EXPECT_EQ(error.lost_host(), this_host()) << error.what();
      }
      std::fprintf(stderr, "%s rank %d: %s\n", backend.c_str(), rank, error.what());
      EXPECT_LT(elapsed_ms(start), 20000 + 5000);
    });
    EXPECT_EQ(outcomes[0].exit_code, 0) << backend << ": " << outcomes[0].describe();
    EXPECT_EQ(outcomes[1].signal, SIGKILL) << backend;
    EXPECT_EQ(outcomes[2].exit_code, 0) << backend << ": " << outcomes[2].describe();
  }
}

TEST(Failure, PeerThatStopsRespondingFailsTheOthersAfterTheTimeout) {
  for (std::string backend : {"gloo", "shm"}) {
    Launch launch;
    launch.timeout = std::chrono::seconds(30);
    auto outcomes = run_ranks(launch, [backend](int rank) {
      ddp::init_process_group(ddp::InitOptions().backend(backend).timeout(kShortTimeout));
      if (rank == 1) {
        ::alarm(10);  // bounded: SIGALRM ends this rank
        ::pause();
      }
      auto start = std::chrono::steady_clock::now();
      auto t = torch::ones({16});
      auto error = expect_error<ddp::TimeoutError>([&] { ddp::all_reduce(t); },
                                                   {"[rank 0] ddp::all_", "InitOptions().timeout"});
      EXPECT_EQ(error.rank(), 0);
      EXPECT_EQ(error.operation(), "all_reduce");
      EXPECT_LT(elapsed_ms(start), 9000);
    });
    EXPECT_EQ(outcomes[0].exit_code, 0) << backend << ": " << outcomes[0].describe();
  }
}

// A peer stopped in the middle of a job (SIGSTOP, Ctrl-Z, a debugger that holds it) is named as
// stopped when the others time out, on gloo (from the peers its connections lead to) and on shm.
TEST(Failure, PeerStoppedDuringACollectiveIsNamedAsStoppedAtTheTimeout) {
  for (std::string backend : {"gloo", "shm"}) {
    auto* stopped_pid = shared_pid();
    ASSERT_NE(stopped_pid, nullptr);
    Launch launch;
    launch.timeout = std::chrono::seconds(30);
    auto outcomes = run_ranks(launch, [backend, stopped_pid](int rank) {
      ddp::init_process_group(ddp::InitOptions().backend(backend).timeout(kShortTimeout));
      auto t = torch::ones({16});
      ddp::all_reduce(t);
      if (rank == 1) {
        stopped_pid->store(::getpid());
        ::raise(SIGSTOP);  // rank 0 ends it once it has reported
      }
      while (stopped_pid->load() == 0) std::this_thread::yield();
      auto error = expect_error<ddp::TimeoutError>(
          [&] { ddp::all_reduce(t); },
          {"[rank 0] ddp::all_reduce",
           ("rank 1 (pid " + std::to_string(stopped_pid->load())).c_str(),
           "is stopped (by SIGSTOP"});
      EXPECT_EQ(error.operation(), "all_reduce");
      std::fprintf(stderr, "%s: %s\n", backend.c_str(), error.what());
      ::kill(stopped_pid->load(), SIGKILL);
    });
    EXPECT_EQ(outcomes[0].exit_code, 0) << backend << ": " << outcomes[0].describe();
    EXPECT_EQ(outcomes[1].signal, SIGKILL) << backend << ": " << outcomes[1].describe();
  }
}

TEST(Failure, StorePortAlreadyInUseIsNamed) {
  int holder = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(holder, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(holder, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  run_ranks_ok(1, [port](int) {
    expect_error<ddp::StoreError>(
        [port] {
          ddp::init_process_group(ddp::InitOptions()
                                      .init_method("tcp://127.0.0.1:" + std::to_string(port))
                                      .rank(0)
                                      .world_size(1)
                                      .timeout(kShortTimeout));
        },
        {"already in use", "MASTER_PORT"});
  });
  ::close(holder);
}

TEST(Failure, MonitoredBarrierNamesEveryMissingRank) {
  Launch launch;
  launch.world_size = 4;
  auto outcomes = run_ranks(launch, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().timeout(std::chrono::seconds(20)));
    if (rank == 1 || rank == 3) {
      // These ranks skip the barrier, then wait for the others' verdict through a normal barrier.
      ddp::barrier();
      return;
    }
    auto start = std::chrono::steady_clock::now();
    if (rank == 0) {
      expect_error<ddp::TimeoutError>(
          [] { ddp::monitored_barrier(std::chrono::seconds(2)); },
          {"ranks 1, 3 failed to pass monitored_barrier", "2 of 4 ranks missing"});
    } else {
      expect_error<ddp::TimeoutError>([] { ddp::monitored_barrier(std::chrono::seconds(2)); },
                                      {"rank 0 reports that ranks 1, 3 failed"});
    }
    EXPECT_LT(elapsed_ms(start), 8000);
    ddp::barrier();
  });
  for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();
}

TEST(Failure, MismatchedTensorSizesAcrossRanksAreAnError) {
  Launch launch;
  launch.timeout = std::chrono::seconds(30);
  auto outcomes = run_ranks(launch, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().timeout(kShortTimeout));
    auto t = torch::ones({rank == 0 ? 100 : 60});
    auto start = std::chrono::steady_clock::now();
    auto error = expect_error<ddp::MismatchError>(
        [&] { ddp::all_reduce(t); }, {"rank 0 calls all_reduce of 100 Float elements, op SUM",
                                      "rank 1 calls all_reduce of 60 Float elements"});
    EXPECT_EQ(error.rank(), rank);
    EXPECT_EQ(error.operation(), "all_reduce");
    // A different collective on each rank is caught the same way, and the group stays usable.
    expect_error<ddp::MismatchError>(
        [&] {
          if (rank == 0) {
            ddp::broadcast(t, 0);
          } else {
            ddp::all_reduce(t);
          }
        },
        {"rank 0 calls broadcast", "rank 1 calls all_reduce"});
    auto same = torch::ones({8});
    ddp::all_reduce(same);
    EXPECT_EQ(same[0].item<float>(), 2.0f);
    EXPECT_LT(elapsed_ms(start), 10000);
  });
  for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();
}

TEST(Failure, BadRankInTheEnvironmentIsAnInvalidArgumentNamingTheValue) {
  run_ranks_ok(1, [](int) {
    ::setenv("RANK", "-1", 1);
    auto error = expect_error<ddp::InvalidArgumentError>(
        [] { ddp::init_process_group(ddp::InitOptions().timeout(kShortTimeout)); },
        {"environment variable RANK must be a rank, 0 or more, got -1"});
    EXPECT_EQ(error.rank(), -1);
    EXPECT_EQ(error.operation(), "init_process_group");
    EXPECT_FALSE(ddp::is_initialized());
  });
}

// c10d's FileStore would retry opening the file until the timeout; the missing folder is named
// at once instead.
TEST(Failure, RendezvousFileInAMissingFolderFailsAtOnceNamingTheFolder) {
  const std::string folder = ddp::testing::fresh_path("missing") + "/dir";
  run_ranks_ok(1, [folder](int) {
    auto start = std::chrono::steady_clock::now();
    expect_error<ddp::InvalidArgumentError>(
        [&] {
          ddp::init_process_group(ddp::InitOptions()
                                      .init_method("file://" + folder + "/x")
                                      .rank(0)
                                      .world_size(2)
                                      .timeout(std::chrono::seconds(30)));
        },
        {("the folder " + folder + " of the rendezvous file").c_str(), "does not exist"});
    EXPECT_LT(elapsed_ms(start), 2000);
  });
}

// Nobody hosts the store: the error names the timeout the caller gave (not what was left of it
// at the last attempt), and c10d's client does not log a warning per refused attempt.
TEST(Failure, UnreachableStoreNamesTheWholeTimeoutWithoutFloodingTheLog) {
  const std::string log = ddp::testing::fresh_path("stderr");
  const int port = ddp::testing::free_port();
  run_ranks_ok(1, [log, port](int) {
    ASSERT_NE(std::freopen(log.c_str(), "w", stderr), nullptr);
    auto start = std::chrono::steady_clock::now();
    auto error = expect_error<ddp::StoreError>(
        [port] {
          ddp::init_process_group(ddp::InitOptions()
                                      .init_method("tcp://127.0.0.1:" + std::to_string(port))
                                      .rank(1)
                                      .world_size(2)
                                      .timeout(std::chrono::seconds(2)));
        },
        {"could not reach the store hosted by rank 0", "within 2.0000 s"});
    EXPECT_EQ(error.rank(), 1);
    EXPECT_GT(elapsed_ms(start), 1900);
    EXPECT_LT(elapsed_ms(start), 6000);
    std::fflush(stderr);
    std::ifstream in(log);
    std::stringstream logged;
    logged << in.rdbuf();
    EXPECT_EQ(logged.str().find("c10d"), std::string::npos) << logged.str();
  });
}

namespace {

// RANK 0, 1, 1, 2 with WORLD_SIZE=3: the process that claims rank 1 second is refused at once;
// the first claimant and the other ranks are refused too, at the end of their init, each naming
// both claimants. Rank 2 starts once the second claim is refused, so that the job cannot have
// started before (a claimant that comes after the job started is refused alone).
void expect_both_claimants_refused(const std::string& init_method) {
  int refused[2];
  ASSERT_EQ(::pipe(refused), 0);
  const std::string pids = ddp::testing::fresh_path("pids");
  Launch launch;
  launch.world_size = 4;
  launch.timeout = std::chrono::seconds(40);
  auto outcomes = run_ranks(launch, [&](int index) {
    const int rank = index == 3 ? 2 : std::min(index, 1);
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", "3", 1);
    std::ofstream(pids + "." + std::to_string(index)) << ::getpid();
    if (index == 3) {
      pollfd second_claim_refused{refused[0], POLLIN, 0};
      ASSERT_EQ(::poll(&second_claim_refused, 1, 20000), 1);
    }
    auto start = std::chrono::steady_clock::now();
    try {
      ddp::init_process_group(
          ddp::InitOptions().init_method(init_method).timeout(std::chrono::seconds(20)));
      ADD_FAILURE() << "init_process_group succeeded";
      return;
    } catch (const ddp::MismatchError& e) {
      EXPECT_EQ(e.rank(), rank);
      EXPECT_EQ(e.operation(), "init_process_group");
      const std::string what = e.what();
      for (int claimant : {1, 2}) {
        std::ifstream in(pids + "." + std::to_string(claimant));
        std::string pid;
        in >> pid;
        EXPECT_NE(what.find("pid " + pid + " on "), std::string::npos) << what;
      }
      if (what.find("(this one)") != std::string::npos) {
        ASSERT_EQ(::write(refused[1], "x", 1), 1);  // the second claimant: rank 2 may come
      }
    }
    EXPECT_LT(elapsed_ms(start), 20000);
  });
  ::close(refused[0]);
  ::close(refused[1]);
  for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();
}

}  // namespace

TEST(Failure, TwoProcessesClaimingOneRankAreBothRefusedNamingBoth) {
  expect_both_claimants_refused("env://");
}

// The same through a rendezvous file, where the second claimant must not take a place in the
// file's generation (rank 2 would then wait alone in the next one).
TEST(Failure, TwoProcessesClaimingOneRankThroughAFileAreBothRefusedNamingBoth) {
  expect_both_claimants_refused("file://" + ddp::testing::fresh_path());
}

// A process that claims a rank of a rendezvous file's job after the job has started is refused
// at once, alone, naming the process that holds the rank (it runs on this host); the job goes on.
TEST(Failure, ALateClaimantOfARankInARendezvousFileIsRefusedAloneNamingTheHolder) {
  int started[2];
  int refused[2];
  ASSERT_EQ(::pipe(started), 0);
  ASSERT_EQ(::pipe(refused), 0);
  const std::string init_method = "file://" + ddp::testing::fresh_path();
  Launch launch;
  launch.world_size = 3;
  launch.set_rendezvous_env = false;
  launch.timeout = std::chrono::seconds(40);
  auto outcomes = run_ranks(launch, [&](int index) {
    const auto options = ddp::InitOptions()
                             .init_method(init_method)
                             .rank(std::min(index, 1))
                             .world_size(2)
                             .timeout(std::chrono::seconds(20));
    if (index == 2) {
      int holder = 0;
      ASSERT_EQ(::read(started[0], &holder, sizeof(holder)), static_cast<ssize_t>(sizeof(holder)));
      auto start = std::chrono::steady_clock::now();
      auto error = expect_error<ddp::MismatchError>([&] { ddp::init_process_group(options); },
                                                    {"(this one)", "still running"});
      EXPECT_NE(std::string(error.what()).find("pid " + std::to_string(holder) + " on "),
                std::string::npos)
          << error.what();
      EXPECT_LT(elapsed_ms(start), 5000);
      ASSERT_EQ(::write(refused[1], "x", 1), 1);
      return;
    }
    ddp::init_process_group(options);
    auto t = torch::ones({3});
    ddp::all_reduce(t);
    if (index == 1) {
      const int me = ::getpid();
      ASSERT_EQ(::write(started[1], &me, sizeof(me)), static_cast<ssize_t>(sizeof(me)));
      char x;
      ASSERT_EQ(::read(refused[0], &x, 1), 1);
    }
    ddp::all_reduce(t);
    EXPECT_TRUE(torch::equal(t, torch::full({3}, 4.0f)));
    ddp::destroy_process_group();
  });
  for (int end : {started[0], started[1], refused[0], refused[1]}) ::close(end);
  for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();
}

namespace {

// Whichever rank reaches the store second is refused at once with both world sizes; the other
// waits for a world that will not come and times out.
void expect_world_sizes_refused(const std::string& init_method) {
  const std::string refused = ddp::testing::fresh_path("refused");
  Launch launch;
  launch.timeout = std::chrono::seconds(30);
  auto outcomes = run_ranks(launch, [refused, init_method](int rank) {
    ::setenv("WORLD_SIZE", rank == 0 ? "2" : "3", 1);
    try {
      ddp::init_process_group(ddp::InitOptions().init_method(init_method).timeout(kShortTimeout));
      ADD_FAILURE() << "init_process_group succeeded";
    } catch (const ddp::MismatchError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("the ranks disagree on the world size"), std::string::npos) << what;
      EXPECT_NE(what.find("has world size 2"), std::string::npos) << what;
      EXPECT_NE(what.find("has world size 3"), std::string::npos) << what;
      std::ofstream(refused + "." + std::to_string(rank)) << what;
    } catch (const ddp::TimeoutError&) {
    }
  });
  for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();
  int refusals = 0;
  for (int rank = 0; rank < 2; ++rank) {
    refusals += std::ifstream(refused + "." + std::to_string(rank)).good() ? 1 : 0;
  }
  EXPECT_EQ(refusals, 1);
}

}  // namespace

TEST(Failure, RanksDisagreeingOnTheWorldSizeAreRefusedNamingBothSizes) {
  expect_world_sizes_refused("env://");
}

// Through a rendezvous file, whose generations are counted by each rank's own world size: the two
// ranks still meet in one generation, where the second is refused.
TEST(Failure, RanksDisagreeingOnTheWorldSizeThroughAFileAreRefusedNamingBothSizes) {
  expect_world_sizes_refused("file://" + ddp::testing::fresh_path());
}

namespace {

// Sends this process `signal` (SIGKILL: a crash; SIGSTOP: a hang) the moment the store holds
// gloo's address of `rank` in the world group: the rank dies or stops right after publishing it,
// while the others connect to it.
// gloo's keys: "<group>/<device index>/<rank>" under the world's store (1.13), with the device
// backend's "cpu/" level in between (2.x).
//
// Returns once the watching thread is connected to the store (within 20 s): a thread still
// connecting when the rank goes on could notice the address only after the rank had joined.
void signal_once_gloo_address_is_published(int rank, int signal) {
  auto connected = std::make_shared<std::promise<void>>();
  auto ready = connected->get_future();
  std::thread([rank, signal, connected] {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(std::stoi(std::getenv("MASTER_PORT")));
    options.waitWorkers = false;
    options.timeout = std::chrono::seconds(20);
    ddp::compat::use_classic_tcp_store(options);
    c10::intrusive_ptr<c10d::TCPStore> store;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!store && std::chrono::steady_clock::now() < deadline) {
      try {
        store = c10::make_intrusive<c10d::TCPStore>(std::getenv("MASTER_ADDR"), options);
      } catch (const std::exception&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    connected->set_value();
    const std::string r = std::to_string(rank);
    while (store) {
      if (store->check({"default_pg/0/0/" + r}) || store->check({"default_pg/0//cpu//0/" + r})) {
        ::raise(signal);
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }).detach();
  ASSERT_EQ(ready.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "the store never listened";
}

// True once `port` can be bound again on every address, looking until `limit` has passed.
bool port_frees_within(int port, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    ::close(fd);
    if (bound) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

// A rank that dies during init, right after it published its gloo address: every other rank
// fails within the timeout + 10 s, naming it, on gloo and on the default backend (which goes on
// to learn the ranks' hosts after gloo).
TEST(Failure, RankThatDiesDuringInitFailsTheOthersWithinTheTimeoutNamingIt) {
  for (std::string backend : {"gloo", "auto"}) {
    Launch launch;
    launch.world_size = 3;
    launch.timeout = std::chrono::seconds(40);
    auto outcomes = run_ranks(launch, [backend](int rank) {
      if (rank == 2) signal_once_gloo_address_is_published(2, SIGKILL);
      auto start = std::chrono::steady_clock::now();
      try {
        ddp::init_process_group(ddp::InitOptions().backend(backend).timeout(kShortTimeout));
        ADD_FAILURE() << "init_process_group succeeded";
      } catch (const ddp::PeerLostError& e) {
        EXPECT_EQ(e.lost_rank(), 2) << e.what();
        EXPECT_EQ(e.lost_host(), this_host()) << e.what();
        EXPECT_EQ(e.rank(), rank) << e.what();
        EXPECT_EQ(e.operation(), "init_process_group") << e.what();
        std::fprintf(stderr, "%s: after %.0f ms: %s\n", backend.c_str(), elapsed_ms(start),
                     e.what());
      } catch (const ddp::DistributedError& e) {
        ADD_FAILURE() << "not a PeerLostError: " << e.what();
      }
      EXPECT_LT(elapsed_ms(start), 4000 + 10000);
    });
    EXPECT_EQ(outcomes[0].exit_code, 0) << backend << ": " << outcomes[0].describe();
    EXPECT_EQ(outcomes[1].exit_code, 0) << backend << ": " << outcomes[1].describe();
    EXPECT_EQ(outcomes[2].signal, SIGKILL) << backend << ": " << outcomes[2].describe();
  }
}

// A rank that stops (alive, but no longer answering) right after it published its gloo address:
// the others cannot see it gone, and give up within the timeout + 10 s (where gloo alone would
// wait five times the timeout) with a TimeoutError that names it among the ranks to look at: at
// the timeout + 5 s if their gloo group is not made, or at the timeout after it was made, when
// the stopped rank does not say who is behind its connections. Rank 0's store port is free again
// at once: the thread that was making gloo's group, left behind, does not hold the store.
TEST(Failure, RankThatStopsDuringInitFailsTheOthersWithinTheTimeoutNamingIt) {
  auto* stopped_pid = shared_pid();
  ASSERT_NE(stopped_pid, nullptr);
  Launch launch;
  launch.world_size = 3;
  launch.timeout = std::chrono::seconds(40);
  auto outcomes = run_ranks(launch, [stopped_pid](int rank) {
    if (rank == 2) {
      stopped_pid->store(::getpid());
      signal_once_gloo_address_is_published(2, SIGSTOP);
    }
    auto start = std::chrono::steady_clock::now();
    auto error = expect_error<ddp::TimeoutError>(
        [] { ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(kShortTimeout)); },
        {"rank 2 (pid", ") is stopped (by SIGSTOP"});
    EXPECT_EQ(error.operation(), "init_process_group");
    std::fprintf(stderr, "after %.0f ms: %s\n", elapsed_ms(start), error.what());
    EXPECT_LT(elapsed_ms(start), 4000 + 10000);
    if (rank == 0) {
      // The gloo thread that init left behind does not keep the store: its port is free again.
      EXPECT_TRUE(
          port_frees_within(std::stoi(std::getenv("MASTER_PORT")), std::chrono::seconds(2)));
      ::kill(stopped_pid->load(), SIGKILL);  // rank 2 stays stopped otherwise
    }
  });
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].describe();
  EXPECT_EQ(outcomes[1].exit_code, 0) << outcomes[1].describe();
  EXPECT_EQ(outcomes[2].signal, SIGKILL) << outcomes[2].describe();
}

namespace {

// A client of this test's job's store, as another process on the machine could make one.
c10::intrusive_ptr<c10d::TCPStore> another_store_client() {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(std::stoi(std::getenv("MASTER_PORT")));
  options.waitWorkers = false;
  options.timeout = std::chrono::seconds(20);
  ddp::compat::use_classic_tcp_store(options);
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

// Connects to the store of this test's job, as a stray client would, and sends the first byte of
// a request (c10d's SET, with no key after it). Returns the connection.
int send_half_a_store_request() {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(std::stoi(std::getenv("MASTER_PORT"))));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
      const char set_request = 0;
      EXPECT_EQ(::write(fd, &set_request, 1), 1);
      return fd;
    }
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ADD_FAILURE() << "the store never listened";
  return -1;
}

bool readable_within(int fd, std::chrono::milliseconds limit) {
  pollfd ready{fd, POLLIN, 0};
  return ::poll(&ready, 1, static_cast<int>(limit.count())) == 1;
}

}  // namespace

// A client of the store that sends half a request and holds its connection would freeze c10d's
// store server for as long as it holds on (the server reads each request to its end before it
// serves the next). Rank 0's server drops such a client once its request has not moved for
// half the timeout, and the job goes on: during init, and later when new_group uses the store.
TEST(Failure, AStoreClientThatSendsHalfARequestAndHoldsOnDoesNotFreezeTheJob) {
  struct Pipe {
    int read_end = -1, write_end = -1;
    Pipe() {
      int ends[2];
      EXPECT_EQ(::pipe(ends), 0);
      read_end = ends[0];
      write_end = ends[1];
    }
    ~Pipe() {
      ::close(read_end);
      ::close(write_end);
    }
    void say() const { EXPECT_EQ(::write(write_end, "x", 1), 1); }
    bool heard_within(std::chrono::milliseconds limit) const {
      char x;
      return readable_within(read_end, limit) && ::read(read_end, &x, 1) == 1;
    }
  };
  const Pipe first_freeze, freeze_again, second_freeze, job_done;
  Launch launch;
  launch.world_size = 3;
  launch.timeout = std::chrono::seconds(60);
  auto outcomes = run_ranks(launch, [&](int index) {
    if (index == 2) {  // the stray client: it holds both connections until the job is done
      // Once rank 0 has claimed its rank, its server runs with its limits: on libtorch 1.13 they
      // come an instant after the server starts (stalled_client_limit.h), and a client that
      // connects within that instant keeps none.
      auto client = another_store_client();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!client->check({"default_pg/ddp_rank_owner/0"})) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "rank 0 never claimed its rank";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      const int first = send_half_a_store_request();
      first_freeze.say();
      ASSERT_TRUE(freeze_again.heard_within(std::chrono::seconds(30)));
      const int second = send_half_a_store_request();
      second_freeze.say();
      second_freeze.say();
      EXPECT_TRUE(job_done.heard_within(std::chrono::seconds(40)));
      ::close(first);
      ::close(second);
      return;
    }
    ::setenv("WORLD_SIZE", "2", 1);
    if (index == 1) {
      ASSERT_TRUE(first_freeze.heard_within(std::chrono::seconds(20)));
    }
    auto start = std::chrono::steady_clock::now();
    ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(kShortTimeout));
    std::fprintf(stderr, "rank %d: init done after %.0f ms\n", index, elapsed_ms(start));
    EXPECT_LT(elapsed_ms(start), 4000 + 10000);
    auto t = torch::full({4}, static_cast<float>(index + 1));
    ddp::all_reduce(t);
    EXPECT_TRUE(torch::equal(t, torch::full({4}, 3.0f)));

    if (index == 0) freeze_again.say();
    ASSERT_TRUE(second_freeze.heard_within(std::chrono::seconds(20)));
    start = std::chrono::steady_clock::now();
    auto pair = ddp::new_group({0, 1});
    t = torch::full({4}, static_cast<float>(index + 1));
    ddp::all_reduce(t, ddp::ReduceOp::SUM, pair);
    EXPECT_TRUE(torch::equal(t, torch::full({4}, 3.0f)));
    std::fprintf(stderr, "rank %d: new_group done after %.0f ms\n", index, elapsed_ms(start));
    EXPECT_LT(elapsed_ms(start), 4000 + 10000);
    ddp::destroy_process_group();
    if (index == 0) job_done.say();
  });
  for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();
}

// A process that writes over rank 0's gloo address in the store (the store authenticates nobody):
// every rank fails within the timeout + 10 s with a StoreError that says so (rank 1 read it, rank 0
// learns it from rank 1's note).
TEST(Failure, AGlooAddressWrittenOverByAnotherClientFailsTheRanksWithinTheTimeout) {
  int overwritten[2];
  ASSERT_EQ(::pipe(overwritten), 0);
  Launch launch;
  launch.world_size = 3;
  launch.timeout = std::chrono::seconds(40);
  auto outcomes = run_ranks(launch, [&](int index) {
    if (index == 2) {  // the other client: waits for rank 0's gloo address, then writes over it
      auto client = another_store_client();
      auto world = ddp::compat::group_store(
          c10::make_intrusive<c10d::PrefixStore>("default_pg", client), "0");
      auto gloo = c10::make_intrusive<c10d::PrefixStore>(
          "0", ddp::compat::device_backend_store(world, "cpu"));  // gloo's device 0
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!gloo->check({"0"})) {  // rank 0's key
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "rank 0 never published";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      gloo->set("0", std::vector<uint8_t>{'n', 'o', 't', ' ', 'a', 'n', ' ', 'a', 'd', 'd', 'r'});
      ASSERT_EQ(::write(overwritten[1], "x", 1), 1);
      return;
    }
    ::setenv("WORLD_SIZE", "2", 1);
    if (index == 1) {
      ASSERT_TRUE(readable_within(overwritten[0], std::chrono::seconds(20)));
    }
    auto start = std::chrono::steady_clock::now();
    auto error = expect_error<ddp::StoreError>(
        [] { ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(kShortTimeout)); },
        {"wrote over it"});
    EXPECT_EQ(error.operation(), "init_process_group");
    EXPECT_EQ(error.rank(), index);
    std::fprintf(stderr, "rank %d after %.0f ms: %s\n", index, elapsed_ms(start), error.what());
    EXPECT_LT(elapsed_ms(start), 4000 + 10000);
  });
  ::close(overwritten[0]);
  ::close(overwritten[1]);
  for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();
}
