"""The ``metal://`` backend: somatile's kernels (integer HCCS, integer exp, Soma, float SFA) on the Apple GPU.

Two dispatch paths run the same kernel text (somatile.host.metal_kernels):

- ``MlxRunner`` (the main path): ``mx.fast.metal_kernel`` with the entry point's body; MLX's default safe
  math; outputs come back as new arrays.
- ``PyObjCRunner`` (the second path): the whole library compiled by ``newLibraryWithSource`` with fast math
  switched off, buffers in shared storage, one command buffer per dispatch.

Both take the module they drive (``mlx.core`` or PyObjC's ``Metal``) as an argument, so tests inject the CPU
stand-ins of somatile.host.metal_emu and run this dispatch code on Linux.

Kernel calls mirror the model's entry points and validate with the model's own checks: `hccs` (hccs_int),
`intexp` (intexp_softmax), `wide_softmax` (the wide profile's normalisers), `soma_prefill` /
`soma_decode_step` (integer Soma, both profiles), `sfa_apply` (float SFA).
Integer results are bit-identical to somatile.model, SFA floats agree within float32 rounding (tests/metal).

The device (`somatile.host.open`) is the host driver of every backend, `TileDevice`, over the firmware's
reference request handling whose tiles compute on Metal (`tile_class`), so it behaves exactly like emu://.
URLs:

- ``metal://`` or ``metal://?api=mlx``: MLX on the Apple GPU; ``metal://?api=pyobjc``: PyObjC.
- ``metal://?emulate=1[&api=...][&order=random&seed=N]``: the same dispatch code over the CPU emulator
  (Linux with g++; slow, for tests and for comparing backends).
- ``&board=NAME`` and tile overrides (``&ring=8&head_dim=16``...), ``timeout``, ``retries``: as for emu://.
"""

from __future__ import annotations

import importlib
import platform
import sys
import urllib.parse
from collections.abc import Sequence

import numpy as np

from somatile.host import metal_kernels

MAX_ROW_THREADS = 256
"""Threads per threadgroup of the row kernels: whole simdgroups, at most 256 (a row's elements are strided
over them)."""


class MetalUnavailable(RuntimeError):
    """The requested Metal dispatch path cannot run on this machine."""


class MetalError(RuntimeError):
    """Metal refused a kernel (compile or pipeline error) or a command buffer failed."""


def _unavailable(api: str, package: str, exc: Exception | None = None) -> MetalUnavailable:
    where = f"{platform.system()} {platform.machine()}"
    text = (f"metal://?api={api}: Metal is not available on this machine ({where}): the Apple GPU backend "
            f"needs macOS on Apple silicon with {package} (`pip install 'somatile[apple]'`). "
            f"On Linux, metal://?emulate=1 runs the same kernels on the CPU emulator (slow; for tests).")
    if exc is not None:
        text += f" ({type(exc).__name__}: {exc})"
    return MetalUnavailable(text)


def row_threads(cols: int) -> int:
    """Threadgroup size for a row of ``cols`` elements: a multiple of 32 covering the row, at most 256."""
    return min(MAX_ROW_THREADS, 32 * max(1, -(-cols // 32)))


class MlxRunner:
    """Runs entry points through ``mx.fast.metal_kernel`` (kernels built once per entry and reused)."""

    api = "mlx"

    def __init__(self, mx):
        self.mx = mx
        self._kernels: dict[tuple[str, str], object] = {}

    def run(self, family: str, entry: str, inputs: Sequence[np.ndarray],
            outputs: Sequence[tuple[tuple[int, ...], np.dtype]], grid: tuple[int, int, int],
            threadgroup: tuple[int, int, int]) -> list[np.ndarray]:
        """Dispatch ``entry`` of ``family`` over ``grid`` threads; inputs bind to the entry's input buffers in
        order and ``outputs`` (shape, dtype) to its output buffers. Returns the outputs as numpy arrays."""
        key = (family, entry)
        if key not in self._kernels:
            spec = metal_kernels.mlx_spec(family, entry)
            self._kernels[key] = self.mx.fast.metal_kernel(
                name=spec.name, input_names=list(spec.input_names), output_names=list(spec.output_names),
                source=spec.source, header=spec.header)
        results = self._kernels[key](
            inputs=[self.mx.array(a) for a in inputs], output_shapes=[tuple(s) for s, _ in outputs],
            output_dtypes=[getattr(self.mx, np.dtype(d).name) for _, d in outputs], grid=tuple(grid),
            threadgroup=tuple(threadgroup))
        return [np.array(r) for r in results]


class PyObjCRunner:
    """Runs entry points through PyObjC's Metal bindings (one library per kernel family, fast math off)."""

    api = "pyobjc"

    def __init__(self, metal):
        self.metal = metal
        self.device = metal.MTLCreateSystemDefaultDevice()
        if self.device is None:
            raise _unavailable("pyobjc", "a Metal device")
        self.queue = self.device.newCommandQueue()
        self._libraries: dict[str, object] = {}
        self._pipelines: dict[tuple[str, str], object] = {}

    def _pipeline(self, family: str, entry: str):
        if family not in self._libraries:
            options = self.metal.MTLCompileOptions.new()
            # Fast math reassociates and flushes float results; both paths must agree with MLX's safe math.
            options.setFastMathEnabled_(False)
            library, error = self.device.newLibraryWithSource_options_error_(
                metal_kernels.library_source(family), options, None)
            if library is None:
                raise MetalError(f"Metal could not compile kernel family {family!r}: {error}")
            self._libraries[family] = library
        key = (family, entry)
        if key not in self._pipelines:
            function = self._libraries[family].newFunctionWithName_(entry)
            if function is None:
                raise MetalError(f"kernel family {family!r} has no function {entry!r}")
            pipeline, error = self.device.newComputePipelineStateWithFunction_error_(function, None)
            if pipeline is None:
                raise MetalError(f"Metal could not build a pipeline for {entry!r}: {error}")
            self._pipelines[key] = pipeline
        return self._pipelines[key]

    def run(self, family: str, entry: str, inputs: Sequence[np.ndarray],
            outputs: Sequence[tuple[tuple[int, ...], np.dtype]], grid: tuple[int, int, int],
            threadgroup: tuple[int, int, int]) -> list[np.ndarray]:
        """Same contract as `MlxRunner.run`."""
        pipeline = self._pipeline(family, entry)
        limit = pipeline.maxTotalThreadsPerThreadgroup()
        if int(np.prod(threadgroup)) > limit:
            raise MetalError(f"{entry}: threadgroup {tuple(threadgroup)} exceeds this pipeline's {limit} threads")
        shared = self.metal.MTLResourceStorageModeShared
        in_buffers = [self.device.newBufferWithBytes_length_options_(np.ascontiguousarray(a).tobytes(),
                                                                     a.nbytes, shared) for a in inputs]
        sizes = [int(np.prod(s)) * np.dtype(d).itemsize for s, d in outputs]
        out_buffers = [self.device.newBufferWithLength_options_(max(1, n), shared) for n in sizes]
        command_buffer = self.queue.commandBuffer()
        encoder = command_buffer.computeCommandEncoder()
        encoder.setComputePipelineState_(pipeline)
        for index, buffer in enumerate(in_buffers + out_buffers):
            encoder.setBuffer_offset_atIndex_(buffer, 0, index)
        encoder.dispatchThreads_threadsPerThreadgroup_(self.metal.MTLSizeMake(*grid),
                                                       self.metal.MTLSizeMake(*threadgroup))
        encoder.endEncoding()
        command_buffer.commit()
        command_buffer.waitUntilCompleted()
        if command_buffer.error() is not None:
            raise MetalError(f"{entry}: the command buffer failed: {command_buffer.error()}")
        return [np.frombuffer(b.contents().as_buffer(n), np.dtype(d)).reshape(s).copy()
                for b, n, (s, d) in zip(out_buffers, sizes, outputs)]


def make_runner(api: str = "mlx", *, emulate: bool = False, order: str = "forward", seed: int = 0,
                marker: int | None = None):
    """A runner for ``api`` ("mlx" or "pyobjc"): on the Apple GPU, or with ``emulate`` on the CPU emulator
    (``order``, ``seed`` and ``marker`` as in somatile.host.metal_emu.EmulatedLibrary.dispatch)."""
    if api not in ("mlx", "pyobjc"):
        raise ValueError(f"api: expected 'mlx' or 'pyobjc', got {api!r}")
    if emulate:
        from somatile.host import metal_emu
        stand_in = (metal_emu.EmulatedMLX if api == "mlx" else metal_emu.EmulatedMetal)(
            order=order, seed=seed, marker=metal_emu.DEFAULT_MARKER if marker is None else marker)
        return MlxRunner(stand_in) if api == "mlx" else PyObjCRunner(stand_in)
    if sys.platform != "darwin":
        raise _unavailable(api, "mlx" if api == "mlx" else "pyobjc-framework-Metal")
    module_name, package = ("mlx.core", "mlx") if api == "mlx" else ("Metal", "pyobjc-framework-Metal")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _unavailable(api, package, exc) from exc
    return MlxRunner(module) if api == "mlx" else PyObjCRunner(module)


def _rows_kernel(runner, family: str, entry: str, x3: np.ndarray, valid3, shape_words: list[int],
                 head_params: np.ndarray, out_dtype) -> np.ndarray:
    """One threadgroup per row of x3 (heads, rows, cols): the calling convention of the row kernels."""
    heads, rows, cols = x3.shape
    valid = np.ones(1, np.uint8) if valid3 is None else np.ascontiguousarray(valid3, np.uint8)
    threads = row_threads(cols)
    inputs = [np.ascontiguousarray(x3), valid, np.array(shape_words, np.int32), head_params]
    (result,) = runner.run(family, entry, inputs, [(x3.shape, out_dtype)], (threads, heads * rows, 1),
                           (threads, 1, 1))
    return result


def hccs(runner, x: np.ndarray, B, S, dmax, *, mode: str = "div", out: str = "uint8", mask=None,
         allow_zero_floor: bool = False) -> np.ndarray:
    """Integer HCCS on the GPU; the contract (arguments, errors, result) of somatile.model.hccs.hccs_int."""
    from somatile.model.hccs import MODE_CODES, OUT_CODES, OUT_DTYPES, as_heads, check_params, code_of

    mode_code = code_of(MODE_CODES, "mode", mode)
    code_of(OUT_CODES, "out", out)
    x3, valid3, squeeze = as_heads(x, mask)
    B, S, dmax = check_params(B, S, dmax, x3.shape[-1], x3.shape[0], allow_zero_floor=allow_zero_floor)
    head_params = np.ascontiguousarray(np.stack([B, S, dmax], axis=1), np.int32)
    result = _rows_kernel(runner, "hccs", f"hccs_{out}", x3, valid3,
                          [x3.shape[2], x3.shape[1], mode_code, valid3 is not None], head_params, OUT_DTYPES[out])
    return result[0] if squeeze else result


def intexp(runner, x: np.ndarray, mult, *, out: str = "uint8", mask=None) -> np.ndarray:
    """Integer-exp softmax on the GPU; the contract of somatile.model.intexp.intexp_softmax."""
    from somatile.model.hccs import OUT_CODES, OUT_DTYPES, as_heads, code_of, per_head
    from somatile.model.intexp import EXP_MULT_MAX, EXP_MULT_MIN, MAX_COLS

    code_of(OUT_CODES, "out", out)
    x3, valid3, squeeze = as_heads(x, mask)
    if x3.shape[-1] > MAX_COLS:
        raise ValueError(f"x: rows of {x3.shape[-1]} elements exceed the int32 row sum ({MAX_COLS} max)")
    mult = per_head("mult", mult, x3.shape[0])
    if np.any((mult < EXP_MULT_MIN) | (mult > EXP_MULT_MAX)):
        h = int(np.flatnonzero((mult < EXP_MULT_MIN) | (mult > EXP_MULT_MAX))[0])
        raise ValueError(f"mult: head {h} M = {mult[h]} is outside {EXP_MULT_MIN}..{EXP_MULT_MAX}")
    result = _rows_kernel(runner, "intexp", f"intexp_{out}", x3, valid3,
                          [x3.shape[2], x3.shape[1], valid3 is not None], np.ascontiguousarray(mult, np.int32),
                          OUT_DTYPES[out])
    return result[0] if squeeze else result


def wide_softmax(runner, x: np.ndarray, normaliser: str = "exp", B=0, S=256, dmax=None, *, mask=None) -> np.ndarray:
    """The wide profile's normaliser on the GPU; the contract (arguments, defaults, errors, uint16 Q15 result) of
    somatile.model.wide.wide_softmax: int16 logits (R, N) or (H, R, N), N <= 65535, normaliser "exp", "hccs"
    or "pwl2" with per-head B, S, dmax (``dmax`` None: the model's default, no clip)."""
    from somatile.model import wide

    x3, valid3, squeeze = wide.as_wide_logits(x, mask)
    B, S, dmax = wide.check_params(normaliser, B, S, wide.DMAX_MAX if dmax is None else dmax, x3.shape[0])
    head_params = np.ascontiguousarray(np.stack([B, S, dmax], axis=1), np.int32)
    result = _rows_kernel(runner, "wide", "wide_softmax", x3, valid3,
                          [x3.shape[2], x3.shape[1], wide.NORM_CODES[normaliser], valid3 is not None], head_params,
                          np.uint16)
    return result[0] if squeeze else result


def _dummy_if_empty(a: np.ndarray) -> np.ndarray:
    """Metal has no zero-length buffers: an empty state array (no sinks, no gate field) binds one element."""
    return a if a.size else np.zeros(1, a.dtype)


def soma_run(runner, cfg, state, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """T integer Soma decode steps on the GPU, one dispatch per token; the contract of the model's integer run
    (somatile.model.soma.prefill with ``integer=True``) in either profile: q int8 (T, H, D), k, v int8
    (T, Hkv, D) -> (T, H, D) of ``soma_fixed.out_dtype(cfg)`` (int8 "paper", int16 "wide"), ``state`` (a
    SomaState of ``cfg``) updated in place. Needs ``cfg.integer`` and sinks + ring <= SOMA_MAX_SLOTS."""
    from somatile.model import hccs as hccs_model
    from somatile.model import soma, soma_fixed, soma_int

    if not cfg.integer:
        raise ValueError("SomaConfig.integer: the Metal Soma kernel runs the integer decode step; expected True")
    if cfg.slots > metal_kernels.SOMA_MAX_SLOTS:
        raise ValueError(f"SomaConfig.ring: sinks + ring = {cfg.slots} exceeds the {metal_kernels.SOMA_MAX_SLOTS} "
                         f"slots the Metal kernel keeps in threadgroup memory")
    soma.check_state(cfg, state, None)
    words = {"heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads, "dim": cfg.head_dim, "ring": cfg.ring,
             "sinks": cfg.sinks, "include_self": cfg.include_self, "gated": cfg.gated,
             "field_keys": cfg.field_source == "keys", "profile": soma_fixed.PROFILE_CODES[cfg.profile],
             "hccs_clb": hccs_model.MODE_CODES[cfg.hccs_mode], "gamma_q15": cfg.gamma_q15}
    geometry = np.array([int(words[name]) for name in metal_kernels.SOMA_GEOMETRY], np.int32)
    rows = {"norm_code": soma_int.norm_codes(cfg)}
    params = np.ascontiguousarray(np.vstack([soma_int.param_table(cfg),
                                             *(rows[name] for name in metal_kernels.SOMA_PARAM_ROWS)]), np.int32)
    threads = row_threads(max(cfg.slots, cfg.head_dim))
    names = ("ring_k", "ring_v", "sink_k", "sink_v", "field", "gate_field")
    # The kernel writes int16 in both profiles; the paper profile's values are int8 by its last saturation.
    out = np.empty(q.shape, soma_fixed.out_dtype(cfg))
    for t in range(q.shape[0]):
        arrays = [_dummy_if_empty(getattr(state, name)) for name in names]
        counters = np.array([state.write_pos, state.fill, state.step], np.int32)
        results = runner.run("soma", "soma_decode", [q[t], k[t], v[t], *arrays, counters, geometry, params],
                             [(q.shape[1:], np.int16), *((a.shape, a.dtype) for a in arrays), ((3,), np.int32)],
                             (threads, cfg.n_kv_heads, 1), (threads, 1, 1))
        out[t] = results[0]
        for name, new in zip(names, results[1:7]):
            if getattr(state, name).size:
                getattr(state, name)[...] = new
        state.write_pos, state.fill, state.step = (int(c) for c in results[7])
    return out


def soma_prefill(runner, cfg, q, k, v, *, state=None):
    """somatile.model.soma.prefill for integer configs, on the GPU: returns (out (T, H, D), state); out is
    int8 in profile "paper" and int16 in "wide", as the model's."""
    from somatile.model import soma

    q, k, v = soma.check_inputs(cfg, q, k, v, seq=True)
    state = soma.SomaState.empty(cfg) if state is None else state
    return soma_run(runner, cfg, state, q, k, v), state


def soma_decode_step(runner, cfg, state, q, k, v):
    """somatile.model.soma.decode_step for integer configs, on the GPU: returns (out (H, D), state), int8
    ("paper") or int16 ("wide")."""
    from somatile.model import soma

    q, k, v = soma.check_inputs(cfg, q, k, v, seq=False)
    return soma_run(runner, cfg, state, q[None], k[None], v[None])[0], state


def _elementwise(n: int) -> dict:
    """Grid and threadgroup of a one-thread-per-element kernel over n elements."""
    return {"grid": (n, 1, 1), "threadgroup": (min(MAX_ROW_THREADS, n), 1, 1)}


def sfa_alphas(runner, cfg) -> np.ndarray:
    """Stage 5 on the GPU: alpha_l for every layer of ``cfg`` (float32 (n_layers,))."""
    (alphas,) = runner.run("sfa", "sfa_alpha_decay",
                           [np.array([cfg.alpha_base, cfg.cross_decay], np.float32),
                            np.array([cfg.n_layers], np.int32)],
                           [((cfg.n_layers,), np.float32)], **_elementwise(cfg.n_layers))
    return alphas


def sfa_enhancement(runner, cfg, state, alpha: float, x: np.ndarray) -> np.ndarray:
    """Stages 1-4 and 6 for one token x (hidden,) float32 with the layer's ``alpha``: the enhancement
    (hidden,) float32; ``state`` (a somatile.model.sfa.SfaState) is updated in place, counters on the host."""
    from somatile.model import sfa

    if cfg.slots > metal_kernels.SFA_MAX_SLOTS:
        raise ValueError(f"SfaConfig.slots: {cfg.slots} exceeds the {metal_kernels.SFA_MAX_SLOTS} pool slots the "
                         f"Metal kernel keeps in threadgroup memory")
    hidden, f32, i32 = state.hidden, np.float32, np.int32
    per_element = _elementwise(hidden)
    ring_fill = min(state.ring_fill + 1, cfg.ring)
    ring, ring_mean = runner.run("sfa", "sfa_ring_buffer",
                                 [state.ring, x, np.array([state.ring_pos, ring_fill], i32),
                                  np.array([cfg.ring, hidden], i32)],
                                 [((cfg.ring, hidden), f32), ((hidden,), f32)], **per_element)
    (field,) = runner.run("sfa", "sfa_ema_field", [state.field, x, np.array([cfg.gamma], f32),
                                                   np.array([hidden], i32)], [((hidden,), f32)], **per_element)
    ring_pos = (state.ring_pos + 1) % cfg.ring
    wrapped = ring_pos == 0
    write = state.pool_pos if wrapped else -1
    pool_pos = (state.pool_pos + 1) % cfg.slots if wrapped else state.pool_pos
    pool_fill = min(state.pool_fill + 1, cfg.slots) if wrapped else state.pool_fill
    temperature = cfg.temperature or float(np.sqrt(hidden))
    threads = row_threads(max(cfg.slots, hidden))
    pool, semantic = runner.run("sfa", "sfa_semantic_pool",
                                [state.pool, ring_mean, np.array([write, pool_fill], i32),
                                 np.array([temperature], f32), np.array([cfg.slots, hidden], i32)],
                                [((cfg.slots, hidden), f32), ((hidden,), f32)], (threads, 1, 1), (threads, 1, 1))
    (fused,) = runner.run("sfa", "sfa_fusion", [ring_mean, field, semantic,
                                                np.array([cfg.field_weight, cfg.semantic_weight], f32),
                                                np.array([hidden], i32)], [((hidden,), f32)], **per_element)
    (enhancement,) = runner.run("sfa", "sfa_clip", [fused, np.array([alpha, cfg.clip], f32),
                                                    np.array([hidden, sfa.CLIP_ORDERS.index(cfg.clip_order)], i32)],
                                [((hidden,), f32)], **per_element)
    state.ring[...], state.field[...], state.pool[...] = ring, field, pool
    state.ring_pos, state.ring_fill, state.pool_pos, state.pool_fill = ring_pos, ring_fill, pool_pos, pool_fill
    return enhancement


def sfa_apply(runner, cfg, state, layer: int, x):
    """somatile.model.sfa.sfa_apply on the GPU: x + enhancement for one token (hidden,) or a sequence
    (T, hidden) of layer ``layer``; returns (float32 array of x's shape, state updated in place)."""
    from somatile.model import sfa

    x = sfa.check_x(state, x)
    sfa.alpha_decay(layer, cfg.n_layers, cfg.alpha_base, cfg.cross_decay)  # validates the layer index
    alpha = float(sfa_alphas(runner, cfg)[layer])
    rows = x[None] if x.ndim == 1 else x
    out = np.stack([row + sfa_enhancement(runner, cfg, state, alpha, np.ascontiguousarray(row)) for row in rows])
    return (out[0] if x.ndim == 1 else out), state


def tile_class():
    """`MetalTile`: the golden tile model of somatile.hw.tile_model with its two compute steps (the Soma
    decode step of one head, the HCCS command's rows) running on a Metal runner. Everything else (frames,
    parameter registers, state bytes, error codes) is the tile model's own, so metal:// answers every command
    exactly as emu:// does. Built on first use: the tile model is not loaded for kernel-only use of this
    module."""
    from somatile.hw.tile_model import TileModel

    class MetalTile(TileModel):
        def __init__(self, params, tile_index: int, runner):
            if params.profile not in METAL_PROFILES:
                raise ValueError(f"metal://: TileParams.profile = {params.profile!r}: the Metal tile implements "
                                 f"{', '.join(METAL_PROFILES)}")
            super().__init__(params, tile_index)
            self.runner = runner

        def decode_step(self, cfg, state, q, k, v):
            return soma_decode_step(self.runner, cfg, state, q, k, v)

        def normalise_rows(self, values, x):
            if self.params.profile == "wide":
                return wide_softmax(self.runner, x, values["normaliser"].removesuffix("_int"), values["hccs_B"],
                                    values["hccs_S"], values["hccs_dmax"])
            return hccs(self.runner, x, values["hccs_B"], values["hccs_S"], values["hccs_dmax"],
                        mode=values["hccs_mode"], out=self.params.hccs_out)

    return MetalTile


METAL_PROFILES = ("paper", "wide")
"""The tile profiles metal:// computes (TileParams.profile)."""


METAL_URL_OPTIONS = ("api", "emulate", "order", "seed")


def open_url(parts: urllib.parse.SplitResult, **options):
    """``somatile.host.open("metal://...")``: the host driver of every backend (`TileDevice`) over the
    firmware's reference request handling, whose tiles compute on Metal. Options (URL query or keywords):
    ``api`` (mlx, pyobjc), ``emulate``, ``order``, ``seed`` (see the module docstring); the rest as for
    emu://: ``board`` (default "sim") with tile parameter overrides (``ring=8``...), ``timeout``, ``retries``,
    and the driver's keywords (``progress``)."""
    from somatile.host import url_options
    from somatile.host.emu import LoopbackTransport, ReferenceFirmware, board_params, url_board
    from somatile.host.tile_driver import open_transport

    query = url_options(parts)
    ours = {k: query.pop(k) for k in METAL_URL_OPTIONS if k in query}
    ours.update({k: str(options.pop(k)) for k in METAL_URL_OPTIONS if k in options})
    link, board, overrides = url_board(parts._replace(query=urllib.parse.urlencode(query)), options)
    emulate = ours.get("emulate", "0").lower() in ("1", "true", "yes")
    runner = make_runner(ours.get("api", "mlx"), emulate=emulate, order=ours.get("order", "forward"),
                         seed=int(ours.get("seed", "0")))
    params, name = board_params(board, overrides)
    metal_tile = tile_class()
    firmware = ReferenceFirmware(params, name, tiles=[metal_tile(params, i, runner).command
                                                      for i in range(params.n_tiles)])
    where = "CPU emulation" if emulate else "GPU"
    return open_transport(LoopbackTransport(firmware.endpoint),
                          f"metal://?{parts.query or 'board=' + name} ({runner.api} on the {where})", **link)
