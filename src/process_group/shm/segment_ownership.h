// Whose a shared-memory segment is: its name says the job, the attempt and the creator's pid, and
// the creator's liveness says whether anybody will still unlink it.
//
// Names are "/ddp-cpp.<job>.<attempt>.g<group>.h<host>.r<random>.p<creator pid>": the job and
// attempt say whose it is, the random token keeps two jobs that share /dev/shm (and perhaps pids,
// from different containers) apart, and the creator's pid lets ddprun remove a segment whose
// creator died in the short window before it unlinks the name (see tools/ddprun/shm_cleanup.h).
//
// Plain C++ and POSIX, no libtorch: ddprun compiles this file too, so that both agree on names.
#pragma once

#include <cstdint>
#include <string>

namespace ddp::detail {

/// The segment name for a group's ranks on one host; characters outside [A-Za-z0-9_-] in the job
/// id become '_' and it is cut to keep the name well under NAME_MAX.
std::string shm_segment_name(const std::string& job, int attempt, const std::string& group,
                             int host_index, uint32_t token, int creator_pid);

/// "ddp-cpp.<job>.<attempt>.": how every segment name of that attempt of the job starts, without
/// the leading '/' (as a directory listing of /dev/shm shows it).
std::string shm_segment_prefix(const std::string& job, int attempt);

/// The creator pid that ends a segment name (".p<pid>"), or -1 if the name has none.
int shm_segment_creator(const std::string& name);

/// True while process `pid` exists and is not a zombie (a killed rank not yet reaped is dead).
bool process_is_alive(int pid);

}  // namespace ddp::detail
