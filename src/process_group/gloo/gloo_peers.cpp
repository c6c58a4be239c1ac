#include "process_group/gloo/gloo_peers.h"

#include <gloo/context.h>
#include <gloo/transport/context.h>

#include <sstream>
#include <stdexcept>
#include <thread>

#include "common/error_context.h"
#include "common/peer_directory.h"
#include "process_group/process_state.h"

namespace ddp::detail {
namespace {

// gloo::Context keeps its transport context (where the connections are) protected, and its
// getPair() is not inline, so calling it would tie this library to a libgloo it does not
// otherwise link (pip's libtorch carries gloo inside). A pointer to the protected member, taken
// in a derived class as C++ allows, reaches the same object; the pairs are then reached through
// virtual calls, which need no symbol.
struct TransportContextOf : ::gloo::Context {
  static constexpr auto member = &TransportContextOf::transportContext_;
};

std::string peer_key(int group_rank) { return "ddp_gloo_peer/" + std::to_string(group_rank); }

// "RANK PID HOST\nADDRESS\nADDRESS...": the local address of each connection of each context.
std::string describe_this_process(const std::vector<std::shared_ptr<::gloo::Context>>& contexts) {
  std::ostringstream out;
  out << PeerIdentity::of_this_process(current_global_rank()).text() << '\n';
  for (const auto& context : contexts) {
    const auto& transport = (*context).*TransportContextOf::member;
    if (!transport) continue;
    for (int peer = 0; peer < context->size; ++peer) {
      if (peer == context->rank) continue;
      const auto& pair = transport->getPair(peer);
      if (pair) out << pair->address().str() << '\n';
    }
  }
  return out.str();
}

void remember(const std::vector<uint8_t>& published) {
  std::istringstream in(std::string(published.begin(), published.end()));
  std::string line;
  std::getline(in, line);
  const PeerIdentity peer = PeerIdentity::parse(line);
  std::string address;
  while (in >> address) remember_peer_address(address, peer);
}

}  // namespace

void learn_gloo_peers(const std::vector<std::shared_ptr<::gloo::Context>>& contexts,
                      c10d::Store& store, int group_rank, const std::vector<PeerIdentity>& members,
                      std::chrono::milliseconds timeout, const std::string& operation) {
  const std::string mine = describe_this_process(contexts);
  std::vector<std::string> keys;
  std::vector<int> others;
  // A member that did not say who it is at arrival is no ddp-cpp rank (a torch.distributed one,
  // in a job shared with Python): it publishes nothing either.
  for (int other = 0; other < static_cast<int>(members.size()); ++other) {
    if (other == group_rank || members[other].pid == 0) continue;
    keys.push_back(peer_key(other));
    others.push_back(other);
  }
  try {
    store.set(peer_key(group_rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    // Polled, not store.wait: a wait holds the store client for its whole length, and the
    // thread that watches for lost members (gloo_connect.h) must get its requests through.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!keys.empty() && !store.check(keys)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throw std::runtime_error("timed out waiting for the other members' connections");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (const auto& key : keys) remember(store.get(key));
  } catch (const std::exception& error) {
    std::string silent;   // who did not publish
    std::string waiting;  // of them, those not known to be stopped
    std::vector<PeerIdentity> silent_members;
    for (int other : others) {
      bool published = false;
      try {
        published = store.check({peer_key(other)});
      } catch (const std::exception&) {
        // The store is gone (its host, rank 0, exited): every member is in doubt.
      }
      if (published) continue;
      silent += (silent.empty() ? "" : ", ") + members[other].describe();
      silent_members.push_back(members[other]);
      if (!members[other].known_to_be_stopped()) {
        waiting += (waiting.empty() ? "" : ", ") + members[other].describe();
      }
    }
    if (silent.empty()) rethrow_backend_failure(operation, error);
    const std::string stopped = describe_stopped(silent_members);
    if (!stopped.empty()) {
      fail<TimeoutError>(
          operation,
          "the gloo group was not made within " + std::to_string(timeout.count()) +
              " ms: " + stopped +
              (waiting.empty() ? std::string() : " " + waiting + " did not go on either."));
    }
    fail<TimeoutError>(operation, silent +
                                      " connected to this rank through gloo but did not go on "
                                      "within " +
                                      std::to_string(timeout.count()) +
                                      " ms: they stopped or exited while the group was being "
                                      "made. Their own output says why.");
  }
}

}  // namespace ddp::detail
