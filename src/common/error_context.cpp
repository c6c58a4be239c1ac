#include "common/error_context.h"

#include "ddp/errors.h"
#include "process_group/process_state.h"

namespace ddp::detail {

std::string context(const std::string& operation) {
  int rank = current_global_rank();
  return "[rank " + (rank < 0 ? std::string("?") : std::to_string(rank)) + "] ddp::" + operation;
}

void fail(const std::string& operation, const std::string& cause) {
  throw DistributedError(context(operation) + ": " + cause);
}

void rethrow_backend_failure(const std::string& operation, const std::exception& error) {
  if (dynamic_cast<const DistributedError*>(&error) != nullptr) throw;
  std::string what = error.what();
  // c10::Error appends a C++ backtrace after the first line; keep the message readable.
  auto backtrace = what.find("\nException raised from");
  if (backtrace != std::string::npos) what.resize(backtrace);
  std::string hint;
  if (what.find("Connection closed by peer") != std::string::npos ||
      what.find("Connection reset") != std::string::npos ||
      what.find("Broken pipe") != std::string::npos) {
    hint =
        " A peer process closed its connection: it probably exited or crashed during the "
        "collective. Look at the other ranks' output for the first error.";
  } else if (what.find("Invalid scalar type") != std::string::npos) {
    hint =
        " Gloo reduces and moves float, double, half, int8, uint8, int32 and int64 tensors "
        "(complex ones as pairs of reals); convert the tensor to one of these dtypes.";
  } else if (what.find("Duplicate GPU") != std::string::npos) {
    hint =
        " Two ranks of this NCCL group use the same GPU, and NCCL needs one GPU per rank: give "
        "each rank its own device (ddp::set_device() before init_process_group, with at most "
        "one rank per GPU), or let ranks share a GPU through backend(\"gloo\").";
  } else if (what.find("imed out") != std::string::npos ||
             what.find("Timeout") != std::string::npos ||
             what.find("timeout") != std::string::npos) {
    hint =
        " A peer did not take part within the group timeout (InitOptions().timeout): it may "
        "be stuck, much slower, or calling a different collective.";
  }
  throw DistributedError(context(operation) + " failed: " + what + "." + hint);
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
