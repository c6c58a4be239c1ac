// Helpers that turn a waitpid() status into words ("exit code 3", "signal 9 (SIGKILL)") and into
// ddprun's own exit code (the worker's code, or 128+signal as shells do). Pure: thread-safe.
#pragma once

#include <string>

namespace ddprun {

// "SIGKILL" for 9, or "" for a signal this table does not know.
std::string SignalName(int signal_number);

// "signal 9 (SIGKILL)", or "signal 77" for an unnamed one.
std::string DescribeSignal(int signal_number);

// "exit code 3" or "signal 9 (SIGKILL)" for a status from waitpid().
std::string DescribeWaitStatus(int status);

// The code a shell would report for `status`: the exit code, or 128+signal.
int ExitCodeForWaitStatus(int status);

// True when `status` is a normal exit with code 0.
bool IsSuccess(int status);

}  // namespace ddprun
