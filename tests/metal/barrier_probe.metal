// Deliberately broken kernels for tests/metal/test_emulator.py: each thread stores its value in threadgroup
// memory and reads its mirror thread's value. `mirror_ok` has the barrier between the store and the load;
// `mirror_missing_barrier` does not, and the emulator must make it fail (the mirror has not stored yet when
// the threads run one after another, so the load sees the marker byte). `barrier_in_branch` lets only the
// even threads reach a barrier, which must be reported as a deadlock rather than hang; `write_past_end`
// writes one element beyond its output, which the emulator's guard bytes must report.
#include <metal_stdlib>
using namespace metal;

kernel void mirror_ok(const device int* x [[buffer(0)]], device int* out [[buffer(1)]],
                      uint i [[thread_position_in_threadgroup]], uint3 size [[threads_per_threadgroup]],
                      uint3 group [[threadgroup_position_in_grid]]) {
  threadgroup int shared[1024];
  const uint base = group.x * size.x;
  shared[i] = x[base + i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[base + i] = shared[size.x - 1 - i];
}

kernel void mirror_missing_barrier(const device int* x [[buffer(0)]], device int* out [[buffer(1)]],
                                   uint i [[thread_position_in_threadgroup]], uint3 size [[threads_per_threadgroup]],
                                   uint3 group [[threadgroup_position_in_grid]]) {
  threadgroup int shared[1024];
  const uint base = group.x * size.x;
  shared[i] = x[base + i];
  out[base + i] = shared[size.x - 1 - i];
}

kernel void barrier_in_branch(const device int* x [[buffer(0)]], device int* out [[buffer(1)]],
                              uint i [[thread_position_in_grid]]) {
  if (i % 2 == 0) threadgroup_barrier(mem_flags::mem_threadgroup);
  out[i] = x[i];
}

kernel void simd_reductions(const device int* x [[buffer(0)]], const device float* y [[buffer(1)]],
                            device int* out [[buffer(2)]], device float* out_float [[buffer(3)]],
                            uint i [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
  const int s = simd_sum(x[i]);
  const int hi = simd_max(x[i]);
  const int lo = simd_min(x[i]);
  const float f = simd_sum(y[i]);
  if (lane == 0) {
    out[3 * (i / 32)] = s;
    out[3 * (i / 32) + 1] = hi;
    out[3 * (i / 32) + 2] = lo;
    out_float[i / 32] = f;
  }
}

kernel void write_past_end(device int* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i + 1] = int(i);
}
