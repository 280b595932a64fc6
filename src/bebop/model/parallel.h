// The CPU kernels' threads: a loop over independent blocks split among torch's intra-op threads.
//
//     parallel_blocks(n, grain, [&](int64_t begin, int64_t end) { for (b = begin; b < end; ++b) ...; });
//
// What at::parallel_for does (its team: the calling thread's torch thread count, at least `grain` blocks a thread,
// serial inside a parallel region), through torch's exported functions only. at::parallel_for is inline: a copy in
// this library would keep its own once-a-thread initialisation, whose first call in a thread sets that thread's
// count to the process's last torch.set_num_threads, undoing a count the thread had set for itself (the async RL
// loop's rollout and learner threads). The library is built with -fopenmp and links the libgomp torch has loaded
// (the same soname): one OpenMP runtime, one pool of threads. Without OpenMP the loop runs on the calling thread.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#ifdef _OPENMP
#include <omp.h>
#endif

// a thread's least share of a kernel's work, in multiply-adds: below it, starting the team costs more than it saves
constexpr int64_t kLeastWork = int64_t(1) << 15;

// the grain (blocks a thread) for blocks of `work` multiply-adds each
inline int64_t grain_for(int64_t work) { return std::max<int64_t>(1, kLeastWork / std::max<int64_t>(work, 1)); }

template <typename F>
inline void parallel_blocks(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
#ifdef _OPENMP
  const int64_t most = (n + grain - 1) / std::max<int64_t>(grain, 1);
  const int threads = int(std::min<int64_t>(at::get_num_threads(), most));
  if (threads > 1 && !at::in_parallel_region()) {
#pragma omp parallel num_threads(threads)
    {
      const int64_t team = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t begin = n * id / team, end = n * (id + 1) / team;
      if (begin < end) f(begin, end);
    }
    return;
  }
#endif
  f(0, n);
}
