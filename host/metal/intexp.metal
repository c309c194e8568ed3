// Integer-exp softmax for the HCCS fallback heads (docs/numerics.md, section "Integer-exp softmax"),
// bit-exact with somatile.model.intexp.intexp_softmax. One threadgroup per row, for the same reason as
// hccs.metal (long rows, a row-wide max and sum); the EXP_* constants come from the model module through
// the prelude of somatile.host.metal_kernels. Every intermediate fits int32 (widths in the model's WIDTHS).
//
// Buffers: x int8 (rows, cols); valid uint8 (rows, cols) read when shape[2] != 0; shape int32
// [cols, rows_per_head, has_mask]; head_params int32 (heads,) = integer input scale M; out uint8/int16.
// Dispatch: grid (T, rows, 1), threadgroup (T, 1, 1), T a multiple of 32 in 32..1024.

// 2**(-r / 2**15) in Q15 for r in 0..32767: the base-2 I-BERT quadratic.
inline int exp2_frac(int r) {
  const int w = (EXP_POLY_B - r) >> 1;
  return ((EXP_POLY_A * ((w * w) >> 13)) >> EXP_FRAC_BITS) + EXP_POLY_C;
}

// E for the distance m - x: the fraction's exponential divided by 2**z (z the integer part), rounded half
// up; 0 once z >= 16.
inline int exp_of_distance(int m, int x, int mult) {
  const int u = (m - x) * mult;
  const int z = u >> EXP_FRAC_BITS;
  return z >= EXP_ZERO_SHIFT ? 0 : (exp2_frac(u & (EXP_ONE - 1)) + ((1 << z) >> 1)) >> z;
}

// Integer-exp softmax of one row of `cols` logits at x (device or threadgroup memory), written to
// out[0..cols); `valid` and `masked` as in hccs_normalise. Called by every thread of the threadgroup.
template <bool Uint8Out, typename XPtr, typename ValidPtr, typename OutPtr, typename Scratch>
void intexp_normalise(XPtr x, ValidPtr valid, bool masked, int cols, int mult, OutPtr out, Scratch scratch,
                      RowThreads t) {
  const int m = masked_row_max(x, valid, masked, cols, scratch, t);

  int partial = 0;
  for (uint c = t.index; c < uint(cols); c += t.count)
    if (!masked || valid[c]) partial += exp_of_distance(m, int(x[c]), mult);
  const int total = threadgroup_sum(partial, scratch, t);

  // The row sum is pre-shifted into [2**14, 2**15) so that one int32 division gives the reciprocal.
  int pre_shift = 0, inv = 0;
  if (total > 0) {
    pre_shift = max(floor_log2(total) - (EXP_SUM_NORM_BITS - 1), 0);
    inv = (Uint8Out ? EXP_UINT8_NUMERATOR : EXP_INT16_NUMERATOR) / (total >> pre_shift);
  }
  for (uint c = t.index; c < uint(cols); c += t.count) {
    int p = 0;
    if (!masked || valid[c]) p = ((exp_of_distance(m, int(x[c]), mult) >> pre_shift) * inv) >> EXP_FRAC_BITS;
    out[c] = p;
  }
}

template <bool Uint8Out, typename Out, typename Scratch>
void intexp_rows(const device char* x, const device uchar* valid, const device int* shape,
                 const device int* head_params, device Out* out, Scratch scratch, uint row, RowThreads t) {
  const int cols = shape[0];
  const uint base = row * uint(cols);
  intexp_normalise<Uint8Out>(x + base, valid + base, shape[2] != 0, cols, head_params[row / uint(shape[1])],
                             out + base, scratch, t);
}

kernel void intexp_uint8(const device char* x [[buffer(0)]], const device uchar* valid [[buffer(1)]],
                         const device int* shape [[buffer(2)]], const device int* head_params [[buffer(3)]],
                         device uchar* out [[buffer(4)]], uint3 group [[threadgroup_position_in_grid]],
                         uint3 size [[threads_per_threadgroup]], uint index [[thread_index_in_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]], uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup int scratch[32];
  intexp_rows<true>(x, valid, shape, head_params, out, scratch, group.y, RowThreads{index, size.x, lane, simd_group});
}

kernel void intexp_int16(const device char* x [[buffer(0)]], const device uchar* valid [[buffer(1)]],
                         const device int* shape [[buffer(2)]], const device int* head_params [[buffer(3)]],
                         device short* out [[buffer(4)]], uint3 group [[threadgroup_position_in_grid]],
                         uint3 size [[threads_per_threadgroup]], uint index [[thread_index_in_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]], uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup int scratch[32];
  intexp_rows<false>(x, valid, shape, head_params, out, scratch, group.y, RowThreads{index, size.x, lane, simd_group});
}
