#include "process_group/shm/shm_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "common/error_context.h"
#include "process_group/shm/segment_ownership.h"
#include "process_group/shm/shm_reduce.h"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;

size_t round_up(size_t value, size_t to) { return (value + to - 1) / to * to; }

size_t control_bytes(int local_size) {
  return round_up(round_up(sizeof(ShmHeader), 64) + local_size * sizeof(RankSlot), 4096);
}

size_t segment_bytes(int local_size) {
  return control_bytes(local_size) + 2 * (local_size + 1) * ShmCommunicator::kChunkBytes;
}

RankSlot* slots_of(void* base) {
  return reinterpret_cast<RankSlot*>(static_cast<char*>(base) + round_up(sizeof(ShmHeader), 64));
}

std::string name_key(int host_index) { return "shm/" + std::to_string(host_index) + "/segment"; }
std::string open_failed_key(int host_index) {
  return "shm/" + std::to_string(host_index) + "/open_failed";
}

}  // namespace

ShmCommunicator::ShmCommunicator(c10d::Store& store, const ShmGroupSetup& setup,
                                 const std::string& operation)
    : timeout_(setup.timeout) {
  const int local_size = static_cast<int>(setup.global_ranks.size());
  const size_t bytes = segment_bytes(local_size);
  if (setup.local_rank == 0) {
    std::random_device random;
    for (int tries = 0; tries < 8 && !segment_.data(); ++tries) {
      segment_ = ShmSegment::create(shm_segment_name(setup.job, setup.attempt, setup.group,
                                                     setup.host_index, random(), getpid()),
                                    bytes, operation);
    }
    if (!segment_.data()) {
      fail(operation, "8 random names for the shared-memory segment were all taken in /dev/shm");
    }
    auto* header = static_cast<ShmHeader*>(segment_.data());
    header->magic = kShmMagic;
    header->local_size = static_cast<uint32_t>(local_size);
    header->chunk_bytes = static_cast<uint32_t>(kChunkBytes);
    header->abort_claimed_by.store(-1);
    header->aborted_by.store(-1);
    header->abort_lost_rank.store(-1);
    slots_of(header)[0].pid.store(getpid());
    header->mapped.store(1);
    const std::string& name = segment_.name();
    store.set(name_key(setup.host_index), std::vector<uint8_t>(name.begin(), name.end()));
    // Unlink as soon as everyone has mapped it: then no exit, however abrupt, leaves it behind.
    const auto deadline = Clock::now() + setup.timeout;
    for (unsigned polls = 1; header->mapped.load() < static_cast<uint32_t>(local_size); ++polls) {
      // A rank that could not open the segment says why (every 10 ms is enough: this is the
      // failure path, and each look is a store round trip).
      if (polls % 50 == 0 && store.check({open_failed_key(setup.host_index)})) {
        std::vector<uint8_t> why = store.get(open_failed_key(setup.host_index));
        fail(operation, std::string(why.begin(), why.end()));
      }
      if (Clock::now() >= deadline) {
        std::vector<int> missing;
        for (int r = 1; r < local_size; ++r) {
          if (slots_of(header)[r].pid.load() == 0) missing.push_back(setup.global_ranks[r]);
        }
        fail<TimeoutError>(operation,
                           "ranks " + join_ints(missing) +
                               " of this host did not map the shared-memory segment within " +
                               std::to_string(setup.timeout.count()) +
                               " ms; did they start, and do they share /dev/shm with this rank?");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    segment_.unlink();
  } else {
    std::vector<uint8_t> name;
    try {
      name = store.get(name_key(setup.host_index));
    } catch (const std::exception& error) {
      rethrow_backend_failure(operation +
                                  " (waiting for this host's first rank to create the "
                                  "shared-memory segment)",
                              error);
    }
    try {
      segment_ = ShmSegment::open(std::string(name.begin(), name.end()), bytes, operation);
    } catch (const std::exception& error) {
      const std::string why =
          "rank " + std::to_string(setup.global_ranks[setup.local_rank]) + ": " + error.what();
      store.set(open_failed_key(setup.host_index), std::vector<uint8_t>(why.begin(), why.end()));
      throw;
    }
    auto* header = static_cast<ShmHeader*>(segment_.data());
    if (header->magic != kShmMagic || header->local_size != static_cast<uint32_t>(local_size) ||
        header->chunk_bytes != kChunkBytes) {
      fail(operation, "the shared-memory segment " + segment_.name() +
                          " was made by another version of ddp-cpp or for another group");
    }
    slots_of(header)[setup.local_rank].pid.store(getpid());
    header->mapped.fetch_add(1);
  }
  auto* header = static_cast<ShmHeader*>(segment_.data());
  sync_ = ShmSync(header, slots_of(header), setup.local_rank, local_size, setup.global_ranks,
                  setup.timeout);
  data_ = static_cast<char*>(segment_.data()) + control_bytes(local_size);
}

ShmCommunicator::~ShmCommunicator() {
  if (segment_.data()) sync_.mark_left();
}

char* ShmCommunicator::slot(int set, int rank) const {
  return data_ + (set * (local_size() + 1) + rank) * kChunkBytes;
}

char* ShmCommunicator::result(int set) const { return slot(set, local_size()); }

int ShmCommunicator::begin_round(const char* operation) {
  const int set = static_cast<int>(round_ & 1);
  if (round_ >= 2) {
    // The last round in this set ended at round_end_phase_[set]; a peer that has finished one
    // more phase has started the following round, so it is done reading this set.
    sync_.wait_for_all(round_end_phase_[set] + 1, deadline_, operation);
  }
  if (!call_published_) {
    // Only now: a peer still checking the call made two calls ago (same parity) has begun the
    // previous round, so it is done with that descriptor. A broadcast's root, which waits for
    // nobody, could otherwise overwrite it first.
    sync_.publish_call(call_, call_fields_[0], call_fields_[1], call_fields_[2]);
    call_published_ = true;
  }
  return set;
}

void ShmCommunicator::end_round() {
  round_end_phase_[round_ & 1] = sync_.phase();
  ++round_;
}

void ShmCommunicator::start_call(const char* operation, Kind kind, uint64_t dtype, uint64_t count) {
  sync_.throw_if_aborted(operation);
  deadline_ = Clock::now() + timeout_;
  ++call_;
  call_checked_ = false;
  call_published_ = false;
  call_fields_[0] = kind;
  call_fields_[1] = dtype;
  call_fields_[2] = count;
}

void ShmCommunicator::check_calls_after_wait(const char* operation) {
  if (call_checked_) return;
  call_checked_ = true;
  for (int peer = 0; peer < local_size(); ++peer) {
    if (peer != local_rank()) sync_.check_call(peer, call_, operation);
  }
}

template <typename Body>
void ShmCommunicator::run_guarded(const char* operation, Body&& body) {
  try {
    body();
  } catch (const std::exception& error) {
    // Whatever failed here (a dead peer, a timeout, a mismatched call), the peers must not wait
    // for this rank any longer.
    const auto* lost = dynamic_cast<const PeerLostError*>(&error);
    sync_.abort(std::string(operation) + ": " + error.what(), failure_kind_of(error),
                lost ? lost->lost_rank() : -1);
    throw;
  }
}

void ShmCommunicator::all_reduce(void* data, size_t count, c10::ScalarType dtype,
                                 c10d::ReduceOp::RedOpType op, const char* operation) {
  const ScatteredBytes tensor(data, count * c10::elementSize(dtype));
  all_reduce(tensor, tensor, dtype, op, 1.0, operation);
}

void ShmCommunicator::all_reduce(const ScatteredBytes& input, const ScatteredBytes& output,
                                 c10::ScalarType dtype, c10d::ReduceOp::RedOpType op, double factor,
                                 const char* operation) {
  const size_t element = c10::elementSize(dtype);
  const size_t count = input.size() / element;
  const int n = local_size();
  const int me = local_rank();
  if (output.size() != input.size()) {
    fail(operation, "the output holds " + std::to_string(output.size()) + " bytes, the input " +
                        std::to_string(input.size()));
  }
  run_guarded(operation, [&] {
    start_call(operation, kAllReduce, static_cast<uint64_t>(dtype) << 8 | op, count);
    std::vector<const void*> sources(n);
    if (count * element <= kSmallBytes) {
      const int set = begin_round(operation);
      input.for_each_part(0, input.size(), [&](char* part, size_t at, size_t length) {
        std::memcpy(slot(set, me) + at, part, length);
      });
      sync_.arrive();
      wait_all(operation);
      check_calls_after_wait(operation);
      output.for_each_part(0, output.size(), [&](char* part, size_t at, size_t length) {
        for (int k = 0; k < n; ++k) sources[k] = slot(set, k) + at;
        reduce_into(part, sources.data(), n, length / element, dtype, op, factor);
      });
      end_round();
      return;
    }
    // Slice j of the tensor is reduced by local rank j; each round covers `chunk` elements of
    // every slice, 64-byte aligned so that the reduction loops run on whole vectors.
    const size_t slice = (count + n - 1) / n;
    const size_t chunk = std::max<size_t>(1, (kChunkBytes / n / element) / 64 * 64);
    for (size_t offset = 0; offset < slice; offset += chunk) {
      auto length = [&](int j) {
        const size_t begin = std::min(count, j * slice + offset);
        const size_t end = std::min({count, (j + 1) * slice, j * slice + offset + chunk});
        return (end > begin ? end - begin : 0) * element;
      };
      // Calls visit(part, at, bytes) over this round's range of slice j of `data`.
      auto for_each_part_of = [&](const ScatteredBytes& data, int j, auto&& visit) {
        data.for_each_part((j * slice + offset) * element, length(j), visit);
      };
      const int set = begin_round(operation);
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        char* staged = slot(set, me) + j * chunk * element;
        for_each_part_of(input, j, [&](char* part, size_t at, size_t bytes) {
          std::memcpy(staged + at, part, bytes);
        });
      }
      sync_.arrive();
      wait_all(operation);
      check_calls_after_wait(operation);
      char* reduced = result(set) + me * chunk * element;
      for_each_part_of(input, me, [&](char* part, size_t at, size_t bytes) {
        for (int k = 0; k < n; ++k) {
          sources[k] = k == me ? part : slot(set, k) + me * chunk * element + at;
        }
        reduce_into(reduced + at, sources.data(), n, bytes / element, dtype, op, factor);
      });
      for_each_part_of(output, me, [&](char* part, size_t at, size_t bytes) {
        std::memcpy(part, reduced + at, bytes);
      });
      sync_.arrive();
      wait_all(operation);
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        const char* from = result(set) + j * chunk * element;
        for_each_part_of(output, j, [&](char* part, size_t at, size_t bytes) {
          std::memcpy(part, from + at, bytes);
        });
      }
      end_round();
    }
  });
}

void ShmCommunicator::reduce_scatter(void* output, const std::vector<const void*>& inputs,
                                     size_t count, c10::ScalarType dtype,
                                     c10d::ReduceOp::RedOpType op) {
  const char* operation = "reduce_scatter";
  const size_t element = c10::elementSize(dtype);
  const int n = local_size();
  const int me = local_rank();
  run_guarded(operation, [&] {
    start_call(operation, kReduceScatter, static_cast<uint64_t>(dtype) << 8 | op, count);
    const size_t chunk = std::max<size_t>(1, (kChunkBytes / n / element) / 64 * 64);
    std::vector<const void*> sources(n);
    size_t offset = 0;
    do {
      const size_t length = std::min(chunk, count - offset);
      const int set = begin_round(operation);
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        std::memcpy(slot(set, me) + j * chunk * element,
                    static_cast<const char*>(inputs[j]) + offset * element, length * element);
      }
      sync_.arrive();
      wait_all(operation);
      check_calls_after_wait(operation);
      for (int k = 0; k < n; ++k) {
        sources[k] = k == me ? static_cast<const char*>(inputs[me]) + offset * element
                             : slot(set, k) + me * chunk * element;
      }
      reduce_into(static_cast<char*>(output) + offset * element, sources.data(), n, length, dtype,
                  op);
      end_round();
      offset += length;
    } while (offset < count);
  });
}

void ShmCommunicator::broadcast(void* data, size_t bytes, int root, const char* operation) {
  const int me = local_rank();
  run_guarded(operation, [&] {
    start_call(operation, kBroadcast, static_cast<uint64_t>(root), bytes);
    size_t offset = 0;
    do {
      const size_t length = std::min(kChunkBytes, bytes - offset);
      const int set = begin_round(operation);
      char* at = static_cast<char*>(data) + offset;
      if (me == root) {
        std::memcpy(result(set), at, length);
        sync_.arrive();
      } else {
        sync_.wait_for(root, sync_.phase() + 1, deadline_, operation);
        if (!call_checked_) {
          call_checked_ = true;
          sync_.check_call(root, call_, operation);
        }
        std::memcpy(at, result(set), length);
        sync_.arrive();
      }
      end_round();
      offset += length;
    } while (offset < bytes);
  });
}

void ShmCommunicator::all_gather(const void* input, size_t bytes,
                                 const std::vector<void*>& outputs) {
  const char* operation = "all_gather";
  const int n = local_size();
  const int me = local_rank();
  run_guarded(operation, [&] {
    start_call(operation, kAllGather, 0, bytes);
    size_t offset = 0;
    do {
      const size_t length = std::min(kChunkBytes, bytes - offset);
      const int set = begin_round(operation);
      const char* mine = static_cast<const char*>(input) + offset;
      std::memcpy(slot(set, me), mine, length);
      sync_.arrive();
      wait_all(operation);
      check_calls_after_wait(operation);
      for (int k = 0; k < n; ++k) {
        std::memmove(static_cast<char*>(outputs[k]) + offset, k == me ? mine : slot(set, k),
                     length);
      }
      end_round();
      offset += length;
    } while (offset < bytes);
  });
}

void ShmCommunicator::barrier() {
  const char* operation = "barrier";
  run_guarded(operation, [&] {
    start_call(operation, kBarrier, 0, 0);
    begin_round(operation);
    sync_.arrive();
    wait_all(operation);
    check_calls_after_wait(operation);
    end_round();
  });
}

}  // namespace ddp::detail
