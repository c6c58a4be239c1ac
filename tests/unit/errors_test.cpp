// The error types: what each carries, and how failures of the layers below are classified.
#include "ddp/errors.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdexcept>

#include "common/error_context.h"
#include "common/peer_directory.h"

namespace {

// Throws `error` and runs rethrow_backend_failure in its catch block, as the library does; returns
// what it throws.
template <typename Thrown>
std::exception_ptr classified(const std::string& operation, const Thrown& error) {
  try {
    try {
      throw error;
    } catch (const std::exception& caught) {
      ddp::detail::rethrow_backend_failure(operation, caught);
    }
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

template <typename Error>
Error as(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a " << typeid(Error).name() << ": " << e.what();
  }
  return Error("none");
}

}  // namespace

TEST(Errors, APlainDistributedErrorStillTakesOnlyAMessage) {
  ddp::DistributedError error("something failed");
  EXPECT_STREQ(error.what(), "something failed");
  EXPECT_EQ(error.rank(), -1);
  EXPECT_EQ(error.operation(), "");
  const std::runtime_error& base = error;  // user code catching runtime_error still works
  EXPECT_STREQ(base.what(), "something failed");
}

TEST(Errors, EveryKindIsADistributedErrorWithRankAndOperation) {
  try {
    ddp::detail::fail<ddp::TimeoutError>("all_reduce between hosts", "slow peer");
  } catch (const ddp::DistributedError& e) {
    EXPECT_NE(dynamic_cast<const ddp::TimeoutError*>(&e), nullptr);
    EXPECT_EQ(e.rank(), -1);  // no process group in this process
    EXPECT_EQ(e.operation(), "all_reduce");
    EXPECT_STREQ(e.what(), "[rank ?] ddp::all_reduce between hosts: slow peer");
  }
  try {
    ddp::detail::fail_peer_lost("broadcast", "rank 3 exited", 3, "node7");
  } catch (const ddp::PeerLostError& e) {
    EXPECT_EQ(e.lost_rank(), 3);
    EXPECT_EQ(e.lost_host(), "node7");
    EXPECT_EQ(e.operation(), "broadcast");
  }
  EXPECT_EQ(ddp::detail::user_call("new_group(0, 1)"), "new_group");
  EXPECT_EQ(ddp::detail::user_call("init_process_group at env://"), "init_process_group");
}

TEST(Errors, BackendFailuresAreClassifiedOnceWithTheirPeer) {
  auto lost = as<ddp::PeerLostError>(classified(
      "all_reduce", std::runtime_error("[../gloo/transport/tcp/pair.cc:598] Connection closed "
                                       "by peer [10.0.0.2]:51234")));
  EXPECT_EQ(lost.lost_rank(), -1);  // gloo does not know ranks
  EXPECT_EQ(lost.lost_host(), "10.0.0.2");
  EXPECT_EQ(lost.operation(), "all_reduce");
  as<ddp::TimeoutError>(
      classified("barrier", std::runtime_error("[gloo] Timed out waiting 4000ms for recv")));
  as<ddp::InvalidArgumentError>(
      classified("all_reduce", std::runtime_error("Invalid scalar type")));
  auto other = classified("all_reduce", std::runtime_error("something new"));
  auto plain = as<ddp::DistributedError>(other);
  EXPECT_EQ(typeid(plain), typeid(ddp::DistributedError));
  EXPECT_NE(std::string(plain.what()).find("something new"), std::string::npos);
}

// A backend names its own step (the fingerprint's all_gather); the error keeps its type and
// fields, and reports the user's call, in its fields and its text.
TEST(Errors, OurErrorsPassThroughWithTheirTypeForTheUsersCall) {
  ddp::PeerLostError inner("[rank 0] ddp::all_gather: rank 1 exited", 0, "all_gather", 1, "");
  auto outer = as<ddp::PeerLostError>(classified("all_reduce", inner));
  EXPECT_EQ(outer.operation(), "all_reduce");
  EXPECT_EQ(outer.lost_rank(), 1);
  EXPECT_EQ(outer.rank(), 0);
  EXPECT_STREQ(outer.what(), "[rank 0] ddp::all_reduce (in its step all_gather): rank 1 exited");
  ddp::MismatchError mismatch("sizes differ", 1, "all_gather");
  EXPECT_EQ(as<ddp::MismatchError>(classified("reduce", mismatch)).operation(), "reduce");
  EXPECT_EQ(as<ddp::MismatchError>(classified("all_gather", mismatch)).operation(), "all_gather");
}

// gloo names a broken connection by its far end's address; the directory the gloo groups fill
// turns it into the rank, and only a whole address matches (port 6522 is not port 65220).
TEST(BackendFailure, AGlooAddressOfAKnownPeerNamesItsRankAndHost) {
  ddp::detail::PeerIdentity peer;
  peer.rank = 3;
  peer.pid = 4242;
  peer.host = "host-b";
  ddp::detail::remember_peer_address("[127.0.0.1]:6522", peer);
  auto error = as<ddp::PeerLostError>(classified(
      "all_reduce", std::runtime_error("[pair.cc:589] Read error [127.0.0.1]:6522: Connection "
                                       "reset by peer")));
  EXPECT_EQ(error.lost_rank(), 3);
  EXPECT_EQ(error.lost_host(), "host-b");
  EXPECT_EQ(error.operation(), "all_reduce");
  auto other = as<ddp::PeerLostError>(
      classified("all_reduce", std::runtime_error("Connection closed by peer [127.0.0.1]:65220")));
  EXPECT_EQ(other.lost_rank(), -1);
  ddp::detail::forget_peer_addresses();
  auto forgotten = as<ddp::PeerLostError>(classified(
      "all_reduce", std::runtime_error("Read error [127.0.0.1]:6522: Connection reset by peer")));
  EXPECT_EQ(forgotten.lost_rank(), -1);
}

// A rank's identity travels through the store as text, and says when its process is known gone or
// known to run (the same process, not a later one given its pid), only where its pid means
// something (this machine's boot, this PID namespace).
TEST(PeerIdentity, TellsAnExitedOrARunningProcessOnlyWhereItsPidMeansSomething) {
  auto me = ddp::detail::PeerIdentity::of_this_process(5);
  auto copy = ddp::detail::PeerIdentity::parse(me.text());
  EXPECT_EQ(copy.rank, 5);
  EXPECT_EQ(copy.pid, me.pid);
  EXPECT_EQ(copy.host, me.host);
  EXPECT_FALSE(copy.pid_space.empty());
  EXPECT_EQ(copy.pid_space, me.pid_space);
  EXPECT_NE(copy.start_time, 0u);
  EXPECT_EQ(copy.start_time, me.start_time);
  EXPECT_FALSE(copy.known_to_have_exited());
  EXPECT_TRUE(copy.known_to_be_running());

  auto successor = copy;  // a later process given the same pid
  successor.start_time = copy.start_time - 1;
  EXPECT_TRUE(successor.known_to_have_exited());
  EXPECT_FALSE(successor.known_to_be_running());

  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  auto gone = me;
  gone.pid = child;
  EXPECT_TRUE(gone.known_to_have_exited());
  EXPECT_FALSE(gone.known_to_be_running());
  gone.pid_space = "another-boot/pid:[1]";
  EXPECT_FALSE(gone.known_to_have_exited());
  gone.pid_space.clear();
  EXPECT_FALSE(gone.known_to_have_exited());
  EXPECT_EQ(ddp::detail::PeerIdentity::parse(gone.text()).pid, child);  // no pid space: still read

  auto elsewhere = me;  // alive, but in a PID namespace this process cannot see into
  elsewhere.pid_space = "another-boot/pid:[1]";
  EXPECT_FALSE(elsewhere.known_to_be_running());
}

// A stopped process (SIGSTOP, Ctrl-Z, a debugger) runs but cannot answer: timeouts name it so.
TEST(PeerIdentity, TellsAStoppedProcessUntilItIsContinued) {
  pid_t child = ::fork();
  if (child == 0) {
    for (;;) ::pause();
  }
  ASSERT_GT(child, 0);
  auto peer = ddp::detail::PeerIdentity::of_this_process(3);
  peer.pid = child;
  peer.start_time = 0;  // the child's own is not known here
  EXPECT_FALSE(peer.known_to_be_stopped());
  EXPECT_EQ(ddp::detail::describe_stopped({peer}), "");

  ASSERT_EQ(::kill(child, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  EXPECT_TRUE(peer.known_to_be_stopped());
  EXPECT_TRUE(peer.known_to_be_running());
  const std::string said = ddp::detail::describe_stopped({peer});
  EXPECT_NE(said.find("rank 3 (pid " + std::to_string(child)), std::string::npos) << said;
  EXPECT_NE(said.find("kill -CONT " + std::to_string(child)), std::string::npos) << said;

  ASSERT_EQ(::kill(child, SIGCONT), 0);
  ASSERT_EQ(::waitpid(child, &status, WCONTINUED), child);
  EXPECT_FALSE(peer.known_to_be_stopped());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}
