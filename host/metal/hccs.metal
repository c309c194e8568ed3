// Integer HCCS (docs/numerics.md, section HCCS), bit-exact with somatile.model.hccs.hccs_int.
//
// One threadgroup per row: rows are long (up to 32767 elements under the row-mass rule) and few per head,
// so the threads of a threadgroup share a row's max and sum through simd and threadgroup reductions rather
// than each thread walking a whole row alone (thread-per-row would leave most of the GPU idle for the
// 64..4096-row batches of one attention layer). The constants HCCS_* come from the model module through
// the prelude that somatile.host.metal_kernels writes; common.metal is assembled before this file.
//
// Buffers: x int8 (rows, cols) row-major; valid uint8 (rows, cols), 1 = element takes part, read only when
// shape[3] != 0; shape int32 [cols, rows_per_head, mode (0 div, 1 clb), has_mask]; head_params int32
// (heads, 3) = (B, S, Dmax), row r uses head r / rows_per_head; out uint8 or int16 (rows, cols).
// Dispatch: grid (T, rows, 1), threadgroup (T, 1, 1), T a multiple of 32 in 32..1024.

// HCCS of one row of `cols` logits at x (device or threadgroup memory; valid[i] != 0 marks the elements
// that take part when `masked`), written to out[0..cols); called by every thread of the threadgroup.
template <bool Uint8Out, typename XPtr, typename ValidPtr, typename OutPtr, typename Scratch>
void hccs_normalise(XPtr x, ValidPtr valid, bool masked, int cols, int B, int S, int dmax, bool clb, OutPtr out,
                    Scratch scratch, RowThreads t) {
  const int m = masked_row_max(x, valid, masked, cols, scratch, t);

  int partial = 0;
  for (uint c = t.index; c < uint(cols); c += t.count)
    if (!masked || valid[c]) partial += B - S * min(m - int(x[c]), dmax);
  const int total = threadgroup_sum(partial, scratch, t);

  // A row with no valid element (total 0) outputs zeros: inv = 0.
  int inv = 0;
  if (total > 0) {
    const int numerator = Uint8Out ? HCCS_UINT8_NUMERATOR : HCCS_INT16_NUMERATOR;
    inv = clb ? (numerator >> floor_log2(total)) : (numerator / total);
  }
  for (uint c = t.index; c < uint(cols); c += t.count) {
    int p = 0;
    if (!masked || valid[c]) {
      p = (B - S * min(m - int(x[c]), dmax)) * inv;
      p = Uint8Out ? min(p >> HCCS_INV_SHIFT, HCCS_UINT8_MAX) : min(p, HCCS_INT16_MAX);
    }
    out[c] = p;
  }
}

template <bool Uint8Out, typename Out, typename Scratch>
void hccs_rows(const device char* x, const device uchar* valid, const device int* shape,
               const device int* head_params, device Out* out, Scratch scratch, uint row, RowThreads t) {
  const int cols = shape[0];
  const uint head = row / uint(shape[1]);
  const uint base = row * uint(cols);
  hccs_normalise<Uint8Out>(x + base, valid + base, shape[3] != 0, cols, head_params[3 * head],
                           head_params[3 * head + 1], head_params[3 * head + 2], shape[2] != 0, out + base,
                           scratch, t);
}

kernel void hccs_uint8(const device char* x [[buffer(0)]], const device uchar* valid [[buffer(1)]],
                       const device int* shape [[buffer(2)]], const device int* head_params [[buffer(3)]],
                       device uchar* out [[buffer(4)]], uint3 group [[threadgroup_position_in_grid]],
                       uint3 size [[threads_per_threadgroup]], uint index [[thread_index_in_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]], uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup int scratch[32];
  hccs_rows<true>(x, valid, shape, head_params, out, scratch, group.y, RowThreads{index, size.x, lane, simd_group});
}

kernel void hccs_int16(const device char* x [[buffer(0)]], const device uchar* valid [[buffer(1)]],
                       const device int* shape [[buffer(2)]], const device int* head_params [[buffer(3)]],
                       device short* out [[buffer(4)]], uint3 group [[threadgroup_position_in_grid]],
                       uint3 size [[threads_per_threadgroup]], uint index [[thread_index_in_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]], uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup int scratch[32];
  hccs_rows<false>(x, valid, shape, head_params, out, scratch, group.y, RowThreads{index, size.x, lane, simd_group});
}
