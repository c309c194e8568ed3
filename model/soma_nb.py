"""Numba fast path of the integer Soma decode step, bit-identical to the numpy spec in soma_int.

The whole token loop runs inside one ``@njit`` function; every slot of the row (sinks, then ring) is scored
whether valid or not, so the work per token is the same at every sequence position, as in the RTL.
The score (q . k, |sum| <= D * 2^14) and P.V (|acc| < 2^23, docs/numerics.md) loops run in int32 lanes, so
that LLVM vectorises int8 x int8 -> int32; the rest is int64 (wide enough for every product), cast on store.
``cfg`` and ``st`` are a :class:`somatile.model.soma.SomaConfig` and its :class:`~somatile.model.soma.SomaState`
(read through their fields, as in soma_int).
"""

from __future__ import annotations

from dataclasses import dataclass

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


DOT_CHUNK = 64
"""Head dimensions that are a multiple of this run the dot products and P.V rows in loops of this constant
trip count: LLVM then emits them as straight-line vector code, with no remainder loop or runtime trip-count
checks per slot (a third of the score time at head_dim 64)."""


@numba.njit(cache=True, nogil=True, inline="always")
def _dot(q16, h, keys, c, j, D):
    """q16[h] . keys[c, j] in int32 lanes (|sum| <= D * 2^14), indexed in place: a view per slot would cost
    two atomic reference-count updates, more than the 64 multiplies. q16 holds the query widened to int16
    once per token, so that the multiply is the int16 x int16 -> int32 pair LLVM forms vpmaddwd from."""
    s = np.int32(0)
    if D % DOT_CHUNK == 0:
        for d0 in range(0, D, DOT_CHUNK):
            for i in range(DOT_CHUNK):
                d = np.uint64(d0) + np.uint64(i)
                s = np.int32(s + np.int32(np.int32(q16[h, d]) * np.int32(keys[c, j, d])))
    else:
        for d in range(D):
            s = np.int32(s + np.int32(np.int32(q16[h, d]) * np.int32(keys[c, j, d])))
    return s


@numba.njit(cache=True, nogil=True, inline="always")
def _scores(q16, h0, group, keys, c, slots, scores, s0, D):
    """scores[g, s0 + j] = q16[h0 + g] . keys[c, j] for the group's heads g and slots j < ``slots``, a head at a
    time over the KV head's key rows (16 KiB at 256 slots x 64: they stay in L1 for the group). A head
    dimension of DOT_CHUNK runs a copy in which it is a constant (1.7 us of an 11 us step at 9 x 64 x 256)."""
    if D == DOT_CHUNK:
        for g in range(group):
            for j in range(slots):
                scores[g, s0 + j] = _dot(q16, h0 + g, keys, c, j, DOT_CHUNK)
    else:
        for g in range(group):
            for j in range(slots):
                scores[g, s0 + j] = _dot(q16, h0 + g, keys, c, j, D)


@numba.njit(cache=True, nogil=True, inline="always")
def _logits(scores, r0, j0, j1, mult, shift, recency, dist0, valid_end, lo, hi, x_rows):
    """Steps 3 and 5 over slots j0..j1-1 of the row at flat offset r0 of ``scores`` and ``x_rows``, where the
    ring distance is ``dist0 - j`` (a straight piece of the modulo): x = sat(rshr(s * mult, shift) -
    recency * dist, lo, hi), 0 from ``valid_end`` on. Branch-free and with unsigned indices (no
    negative-index wrap-around), so that LLVM vectorises it in int64 lanes."""
    half = (np.int64(1) << shift) >> 1
    for i in range(j1 - j0):
        j = np.uint64(j0) + np.uint64(i)
        logit = ((np.int64(scores[r0 + j]) * mult + half) >> shift) - recency * (dist0 - np.int64(j))
        logit = lo if logit < lo else (hi if logit > hi else logit)
        x_rows[r0 + j] = logit if np.int64(j) < valid_end else 0


PV_SLOTS = 4
"""P.V adds this many value rows per pass over the accumulator rows, so that an int32 accumulator is loaded
and stored once per four slots rather than once per slot."""
PV_HEADS = 3
"""P.V multiplies each value element by this many query heads' probabilities while it is in a register (the
group of a KV head, SmolLM2's 9 / 3): the value rows are loaded and widened once for the three."""
NARROW_PROB = (1 << 15) - 1
"""Probabilities below 2^15 (every paper row, and a wide row without a probability of exactly 1.0) are
masked with this before the multiply: LLVM then knows that the int32 product of a probability and a
sign-extended int8 fits one ``vpmaddwd`` lane instead of a ``vpmulld`` (a mask of -1 keeps the general
multiply for wide rows that reach 32768)."""


@numba.njit(cache=True, nogil=True, inline="always")
def _probs(prob, g, j, keep):
    """prob[g, j..j+PV_SLOTS-1] as int32, each masked with ``keep`` (NARROW_PROB or -1)."""
    return (np.int32(prob[g, j]) & keep, np.int32(prob[g, j + 1]) & keep, np.int32(prob[g, j + 2]) & keep,
            np.int32(prob[g, j + 3]) & keep)


@numba.njit(cache=True, nogil=True, inline="always")
def _weighted(p, v_0, v_1, v_2, v_3):
    """p[0]*v_0 + ... + p[3]*v_3 in int32 (each product below 2^22)."""
    return np.int32(np.int32(np.int32(p[0] * v_0) + np.int32(p[1] * v_1))
                    + np.int32(np.int32(p[2] * v_2) + np.int32(p[3] * v_3)))


@numba.njit(cache=True, nogil=True, inline="always")
def _accumulate_heads(acc, g, p_a, p_b, p_c, values, c, j, d):
    """acc[g..g+2, d] += the products of the three heads' probabilities and values[c, j..j+3, d]."""
    v_0, v_1 = np.int32(values[c, j, d]), np.int32(values[c, j + 1, d])
    v_2, v_3 = np.int32(values[c, j + 2, d]), np.int32(values[c, j + 3, d])
    acc[g, d] = np.int32(acc[g, d] + _weighted(p_a, v_0, v_1, v_2, v_3))
    acc[g + 1, d] = np.int32(acc[g + 1, d] + _weighted(p_b, v_0, v_1, v_2, v_3))
    acc[g + 2, d] = np.int32(acc[g + 2, d] + _weighted(p_c, v_0, v_1, v_2, v_3))


@numba.njit(cache=True, nogil=True, inline="always")
def _accumulate_head(acc, g, p_a, values, c, j, d):
    """acc[g, d] += the products of one head's probabilities and values[c, j..j+3, d]."""
    acc[g, d] = np.int32(acc[g, d] + _weighted(p_a, np.int32(values[c, j, d]), np.int32(values[c, j + 1, d]),
                                               np.int32(values[c, j + 2, d]), np.int32(values[c, j + 3, d])))


@numba.njit(cache=True, nogil=True, inline="always")
def _below(values, bound):
    """Whether every element of the 1-D int32 array ``values`` is below ``bound``."""
    top = np.int32(0)
    for i in range(values.shape[0]):
        v = values[np.uint64(i)]
        top = v if v > top else top
    return top < bound


@numba.njit(cache=True, nogil=True, inline="always")
def _accumulate(acc, group, prob, p0, values, c, slots, D, keep):
    """acc[g] += sum_j prob[g, p0 + j] * values[c, j] over slots j < ``slots``, in int32 lanes (|acc| < 2^23):
    PV_SLOTS value rows per pass, PV_HEADS heads per value element; ``keep`` as :data:`NARROW_PROB`. A head
    dimension of DOT_CHUNK runs a copy of the loops in which it is a constant (the pass measured 1.35x
    slower with it a runtime value)."""
    if D == DOT_CHUNK:
        _accumulate_rows(acc, group, prob, p0, values, c, slots, DOT_CHUNK, keep)
    else:
        _accumulate_rows(acc, group, prob, p0, values, c, slots, D, keep)


@numba.njit(cache=True, nogil=True, inline="always")
def _accumulate_rows(acc, group, prob, p0, values, c, slots, D, keep):
    """The loops of :func:`_accumulate`; the loop over heads stays outside the loop over slots (inside it, with
    a runtime group size, the pass measured 2.2x slower)."""
    full = slots - slots % PV_SLOTS
    triples = group - group % PV_HEADS
    chunked = D % DOT_CHUNK == 0
    for g in range(0, triples, PV_HEADS):
        for j in range(0, full, PV_SLOTS):
            p_a, p_b = _probs(prob, g, p0 + j, keep), _probs(prob, g + 1, p0 + j, keep)
            p_c = _probs(prob, g + 2, p0 + j, keep)
            if chunked:
                for d0 in range(0, D, DOT_CHUNK):
                    for i in range(DOT_CHUNK):
                        _accumulate_heads(acc, g, p_a, p_b, p_c, values, c, j, np.uint64(d0) + np.uint64(i))
            else:
                for d in range(D):
                    _accumulate_heads(acc, g, p_a, p_b, p_c, values, c, j, d)
    for g in range(triples, group):
        for j in range(0, full, PV_SLOTS):
            p_a = _probs(prob, g, p0 + j, keep)
            if chunked:
                for d0 in range(0, D, DOT_CHUNK):
                    for i in range(DOT_CHUNK):
                        _accumulate_head(acc, g, p_a, values, c, j, np.uint64(d0) + np.uint64(i))
            else:
                for d in range(D):
                    _accumulate_head(acc, g, p_a, values, c, j, d)
    for j in range(full, slots):
        for g in range(group):
            p_j = np.int32(prob[g, p0 + j])
            for d in range(D):
                acc[g, d] = np.int32(acc[g, d] + np.int32(p_j * np.int32(values[c, j, d])))


@numba.njit(cache=True, nogil=True)
def _run(q, k, v, ring_k, ring_v, sink_k, sink_v, field, gate_field, write_pos, fill, step, p, codes, layer, out):
    """The token loop. Work is blocked by KV head: its ``group`` query heads score and accumulate against
    the same key and value rows while they are in L1, sinks and ring in separate loops (no per-slot branch
    between the two arrays). The ring distance is linear in the slot on either side of ``write_pos``, so
    the logits need no distance table; once every slot is valid the normaliser takes its unmasked path.
    ``layer`` holds the per-layer integers in LAYER_FIELDS order (one array: a numba call costs per
    argument). The state's counters come in as integers and go back as the returned (write_pos, fill, step):
    an array for them cost a numpy construction and a ``tolist`` per call."""
    (include_self, gated, field_keys, profile, hccs_mode, gamma_q15, logit_lo, logit_hi, out_lo,
     out_hi) = (layer[0] != 0, layer[1] != 0, layer[2] != 0, layer[3], layer[4], layer[5], layer[6], layer[7],
                layer[8], layer[9])
    T, H, D = q.shape
    Hkv = k.shape[1]
    group = H // Hkv
    sinks, ring = sink_k.shape[1], ring_k.shape[1]
    n = sinks + ring
    q16 = np.empty((H, D), np.int16)
    scores = np.empty((group, n), np.int32)
    x_rows = np.empty((group, n), np.int32)
    flat_scores, flat_x = scores.reshape(-1), x_rows.reshape(-1)
    valid = np.zeros(n, np.bool_)
    no_mask = np.zeros(0, np.bool_)
    prob = np.zeros((group, n), np.int32)
    flat_prob = prob.reshape(-1)
    acc = np.zeros((group, D), np.int32)
    lag = 0 if include_self else 1
    counters = np.empty(3, np.int64)
    counters[0], counters[1], counters[2] = write_pos, fill, step
    for t in range(T):
        if include_self:
            _write(ring_k, ring_v, sink_k, sink_v, counters, k[t], v[t])
        write_pos, fill, step = counters[0], counters[1], counters[2]
        sink_fill = min(step, sinks)
        for j in range(sinks):
            valid[j] = j < sink_fill
        for j in range(ring):
            valid[sinks + j] = j < fill
        mask = no_mask if sink_fill == sinks and fill == ring else valid
        for h in range(H):
            for d in range(D):
                q16[h, d] = q[t, h, d]
        for c in range(Hkv):
            h0 = c * group
            _scores(q16, h0, group, sink_k, c, sinks, scores, 0, D)
            _scores(q16, h0, group, ring_k, c, ring, scores, sinks, D)
            for g in range(group):
                h = h0 + g
                mult, shift, recency = p[_SCORE_MULT, h], p[_SCORE_SHIFT, h], p[_RECENCY, h]
                r0 = np.uint64(g * n)
                _logits(flat_scores, r0, 0, sinks, mult, shift, 0, 0, sink_fill, logit_lo, logit_hi, flat_x)
                # ring slot j: dist = (write_pos - 1 - j) mod ring + lag, i.e. dist0 - j with dist0 below
                # for j < write_pos and dist0 + ring from there on
                dist0 = write_pos - 1 + lag + sinks
                _logits(flat_scores, r0, sinks, sinks + write_pos, mult, shift, recency, dist0, sinks + fill,
                        logit_lo, logit_hi, flat_x)
                _logits(flat_scores, r0, sinks + write_pos, n, mult, shift, recency, dist0 + ring, sinks + fill,
                        logit_lo, logit_hi, flat_x)
                _normalise_row(x_rows[g], mask, p, h, profile, codes[h], hccs_mode, prob[g])
            acc[:] = 0
            if profile != PROFILE_WIDE or _below(flat_prob, NARROW_PROB + 1):
                _accumulate(acc, group, prob, 0, sink_v, c, sinks, D, np.int32(NARROW_PROB))
                _accumulate(acc, group, prob, sinks, ring_v, c, ring, D, np.int32(NARROW_PROB))
            else:
                _accumulate(acc, group, prob, 0, sink_v, c, sinks, D, np.int32(-1))
                _accumulate(acc, group, prob, sinks, ring_v, c, ring, D, np.int32(-1))
            for g in range(group):
                h = h0 + g
                gate = np.int64(GATE_ONE)
                if gated:
                    z = np.int64(0)
                    for d in range(D):
                        z += np.int64(q[t, h, d]) * np.int64(gate_field[c, d])
                    gate = _clamp(GATE_HALF + _rshift_round(z * p[_GATE_MULT, h], p[_GATE_SHIFT, h]), 0, GATE_ONE)
                out_mult, out_shift = p[_OUT_MULT, h], p[_OUT_SHIFT, h]
                far_mult, far_shift = p[_ALPHA_MULT, h] * gate, p[_ALPHA_SHIFT, h] + GATE_FRAC_BITS
                for d in range(D):
                    near = _clamp(_rshift_round(np.int64(acc[g, d]) * out_mult, out_shift), INT16_MIN, INT16_MAX)
                    far = _clamp(_rshift_round(np.int64(field[c, d]) * far_mult, far_shift), INT16_MIN, INT16_MAX)
                    out[t, h, d] = _clamp(near + far, out_lo, out_hi)
        if not include_self:
            _write(ring_k, ring_v, sink_k, sink_v, counters, k[t], v[t])
        _field_update(field, k[t] if field_keys else v[t], gamma_q15)
        if gated:
            _field_update(gate_field, k[t], gamma_q15)
    return counters[0], counters[1], counters[2]


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


LAYER_FIELDS = ("include_self", "gated", "field_keys", "profile", "hccs_mode", "gamma_q15", "logit_lo", "logit_hi",
                "out_lo", "out_hi")
"""The per-layer integers that :func:`_run` reads from its ``layer`` argument, in this order."""
PLAN_CACHE_SIZE = 32


@dataclass(frozen=True)
class _Plan:
    """What a config contributes to every call of :func:`_run`, computed once per config object: the
    parameter table, the normaliser codes, the LAYER_FIELDS array and the output dtype (together about
    a tenth of a 30 us step when rebuilt per token)."""

    cfg: object
    params: np.ndarray
    codes: np.ndarray
    layer: np.ndarray
    out_dtype: np.dtype


_plans: dict[int, _Plan] = {}


def _plan(cfg) -> _Plan:
    """The plan of ``cfg``, looked up by identity (a frozen config never changes; hashing one costs more
    than the lookup saves). The plan holds ``cfg``, so its id is not reused while the entry exists."""
    plan = _plans.get(id(cfg))
    if plan is not None and plan.cfg is cfg:
        return plan
    lim = LIMITS[cfg.profile]
    layer = np.array([cfg.include_self, cfg.gated, cfg.field_source == "keys", PROFILE_CODES[cfg.profile],
                      hccs.MODE_CODES[cfg.hccs_mode], cfg.gamma_q15, *lim["logit"], *lim["out"]], np.int64)
    plan = _Plan(cfg, param_table(cfg), norm_codes(cfg), layer, out_dtype(cfg))
    if len(_plans) >= PLAN_CACHE_SIZE:
        _plans.pop(next(iter(_plans)), None)
    _plans[id(cfg)] = plan
    return plan


def run(cfg, st, q, k, v) -> np.ndarray:
    """T integer decode steps (same contract as soma_int.run_spec); ``st`` is updated in place."""
    plan = _plan(cfg)
    out = np.empty(q.shape, plan.out_dtype)
    st.write_pos, st.fill, st.step = _run(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                                          st.ring_k, st.ring_v, st.sink_k, st.sink_v, st.field, st.gate_field,
                                          st.write_pos, st.fill, st.step, plan.params, plan.codes, plan.layer, out)
    return out
