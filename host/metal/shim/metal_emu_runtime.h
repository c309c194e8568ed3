// CPU runtime behind the metal_stdlib shim: runs one Metal dispatch with every GPU thread as a fiber.
//
// Threadgroups run one after another; inside a threadgroup each thread is a ucontext fiber that runs until
// it returns, reaches threadgroup_barrier (all threads of the threadgroup must arrive before any goes on) or
// a simd_* reduction (all lanes of its 32-wide simdgroup must arrive). Each round of the scheduler resumes
// the ready fibers in forward, reverse or a freshly shuffled order, and threadgroup memory is filled with a
// marker byte before each threadgroup, so a kernel that reads threadgroup memory another thread has not yet
// written (a missing barrier) reads the marker or stale data and fails its test. A barrier that only some
// threads reach, or a simd reduction in divergent control flow, is reported as an error instead of hanging.
#pragma once

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <vector>

extern char __start_metal_tg[] __attribute__((weak));
extern char __stop_metal_tg[] __attribute__((weak));

namespace metal_emu {

constexpr unsigned kSimdWidth = 32;  // threads_per_simdgroup on every Apple GPU
constexpr unsigned kMaxThreadsPerThreadgroup = 1024;
constexpr size_t kStackBytes = 256 * 1024;

struct Dim3 {
  unsigned x, y, z;
};

struct ThreadAttrs {
  Dim3 thread_position_in_grid, thread_position_in_threadgroup, threadgroup_position_in_grid;
  Dim3 threads_per_threadgroup, threads_per_grid, threadgroups_per_grid;
  unsigned thread_index_in_threadgroup, thread_index_in_simdgroup, simdgroup_index_in_threadgroup;
  unsigned threads_per_simdgroup, simdgroups_per_threadgroup;
};

using Launch = void (*)(void* const* buffers, const ThreadAttrs& attrs);

enum class State { ready, at_barrier, at_simd, done };

// A fiber starts once through setcontext (which also restores the signal mask: one system call per
// thread) and then switches with _setjmp/_longjmp, which leave the signal mask alone; swapcontext would make
// two system calls per switch, and a kernel with reductions switches several times per thread.
struct Fiber {
  ucontext_t start;
  jmp_buf resume;
  bool started;
  State state;
  ThreadAttrs attrs;
  unsigned simd_ops;                 // simd reductions this thread has entered
  alignas(16) unsigned char slot[2][16];  // value offered to reduction simd_ops & 1 (double-buffered)
};

enum Order { forward = 0, reverse = 1, shuffled = 2 };

struct Runtime {
  std::mutex lock;  // ctypes releases the GIL: one dispatch at a time per loaded library
  std::vector<Fiber> fibers;
  unsigned char* stacks = nullptr;
  size_t stack_capacity = 0;  // fibers the mapping can hold
  jmp_buf scheduler;
  Fiber* current = nullptr;
  unsigned active = 0;  // threads in the running threadgroup (edge threadgroups are partial)
  Launch launch = nullptr;
  void* const* buffers = nullptr;
  char error[512] = {0};
};

inline Runtime& runtime() {
  static Runtime r;
  return r;
}

inline void suspend(State why) {
  Runtime& r = runtime();
  Fiber* f = r.current;
  f->state = why;
  if (!_setjmp(f->resume)) _longjmp(r.scheduler, 1);
}

inline void barrier() { suspend(State::at_barrier); }

// Every lane offers `value`; after all lanes of the simdgroup have arrived, each lane folds the offers in
// lane order (a GPU may associate float sums differently: float kernels are tested with a tolerance).
template <typename T, typename Op>
T simd_reduce(T value, Op op) {
  static_assert(sizeof(T) <= 16, "simd reduction of a type wider than 16 bytes");
  Runtime& r = runtime();
  Fiber* self = r.current;
  const unsigned buffer = self->simd_ops & 1u;
  self->simd_ops++;
  std::memcpy(self->slot[buffer], &value, sizeof(T));
  suspend(State::at_simd);
  const unsigned first = self->attrs.simdgroup_index_in_threadgroup * kSimdWidth;
  const unsigned end = std::min(first + kSimdWidth, r.active);
  T acc;
  std::memcpy(&acc, r.fibers[first].slot[buffer], sizeof(T));
  for (unsigned lane = first + 1; lane < end; ++lane) {
    T other;
    std::memcpy(&other, r.fibers[lane].slot[buffer], sizeof(T));
    acc = op(acc, other);
  }
  return acc;
}

inline void simd_barrier() {
  simd_reduce(0, [](int a, int) { return a; });
}

inline void fiber_main() {
  Runtime& r = runtime();
  r.launch(r.buffers, r.current->attrs);
  r.current->state = State::done;
  _longjmp(r.scheduler, 1);
}

inline bool fail(const char* message) {
  std::snprintf(runtime().error, sizeof(runtime().error), "%s", message);
  return false;
}

inline std::vector<unsigned> visiting_order(unsigned n, int order, std::mt19937_64& rng) {
  std::vector<unsigned> ids(n);
  std::iota(ids.begin(), ids.end(), 0u);
  if (order == reverse) std::reverse(ids.begin(), ids.end());
  if (order == shuffled) std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

// Runs the threads of one threadgroup to completion; false (with runtime().error set) on a barrier or a
// simd reduction that not every thread reaches.
inline bool run_threadgroup(unsigned n, int order, std::mt19937_64& rng) {
  Runtime& r = runtime();
  r.active = n;
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = r.fibers[i];
    getcontext(&f.start);
    f.start.uc_stack.ss_sp = r.stacks + size_t(i) * kStackBytes;
    f.start.uc_stack.ss_size = kStackBytes;
    f.start.uc_link = nullptr;
    makecontext(&f.start, fiber_main, 0);
    f.started = false;
    f.state = State::ready;
    f.simd_ops = 0;
  }
  for (;;) {
    for (unsigned i : visiting_order(n, order, rng)) {
      Fiber& f = r.fibers[i];
      if (f.state != State::ready) continue;
      r.current = &f;
      if (!_setjmp(r.scheduler)) {
        if (f.started) _longjmp(f.resume, 1);
        f.started = true;
        setcontext(&f.start);
      }
    }
    unsigned done = 0, at_barrier = 0, released = 0;
    for (unsigned first = 0; first < n; first += kSimdWidth) {
      const unsigned end = std::min(first + kSimdWidth, n);
      unsigned waiting = 0;
      for (unsigned i = first; i < end; ++i) waiting += r.fibers[i].state == State::at_simd;
      if (waiting == 0) continue;
      if (waiting != end - first) continue;
      for (unsigned i = first; i < end; ++i) {
        if (r.fibers[i].simd_ops != r.fibers[first].simd_ops)
          return fail("simd reduction: lanes of one simdgroup are in different reductions (divergent control flow)");
        r.fibers[i].state = State::ready;
      }
      released += end - first;
    }
    if (released) continue;
    for (unsigned i = 0; i < n; ++i) {
      done += r.fibers[i].state == State::done;
      at_barrier += r.fibers[i].state == State::at_barrier;
    }
    if (done == n) return true;
    if (at_barrier == n) {
      for (unsigned i = 0; i < n; ++i) r.fibers[i].state = State::ready;
      continue;
    }
    char message[256];
    std::snprintf(message, sizeof(message),
                  "deadlock in threadgroup of %u threads: %u at threadgroup_barrier, %u returned, %u waiting in a "
                  "simd reduction that not all lanes reach",
                  n, at_barrier, done, n - done - at_barrier);
    return fail(message);
  }
}

inline bool reserve_stacks(unsigned n) {
  Runtime& r = runtime();
  if (n <= r.stack_capacity) return true;
  if (r.stacks) munmap(r.stacks, r.stack_capacity * kStackBytes);
  void* p = mmap(nullptr, size_t(n) * kStackBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    r.stacks = nullptr;
    r.stack_capacity = 0;
    return fail("could not map fiber stacks");
  }
  r.stacks = static_cast<unsigned char*>(p);
  r.stack_capacity = n;
  r.fibers.resize(n);
  return true;
}

inline unsigned ceil_div(unsigned a, unsigned b) { return (a + b - 1) / b; }

// One dispatchThreads(grid, threadgroup) of `launch`. Edge threadgroups are partial (as on Apple GPUs with
// non-uniform threadgroups); threads_per_threadgroup reports the requested size. Returns 0, or -1 with a
// message in `error`.
inline int dispatch(Launch launch, void* const* buffers, const unsigned grid[3], const unsigned group[3], int order,
                    unsigned long long seed, int marker, char* error, int error_len) {
  Runtime& r = runtime();
  std::lock_guard<std::mutex> hold(r.lock);
  r.error[0] = 0;
  bool ok = true;
  const unsigned group_threads = group[0] * group[1] * group[2];
  if (group_threads == 0 || group_threads > kMaxThreadsPerThreadgroup) {
    ok = fail("threadgroup size must be 1..1024 threads");
  } else {
    ok = reserve_stacks(group_threads);
  }
  const Dim3 groups{ceil_div(grid[0], group[0] ? group[0] : 1), ceil_div(grid[1], group[1] ? group[1] : 1),
                    ceil_div(grid[2], group[2] ? group[2] : 1)};
  const unsigned total_groups = groups.x * groups.y * groups.z;
  std::mt19937_64 rng(seed);
  r.launch = launch;
  r.buffers = buffers;
  for (unsigned g : ok ? visiting_order(total_groups, order, rng) : std::vector<unsigned>{}) {
    const Dim3 gpos{g % groups.x, (g / groups.x) % groups.y, g / (groups.x * groups.y)};
    const Dim3 size{std::min(group[0], grid[0] - gpos.x * group[0]), std::min(group[1], grid[1] - gpos.y * group[1]),
                    std::min(group[2], grid[2] - gpos.z * group[2])};
    const unsigned n = size.x * size.y * size.z;
    for (unsigned i = 0; i < n; ++i) {
      ThreadAttrs& a = r.fibers[i].attrs;
      const Dim3 local{i % size.x, (i / size.x) % size.y, i / (size.x * size.y)};
      a.thread_position_in_threadgroup = local;
      a.threadgroup_position_in_grid = gpos;
      a.thread_position_in_grid = {gpos.x * group[0] + local.x, gpos.y * group[1] + local.y,
                                   gpos.z * group[2] + local.z};
      a.threads_per_threadgroup = {group[0], group[1], group[2]};
      a.threads_per_grid = {grid[0], grid[1], grid[2]};
      a.threadgroups_per_grid = groups;
      a.thread_index_in_threadgroup = i;
      a.thread_index_in_simdgroup = i % kSimdWidth;
      a.simdgroup_index_in_threadgroup = i / kSimdWidth;
      a.threads_per_simdgroup = kSimdWidth;
      a.simdgroups_per_threadgroup = ceil_div(n, kSimdWidth);
    }
    if (__start_metal_tg && __stop_metal_tg > __start_metal_tg)
      std::memset(__start_metal_tg, marker, size_t(__stop_metal_tg - __start_metal_tg));
    if (!run_threadgroup(n, order, rng)) {
      ok = false;
      break;
    }
  }
  std::snprintf(error, size_t(error_len), "%s", r.error);
  return ok ? 0 : -1;
}

}  // namespace metal_emu
