#include "common/error_context.h"

#include "common/peer_directory.h"
#include "process_group/process_state.h"
#include "trace/trace_dump.h"

namespace ddp::detail {
namespace {

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

// gloo names the peer of a closed connection: "Connection closed by peer [10.0.0.2]:51234".
std::string peer_address(const std::string& what) {
  auto open = what.find("peer [");
  if (open == std::string::npos) return "";
  open += 6;
  auto close = what.find(']', open);
  return close == std::string::npos ? "" : what.substr(open, close - open);
}

}  // namespace

bool reports_a_lost_connection(const std::string& what) {
  for (const char* sign : {"Connection closed by peer", "Connection reset", "Broken pipe"}) {
    if (what.find(sign) != std::string::npos) return true;
  }
  return false;
}

bool reports_a_timeout(const std::string& what) {
  return contains(what, "imed out") || contains(what, "Timeout") || contains(what, "timeout");
}

std::string context(const std::string& operation) {
  int rank = current_global_rank();
  return "[rank " + (rank < 0 ? std::string("?") : std::to_string(rank)) + "] ddp::" + operation;
}

int reporting_rank() { return current_global_rank(); }

std::string user_call(const std::string& operation) {
  return operation.substr(0, operation.find_first_of(" ("));
}

void fail_peer_lost(const std::string& operation, const std::string& cause, int lost_rank,
                    const std::string& lost_host) {
  raise_error(PeerLostError(context(operation) + ": " + cause, reporting_rank(),
                            user_call(operation), lost_rank, lost_host));
}

namespace {

// The same error, of the same type, reported for `call`: a backend names its own step (the
// fingerprint's all_gather), the user wants the call they made (all_reduce).
[[noreturn]] void rethrow_for_call(const std::string& call, const DistributedError& error) {
  if (error.operation() == call || call.empty()) {
    note_failure(error);
    throw;
  }
  std::string message = error.what();
  const std::string step = "] ddp::" + error.operation();
  if (const auto at = message.find(step); at != std::string::npos) {
    message.replace(at, step.size(), "] ddp::" + call + " (in its step " + error.operation() + ")");
  }
  throw_like(error, message, call);
}

}  // namespace

void throw_like(const DistributedError& error, const std::string& message,
                const std::string& call) {
  const int rank = error.rank();
  if (const auto* lost = dynamic_cast<const PeerLostError*>(&error)) {
    raise_error(PeerLostError(message, rank, call, lost->lost_rank(), lost->lost_host()));
  }
  if (dynamic_cast<const TimeoutError*>(&error)) raise_error(TimeoutError(message, rank, call));
  if (dynamic_cast<const UnevenInputsError*>(&error)) {
    raise_error(UnevenInputsError(message, rank, call));
  }
  if (dynamic_cast<const MismatchError*>(&error)) raise_error(MismatchError(message, rank, call));
  if (dynamic_cast<const StoreError*>(&error)) raise_error(StoreError(message, rank, call));
  if (dynamic_cast<const InvalidArgumentError*>(&error)) {
    raise_error(InvalidArgumentError(message, rank, call));
  }
  raise_error(DistributedError(message, rank, call));
}

void rethrow_backend_failure(const std::string& operation, const std::exception& error) {
  if (const auto* ours = dynamic_cast<const DistributedError*>(&error)) {
    rethrow_for_call(user_call(operation), *ours);
  }
  std::string what = error.what();
  // c10::Error appends a C++ backtrace after the first line; keep the message readable.
  auto backtrace = what.find("\nException raised from");
  if (backtrace != std::string::npos) what.resize(backtrace);
  const std::string message = context(operation) + " failed: " + what + ".";
  const int rank = reporting_rank();
  const std::string call = user_call(operation);
  auto peer = peer_named_in(what);
  if (reports_a_lost_connection(what)) {
    // A peer seen gone on this host is surer than the address gloo named (see
    // peer_known_to_have_exited); a peer on another host can only be named by its address.
    if (!peer || !peer->known_to_have_exited()) {
      if (auto gone = peer_known_to_have_exited(std::chrono::milliseconds(500))) peer = gone;
    }
    if (peer) {
      raise_error(
          PeerLostError(context(operation) + " failed: " + peer->describe() +
                            " closed its connection to this rank: it exited or crashed during "
                            "the collective; its own output says why. (gloo: " +
                            what + ")",
                        rank, call, peer->rank, peer->host));
    }
    raise_error(PeerLostError(
        message + " A peer process closed its connection: it probably exited or "
                  "crashed during the collective. Look at the other ranks' output for "
                  "the first error.",
        rank, call, -1, peer_address(what)));
  }
  if (contains(what, "Invalid scalar type")) {
    raise_error(InvalidArgumentError(
        message +
            " Gloo reduces and moves float, double, half, int8, uint8, int32 and int64 tensors "
            "(complex ones as pairs of reals); convert the tensor to one of these dtypes.",
        rank, call));
  }
  if (contains(what, "Duplicate GPU")) {
    raise_error(InvalidArgumentError(
        message +
            " Two ranks of this NCCL group use the same GPU, and NCCL needs one GPU per rank: "
            "give each rank its own device (ddp::set_device() before init_process_group, with at "
            "most one rank per GPU), or let ranks share a GPU through backend(\"gloo\").",
        rank, call));
  }
  if (reports_a_timeout(what)) {
    const std::string stopped = describe_stopped(known_peers());
    if (!stopped.empty()) raise_error(TimeoutError(message + " " + stopped, rank, call));
    raise_error(TimeoutError(
        message +
            (peer ? " The peer that did not answer: " + peer->describe() + "." : std::string()) +
            " A peer did not take part within the group timeout "
            "(InitOptions().timeout): it may be stuck, much slower, or calling a "
            "different collective.",
        rank, call));
  }
  raise_error(DistributedError(message, rank, call));
}

std::string join_ints(const std::vector<int>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(values[i]);
  }
  return out;
}

}  // namespace ddp::detail
