// ScatteredBytes: the memory of several tensors, in order, seen as one run of bytes.
//
// A collective over many tensors at once (DDP's gradients, read where autograd left them)
// works on offsets into this run exactly as it would into one flat buffer, and copies each range
// from or to the pieces it covers. That saves what a flat buffer costs: a pass over memory to
// copy every gradient into it, and another to copy the result back where it may go. Pieces that
// follow each other in memory are merged, so a flat buffer is one piece and costs nothing extra.
//
// Not thread-safe; built by the caller of one collective and read by it.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <vector>

namespace ddp::detail {

class ScatteredBytes {
 public:
  ScatteredBytes() = default;
  ScatteredBytes(void* data, size_t bytes) { add(data, bytes); }

  void add(void* data, size_t bytes) {
    if (bytes == 0) return;
    char* start = static_cast<char*>(data);
    const size_t last = starts_.size() - 1;
    if (!starts_.empty() && starts_[last] + (ends_[last] - begin_of(last)) == start) {
      ends_[last] += bytes;  // follows the last piece in memory
      return;
    }
    starts_.push_back(start);
    ends_.push_back(size() + bytes);
  }

  size_t size() const { return ends_.empty() ? 0 : ends_.back(); }
  size_t pieces() const { return starts_.size(); }

  /// Calls visit(pointer, offset, length) for each contiguous part of [begin, begin + length):
  /// `pointer` is where the part lives, `offset` its distance from `begin`.
  template <typename Visit>
  void for_each_part(size_t begin, size_t length, Visit&& visit) const {
    assert(begin + length <= size());
    size_t piece = std::upper_bound(ends_.begin(), ends_.end(), begin) - ends_.begin();
    for (size_t done = 0; done < length; ++piece) {
      const size_t at = begin + done;
      const size_t take = std::min(length - done, ends_[piece] - at);
      visit(starts_[piece] + (at - begin_of(piece)), done, take);
      done += take;
    }
  }

 private:
  size_t begin_of(size_t piece) const { return piece == 0 ? 0 : ends_[piece - 1]; }

  std::vector<char*> starts_;
  std::vector<size_t> ends_;  // ends_[i]: offset just past piece i in the run
};

}  // namespace ddp::detail
