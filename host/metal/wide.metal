// The wide profile's row normaliser (docs/numerics.md, "Wide normalisers"), bit-exact with
// somatile.model.wide.wide_softmax: int16 base-2 logits in, Q15 probabilities out, weights exp / hccs / pwl2.
// One threadgroup per row for the reasons of hccs.metal (rows up to 65535 elements, a row-wide max and sum).
// The WIDE_* constants come from somatile.model.wide through the prelude of somatile.host.metal_kernels;
// common.metal and intexp.metal (whose exp2_frac is the exp weight's quadratic) are assembled before this file.
//
// Widths: distances and weights are unsigned 16 bit, S * d needs all 32 bits of a uint, the row sum stays
// below 2^31 (65535 * 32768) so the int reductions hold it, and E * inv + half < 2^32 fits a uint.
//
// Buffers: x int16 (rows, cols); valid uint8 (rows, cols) read when shape[3] != 0; shape int32
// [cols, rows_per_head, code (WIDE_NORM_*), has_mask]; head_params int32 (heads, 3) = (B, S, dmax);
// out uint16 (rows, cols). Dispatch: grid (T, rows, 1), threadgroup (T, 1, 1), T a multiple of 32 in 32..1024.

constant uint wide_pwl2_knots[WIDE_PWL2_SEGMENTS + 1] = {WIDE_PWL2_KNOTS};

// v >> z rounded half up; 0 once z >= WIDE_ZERO_SHIFT (every Q15 weight is then below 1/2 LSB).
inline uint wide_octave(uint v, uint z) { return z >= WIDE_ZERO_SHIFT ? 0u : (v + ((1u << z) >> 1)) >> z; }

// The weight E (0..32768) of an element at distance t = m - x (0..65535) for normaliser `code`.
inline uint wide_weight(int code, uint t, uint B, uint S, uint dmax) {
  if (code == WIDE_NORM_EXP)
    return wide_octave(uint(exp2_frac(int((t & 0xFFu) << (EXP_FRAC_BITS - WIDE_LOGIT_FRAC_BITS)))),
                       t >> WIDE_LOGIT_FRAC_BITS);
  const uint d = min(t, dmax);
  if (code == WIDE_NORM_HCCS) return B - ((S * d) >> WIDE_S_FRAC_BITS);
  const uint u = (S * d) >> WIDE_S_FRAC_BITS;
  const uint interp_bits = WIDE_LOGIT_FRAC_BITS - WIDE_PWL2_SEG_BITS;
  const uint f = u & ((1u << WIDE_LOGIT_FRAC_BITS) - 1u);
  const uint seg = f >> interp_bits, g = f & ((1u << interp_bits) - 1u);
  const uint hi = wide_pwl2_knots[seg], lo = wide_pwl2_knots[seg + 1];
  return wide_octave(hi - (((hi - lo) * g) >> interp_bits), u >> WIDE_LOGIT_FRAC_BITS);
}

// The wide normaliser of one row of `cols` int16 logits at x (device or threadgroup memory), Q15 into
// out[0..cols); `valid` and `masked` as in hccs_normalise. Called by every thread of the threadgroup.
template <typename XPtr, typename ValidPtr, typename OutPtr, typename Scratch>
void wide_normalise(XPtr x, ValidPtr valid, bool masked, int cols, int code, int B, int S, int dmax, OutPtr out,
                    Scratch scratch, RowThreads t) {
  const int m = masked_row_max(x, valid, masked, cols, scratch, t, WIDE_LOGIT_MIN);

  int partial = 0;
  for (uint c = t.index; c < uint(cols); c += t.count)
    if (!masked || valid[c]) partial += int(wide_weight(code, uint(m - int(x[c])), uint(B), uint(S), uint(dmax)));
  const int total = threadgroup_sum(partial, scratch, t);

  // The sum is shifted (either way) into [2^15, 2^16) so that 2^31 / T is one 32-bit division; the shift
  // moves to the rounding of each element. A row with no valid element (total 0) outputs zeros: inv = 0.
  uint inv = 0u, shift = 1u;
  if (total > 0) {
    const int k = floor_log2(total) - (WIDE_SUM_NORM_BITS - 1);
    const uint normalised = k >= 0 ? uint(total) >> k : uint(total) << -k;
    inv = (1u << WIDE_RECIP_BITS) / normalised;
    shift = uint(WIDE_SUM_NORM_BITS + k);
  }
  const uint half = (1u << shift) >> 1;
  for (uint c = t.index; c < uint(cols); c += t.count) {
    uint p = 0u;
    if (!masked || valid[c]) {
      const uint e = wide_weight(code, uint(m - int(x[c])), uint(B), uint(S), uint(dmax));
      p = min((e * inv + half) >> shift, uint(WIDE_PROB_ONE));
    }
    out[c] = p;
  }
}

kernel void wide_softmax(const device short* x [[buffer(0)]], const device uchar* valid [[buffer(1)]],
                         const device int* shape [[buffer(2)]], const device int* head_params [[buffer(3)]],
                         device ushort* out [[buffer(4)]], uint3 group [[threadgroup_position_in_grid]],
                         uint3 size [[threads_per_threadgroup]], uint index [[thread_index_in_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]], uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup int scratch[32];
  const int cols = shape[0];
  const uint row = group.y, head = row / uint(shape[1]), base = row * uint(cols);
  wide_normalise(x + base, valid + base, shape[3] != 0, cols, shape[2], head_params[3 * head],
                 head_params[3 * head + 1], head_params[3 * head + 2], out + base, scratch,
                 RowThreads{index, size.x, lane, simd_group});
}
