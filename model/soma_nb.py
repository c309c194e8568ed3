"""Numba fast path of the integer Soma decode step, bit-identical to the numpy spec in soma_int.

The whole token loop runs inside one ``@njit`` function; every slot of the row (sinks, then ring) is scored
whether valid or not, so the work per token is the same at every sequence position, as in the RTL.
The score (q . k, |sum| <= D * 2^14) and P.V (|acc| < 2^23, docs/numerics.md) loops run in int32 lanes, so
that LLVM vectorises int8 x int8 -> int32; the rest is int64 (wide enough for every product), cast on store.
``cfg`` and ``st`` are a :class:`somatile.model.soma.SomaConfig` and its :class:`~somatile.model.soma.SomaState`
(read through their fields, as in soma_int).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from somatile.model import hccs, intexp, nbcache, wide
from somatile.model.soma_fixed import (COUNTER_MAX, FIELD_FRAC_BITS, GAMMA_Q15_ONE, GATE_FRAC_BITS, GATE_HALF,
                                       GATE_ONE, INT16_MAX, INT16_MIN, NORM_HCCS, PARAM_ROWS, PROFILE_CODES,
                                       PROFILE_WIDE, out_dtype, param_table)
from somatile.model.soma_int import LIMITS, norm_codes

# The kernels here inline the row kernels of hccs.py / intexp.py / wide.py and constants of soma_fixed.py /
# soma_int.py: their changes must reach this module's cache too.
nbcache.drop_stale(__file__, ("soma_nb.py", "hccs.py", "intexp.py", "wide.py", "soma_fixed.py", "soma_int.py"))

(_SCORE_MULT, _SCORE_SHIFT, _RECENCY, _B, _S, _DMAX, _EXP_MULT, _OUT_MULT, _OUT_SHIFT, _ALPHA_MULT,
 _ALPHA_SHIFT, _GATE_MULT, _GATE_SHIFT) = range(len(PARAM_ROWS))


@numba.njit(cache=True, nogil=True, inline="always")
def _rshift_round(x, s):
    return (x + ((np.int64(1) << s) >> 1)) >> s


@numba.njit(cache=True, nogil=True, inline="always")
def _clamp(x, lo, hi):
    return lo if x < lo else (hi if x > hi else x)


@numba.njit(cache=True, nogil=True)
def _normalise_row(x_row, valid_row, p, h, profile, norm_code, hccs_mode, out_row):
    if profile == PROFILE_WIDE:
        wide.wide_row(x_row, valid_row, norm_code, p[_B, h], p[_S, h], p[_DMAX, h], out_row)
    elif norm_code == NORM_HCCS:
        hccs.hccs_row(x_row, valid_row, p[_B, h], p[_S, h], p[_DMAX, h], hccs_mode, hccs.OUT_UINT8, out_row)
    else:
        intexp.intexp_row(x_row, valid_row, p[_EXP_MULT, h], hccs.OUT_UINT8, out_row)


@numba.njit(cache=True, nogil=True)
def normalise_rows(x2, valid2, head_of_row, p, profile, codes, hccs_mode, out2):
    """Probabilities (int32 out2: uint8-valued "paper", Q15 "wide") of rows x2 (R, N) of the profile's
    logits; row r uses head head_of_row[r] and its normaliser code codes[head]."""
    for r in range(x2.shape[0]):
        h = head_of_row[r]
        _normalise_row(x2[r], valid2[r], p, h, profile, codes[h], hccs_mode, out2[r])


@numba.njit(cache=True, nogil=True)
def _write(ring_k, ring_v, sink_k, sink_v, counters, k, v):
    write_pos, fill, step = counters[0], counters[1], counters[2]
    sinks, ring = sink_k.shape[1], ring_k.shape[1]
    if step < sinks:
        sink_k[:, step, :] = k
        sink_v[:, step, :] = v
    else:
        ring_k[:, write_pos, :] = k
        ring_v[:, write_pos, :] = v
        counters[0] = (write_pos + 1) % ring
        counters[1] = min(fill + 1, ring)
    counters[2] = min(step + 1, COUNTER_MAX)


@numba.njit(cache=True, nogil=True)
def _field_update(f, x, gamma_q15):
    for c in range(f.shape[0]):
        for d in range(f.shape[1]):
            acc = gamma_q15 * np.int64(f[c, d]) + (GAMMA_Q15_ONE - gamma_q15) * (np.int64(x[c, d]) << FIELD_FRAC_BITS)
            f[c, d] = _rshift_round(acc, 15)


@numba.njit(cache=True, nogil=True, inline="always")
def _dot(q, t, h, keys, c, j, D):
    """q[t, h] . keys[c, j] in int32 lanes (|sum| <= D * 2^14), indexed in place: a view per slot would
    cost two atomic reference-count updates, more than the 64 multiplies."""
    s = np.int32(0)
    for d in range(D):
        s = np.int32(s + np.int32(np.int32(q[t, h, d]) * np.int32(keys[c, j, d])))
    return s


@numba.njit(cache=True, nogil=True, inline="always")
def _accumulate(acc, g, pj, values, c, j, D):
    """acc[g] += pj * values[c, j] in int32 lanes (|acc| < 2^23)."""
    for d in range(D):
        acc[g, d] = np.int32(acc[g, d] + np.int32(pj * np.int32(values[c, j, d])))


@numba.njit(cache=True, nogil=True)
def _run(q, k, v, ring_k, ring_v, sink_k, sink_v, field, gate_field, counters, p, include_self, gated,
         field_keys, profile, codes, hccs_mode, gamma_q15, logit_lo, logit_hi, out_lo, out_hi, out):
    """The token loop. Work is blocked by KV head: its ``group`` query heads score and accumulate against
    the same key and value rows while they are in L1, sinks and ring in separate loops (no per-slot branch
    between the two arrays)."""
    T, H, D = q.shape
    Hkv = k.shape[1]
    group = H // Hkv
    sinks, ring = sink_k.shape[1], ring_k.shape[1]
    n = sinks + ring
    x_row = np.zeros(n, np.int32)
    valid = np.zeros(n, np.bool_)
    dist = np.zeros(n, np.int64)
    prob = np.zeros((group, n), np.int32)
    acc = np.zeros((group, D), np.int32)
    for t in range(T):
        if include_self:
            _write(ring_k, ring_v, sink_k, sink_v, counters, k[t], v[t])
        write_pos, fill, step = counters[0], counters[1], counters[2]
        for j in range(sinks):
            valid[j] = j < step
            dist[j] = 0
        lag = 0 if include_self else 1
        for j in range(ring):
            valid[sinks + j] = j < fill
            dist[sinks + j] = (write_pos - 1 - j) % ring + lag
        for c in range(Hkv):
            for g in range(group):
                h = c * group + g
                mult, shift, recency = p[_SCORE_MULT, h], p[_SCORE_SHIFT, h], p[_RECENCY, h]
                for j in range(sinks):
                    logit = _rshift_round(np.int64(_dot(q, t, h, sink_k, c, j, D)) * mult, shift) - recency * dist[j]
                    x_row[j] = _clamp(logit, logit_lo, logit_hi) if valid[j] else 0
                for j in range(ring):
                    logit = (_rshift_round(np.int64(_dot(q, t, h, ring_k, c, j, D)) * mult, shift)
                             - recency * dist[sinks + j])
                    x_row[sinks + j] = _clamp(logit, logit_lo, logit_hi) if valid[sinks + j] else 0
                _normalise_row(x_row, valid, p, h, profile, codes[h], hccs_mode, prob[g])
            acc[:] = 0
            for j in range(sinks):
                for g in range(group):
                    _accumulate(acc, g, prob[g, j], sink_v, c, j, D)
            for j in range(ring):
                for g in range(group):
                    _accumulate(acc, g, prob[g, sinks + j], ring_v, c, j, D)
            for g in range(group):
                h = c * group + g
                gate = np.int64(GATE_ONE)
                if gated:
                    z = np.int64(0)
                    for d in range(D):
                        z += np.int64(q[t, h, d]) * np.int64(gate_field[c, d])
                    gate = _clamp(GATE_HALF + _rshift_round(z * p[_GATE_MULT, h], p[_GATE_SHIFT, h]), 0, GATE_ONE)
                for d in range(D):
                    near = _clamp(_rshift_round(np.int64(acc[g, d]) * p[_OUT_MULT, h], p[_OUT_SHIFT, h]),
                                  INT16_MIN, INT16_MAX)
                    far = _clamp(_rshift_round(np.int64(field[c, d]) * p[_ALPHA_MULT, h] * gate,
                                               p[_ALPHA_SHIFT, h] + GATE_FRAC_BITS), INT16_MIN, INT16_MAX)
                    out[t, h, d] = _clamp(near + far, out_lo, out_hi)
        if not include_self:
            _write(ring_k, ring_v, sink_k, sink_v, counters, k[t], v[t])
        _field_update(field, k[t] if field_keys else v[t], gamma_q15)
        if gated:
            _field_update(gate_field, k[t], gamma_q15)


def normalise_int(cfg, x3: np.ndarray, valid3: np.ndarray) -> np.ndarray:
    """Integer probabilities (int32; uint8-valued in profile "paper", Q15 in "wide") of the profile's
    logits (int8 / int16, (n_heads, R, N)) over bool ``valid3`` of the same shape, through the row kernels
    (parameters were checked for rows of ``cfg.slots`` valid entries)."""
    heads, rows, n = x3.shape
    out = np.empty((heads * rows, n), np.int32)
    normalise_rows(np.ascontiguousarray(x3.reshape(-1, n)), np.ascontiguousarray(valid3.reshape(-1, n)),
                   np.repeat(np.arange(heads), rows), param_table(cfg), PROFILE_CODES[cfg.profile],
                   norm_codes(cfg), hccs.MODE_CODES[cfg.hccs_mode], out)
    return out.reshape(x3.shape)


@functools.lru_cache(maxsize=32)
def _tables(cfg):
    """param_table and norm_codes of a config, computed once: at one token per call they cost about a
    sixth of the step. The arrays are only read by _run."""
    return param_table(cfg), norm_codes(cfg)


def run(cfg, st, q, k, v) -> np.ndarray:
    """T integer decode steps (same contract as soma_int.run_spec); ``st`` is updated in place."""
    out = np.empty(q.shape, out_dtype(cfg))
    counters = np.array([st.write_pos, st.fill, st.step], np.int64)
    lim = LIMITS[cfg.profile]
    params, codes = _tables(cfg)
    _run(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), st.ring_k, st.ring_v,
         st.sink_k, st.sink_v, st.field, st.gate_field, counters, params, cfg.include_self, cfg.gated,
         cfg.field_source == "keys", PROFILE_CODES[cfg.profile], codes, hccs.MODE_CODES[cfg.hccs_mode],
         cfg.gamma_q15, *lim["logit"], *lim["out"], out)
    st.write_pos, st.fill, st.step = (int(x) for x in counters)
    return out
