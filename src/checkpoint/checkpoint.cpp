#include "ddp/checkpoint.h"

#include <sys/stat.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <vector>

#include "checkpoint/optimizer_state.h"
#include "checkpoint/python_pickle.h"
#include "checkpoint/torch_save_format.h"
#include "common/atomic_file.h"
#include "common/error_context.h"
#include "ddp/collectives.h"
#include "ddp/errors.h"
#include "ddp/init.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "fully_shard/sharded_module.h"
#include "trace/flight_recorder.h"
#include "trace/timeline.h"

namespace ddp {
namespace {

constexpr const char* kSave = "save_checkpoint";
constexpr const char* kLoad = "load_checkpoint";
constexpr const char* kPrefix = "module.";

std::string errno_text(int error) { return std::strerror(error); }

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Drops "module." from every name when every name has it: the state of a Python DDP model, or of
// a module that wraps its model in a child named "module". Any equivalent module then matches.
NamedTensors without_common_prefix(NamedTensors entries) {
  bool prefixed = !entries.empty();
  for (const auto& entry : entries) {
    if (entry.first.rfind(kPrefix, 0) != 0) prefixed = false;
  }
  if (prefixed) {
    for (auto& entry : entries) entry.first = entry.first.substr(std::strlen(kPrefix));
  }
  return entries;
}

// A module's parameters and buffers under the names a checkpoint uses for them.
NamedTensors module_state(const torch::nn::Module& module) {
  NamedTensors entries;
  for (const auto& item : module.named_parameters()) entries.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers()) entries.emplace_back(item.key(), item.value());
  return without_common_prefix(std::move(entries));
}

struct WriteFailure {
  std::string cause;      // "" on success
  bool bad_path = false;  // the caller's path is unusable (no such folder, not writable)
};

// Writes `bytes` to `path` atomically and durably (common/atomic_file.h). The temporary file never
// survives a failure of this process; a killed one's is removed by the next save.
WriteFailure write_atomically(const std::string& path, const std::vector<char>& bytes) {
  detail::remove_stale_temporaries(path);
  detail::AtomicWriteOptions options;
  options.durable = true;
  options.mode = 0644;
  const detail::AtomicWriteResult written =
      detail::write_file_atomically(path, std::string_view(bytes.data(), bytes.size()), options);
  if (written.ok()) return {};
  const int error = written.error;
  const bool bad_path =
      written.failed_step == "create"
          ? error == ENOENT || error == ENOTDIR || error == EACCES || error == EROFS
          : written.failed_step == "rename" && (error == EISDIR || error == EACCES);
  return {written.message(), bad_path};
}

// `whole_optimizer`: the optimizer's state already made whole (a sharded model's), or None.
std::vector<char> serialize(const NamedTensors& module_state,
                            const torch::optim::Optimizer* optimizer,
                            const c10::IValue& whole_optimizer, const ExtraState& extra) {
  c10::Dict<std::string, at::Tensor> model;
  // On the CPU whatever the device (a no-op for CPU tensors): a checkpoint saved on a GPU loads
  // on a machine without one, and into a module on any device.
  for (const auto& [name, tensor] : module_state) {
    model.insert(name, tensor.detach().cpu());
  }
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("model", model);
  if (!whole_optimizer.isNone()) {
    top.insert("optimizer", whole_optimizer);
  } else if (const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(optimizer)) {
    // The whole state, consolidated on this rank beforehand (state_dict() says so otherwise).
    top.insert("optimizer", zero->state_dict());
  } else if (optimizer != nullptr) {
    top.insert("optimizer", detail::optimizer_state_dict(*optimizer, kSave));
  }
  for (const auto& [key, value] : extra) {
    if (key == "model" || key == "optimizer") {
      detail::fail<InvalidArgumentError>(
          kSave, "an extra entry is named \"" + key +
                     "\", a name the checkpoint keeps for itself; rename it.");
    }
    top.insert(key, value.isTensor() ? c10::IValue(value.toTensor().detach().cpu()) : value);
  }
  return detail::torch_save_bytes(top);
}

std::string first_line(const std::string& text) {
  auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// Everything load_checkpoint does; a failure that is not a DistributedError is the file's.
ExtraState load_checkpoint_file(const std::string& path, torch::nn::Module& module,
                                torch::optim::Optimizer* optimizer, const LoadOptions& options);

// The parameters of `optimizer`, numbered as its state dict numbers them (across its groups).
std::vector<at::Tensor> numbered_parameters(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> parameters;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) parameters.push_back(parameter);
  }
  return parameters;
}

// The state entries of parameter `index` in an optimizer state dict, or none.
std::optional<c10::impl::GenericDict> state_of(const c10::IValue& state_dict, int64_t index) {
  if (!state_dict.isGenericDict()) return std::nullopt;
  const auto top = state_dict.toGenericDict();
  const auto state = top.find(std::string("state"));
  if (state == top.end() || !state->value().isGenericDict()) return std::nullopt;
  const auto per_parameter = state->value().toGenericDict();
  const auto entries = per_parameter.find(index);
  if (entries == per_parameter.end() || !entries->value().isGenericDict()) return std::nullopt;
  return entries->value().toGenericDict();
}

// A sharded model's optimizer keeps per-element state (momentum, Adam's moments) in the shards'
// rows: in a checkpoint it is whole, as a plain optimizer of the whole model would have it.
// Gathered from every rank (collective: every rank has the same entries, in the same order).
c10::IValue whole_optimizer_state(const torch::nn::Module& module,
                                  const torch::optim::Optimizer& optimizer) {
  c10::IValue saved = detail::optimizer_state_dict(optimizer, kSave);
  const auto shard_rows = detail::shard_rows_of(module);
  const auto parameters = numbered_parameters(optimizer);
  for (size_t index = 0; index < parameters.size(); ++index) {
    if (!shard_rows.count(parameters[index].unsafeGetTensorImpl())) continue;
    auto entries = state_of(saved, static_cast<int64_t>(index));
    if (!entries) continue;
    std::vector<std::pair<c10::IValue, at::Tensor>> whole;
    for (const auto& entry : *entries) {
      if (entry.value().isTensor() && entry.value().toTensor().dim() > 0 &&
          entry.value().toTensor().sizes() == parameters[index].sizes()) {
        whole.emplace_back(
            entry.key(), detail::gather_rows(module, parameters[index], entry.value().toTensor()));
      }
    }
    for (auto& [key, tensor] : whole) entries->insert_or_assign(key, tensor);
  }
  return saved;
}

// The other way: each whole per-element state tensor of a sharded parameter becomes this rank's
// rows of it, so that the optimizer of the shards loads it as a plain optimizer would.
c10::IValue sharded_optimizer_state(const torch::nn::Module& module,
                                    const torch::optim::Optimizer& optimizer,
                                    const c10::IValue& saved) {
  const auto shard_rows = detail::shard_rows_of(module);
  if (shard_rows.empty()) return saved;
  const auto parameters = numbered_parameters(optimizer);
  for (size_t index = 0; index < parameters.size(); ++index) {
    const auto rows = shard_rows.find(parameters[index].unsafeGetTensorImpl());
    if (rows == shard_rows.end()) continue;
    auto entries = state_of(saved, static_cast<int64_t>(index));
    if (!entries) continue;
    std::vector<std::pair<c10::IValue, at::Tensor>> sharded;
    for (const auto& entry : *entries) {
      // "step" is a count, not per element, whatever its shape.
      const bool step = entry.key().isString() && entry.key().toStringRef() == "step";
      if (!step && entry.value().isTensor() &&
          entry.value().toTensor().sizes() == at::IntArrayRef(rows->second.whole_shape)) {
        sharded.emplace_back(entry.key(), rows->second.of(entry.value().toTensor()));
      }
    }
    for (auto& [key, tensor] : sharded) entries->insert_or_assign(key, tensor);
  }
  return saved;
}

}  // namespace

void save_checkpoint(const std::string& path, const torch::nn::Module& module,
                     const torch::optim::Optimizer* optimizer, const ExtraState& extra) {
  detail::TimelineSpan span(kSave, "checkpoint");
  bool collective = is_initialized() && get_world_size() > 1;
  int rank = is_initialized() ? get_rank() : 0;
  // A sharded model is written whole: its parameters and its optimizer's state gathered on every
  // rank (collective), written by rank 0.
  const bool sharded = detail::holds_fully_sharded_units(module);
  const NamedTensors state =
      sharded ? without_common_prefix(detail::whole_module_state(module)) : module_state(module);
  c10::IValue whole_optimizer;
  if (sharded && optimizer != nullptr &&
      dynamic_cast<const ZeroRedundancyOptimizer*>(optimizer) == nullptr) {
    whole_optimizer = whole_optimizer_state(module, *optimizer);
  }
  WriteFailure failure;
  std::exception_ptr own_error;  // rank 0's own DistributedError, rethrown with its type
  if (rank == 0) {
    try {
      failure = write_atomically(path, serialize(state, optimizer, whole_optimizer, extra));
    } catch (const DistributedError& error) {
      if (!collective) throw;
      own_error = std::current_exception();
      failure.cause = error.what();
      failure.bad_path = dynamic_cast<const InvalidArgumentError*>(&error) != nullptr;
    } catch (const std::exception& error) {
      failure.cause = "cannot serialize the checkpoint: " + first_line(error.what());
    }
  }
  if (collective) {
    detail::TraceLabel label("save_checkpoint");
    // Rank 0 tells the others whether it wrote the file (and why not, and whether the caller's
    // path or arguments were at fault), so that they never wait for a file that will not come.
    auto header = at::tensor(
        {static_cast<int64_t>(failure.cause.size()), static_cast<int64_t>(failure.bad_path)},
        at::kLong);
    broadcast(header, 0);
    int64_t n = header[0].item<int64_t>();
    if (n > 0) {
      auto text = at::zeros({n}, at::kByte);
      if (rank == 0) std::memcpy(text.data_ptr(), failure.cause.data(), failure.cause.size());
      broadcast(text, 0);
      if (rank != 0) {
        std::string cause(static_cast<const char*>(text.data_ptr()), static_cast<size_t>(n));
        const std::string message = "rank 0 failed to write " + path + ": " + cause;
        if (header[1].item<int64_t>() != 0) detail::fail<InvalidArgumentError>(kSave, message);
        detail::fail(kSave, message);
      }
    } else {
      barrier();
    }
  }
  if (own_error) std::rethrow_exception(own_error);
  if (!failure.cause.empty()) {
    const std::string message = "failed to write " + path + ": " + failure.cause;
    if (failure.bad_path) detail::fail<InvalidArgumentError>(kSave, message);
    detail::fail(kSave, message);
  }
}

ExtraState load_checkpoint(const std::string& path, torch::nn::Module& module,
                           torch::optim::Optimizer* optimizer, bool strict) {
  return load_checkpoint(path, module, optimizer, LoadOptions().strict(strict));
}

ExtraState load_checkpoint(const std::string& path, torch::nn::Module& module,
                           torch::optim::Optimizer* optimizer, const LoadOptions& options) {
  try {
    return load_checkpoint_file(path, module, optimizer, options);
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& error) {
    // Whatever libtorch's readers throw on a damaged file, the caller learns which file it was.
    detail::fail<InvalidArgumentError>(
        kLoad, "cannot read " + path + ": " + first_line(error.what()) + ".");
  }
}

namespace {

ExtraState load_checkpoint_file(const std::string& path, torch::nn::Module& module,
                                torch::optim::Optimizer* optimizer, const LoadOptions& options) {
  // std::ifstream opens a folder without complaint and then reads nothing: look first.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    detail::fail<InvalidArgumentError>(kLoad,
                                       "cannot open " + path + ": " + errno_text(errno) + ".");
  }
  if (!S_ISREG(info.st_mode)) {
    detail::fail<InvalidArgumentError>(
        kLoad, path + (S_ISDIR(info.st_mode) ? " is a directory" : " is not a regular file") +
                   ", not a checkpoint file.");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    detail::fail<InvalidArgumentError>(kLoad,
                                       "cannot open " + path + ": " + errno_text(errno) + ".");
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue loaded;
  try {
    loaded = torch::jit::pickle_load(bytes);
  } catch (const std::exception& error) {
    // libtorch's unpickler cannot read Python's OrderedDicts (every state_dict()): read those.
    try {
      loaded = detail::load_python_pickle(path);
    } catch (const std::exception&) {
      detail::fail<InvalidArgumentError>(
          kLoad, path +
                     " is not a checkpoint in torch.save / ddp::save_checkpoint "
                     "(pickle_save) format, or it is truncated (" +
                     first_line(error.what()) + ").");
    }
  }
  if (!loaded.isGenericDict()) {
    detail::fail<InvalidArgumentError>(kLoad,
                                       path + " holds a " + loaded.tagKind() +
                                           ", not a dict: expected a checkpoint or a state dict.");
  }
  auto top = loaded.toGenericDict();
  // Ours and Python's {"model": state_dict, ...}, or a bare state dict.
  c10::impl::GenericDict state = top;
  ExtraState extra;
  c10::IValue saved_optimizer;
  auto model_it = top.find(std::string("model"));
  if (model_it != top.end() && model_it->value().isGenericDict()) {
    state = model_it->value().toGenericDict();
    for (const auto& item : top) {
      if (!item.key().isString()) continue;
      const auto& key = item.key().toStringRef();
      if (key == "model") continue;
      if (key == "optimizer") {
        saved_optimizer = item.value();
      } else if (item.value().isTensor()) {
        extra[key] = item.value().toTensor().to(options.map_location());
      } else {
        extra[key] = item.value();
      }
    }
  }
  NamedTensors file_entries;
  for (const auto& item : state) {
    if (!item.key().isString() || !item.value().isTensor()) {
      detail::fail<InvalidArgumentError>(
          kLoad, path + "'s state dict has an entry that is not name -> tensor (" +
                     item.key().tagKind() + " -> " + item.value().tagKind() + ").");
    }
    file_entries.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  std::map<std::string, at::Tensor> saved;
  for (auto& [name, tensor] : without_common_prefix(std::move(file_entries))) saved[name] = tensor;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  std::vector<std::string> missing;
  std::set<std::string> used;
  // A sharded parameter takes its rows of the whole saved tensor.
  const auto shard_rows = detail::shard_rows_of(module);
  auto match = [&](const std::string& name, const at::Tensor& target) {
    auto it = saved.find(name);
    if (it == saved.end()) {
      missing.push_back(name);
      return;
    }
    used.insert(name);
    auto shard = shard_rows.find(target.unsafeGetTensorImpl());
    if (shard != shard_rows.end()) {
      if (it->second.sizes() != at::IntArrayRef(shard->second.whole_shape)) {
        detail::fail<InvalidArgumentError>(
            kLoad, "shape mismatch for \"" + name + "\": " + path + " has " +
                       c10::str(it->second.sizes()) + ", the (sharded) module has " +
                       c10::str(at::IntArrayRef(shard->second.whole_shape)) + ".");
      }
      copies.emplace_back(target, shard->second.of(it->second));
      return;
    }
    if (it->second.sizes() != target.sizes()) {
      detail::fail<InvalidArgumentError>(kLoad, "shape mismatch for \"" + name + "\": " + path +
                                                    " has " + c10::str(it->second.sizes()) +
                                                    ", the module has " + c10::str(target.sizes()) +
                                                    ".");
    }
    copies.emplace_back(target, it->second);
  };
  for (const auto& [name, tensor] : module_state(module)) match(name, tensor);
  std::vector<std::string> unexpected;
  for (const auto& [name, tensor] : saved) {
    if (used.count(name) == 0) unexpected.push_back(name);
  }
  if (options.strict() && (!missing.empty() || !unexpected.empty())) {
    std::string cause = path + " does not match the module:";
    if (!missing.empty()) cause += " missing keys: " + join(missing) + ";";
    if (!unexpected.empty()) cause += " unexpected keys: " + join(unexpected) + ";";
    detail::fail<InvalidArgumentError>(
        kLoad, cause + " load with LoadOptions().strict(false) to load what matches.");
  }
  if (optimizer != nullptr && saved_optimizer.isNone()) {
    detail::fail<InvalidArgumentError>(
        kLoad, path + " has no optimizer state (\"optimizer\"); pass no optimizer.");
  }
  // The optimizer first: it checks all of its state before changing any, so that a bad file
  // leaves both the optimizer and the module as they were.
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(optimizer)) {
    zero->load_state_dict(saved_optimizer);  // this rank's partition, at any world size
  } else if (optimizer != nullptr) {
    detail::load_optimizer_state_dict(
        *optimizer, sharded_optimizer_state(module, *optimizer, saved_optimizer), path, kLoad);
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& [target, value] : copies) target.copy_(value);
  }
  return extra;
}

}  // namespace

}  // namespace ddp
