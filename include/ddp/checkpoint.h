// Checkpoints: save_checkpoint / load_checkpoint, in the format of torch.save, so that Python's
// torch.load reads ours and we read Python's.
//
// A checkpoint is a pickled dict (torch::pickle_save, the zip format of torch.save):
//   "model"     -> the state dict: every named parameter and buffer, names without "module.";
//   "optimizer" -> when an optimizer is given, its state in PyTorch's layout
//                  {"state": {param_index: {...}}, "param_groups": [{options..., "params": [...]}]}
//                  (SGD, Adam, AdamW; a ZeroRedundancyOptimizer's consolidated state);
//   then the `extra` entries (epoch, step, ...).
// Tensors are saved on the CPU whatever their device (torch.save's map_location="cpu", applied
// when saving): a checkpoint written from GPU parameters loads on a machine without a GPU, in
// Python with a plain torch.load, and into a module on any device.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <map>
#include <string>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace ddp {

/// Entries saved next to the model and the optimizer (epoch, step, ...), returned by load.
using ExtraState = std::map<std::string, c10::IValue>;

/// Options of load_checkpoint.
struct LoadOptions {
  /// true: every parameter and buffer of the module must be in the checkpoint and every entry of
  /// the checkpoint's state dict must be in the module (missing and unexpected keys are listed in
  /// the error). false: loads the entries whose names match and ignores the others. A shape
  /// mismatch is an error either way. Default: true.
  TORCH_ARG(bool, strict) = true;
  /// Where tensors among the extra entries are placed, as torch.load's map_location. The module's
  /// parameters and buffers, and the optimizer's state, always go where the module's parameters
  /// are (the values are copied into them). Default: the CPU.
  TORCH_ARG(c10::Device, map_location) = c10::Device(c10::kCPU);
};

/// Saves `module` (and `optimizer`, and `extra`) to `path`.
///
/// Collective when a default process group exists: every rank calls it; rank 0 writes the file
/// atomically (a temporary file in the same folder, fsync'ed, renamed over `path`, the folder
/// fsync'ed) while the others wait; a failure on rank 0 is thrown on every rank. Without a group
/// the calling process writes alone. Only rank 0's module and optimizer are saved.
/// Optimizers: torch::optim::SGD, Adam and AdamW, and a ddp::ZeroRedundancyOptimizer whose state
/// was consolidated on rank 0 first (consolidate_state_dict(0) on every rank); loading hands each
/// rank of any world size its partition.
void save_checkpoint(const std::string& path, const torch::nn::Module& module,
                     const torch::optim::Optimizer* optimizer = nullptr,
                     const ExtraState& extra = {});

/// Loads a checkpoint into `module` (and `optimizer`) and returns its extra entries.
///
/// Reads: our checkpoints, Python's torch.save({"model": m.state_dict(), ...}) and a plain
/// torch.save(m.state_dict()); names with DDP's "module." prefix are stripped. Not collective:
/// every rank reads the file itself. Values are copied into the existing parameters, buffers and
/// optimizer state (the optimizer must have the same parameter groups as the saved one).
ExtraState load_checkpoint(const std::string& path, torch::nn::Module& module,
                           torch::optim::Optimizer* optimizer = nullptr,
                           const LoadOptions& options = LoadOptions());

/// Shorthand for load_checkpoint(path, module, optimizer, LoadOptions().strict(strict)).
ExtraState load_checkpoint(const std::string& path, torch::nn::Module& module,
                           torch::optim::Optimizer* optimizer, bool strict);

}  // namespace ddp
