# ruff: noqa
"""Lab (not shipped; lab/onchip_ab.py's OA_PACKED=1 A/B): rmsnorm's on-chip kernel (kernels/ops/rmsnorm.py
make_onchip) with the shared part as packed pairs of bf16 words, one 32-bit word per two columns (column
pair k of vector j at word k * nt + j: a warp's stores still hit 32 consecutive words), so each 16-byte
vector takes 4 shared stores and 4 loads instead of 8 and 8 of 16-bit words. bf16 only (a pair is the two
fp32 bit patterns' high halves: exact for values loaded from bf16). ncu on an H100 (2026-12-05, 261 x 128256
bf16): the product kernel issued instructions half the time (SM throughput 50 %) at 0.77 of copy."""

import math

from numba import cuda, float32, uint32

from kernels.ops.rows import OnChipRows, vec_jit
from kernels.primitives.bf16 import bits_f32, f32_bits
from kernels.primitives.reductions import make_block_sum, row_slots
from kernels.primitives.vector import ldg_into, make_row_io, stg_from


def make_onchip_packed(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    assert word and width == 8, "bf16 only"
    threads, per, nvec = config.threads, config.per, config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm = 2 * slots
    head = threads * per
    nv = per // width
    nvals = nvec * width
    pairs = width // 2

    @cuda.jit(**vec_jit(threads, config.min_blocks, False))
    def k(x, w, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        part = cuda.shared.array(0, uint32)  # nt vectors of 4 pairs, pair-major
        v = cuda.local.array(per, float32)
        t = cuda.local.array(nvals, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        nt = (n - head) // width
        row = cuda.blockIdx.x
        base = 0
        while row < rows:
            xr = x[row]
            load_row(v, xr, n, float32(0.0))
            acc = float32(0.0)
            j = tid
            while j < nt:
                for u in range(nvec):
                    if j + u * threads < nt:
                        ldg_into(t, u * width, xr, head + (j + u * threads) * width)
                for u in range(nvec):
                    if j + u * threads < nt:
                        for p in range(pairs):
                            lo = t[u * width + 2 * p]
                            hi = t[u * width + 2 * p + 1]
                            acc += lo * lo
                            acc += hi * hi
                            part[p * nt + j + u * threads] = (f32_bits(lo) >> uint32(16)) | (f32_bits(hi) & uint32(0xFFFF0000))
                j += nvec * threads
            for e in range(per):
                acc += v[e] * v[e]
            inv = float32(1.0) / math.sqrt(bsum(acc, sm, base) / float32(n) + eps)
            base = slots - base
            orow = out[row]
            for q in range(nv):
                col = col_of(q)
                ldg_into(t, 0, w, col)
                for e in range(width):
                    t[e] = v[q * width + e] * inv * t[e]
                stg_from(orow, col, t, 0)
            j = tid
            while j < nt:
                col = head + j * width
                ldg_into(t, 0, w, col)
                for p in range(pairs):
                    pw = part[p * nt + j]
                    t[2 * p] = bits_f32(pw << uint32(16)) * inv * t[2 * p]
                    t[2 * p + 1] = bits_f32(pw & uint32(0xFFFF0000)) * inv * t[2 * p + 1]
                stg_from(orow, col, t, 0)
                j += threads
            row += cuda.gridDim.x

    return k
