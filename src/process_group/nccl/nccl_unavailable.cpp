// CPU builds of libtorch: no NCCL. backend_factory.cpp asks nccl_compiled_in() before it would
// make one, and tells the user why "nccl" is refused.
#include "common/error_context.h"
#include "process_group/gpu_inventory.h"
#include "process_group/nccl/nccl_backend.h"

namespace ddp::detail {

bool nccl_compiled_in() { return false; }

int visible_gpus() { return 0; }

std::string local_gpu_identity() { return ""; }

void prepare_nccl_error_handling() {}

std::shared_ptr<Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                           std::chrono::milliseconds, const std::string& operation,
                                           bool) {
  fail<InvalidArgumentError>(
      operation, "backend 'nccl' is not available: this libtorch was built without CUDA");
}

}  // namespace ddp::detail
