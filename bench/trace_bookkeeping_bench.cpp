// trace_bookkeeping_bench: the flight recorder's own cost per collective, without a collective.
//
//   build/bench/trace_bookkeeping_bench [--timeline DIR]
//
// One thread runs, a million times, what an all_reduce asks of the recorder (src/trace): open the
// entry, describe and start it, hand the slot to a Work (which keeps the recorder alive) and
// complete it. Prints the time per collective for each of five rounds, as JSON lines; the best is
// the cost with the least interference from the machine. With --timeline DIR the timeline
// (trace/timeline.h) is on, writing DIR/timeline_rank0.json: each completed collective then also
// becomes its four events there, and each call adds one span, as a DDP bucket's all-reduce does.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "trace/flight_recorder.h"
#include "trace/timeline.h"

int main(int argc, char** argv) {
  using namespace ddp::detail;
  const bool timeline = argc == 3 && std::string(argv[1]) == "--timeline";
  if (argc != 1 && !timeline) {
    std::fprintf(stderr, "usage: trace_bookkeeping_bench [--timeline DIR]\n");
    return 2;
  }
  if (timeline) {
    open_timeline(argv[2], 0);
    start_timeline(0);
  }
  auto recorder = std::make_shared<FlightRecorder>(2000, "0", std::vector<int>{0, 1}, 0);
  const std::string operation = "all_reduce";
  const std::string backend = "shm";
  // With the timeline, fewer: each collective writes about 700 bytes of events.
  const int kCalls = timeline ? 100000 : 1000000;
  const char* backend_name = lasting_backend_name(backend);
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) {
      TraceSlot slot;
      slot.recorder = recorder.get();
      slot.sequence = recorder->open(operation, TraceLabel::current());
      ActiveTraceScope active(&slot);
      slot.tensor.dtype = 6;  // Float
      slot.tensor.numel = 2;
      slot.tensor.dims = 1;
      slot.tensor.sizes[0] = 2;
      slot.backend = backend_name;  // as Backend::lasting_name() gives it, looked up once
      slot.changed = true;
      recorder->mark_started(slot);
      TraceSlot work = slot;
      std::shared_ptr<FlightRecorder> kept = recorder->shared_from_this();
      recorder->mark_completed(work);
      if (timeline) timeline_bucket_span(0, "all-reduce", 1, 2);
    }
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
        kCalls;
    std::printf("{\"round\": %d, \"timeline\": %s, \"ns_per_collective\": %.1f}\n", round,
                timeline ? "true" : "false", ns);
  }
  if (timeline) stop_timeline();
}
