// Helpers shared by every somatile kernel. Assembled first into each kernel source by
// somatile.host.metal_kernels (Metal's runtime compiler cannot resolve includes of user files), so the
// entry points of both dispatch paths (MLX body-only kernels and the full PyObjC kernels) call the same code.
#include <metal_stdlib>
using namespace metal;

// Threads of a row-per-threadgroup kernel: the threadgroup size is a multiple of 32 (whole simdgroups) and
// at most 1024, so the per-simdgroup partial results fit in 32 slots of threadgroup scratch.
struct RowThreads {
  uint index;        // thread_index_in_threadgroup
  uint count;        // threads in the threadgroup
  uint lane;         // thread_index_in_simdgroup
  uint simd_group;   // simdgroup_index_in_threadgroup
};

// Threadgroup-wide reductions of one value per thread. `scratch` is kernel-scope threadgroup memory of at
// least 32 elements (passed as a template parameter so that the address space is deduced). The second
// barrier keeps a following reduction from overwriting scratch before every thread has read it.
template <typename T, typename Scratch>
T threadgroup_max(T value, Scratch scratch, RowThreads t) {
  value = simd_max(value);
  if (t.lane == 0) scratch[t.simd_group] = value;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  T result = scratch[0];
  for (uint i = 1; i < t.count / 32; ++i) result = max(result, T(scratch[i]));
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return result;
}

template <typename T, typename Scratch>
T threadgroup_sum(T value, Scratch scratch, RowThreads t) {
  value = simd_sum(value);
  if (t.lane == 0) scratch[t.simd_group] = value;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  T result = scratch[0];
  for (uint i = 1; i < t.count / 32; ++i) result += scratch[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return result;
}

// Max of the valid elements of a row of `cols` at x (`none` when no element is valid), shared by every
// thread of the threadgroup; valid[c] != 0 marks the elements that take part when `masked`. `none` is at or
// below the logits' minimum: HCCS_NO_MAX for int8 rows, WIDE_LOGIT_MIN for the wide profile's int16 rows.
template <typename XPtr, typename ValidPtr, typename Scratch>
int masked_row_max(XPtr x, ValidPtr valid, bool masked, int cols, Scratch scratch, RowThreads t,
                   int none = HCCS_NO_MAX) {
  int m = none;
  for (uint c = t.index; c < uint(cols); c += t.count)
    if (!masked || valid[c]) m = max(m, int(x[c]));
  return threadgroup_max(m, scratch, t);
}

// floor(log2(v)) for v >= 1: the leading-bit count of the CLB normaliser.
inline int floor_log2(int v) { return 31 - int(clz(uint(v))); }

// Saturate to the output type's maximum (every value here is already >= 0).
inline int saturate_max(int v, int hi) { return min(v, hi); }
