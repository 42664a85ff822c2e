//===- best_fit.h - The memory plan's allocator, shared ---------*- C++ -*-===//
//
// A best-fit allocator over one range of bytes: a free block is taken whole
// or split, the smallest that fits (lowest offset among equals); nothing
// fits: the range grows from its top (from the free block at the top, if
// any). Freed blocks merge with their free neighbours, so the free set after
// any sequence of calls does not depend on the order of frees between two
// allocations.
//
// planc's plan-memory runs it at compile time over each block's buffers in
// program order; for the pipeline stash, whose allocations and frees follow
// the schedule, the compiler simulates the events the runtime will see and
// planrt runs the same allocator on them: the same offsets, and the same
// highest byte, which the runtime checks against the plan. Header-only,
// plain C++.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_BEST_FIT_H
#define PLANRT_BEST_FIT_H

#include <cstdint>
#include <iterator>
#include <map>
#include <set>
#include <utility>

namespace planrt {

class BestFit {
  std::map<int64_t, int64_t> byOffset_;          // offset -> size
  std::set<std::pair<int64_t, int64_t>> bySize_; // (size, offset)
  int64_t top_ = 0;

  void add(int64_t off, int64_t size) {
    byOffset_[off] = size;
    bySize_.insert({size, off});
  }
  void remove(std::map<int64_t, int64_t>::iterator it) {
    bySize_.erase({it->second, it->first});
    byOffset_.erase(it);
  }

public:
  /// The highest byte ever handed out.
  int64_t highWater() const { return top_; }
  int64_t allocate(int64_t bytes) {
    auto fit = bySize_.lower_bound({bytes, INT64_MIN});
    if (fit != bySize_.end()) {
      int64_t size = fit->first, off = fit->second;
      remove(byOffset_.find(off));
      if (size > bytes)
        add(off + bytes, size - bytes);
      return off;
    }
    if (!byOffset_.empty()) {
      auto last = std::prev(byOffset_.end());
      if (last->first + last->second == top_) {
        int64_t off = last->first;
        remove(last);
        top_ = off + bytes;
        return off;
      }
    }
    int64_t off = top_;
    top_ += bytes;
    return off;
  }
  void release(int64_t off, int64_t bytes) {
    auto next = byOffset_.lower_bound(off);
    if (next != byOffset_.end() && off + bytes == next->first) {
      bytes += next->second;
      remove(next);
    }
    auto after = byOffset_.lower_bound(off);
    if (after != byOffset_.begin()) {
      auto prev = std::prev(after);
      if (prev->first + prev->second == off) {
        off = prev->first;
        bytes += prev->second;
        remove(prev);
      }
    }
    add(off, bytes);
  }
};

} // namespace planrt

#endif
