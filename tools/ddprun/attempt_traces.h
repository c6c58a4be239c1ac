// AttemptTraces: the folder of flight records (DDP_CPP_TRACE_DIR) that ddprun gives each attempt
// of the worker group, and what becomes of it.
//
// Unless ddprun's own environment sets DDP_CPP_TRACE_DIR (then the workers keep the user's folder,
// and ddprun only diagnoses what is in it when an attempt fails), each attempt gets a fresh folder,
// ROOT/attempt_N, ROOT being a new <run-id>_XXXXXX under --log-dir (torchrun's layout), or a new
// ddprun_<run-id>_XXXXXX under TMPDIR (or /tmp).
// A rank writes its record there when it raises a timeout, lost-peer or mismatch error (or gets
// SIGUSR1). When the attempt succeeds the folder is removed (and ROOT once empty); when it fails
// it is kept, named, and its records are diagnosed (trace_analysis.h), unless no rank wrote one
// (then it goes too). Not thread-safe.
#pragma once

#include <string>

#include "launcher_options.h"

namespace ddprun {

class AttemptTraces {
 public:
  // `user_dir`: DDP_CPP_TRACE_DIR as ddprun found it, "" when unset.
  AttemptTraces(const LauncherOptions& options, std::string user_dir);
  ~AttemptTraces();
  AttemptTraces(const AttemptTraces&) = delete;
  AttemptTraces& operator=(const AttemptTraces&) = delete;

  // The folder attempt `restart_count` writes to, made where ddprun chooses it; "" and `error`
  // set when it cannot be made (the attempt then runs without one).
  std::string Begin(int restart_count, std::string* error);
  // Whether the workers must be given DDP_CPP_TRACE_DIR=Begin(...) (ddprun chose it).
  bool ChosenByDdprun() const { return user_dir_.empty(); }
  // After the attempt. Succeeded: removes a folder ddprun chose. Failed: keeps it and returns
  // what to print: where it is, and the diagnosis of the records in it (none: says so, and
  // removes a folder ddprun chose).
  std::string End(bool succeeded);

 private:
  const std::string log_dir_;
  const std::string run_id_;
  const std::string user_dir_;
  std::string root_;     // made on the first Begin
  std::string current_;  // this attempt's folder
};

// Removes `dir` and the files in it (it holds no folders); true when it is gone.
bool RemoveFlatFolder(const std::string& dir);

}  // namespace ddprun
