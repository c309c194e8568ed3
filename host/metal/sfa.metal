// The six float32 kernels of the SFA three-channel enhancement (seed 001), one per stage of
// somatile.model.sfa, so that each is checked against its model function: ring buffer, EMA field,
// semantic pool, fusion, alpha decay, clip. common.metal is assembled before this file. Float results match
// the model within a tolerance (tests/metal/test_sfa.py states it): sums are associated differently and
// exp() may differ in the last bits; the kernels use no fast-math functions.
//
// Counters (ring position and fill, pool slot) are plain integer bookkeeping done by the host, which
// passes the values each kernel needs.

// Stage 1. ring (R, H) -> ring_out with x written at row pos; ring_mean = sum of rows 0..fill-1 / fill.
// counters int32 [pos, fill after the write]. Grid (H), one thread per hidden element.
kernel void sfa_ring_buffer(const device float* ring [[buffer(0)]], const device float* x [[buffer(1)]],
                            const device int* counters [[buffer(2)]], const device int* shape [[buffer(3)]],
                            device float* ring_out [[buffer(4)]], device float* ring_mean [[buffer(5)]],
                            uint i [[thread_position_in_grid]]) {
  const int rows = shape[0], hidden = shape[1], pos = counters[0], fill = counters[1];
  if (i >= uint(hidden)) return;
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float value = r == pos ? x[i] : ring[uint(r * hidden) + i];
    ring_out[uint(r * hidden) + i] = value;
    if (r < fill) sum += value;
  }
  ring_mean[i] = sum / float(fill);
}

// Stage 2. field_out = gamma * field + (1 - gamma) * x. params float [gamma]. Grid (H).
kernel void sfa_ema_field(const device float* field [[buffer(0)]], const device float* x [[buffer(1)]],
                          const device float* params [[buffer(2)]], const device int* shape [[buffer(3)]],
                          device float* field_out [[buffer(4)]], uint i [[thread_position_in_grid]]) {
  if (i >= uint(shape[0])) return;
  const float gamma = params[0];
  const float decayed = field[i] * gamma;
  const float added = (1.0f - gamma) * x[i];
  field_out[i] = decayed + added;
}

// Stage 3. Write rule and read of the semantic pool (S, H): pool_out is pool with slot `write` (counters[0],
// -1 for none) replaced by ring_mean; semantic = softmax(pool_out[:fill] . ring_mean / temperature) @
// pool_out[:fill] (zeros when fill = 0). counters int32 [write, fill]; params float [temperature]; shape
// int32 [S, H]. One threadgroup: grid (T), threadgroup (T), T a multiple of 32; S <= SFA_MAX_SLOTS.
template <typename Scratch, typename Weights>
void sfa_semantic_pool_group(const device float* pool, const device float* ring_mean, const device int* counters,
                             const device float* params, const device int* shape, device float* pool_out,
                             device float* semantic, Scratch scratch, Weights weights, RowThreads t) {
  const int slots = shape[0], hidden = shape[1], write = counters[0], fill = counters[1];
  for (uint i = t.index; i < uint(slots * hidden); i += t.count)
    pool_out[i] = int(i) / hidden == write ? ring_mean[i % uint(hidden)] : pool[i];
  threadgroup_barrier(mem_flags::mem_device);

  float local_max = -INFINITY;
  for (uint s = t.index; s < uint(fill); s += t.count) {
    float dot = 0.0f;
    for (int h = 0; h < hidden; ++h) dot += pool_out[s * uint(hidden) + uint(h)] * ring_mean[h];
    weights[s] = dot / params[0];
    local_max = max(local_max, float(weights[s]));
  }
  const float top = threadgroup_max(local_max, scratch, t);
  float local_sum = 0.0f;
  for (uint s = t.index; s < uint(fill); s += t.count) {
    weights[s] = exp(weights[s] - top);
    local_sum += weights[s];
  }
  const float total = threadgroup_sum(local_sum, scratch, t);
  for (uint s = t.index; s < uint(fill); s += t.count) weights[s] = weights[s] / total;
  threadgroup_barrier(mem_flags::mem_threadgroup);

  for (uint h = t.index; h < uint(hidden); h += t.count) {
    float acc = 0.0f;
    for (int s = 0; s < fill; ++s) acc += weights[s] * pool_out[uint(s * hidden) + h];
    semantic[h] = acc;
  }
}

kernel void sfa_semantic_pool(const device float* pool [[buffer(0)]], const device float* ring_mean [[buffer(1)]],
                              const device int* counters [[buffer(2)]], const device float* params [[buffer(3)]],
                              const device int* shape [[buffer(4)]], device float* pool_out [[buffer(5)]],
                              device float* semantic [[buffer(6)]], uint3 size [[threads_per_threadgroup]],
                              uint index [[thread_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                              uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup float scratch[32];
  threadgroup float weights[SFA_MAX_SLOTS];
  sfa_semantic_pool_group(pool, ring_mean, counters, params, shape, pool_out, semantic, scratch, weights,
                          RowThreads{index, size.x, lane, simd_group});
}

// Stage 4. fused = ring_mean + field_weight * field + semantic_weight * semantic. params float
// [field_weight, semantic_weight]. Grid (H).
kernel void sfa_fusion(const device float* ring_mean [[buffer(0)]], const device float* field [[buffer(1)]],
                       const device float* semantic [[buffer(2)]], const device float* params [[buffer(3)]],
                       const device int* shape [[buffer(4)]], device float* fused [[buffer(5)]],
                       uint i [[thread_position_in_grid]]) {
  if (i >= uint(shape[0])) return;
  const float near = ring_mean[i] + params[0] * field[i];
  fused[i] = near + params[1] * semantic[i];
}

// Stage 5. alpha_l = alpha_base * (0.3 + 0.7 * l / (L - 1)) * cross_decay**l for every layer l (ratio 0 when
// L = 1); cross_decay**l by repeated multiplication. params float [alpha_base, cross_decay]; shape [L].
kernel void sfa_alpha_decay(const device float* params [[buffer(0)]], const device int* shape [[buffer(1)]],
                            device float* alpha [[buffer(2)]], uint layer [[thread_position_in_grid]]) {
  const int layers = shape[0];
  if (layer >= uint(layers)) return;
  const float ratio = layers > 1 ? float(layer) / float(layers - 1) : 0.0f;
  float decay = 1.0f;
  for (uint l = 0; l < layer; ++l) decay *= params[1];
  alpha[layer] = params[0] * (0.3f + 0.7f * ratio) * decay;
}

// Stage 6. enhancement = clip(alpha * fused) (order 0, "alpha_then_clip") or alpha * clip(fused) (order 1).
// params float [alpha, limit]; shape int32 [H, order]. Grid (H).
kernel void sfa_clip(const device float* fused [[buffer(0)]], const device float* params [[buffer(1)]],
                     const device int* shape [[buffer(2)]], device float* enhancement [[buffer(3)]],
                     uint i [[thread_position_in_grid]]) {
  if (i >= uint(shape[0])) return;
  const float alpha = params[0], limit = params[1];
  enhancement[i] = shape[1] == 0 ? clamp(alpha * fused[i], -limit, limit) : alpha * clamp(fused[i], -limit, limit);
}
