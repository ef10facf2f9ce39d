"""rope: rotary position embedding, NeoX (rotate-half) layout, IN PLACE on one tensor per call.

  x [tokens, heads, head_dim] (fp32, fp16 or bf16, C-contiguous), d = head_dim (even), h = d / 2;
  cos, sin [tokens, h] fp32: the angles of each token's position, already gathered by the caller
  (cos[t, j] = cos(pos[t] * inv_freq[j])); every head of token t takes row t.
  x[t, :, :h], x[t, :, h:] = x1 * cos - x2 * sin, x2 * cos + x1 * sin     (x1 = x[t, :, :h], x2 = x[t, :, h:])

In place, as vLLM's `rotary_embedding` and Liger's rope kernel work (q and k are overwritten). One tensor per
call: q and k are two calls with the same cos / sin (they differ in head count under GQA, and a one-tensor
launcher keeps the operand checks, the reference and the registry case simple); a fused q+k call would save
one launch (~5 us of host overhead) and nothing in bytes. fp32 math: 16-bit elements are widened exactly,
rotated in fp32 and rounded once on the store (bf16: to nearest even, kernels.primitives.bf16).

NaN / infinities: elementwise IEEE arithmetic of the pair. A NaN in x1 or x2 makes both outputs of its pair
NaN; an infinity makes both +-inf (NaN where it meets a 0 of cos / sin, or where both terms are infinite
with opposite signs). The reference is the same arithmetic in float64.

Floors per element of x: 3 FLOP (two multiplies and an add per output); bytes = 2 * itemsize (read and
write x) + the cos / sin tables, 2 * 4 * tokens * h, read once.

Kernels:
  - scalar: one block per token (a grid-stride loop past 2^31 - 1 tokens); thread q of the block takes the
    pairs q, q + THREADS, ... of the token's heads * h pairs, UNROLL of them per step (all loads, then all
    stores), so a warp reads 32 consecutive x1 elements, 32 x2 and 32 cos / sin of the same row (cached in
    L1: every head reads it). (head, j) of the next pair is updated without a division (THREADS = dh * h +
    dj, precomputed).
  - vector (x, cos, sin 16-byte aligned and h * itemsize a multiple of 16: h % 8 == 0 for 16-bit x, so every
    Llama / Mistral / Qwen head_dim): the flat index space of "pair vectors", W = 16 / itemsize pairs each
    (W elements of x1, the W of x2 beside them, W cos and W sin), one pair vector per thread per step in
    block-contiguous tiles; a thread's 16-byte loads of x1 and x2 and its W cos / sin (2 x 16 bytes each for
    16-bit x) all issue before its two 16-byte stores. (token, head, j) by one uint32 division each, so the
    kernel takes tensors of under 2^31 pair vectors (32 G elements of 16-bit x); larger ones run the scalar
    kernel.
`path="auto"` takes the vector kernel for fp16 / bf16 on a GPU when it applies
(kernels.primitives.vector.choose); "scalar" and "vector" stay selectable so they can be timed side by side.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, int64, uint32

from kernels.primitives.bf16 import bf16_to_f32, f32_to_bf16
from kernels.primitives.reductions import BLOCK
from kernels.primitives.vector import AUTO_VECTOR, WIDTH, choose, ldg_into, stg_from, vector_ok
from kernels.registry import SPECIALS, Case, Choice, OpSpec, Problem, poison, register
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, FLOAT_IO_BF16, HostSync
from kernels.runtime.launch import FastCache, OverlapGuard, kernel

THREADS = BLOCK  # 256 on a GPU, 32 under the simulator (kernels.primitives.reductions)
F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
MAX_GRID = 2**31 - 1
UNROLL = 4  # pairs per thread per step: 4 x 2 loads of x in flight (plus cos / sin, from L1 after head 0)
# ptxas (sm_90, kernels.runtime.ptx): 64 registers, no spills, every dtype: 4 blocks of 256 per SM, so 32
# warps x 8 loads of x in flight per SM (fp32: 32 KB, what Little's law asks at 4.1 TB/s x ~1 us); one pair
# per step took 72 registers and 2 loads. benchmarks/notes-llm.md has the floors and the prediction.


@cuda.jit(device=True, inline="always")
def _widen(v):  # type: ignore[no-untyped-def]
    return float32(v)


@cuda.jit(device=True, inline="always")
def _same(v):  # type: ignore[no-untyped-def]
    return v  # fp32 / fp16 arrays: the store converts (fp16: round to nearest even)


def _make_rope(load: Any, store: Any) -> Any:
    """x: [tokens * heads * d] flat, cos / sin: [tokens * h] flat; heads, h as scalars."""

    @cuda.jit
    def k(x, cos, sin, heads, h):  # type: ignore[no-untyped-def]
        xi = cuda.local.array(UNROLL, int64)
        a1 = cuda.local.array(UNROLL, float32)
        a2 = cuda.local.array(UNROLL, float32)
        cc = cuda.local.array(UNROLL, float32)
        ss = cuda.local.array(UNROLL, float32)
        tid = cuda.threadIdx.x
        d = 2 * h
        pairs = heads * h
        dh = THREADS // h
        dj = THREADS - dh * h
        h0 = tid // h
        j0 = tid - h0 * h
        tokens = cos.shape[0] // h
        t = cuda.blockIdx.x
        while t < tokens:
            row = t * heads * d
            crow = t * h
            q = tid
            head = h0
            j = j0
            while q < pairs:
                for u in range(UNROLL):  # every load of the step issues before the first store
                    if q < pairs:
                        i = row + head * d + j
                        xi[u] = i
                        a1[u] = load(x[i])
                        a2[u] = load(x[i + h])
                        cc[u] = cos[crow + j]
                        ss[u] = sin[crow + j]
                    else:
                        xi[u] = -1
                    q += THREADS
                    head += dh
                    j += dj
                    if j >= h:
                        j -= h
                        head += 1
                for u in range(UNROLL):
                    i = xi[u]
                    if i >= 0:
                        x[i] = store(a1[u] * cc[u] - a2[u] * ss[u])
                        x[i + h] = store(a2[u] * cc[u] + a1[u] * ss[u])
            t += cuda.gridDim.x

    return k


def _make_rope_vec(width: int) -> Any:
    """The vector kernel for x elements of 16 / width bytes: x [tokens * heads * d] flat, cos / sin [tokens *
    h] flat (fp32, read as width / 4 16-byte vectors per pair vector); heads, h as scalars; h % width == 0."""
    cvec = width // 4  # 16-byte fp32 vectors of cos (and of sin) per pair vector

    @cuda.jit
    def k(x, cos, sin, heads, h):  # type: ignore[no-untyped-def]
        a1 = cuda.local.array(width, float32)
        a2 = cuda.local.array(width, float32)
        cc = cuda.local.array(width, float32)
        ss = cuda.local.array(width, float32)
        hv = uint32(h // width)  # pair vectors per head
        per_token = uint32(heads) * hv
        total = cos.shape[0] // width  # tokens * hv: the pair vectors of one head, over all tokens
        total *= heads
        d = 2 * h
        g = cuda.blockIdx.x * THREADS + cuda.threadIdx.x
        while g < total:
            t = uint32(g) // per_token
            rem = uint32(g) - t * per_token
            head = rem // hv
            jw = (rem - head * hv) * uint32(width)
            i = int64(t) * heads * d + int64(head) * d + jw
            ci = int64(t) * h + jw
            ldg_into(a1, 0, x, i)
            ldg_into(a2, 0, x, i + h)
            for q in range(cvec):
                ldg_into(cc, 4 * q, cos, ci + 4 * q)
                ldg_into(ss, 4 * q, sin, ci + 4 * q)
            for e in range(width):
                y1 = a1[e] * cc[e] - a2[e] * ss[e]
                a2[e] = a2[e] * cc[e] + a1[e] * ss[e]
                a1[e] = y1
            stg_from(x, i, a1, 0)
            stg_from(x, i + h, a2, 0)
            g += cuda.gridDim.x * THREADS

    return k


_IN: dict[np.dtype, str] = {F32: "float32", F16: "float16", BF16: "uint16"}  # bf16 as its raw words
_FNS = {
    F32: _make_rope(_widen, _same),
    F16: _make_rope(_widen, _same),
    BF16: _make_rope(bf16_to_f32, f32_to_bf16),
}
_SIGS = {dt: f"void({t}[::1], float32[::1], float32[::1], int64, int64)" for dt, t in _IN.items()}
_KERNELS = {dt: kernel(_FNS[dt], s) for dt, s in _SIGS.items()}
_VEC_FNS = {dt: _make_rope_vec(WIDTH[dt]) for dt in _SIGS}
_VEC = {dt: kernel(_VEC_FNS[dt], s) for dt, s in _SIGS.items()}
VEC_LIMIT = 2**31  # pair vectors: the vector kernel's uint32 (token, head, j) arithmetic


# x is rewritten in place while every token's cos / sin rows are read by all of its heads' threads
_OVERLAPS: tuple[arrays.Overlap, ...] = (
    (0, 1, False, "x is written while cos is still being read"),
    (0, 2, False, "x is written while sin is still being read"),
)
_FAST = FastCache()  # validated launches by operand layout (kernels.runtime.launch.FastCache)


def rope(x: Any, cos: Any, sin: Any, *, stream: int = 0, path: str = "auto") -> Any:
    """Rotate x [tokens, heads, head_dim] in place by cos / sin [tokens, head_dim / 2] (fp32), NeoX layout
    (see the module doc). Returns x (a numpy x is copied back). `path`: "auto", "scalar" or "vector"
    (kernels.primitives.vector.choose; "vector" needs 16-byte aligned x, cos, sin and head_dim / 2 elements
    of x a multiple of 16 bytes)."""
    bound, ptrs = _FAST.find((x, cos, sin), path)
    if bound is not None:
        bound.launch(ptrs, stream)
        return x
    sync = HostSync()
    xo = arrays.operand("x", x, sync, writeback=True)
    arrays.check_dtype(xo, FLOAT_IO_BF16)
    arrays.check_ndim(xo, (3,))
    arrays.check_contiguous(xo)
    arrays.check_nonempty(xo)
    tokens, heads, d = xo.shape
    if d % 2:
        raise ValueError(f"x: head_dim (the last dimension) must be even, got shape {xo.shape}")
    h = d // 2
    co = arrays.operand("cos", cos, sync)
    so = arrays.operand("sin", sin, sync)
    for op in (co, so):
        arrays.check_dtype(op, (F32,))
        arrays.check_shape(op, (tokens, h), "x's tokens by head_dim / 2")
        arrays.check_contiguous(op)
    arrays.check_overlaps((xo, co, so), _OVERLAPS)
    dt = xo.dtype
    w = WIDTH[dt]
    ok = vector_ok((xo.ptr, co.ptr, so.ptr), h * dt.itemsize) and xo.size // (2 * w) < VEC_LIMIT
    if choose(path, dt, ok):
        k, grid = _VEC[dt], max(1, min(MAX_GRID, (xo.size // (2 * w) + THREADS - 1) // THREADS))
    else:
        k, grid = _KERNELS[dt], max(1, min(MAX_GRID, tokens))
    args = (xo, co, so, heads, h)
    k.launch(grid, THREADS, args, stream=stream)
    if xo.host is None and co.host is None and so.host is None:
        # the same layout again (the key: shapes, strides, dtypes, 16-byte alignment, path) takes the same
        # kernel and grid; only the pointers are new, and the guard checks them against _OVERLAPS
        guard = OverlapGuard.over(k.bind(grid, THREADS, args), (xo, co, so), _OVERLAPS)
        _FAST.store((x, cos, sin), path, guard)
    sync.finish()
    return x


def reference(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """The rotation in float64 (x, cos, sin widened exactly)."""
    xf = np.asarray(x).astype(np.float64)
    h = xf.shape[-1] // 2
    c = cos.astype(np.float64)[:, None, :]
    s = sin.astype(np.float64)[:, None, :]
    x1, x2 = xf[..., :h], xf[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def tables(positions: np.ndarray, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos / sin [tokens, head_dim / 2] fp32 for integer positions (the usual inv_freq = base^(-2j / d))."""
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


# --- registry ---------------------------------------------------------------------------------------------


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    p = case.params
    shape = (p["tokens"], p["heads"], p["head_dim"])
    dt = np.dtype(case.dtype)
    x = rng.standard_normal(shape, dtype=np.float32).astype(dt)
    cos, sin = tables(rng.integers(0, 32768, p["tokens"]), p["head_dim"])
    if p.get(SPECIALS):
        x = poison(x, p[SPECIALS])
    return Problem(
        inputs={"x": x, "cos": cos, "sin": sin},
        outputs={},
        reference={"x": reference(x, cos, sin)},
        inplace=("x",),
    )


def _spec_launch(a: dict[str, Any]) -> None:
    rope(a["x"], a["cos"], a["sin"])


def _cupy(a: dict[str, Any]) -> None:
    # the same rotation as CuPy elementwise expressions (fp32 math for 16-bit x), written back in place
    import cupy as cp

    x = a["x"]
    h = x.shape[-1] // 2
    c = a["cos"][:, None, :]
    s = a["sin"][:, None, :]
    x1 = x[..., :h].astype(cp.float32)
    x2 = x[..., h:].astype(cp.float32)
    x[..., :h] = x1 * c - x2 * s
    x[..., h:] = x2 * c + x1 * s


def _elems(c: Case) -> int:
    return c.params["tokens"] * c.params["heads"] * c.params["head_dim"]


def _bytes(c: Case) -> float:
    tables_bytes = 2 * 4 * c.params["tokens"] * (c.params["head_dim"] // 2)
    return float(2 * _elems(c) * np.dtype(c.dtype).itemsize + tables_bytes)


def _choose(case: Case) -> Choice:
    """What "auto" runs for a registry case (device allocations are aligned: dtype and head_dim decide)."""
    dt = np.dtype(case.dtype)
    h = case.params["head_dim"] // 2
    if arrays.SIMULATED:
        return Choice("scalar", "simulated", "the CUDA simulator runs the scalar kernel")
    if dt not in AUTO_VECTOR:
        return Choice("scalar", "primary", f"{dt}: one element per load, UNROLL pairs in flight per thread")
    if (h * dt.itemsize) % 16:
        return Choice("scalar", "fallback", f"head_dim / 2 = {h} elements of {dt} is not a multiple of 16 "
                      "bytes: scalar loads instead of the vector kernel")  # fmt: skip
    return Choice("vector", "primary", f"{dt}: 16-byte loads of x1, x2, cos and sin")


def _cases(shapes: list[tuple[str, int, int, int]], **extra: int) -> tuple[Case, ...]:
    return tuple(
        Case(label, {"tokens": t, "heads": nh, "head_dim": d, **extra}, dt)
        for label, t, nh, d in shapes
        for dt in ("float32", "float16", "bfloat16")
    )


SPEC = register(
    OpSpec(
        name="rope",
        dtypes=("float32", "float16", "bfloat16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=lambda c: float(3 * _elems(c)),
        bytes=_bytes,
        # measured in the simulator, worst of 12 seeds x sim + special cases (rel / elem): fp32 4.5e-8 /
        # 8.5e-8, fp16 2.4e-4 / 3.5e-4, bf16 1.8e-3 / 2.7e-3. fp32: two products and a sum per output (a GPU
        # may fuse one product into an FMA: another ulp); 16-bit: one rounding of the fp32 result, at most
        # 2^-11 (fp16) / 2^-8 (bf16) of |ref|
        tolerance={"float32": 1e-6, "float16": 1e-3, "bfloat16": 4e-3},
        elem_tolerance={"float32": 1e-5, "float16": 1e-3, "bfloat16": 5e-3},
        sim_cases=_cases([("tiny-odd", 3, 5, 38)]),
        verify_cases=_cases([("odd", 37, 7, 94), ("gqa-like", 1001, 3, 128)]),
        # head_dim 34: the scalar kernel; 128: the vector kernel on a GPU (the simulator runs it by path)
        special_cases=_cases([("specials", 4, 2, 34), ("specials-aligned", 4, 2, 128)], specials=1),
        # 16384 tokens x 32 heads x 128: fp32 reads and writes 268 MB each (545 MB with the tables), 16-bit
        # 277 MB
        bench_cases=_cases([("16384x32x128", 16384, 32, 128)]),
        cupy=_cupy,
        bound="memory",
        ptx_kernels=(
            *((f"rope_{dt.name}", _FNS[dt], s) for dt, s in _SIGS.items()),
            *((f"rope_vec_{dt.name}", _VEC_FNS[dt], s) for dt, s in _SIGS.items()),
        ),
        path=lambda c: _choose(c).path,
        choose=_choose,
    )
)
