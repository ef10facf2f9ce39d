"""gemm's portable kernel: 16 x 16 shared-memory tiles, one output per thread. Pure numba: it runs under the
CUDA simulator and on any GPU (fp32 or fp16 inputs; bf16 through `make_words_kernel`)."""

from __future__ import annotations

import math
from functools import cache
from typing import Any

from numba import cuda, float32

from kernels.primitives.bf16 import bf16_to_f32, f32_to_bf16

PT = 16  # tile edge; block = PT x PT threads
PT1 = PT + 1  # padded row (shared-array shapes must be literal constants for numba-cuda on a GPU)


@cache
def make_kernel(has_bias: bool, has_res: bool) -> Any:
    """C tile of PT x PT per block, one element per thread; A and B tiles staged through shared memory.
    Edges: out-of-range loads read 0 (they add nothing to the dot product); out-of-range stores are skipped.
    """

    @cuda.jit
    def portable(a, b, bias, res, out, m, n, k):  # type: ignore[no-untyped-def]
        sa = cuda.shared.array((PT, PT), float32)
        sb = cuda.shared.array((PT, PT1), float32)  # +1: column reads sb[i, tx] spread over banks
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y * PT + ty
        col = cuda.blockIdx.x * PT + tx
        acc = float32(0.0)
        for k0 in range(0, k, PT):
            ka = k0 + tx
            sa[ty, tx] = float32(a[row, ka]) if (row < m and ka < k) else float32(0.0)
            kb = k0 + ty
            sb[ty, tx] = float32(b[kb, col]) if (kb < k and col < n) else float32(0.0)
            cuda.syncthreads()
            for i in range(PT):
                acc += sa[ty, i] * sb[i, tx]
            cuda.syncthreads()
        if row < m and col < n:
            if has_bias:
                acc += float32(bias[col])
            if has_res:
                acc += float32(res[row, col])
            out[row, col] = acc

    return portable


@cache
def make_words_kernel(has_bias: bool, has_res: bool, out_words: bool) -> Any:
    """`make_kernel`'s tile for bf16 operands, which arrive as uint16 words (kernels.primitives.bf16): A, B,
    bias and res are converted on load; the fp32 sum is rounded to bf16 on store when `out_words` (o_proj),
    else stored as fp32 (gemm). A separate body, so that the fp32 / fp16 kernels' code stays as it is."""

    @cuda.jit
    def portable_bf16(a, b, bias, res, out, m, n, k):  # type: ignore[no-untyped-def]
        sa = cuda.shared.array((PT, PT), float32)
        sb = cuda.shared.array((PT, PT1), float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y * PT + ty
        col = cuda.blockIdx.x * PT + tx
        acc = float32(0.0)
        for k0 in range(0, k, PT):
            ka = k0 + tx
            sa[ty, tx] = bf16_to_f32(a[row, ka]) if (row < m and ka < k) else float32(0.0)
            kb = k0 + ty
            sb[ty, tx] = bf16_to_f32(b[kb, col]) if (kb < k and col < n) else float32(0.0)
            cuda.syncthreads()
            for i in range(PT):
                acc += sa[ty, i] * sb[i, tx]
            cuda.syncthreads()
        if row < m and col < n:
            if has_bias:
                acc += bf16_to_f32(bias[col])
            if has_res:
                acc += bf16_to_f32(res[row, col])
            if out_words:
                out[row, col] = f32_to_bf16(acc)
            else:
                out[row, col] = acc

    return portable_bf16


@cuda.jit(device=True, inline="always")
def x_sigmoid(x, z):  # type: ignore[no-untyped-def]
    """x * sigmoid(z) = x / (1 + e^-z) in fp32 (the Hopper tiles' wg_x_sigmoid, wgmma_epi.cuh, with numba's
    exp and an IEEE division where they take rcp.approx)."""
    return x / (float32(1.0) + math.exp(-z))


@cache
def make_linear_kernel(has_bias: bool, act: str, words: bool) -> Any:
    """linear's portable tile: out = act(x @ w.T (+ bias)) with w [N, K] (a torch Linear weight), rounded
    once to the input type; `words`: bf16 as uint16 words (kernels.primitives.bf16), else fp16 / fp32 arrays.
    `act`: "none", "silu" or "gelu_tanh" (kernels.ops.gemm.wgmma.ACTIVATIONS). As `make_kernel`, with the w
    tile read along K (coalesced) and used transposed from shared memory."""
    silu, gelu = act == "silu", act == "gelu_tanh"
    if act not in ("none", "silu", "gelu_tanh"):
        raise ValueError(f"activation: {act!r} is not supported; allowed: none, silu, gelu_tanh")

    load, store = (bf16_to_f32, f32_to_bf16) if words else (float32, float32)

    @cuda.jit
    def portable_linear(x, w, bias, out, m, n, k):  # type: ignore[no-untyped-def]
        sa = cuda.shared.array((PT, PT), float32)
        sw = cuda.shared.array((PT, PT1), float32)  # sw[c, i] = w[n0 + c, k0 + i]; read as sw[tx, i]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y * PT + ty
        col = cuda.blockIdx.x * PT + tx
        wrow = cuda.blockIdx.x * PT + ty
        acc = float32(0.0)
        for k0 in range(0, k, PT):
            ka = k0 + tx
            sa[ty, tx] = load(x[row, ka]) if (row < m and ka < k) else float32(0.0)
            sw[ty, tx] = load(w[wrow, ka]) if (wrow < n and ka < k) else float32(0.0)
            cuda.syncthreads()
            for i in range(PT):
                acc += sa[ty, i] * sw[tx, i]
            cuda.syncthreads()
        if row < m and col < n:
            if has_bias:
                acc += load(bias[col])
            if silu:
                acc = x_sigmoid(acc, acc)
            elif gelu:
                acc = x_sigmoid(
                    acc, float32(1.5957691216057308) * (acc + float32(0.044715) * acc * acc * acc)
                )
            out[row, col] = store(acc)

    return portable_linear
