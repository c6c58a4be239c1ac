// Writing this rank's flight records (flight_recorder.h) to its trace folder.
//
// init_process_group starts recording (start_flight_recording) with the resolved settings, and
// every group it and new_group create gets a recorder from make_flight_recorder;
// destroy_process_group stops it. While recording with a trace folder, this rank writes
// <folder>/rank<R>.json, every group's entries, when
//   - it raises a TimeoutError, PeerLostError or MismatchError (note_failure, called where
//     error_context.h raises them): at once, on the raising thread, before the error reaches the
//     caller, with the collective it was in marked failed. UnevenInputsError is not a failure
//     here: Join raises it on every rank on purpose, and the program goes on;
//   - it receives SIGUSR1, where the program left SIGUSR1 at its default action: the handler only
//     posts a semaphore; a thread of ours writes the file.
// The file is written to a temporary name and renamed, so a reader (ddprun) never sees half of
// one; a later dump replaces an earlier one. Format: docs in README.md, "the flight recorder".
//
// Thread-safety: every function may be called from any thread; dumps are serialised.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ddp/errors.h"
#include "trace/flight_recorder.h"

namespace ddp::detail {

struct TraceSettings {
  size_t buffer = 0;  // entries per group; 0: off
  std::string dir;    // "" : nowhere
  int rank = -1;
  int world_size = -1;
};

/// Starts recording for the job that init_process_group is making; replaces earlier settings.
void start_flight_recording(const TraceSettings& settings);
/// Stops recording and forgets every recorder (destroy_process_group).
void stop_flight_recording();
/// The settings in force (buffer 0 when not recording).
TraceSettings flight_recording_settings();

/// A recorder for a group this rank is a member of, registered for dumps; null when recording is
/// off.
std::shared_ptr<FlightRecorder> make_flight_recorder(const std::string& group_name,
                                                     const std::vector<int>& global_ranks,
                                                     int global_rank);

/// Writes every live recorder's entries to <dir>/rank<R>.json; `reason` says why. Returns the
/// path written, "" when there is no trace folder or nothing is recorded. Never throws: a dump
/// that cannot be written says so on stderr.
std::string dump_flight_records(const std::string& reason);

/// Called with every DistributedError just before it is thrown (error_context.h). For a
/// TimeoutError, PeerLostError or MismatchError (not UnevenInputsError), marks the collective this
/// thread is in (ActiveTraceScope) failed with that kind, and dumps once per failed entry.
void note_failure(const DistributedError& error);

/// The kind of failure an error is, for the recorder (kOther for the kinds that do not dump).
TraceFailure failure_kind(const DistributedError& error);

/// The JSON text of a dump (for tests and dump_flight_records).
std::string flight_records_json(const std::vector<std::shared_ptr<FlightRecorder>>& recorders,
                                const TraceSettings& settings, const std::string& reason);

}  // namespace ddp::detail
