// One integer Soma decode step (docs/numerics.md, sections "Soma" and "Two integer profiles"), bit-exact with
// somatile.model.soma (integer=True: soma_int's spec and soma_nb's fast path) in both profiles, chosen by
// the geometry word SOMA_G_PROFILE: "paper" (int8 logits, HCCS or integer exp with uint8 probabilities, int8
// output) and "wide" (int16 logits, the wide normaliser with Q15 probabilities, int16 output); state, field
// and gate are the same code. One entry point serves both, so its threadgroup rows and its output buffer
// have the wide profile's types, which hold the paper profile's values exactly. The SOMA_* constants and
// parameter-row indices come from the model modules through the prelude; common.metal, hccs.metal,
// intexp.metal and wide.metal are assembled before this file (the near-field normaliser is their row code,
// run on threadgroup memory).
//
// One threadgroup per KV head: the threadgroup owns that head's slice of the state, so the ring write and
// the field update need no cross-threadgroup ordering, and the query heads of its group (grouped-query
// attention) are scored one after another over the shared keys. Inside a head, threads split the slots
// (scores), then the row (normaliser), then the head dimension (P.V, output, field).
//
// The step reads the state from the input buffers and writes the complete new state to the output buffers
// (MLX outputs are always new arrays; the PyObjC path ping-pongs two buffer sets the same way). Keys and
// values are read back from the output buffers after the copy, so the token written first (include_self)
// is visible, and a device barrier orders the copy, the write and the reads within the threadgroup.
//
// Buffers: q int8 (H, D); k, v int8 (Hkv, D); ring_k, ring_v int8 (Hkv, ring, D); sink_k, sink_v int8
// (Hkv, sinks, D) (one dummy byte when sinks = 0); field int16 (Hkv, D); gate_field int16 (Hkv, D) (dummy
// when ungated); counters int32 [write_pos, fill, step]; geometry int32 (SOMA_G_* indices); params int32
// (SOMA_P_* rows, H) = soma_int.param_table and the per-head normaliser code of the profile (paper:
// soma_fixed.NORM_CODES, wide: wide.NORM_CODES); then the outputs: out int16 (H, D) and the new state.
// Dispatch: grid (T, Hkv, 1), threadgroup (T, 1, 1), T a multiple of 32 in 32..1024.

inline long rshift_round(long x, int shift) { return (x + ((long(1) << shift) >> 1)) >> shift; }

inline long clamp_long(long x, long lo, long hi) { return x < lo ? lo : (x > hi ? hi : x); }

struct SomaCounters {
  int write_pos, fill, step;
};

// Counters after writing one token: the first `sinks` tokens fill the sink slots, later ones the ring.
inline SomaCounters soma_after_write(SomaCounters c, int sinks, int ring) {
  if (c.step >= sinks) {
    c.write_pos = (c.write_pos + 1) % ring;
    c.fill = min(c.fill + 1, ring);
  }
  c.step = c.step < SOMA_COUNTER_MAX ? c.step + 1 : c.step;
  return c;
}

// Writes this KV head's k and v into the slot the counters point at (threads split the head dimension).
inline void soma_write_token(device char* ring_k, device char* ring_v, device char* sink_k, device char* sink_v,
                             const device char* k, const device char* v, SomaCounters c, int sinks, int ring,
                             int dim, uint kv, RowThreads t) {
  const bool to_sink = c.step < sinks;
  const uint slot = to_sink ? (kv * uint(sinks) + uint(c.step)) * uint(dim)
                            : (kv * uint(ring) + uint(c.write_pos)) * uint(dim);
  for (uint d = t.index; d < uint(dim); d += t.count) {
    if (to_sink) {
      sink_k[slot + d] = k[kv * uint(dim) + d];
      sink_v[slot + d] = v[kv * uint(dim) + d];
    } else {
      ring_k[slot + d] = k[kv * uint(dim) + d];
      ring_v[slot + d] = v[kv * uint(dim) + d];
    }
  }
}

// F <- round((gamma F + (1 - gamma) (x << 7)) / 2**15): the field keeps 7 fraction bits.
inline short field_update(short f, char x, int gamma_q15) {
  const long acc = long(gamma_q15) * long(f) + long(SOMA_GAMMA_ONE - gamma_q15) * (long(x) << SOMA_FIELD_FRAC_BITS);
  return short(rshift_round(acc, 15));
}

template <typename Scratch, typename Logits, typename Valid, typename Prob>
void soma_decode_kv_head(const device char* q, const device char* k, const device char* v,
                         const device char* ring_k, const device char* ring_v, const device char* sink_k,
                         const device char* sink_v, const device short* field, const device short* gate_field,
                         const device int* counters, const device int* geometry, const device int* params,
                         device short* out, device char* ring_k_out, device char* ring_v_out,
                         device char* sink_k_out, device char* sink_v_out, device short* field_out,
                         device short* gate_field_out, device int* counters_out, uint kv, Scratch scratch,
                         Logits logits, Valid valid, Prob prob, RowThreads t) {
  const int heads = geometry[SOMA_G_HEADS], kv_heads = geometry[SOMA_G_KV_HEADS], dim = geometry[SOMA_G_DIM];
  const int ring = geometry[SOMA_G_RING], sinks = geometry[SOMA_G_SINKS];
  const bool include_self = geometry[SOMA_G_INCLUDE_SELF] != 0, gated = geometry[SOMA_G_GATED] != 0;
  const bool field_keys = geometry[SOMA_G_FIELD_KEYS] != 0, clb = geometry[SOMA_G_HCCS_CLB] != 0;
  const bool wide = geometry[SOMA_G_PROFILE] == SOMA_PROFILE_WIDE;
  const int gamma_q15 = geometry[SOMA_G_GAMMA_Q15];
  const int group = heads / kv_heads, slots = sinks + ring;
  const uint ring_base = kv * uint(ring * dim), sink_base = kv * uint(sinks * dim), row = kv * uint(dim);
  SomaCounters c = {counters[0], counters[1], counters[2]};

  for (uint i = t.index; i < uint(ring * dim); i += t.count) {
    ring_k_out[ring_base + i] = ring_k[ring_base + i];
    ring_v_out[ring_base + i] = ring_v[ring_base + i];
  }
  for (uint i = t.index; i < uint(sinks * dim); i += t.count) {
    sink_k_out[sink_base + i] = sink_k[sink_base + i];
    sink_v_out[sink_base + i] = sink_v[sink_base + i];
  }
  threadgroup_barrier(mem_flags::mem_device);
  if (include_self) {
    soma_write_token(ring_k_out, ring_v_out, sink_k_out, sink_v_out, k, v, c, sinks, ring, dim, kv, t);
    c = soma_after_write(c, sinks, ring);
    threadgroup_barrier(mem_flags::mem_device);
  }
  const int sink_fill = min(c.step, sinks);
  const int lag = include_self ? 0 : 1;
  const long logit_min = wide ? SOMA_WIDE_LOGIT_MIN : SOMA_PAPER_LOGIT_MIN;
  const long logit_max = wide ? SOMA_WIDE_LOGIT_MAX : SOMA_PAPER_LOGIT_MAX;
  const long out_min = wide ? SOMA_WIDE_OUT_MIN : SOMA_PAPER_OUT_MIN;
  const long out_max = wide ? SOMA_WIDE_OUT_MAX : SOMA_PAPER_OUT_MAX;

  for (int h = int(kv) * group; h < (int(kv) + 1) * group; ++h) {
    const uint qh = uint(h * dim);
    for (uint j = t.index; j < uint(slots); j += t.count) {
      const bool sink = j < uint(sinks);
      const int r = int(j) - sinks;
      const bool ok = sink ? int(j) < sink_fill : r < c.fill;
      const long distance = sink ? 0 : long((c.write_pos - 1 - r + ring) % ring + lag);
      const device char* key = sink ? sink_k_out + sink_base + j * uint(dim) : ring_k_out + ring_base + uint(r * dim);
      int score = 0;
      for (int d = 0; d < dim; ++d) score += int(q[qh + uint(d)]) * int(key[d]);
      const long logit = rshift_round(long(score) * params[SOMA_P_SCORE_MULT * heads + h],
                                      params[SOMA_P_SCORE_SHIFT * heads + h]) -
                         long(params[SOMA_P_RECENCY_INT * heads + h]) * distance;
      logits[j] = ok ? short(clamp_long(logit, logit_min, logit_max)) : short(0);
      valid[j] = ok ? 1 : 0;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const int code = params[SOMA_P_NORM_CODE * heads + h];
    const int B = params[SOMA_P_HCCS_B * heads + h], S = params[SOMA_P_HCCS_S * heads + h];
    const int dmax = params[SOMA_P_HCCS_DMAX * heads + h];
    if (wide)
      wide_normalise(logits, valid, true, slots, code, B, S, dmax, prob, scratch, t);
    else if (code == SOMA_NORM_EXP)
      intexp_normalise<true>(logits, valid, true, slots, params[SOMA_P_EXP_MULT * heads + h], prob, scratch, t);
    else
      hccs_normalise<true>(logits, valid, true, slots, B, S, dmax, clb, prob, scratch, t);
    threadgroup_barrier(mem_flags::mem_threadgroup);

    long gate = SOMA_GATE_ONE;
    if (gated) {
      int partial = 0;
      for (uint d = t.index; d < uint(dim); d += t.count) partial += int(q[qh + d]) * int(gate_field[row + d]);
      const int z = threadgroup_sum(partial, scratch, t);
      gate = clamp_long(SOMA_GATE_HALF + rshift_round(long(z) * params[SOMA_P_GATE_MULT * heads + h],
                                                      params[SOMA_P_GATE_SHIFT * heads + h]),
                        0, SOMA_GATE_ONE);
    }
    for (uint d = t.index; d < uint(dim); d += t.count) {
      long acc = 0;
      for (int j = 0; j < sinks; ++j) acc += long(prob[j]) * long(sink_v_out[sink_base + uint(j * dim) + d]);
      for (int r = 0; r < ring; ++r)
        acc += long(prob[sinks + r]) * long(ring_v_out[ring_base + uint(r * dim) + d]);
      const long near = clamp_long(rshift_round(acc * params[SOMA_P_OUT_MULT * heads + h],
                                                params[SOMA_P_OUT_SHIFT * heads + h]),
                                   SOMA_INT16_MIN, SOMA_INT16_MAX);
      const long far = clamp_long(rshift_round(long(field[row + d]) * params[SOMA_P_ALPHA_MULT * heads + h] * gate,
                                               params[SOMA_P_ALPHA_SHIFT * heads + h] + SOMA_GATE_FRAC_BITS),
                                  SOMA_INT16_MIN, SOMA_INT16_MAX);
      out[qh + d] = short(clamp_long(near + far, out_min, out_max));
    }
    // The next head rewrites logits, valid and prob.
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }

  if (!include_self) {
    threadgroup_barrier(mem_flags::mem_device);
    soma_write_token(ring_k_out, ring_v_out, sink_k_out, sink_v_out, k, v, c, sinks, ring, dim, kv, t);
    c = soma_after_write(c, sinks, ring);
  }
  for (uint d = t.index; d < uint(dim); d += t.count) {
    field_out[row + d] = field_update(field[row + d], field_keys ? k[row + d] : v[row + d], gamma_q15);
    if (gated) gate_field_out[row + d] = field_update(gate_field[row + d], k[row + d], gamma_q15);
  }
  if (kv == 0 && t.index == 0) {
    counters_out[0] = c.write_pos;
    counters_out[1] = c.fill;
    counters_out[2] = c.step;
  }
}

kernel void soma_decode(const device char* q [[buffer(0)]], const device char* k [[buffer(1)]],
                        const device char* v [[buffer(2)]], const device char* ring_k [[buffer(3)]],
                        const device char* ring_v [[buffer(4)]], const device char* sink_k [[buffer(5)]],
                        const device char* sink_v [[buffer(6)]], const device short* field [[buffer(7)]],
                        const device short* gate_field [[buffer(8)]], const device int* counters [[buffer(9)]],
                        const device int* geometry [[buffer(10)]], const device int* params [[buffer(11)]],
                        device short* out [[buffer(12)]], device char* ring_k_out [[buffer(13)]],
                        device char* ring_v_out [[buffer(14)]], device char* sink_k_out [[buffer(15)]],
                        device char* sink_v_out [[buffer(16)]], device short* field_out [[buffer(17)]],
                        device short* gate_field_out [[buffer(18)]], device int* counters_out [[buffer(19)]],
                        uint3 group [[threadgroup_position_in_grid]], uint3 size [[threads_per_threadgroup]],
                        uint index [[thread_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                        uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup int scratch[32];
  threadgroup short logits[SOMA_MAX_SLOTS];
  threadgroup uchar valid[SOMA_MAX_SLOTS];
  threadgroup ushort prob[SOMA_MAX_SLOTS];
  soma_decode_kv_head(q, k, v, ring_k, ring_v, sink_k, sink_v, field, gate_field, counters, geometry, params, out,
                      ring_k_out, ring_v_out, sink_k_out, sink_v_out, field_out, gate_field_out, counters_out,
                      group.y, scratch, logits, valid, prob, RowThreads{index, size.x, lane, simd_group});
}
