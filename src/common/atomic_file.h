// Writing a file so that readers see either its old content or the whole new one, never a part:
// the bytes go to a temporary file beside the destination (same folder, hence same filesystem),
// which is then renamed over it. Shared by the library (checkpoints, flight records) and ddprun
// (the diagnosis, the merged timeline); plain C++17 and POSIX, no libtorch.
//
// The temporary is "<path>.tmp.<pid>.<time>.<n>", unique to this call, and this process holds an
// exclusive flock on it while writing: a failed call removes it; a process killed mid-write leaves
// it, and remove_stale_temporaries(path) recognises it by its name, its writer's pid and its lock.
//
// Thread-safe: concurrent calls use different temporaries (the last rename wins).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace ddp::detail {

struct AtomicWriteOptions {
  /// fsync the file before the rename and its folder after it (best effort for the folder), so
  /// that the new content survives a crash of the machine. Default: false.
  bool durable = false;
  /// The new file's permissions, before the umask. Default: 0666 (what fopen gives).
  mode_t mode = 0666;
};

/// What write_file_atomically did: nothing failed (ok()), or the step that failed and its errno.
struct AtomicWriteResult {
  std::string path;         // the destination
  std::string temporary;    // the temporary file's name (gone by the time this is returned)
  std::string failed_step;  // "" on success, else "create", "write", "fsync", "close", "rename"
  int error = 0;            // errno of the failed step

  bool ok() const { return failed_step.empty(); }
  /// "" on success, else what failed, to what, and why: "cannot rename <temporary> to <path>: Is a
  /// directory", "cannot fsync <temporary>: ...", "cannot create the temporary file <temporary>:
  /// No such file or directory. Does the folder <folder> exist and is it writable?"
  std::string message() const;
};

/// Writes `bytes` to `path` through a temporary file and a rename. On any failure the temporary
/// is removed and `path` is left as it was.
AtomicWriteResult write_file_atomically(const std::string& path, std::string_view bytes,
                                        const AtomicWriteOptions& options = {});

/// Removes the temporaries of `path` left by writers that are certainly gone (no process has their
/// pid and nobody holds their lock); never a live writer's. Best effort: a file that cannot be
/// examined stays.
void remove_stale_temporaries(const std::string& path);

}  // namespace ddp::detail
