// Work spread over XLA's intra-op threads, for the CPU kernels (cpu_kernels.py builds them).
//
// Items 0 .. total - 1 are handed out by an atomic counter to the calling thread and to tasks on
// XLA's intra-op pool. The caller waits only for items some thread has claimed, so a task the
// pool never starts cannot block it (it finds no item left and returns). Which thread runs an
// item never changes what the item computes: each writes its own part of the output.

#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace morse {

struct Work {
  std::atomic<int64_t> next{0};
  int64_t total = 0;
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;
};

template <typename Fn>
void drain(Work& w, const Fn& fn) {
  for (int64_t item; (item = w.next.fetch_add(1)) < w.total;) {
    fn(item);
    if (w.done.fetch_add(1) + 1 == w.total) {
      std::lock_guard<std::mutex> lock(w.mu);
      w.cv.notify_all();
    }
  }
}

// fn(item) for every item in [0, total), on this thread and the pool's; returns when all ran.
template <typename Fn>
void parallel_for(xla::ffi::ThreadPool& pool, int64_t total, const Fn& fn) {
  if (total <= 0) return;
  auto work = std::make_shared<Work>();
  work->total = total;
  // The pool has a thread per core and the caller works too: one helper fewer than the pool's
  // threads keeps a thread per core (with as many helpers as threads, SmolLM2's decode products
  // at 4 rows took 33-42 ms a token against 28-30, the threads taking turns on the cores).
  const int64_t helpers = std::min<int64_t>(pool.num_threads() - 1, total - 1);
  for (int64_t i = 0; i < helpers; ++i) {
    pool.Schedule([work, fn] { drain(*work, fn); });
  }
  drain(*work, fn);
  std::unique_lock<std::mutex> lock(work->mu);
  work->cv.wait(lock, [&] { return work->done.load() == work->total; });
}

}  // namespace morse
