#include "ddp/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include "checkpoint/optimizer_state.h"
#include "checkpoint/python_pickle.h"
#include "checkpoint/torch_save_format.h"
#include "common/error_context.h"
#include "ddp/collectives.h"
#include "ddp/errors.h"
#include "ddp/init.h"
#include "ddp/zero_redundancy_optimizer.h"
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

std::string folder_of(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The writer of "<name>.tmp.<pid>.<time>.<n>" is certainly gone when no process has its pid
// (ESRCH) and nobody holds the file's lock: the writer holds it while writing, and the kernel
// drops it when the writer dies. The pid test alone could be fooled by a writer in another pid
// namespace or on another host sharing the folder; the lock alone, by the moment between a
// writer's open and its flock.
bool writer_is_gone(const std::string& tmp, const std::string& pid_text) {
  char* end = nullptr;
  long pid = std::strtol(pid_text.c_str(), &end, 10);
  if (pid_text.empty() || *end != '\0' || pid <= 0 || pid == ::getpid()) return false;
  if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return false;
  int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool unlocked = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return unlocked;
}

// A save killed mid-write leaves its temporary file behind; the next save of the same path
// removes those whose writer is gone, and never a live writer's. Best effort: a file that cannot
// be examined stays.
void remove_stale_temporaries(const std::string& path) {
  const std::string prefix = base_name(path) + ".tmp.";
  const std::string folder = folder_of(path);
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const std::string tmp = folder + "/" + name;
    if (writer_is_gone(tmp, rest.substr(0, rest.find('.')))) ::unlink(tmp.c_str());
  }
  ::closedir(dir);
}

struct WriteFailure {
  std::string cause;      // "" on success
  bool bad_path = false;  // the caller's path is unusable (no such folder, not writable)
};

// Writes `bytes` to `path` atomically: a uniquely named temporary file in the same folder,
// written, fsync'ed and renamed over `path`, then the folder fsync'ed. The temporary file never
// survives a failure of this process (a killed one's is removed by the next save).
WriteFailure write_atomically(const std::string& path, const std::vector<char>& bytes) {
  static std::atomic<unsigned> counter{0};
  remove_stale_temporaries(path);
  auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(now) + "." +
                    std::to_string(counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    int error = errno;
    return {"cannot create the temporary file " + tmp + ": " + errno_text(error) +
                ". Does the folder " + folder_of(path) + " exist and is it writable?",
            error == ENOENT || error == ENOTDIR || error == EACCES || error == EROFS};
  }
  // Held until this process closes the file or dies: it marks the file as being written.
  ::flock(fd, LOCK_EX | LOCK_NB);
  auto give_up = [&](const std::string& step) {
    int error = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return WriteFailure{"cannot " + step + " " + tmp + ": " + errno_text(error)};
  };
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return give_up("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return give_up("fsync");
  int closed = ::close(fd);
  fd = -1;
  if (closed != 0) return give_up("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int error = errno;
    ::unlink(tmp.c_str());
    return {"cannot rename " + tmp + " to " + path + ": " + errno_text(error),
            error == EISDIR || error == EACCES};
  }
  int dir = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);  // best effort: the file is in place; some filesystems refuse fsync on folders
    ::close(dir);
  }
  return {};
}

std::vector<char> serialize(const torch::nn::Module& module,
                            const torch::optim::Optimizer* optimizer, const ExtraState& extra) {
  c10::Dict<std::string, at::Tensor> model;
  // On the CPU whatever the device (a no-op for CPU tensors): a checkpoint saved on a GPU loads
  // on a machine without one, and into a module on any device.
  for (const auto& [name, tensor] : module_state(module)) {
    model.insert(name, tensor.detach().cpu());
  }
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("model", model);
  if (const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(optimizer)) {
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

}  // namespace

void save_checkpoint(const std::string& path, const torch::nn::Module& module,
                     const torch::optim::Optimizer* optimizer, const ExtraState& extra) {
  detail::TimelineSpan span(kSave, "checkpoint");
  bool collective = is_initialized() && get_world_size() > 1;
  int rank = is_initialized() ? get_rank() : 0;
  WriteFailure failure;
  std::exception_ptr own_error;  // rank 0's own DistributedError, rethrown with its type
  if (rank == 0) {
    try {
      failure = write_atomically(path, serialize(module, optimizer, extra));
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
  auto match = [&](const std::string& name, const at::Tensor& target) {
    auto it = saved.find(name);
    if (it == saved.end()) {
      missing.push_back(name);
      return;
    }
    used.insert(name);
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
    detail::load_optimizer_state_dict(*optimizer, saved_optimizer, path, kLoad);
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& [target, value] : copies) target.copy_(value);
  }
  return extra;
}

}  // namespace

}  // namespace ddp
