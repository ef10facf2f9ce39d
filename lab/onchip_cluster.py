# ruff: noqa: E501, B023  (a probe: each lambda is timed within its own loop iteration)
"""Probe (GPU only, sm_90+, not shipped; written in the ninth session and not yet run): a vocabulary row
split over a cluster of two CTAs, for rmsnorm, layernorm and softmax, against the product's on-chip kernels.

Why (benchmarks/PERF.md, "ninth session"): rmsnorm's on-chip kernel at 128256 columns (one 1024-thread block
per SM holding a whole row) writes and loads at copy speed, and loses its time at the row boundaries: each
block reduction waits 1.4-2.1 us for the block's last loads while every SM does the same, so DRAM idles. The
mid shape (rows of 32776-65536: two 512-thread blocks per SM) gets 0.91 of a copy of its own bytes where the
vocabulary rows get 0.85-0.89: one block's boundary overlaps the other's stream. A row of 128256 does not fit
one 512-thread block (the mid shape holds 65536), but half of it does: 64128 columns.

The kernel: the product's rmsnorm `make_onchip` (the eighth session's "early" form) on ONCHIP_MID_ROWS,
launched as clusters of two CTAs (cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = (2, 1, 1)),
grid = 2 x SMs. Cluster c takes rows c, c + clusters, ...; CTA rank r (blockIdx.x % 2) holds columns
[r * n / 2, (r + 1) * n / 2) of each: 8192 in registers, the rest in its 112 KB of shared memory. Each row's
sum of squares: the block's sum, thread 0 puts it in a shared slot (alternating between two by row, as the
block reduction's halves do), one cluster barrier (barrier.cluster.arrive.release / wait.acquire), and every
thread adds the partner's slot through distributed shared memory (mapa + ld.shared::cluster). The slot a
partner reads is written again two rows later, after the next cluster barrier, which the reader reaches only
after its read. A last cluster barrier before exit keeps each CTA's shared memory alive for its partner's read.
Needs n % 16 == 0 (each half a whole number of 16-byte vectors) and n / 2 within ONCHIP_MID_ROWS.cols.
layernorm (ln_cluster) exchanges its two shifted sums the same way (both halves shift by the row's first
element); softmax (sm_cluster) exchanges each half's (max, sum) and merges them (see its docstring for the
NaN / inf rules, which stay the whole-row kernel's).

Predicted (from the mid shape's 0.91 of a same-bytes copy, less a cluster barrier per row): 1.03-1.08x the
shipped kernel at 261 x 128256 and 1024 x 128256. A risk (the ninth session's review): with two CTAs per SM
the scheduler may put both halves of a row on one SM, where they reach every row boundary together and
nothing overlaps. So the run also times the launch with the SPREAD scheduling policy ("spread"), and a
kernel of the same shape reports each CTA's SM (%smid) under both policies ("placement").

The check: rows at scales 2^-3 .. 2^3 with the second half of each row 3x the first, and the error taken per
row (worst row's max |got - ref| / max |ref|) against float64 (bar 5e-3) and against the shipped kernel (bar
1e-2: two roundings): a half that met the wrong sum (its own, or the previous row's) fails it by far, where
uniform data would hide it. Two read-only reviews (helpers) found no bug in the kernels, the cluster
protocol, the inline PTX or the driver structs; their findings in the check and the timing are fixed.

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/onchip_cluster.py   (CL_SHAPES=261x128256,1024x128256;
    CL_DTYPES=bfloat16,float16; CL_OPS=rmsnorm,layernorm,softmax)
Offline (no GPU): `python lab/onchip_cluster.py --ptxas` compiles the kernels for sm_90 and prints ptxas's
registers and spills (this checks the inline PTX too).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda, float32, uint32

from kernels.ops import layernorm as ln_mod
from kernels.ops import rmsnorm as rms_mod
from kernels.ops import softmax as sm_mod
from kernels.ops.rows import ONCHIP_MID_ROWS, OnChipRows, onchip_part, vec_jit
from kernels.ops.softmax import _fast_exp, _fold
from kernels.primitives.reductions import NEG_INF, make_block_max, make_block_sum, make_block_sum2, row_slots
from kernels.primitives.vector import ldg_into, make_row_io, stg_from
from kernels.runtime.arrays import BF16

sys.path.insert(0, str(Path(__file__).resolve().parent))  # lab/ptx_asm.py

SHAPES = [
    tuple(map(int, s.split("x"))) for s in os.environ.get("CL_SHAPES", "261x128256,1024x128256").split(",")
]
DTYPES = [
    np.dtype(np.float16) if d == "float16" else BF16
    for d in os.environ.get("CL_DTYPES", "bfloat16,float16").split(",")
]
CLUSTER = 2


def _intrinsics() -> tuple[Any, Any]:
    """cluster_sync(): barrier.cluster arrive (release) + wait (acquire), every thread of both CTAs;
    peer_f32(arr, i, rank): float32 arr[i] of shared array `arr` in cluster CTA `rank` (mapa + ld.shared::cluster)."""
    from llvmlite import ir
    from numba.core import types as nt
    from numba.cuda.extending import intrinsic
    from ptx_asm import I32, asm, shared_u32, statement

    @intrinsic
    def peer_f32(typingctx, arr, i, rank):  # type: ignore[no-untyped-def]
        sig = nt.float32(arr, i, rank)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            a = shared_u32(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            r = context.cast(builder, args[2], sig.args[2], nt.uint32)
            text = "{\n\t.reg .u32 ra;\n\tmapa.shared::cluster.u32 ra, $1, $2;\n\tld.shared::cluster.f32 $0, [ra];\n\t}"
            return asm(builder, ir.FloatType(), text, "=f,r,r,~{memory}", [a, r], [I32, I32])

        return sig, codegen

    sync = statement("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;")
    return sync, peer_f32


cluster_sync, peer_f32 = _intrinsics()


def rms_cluster(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """rmsnorm's make_onchip ("early") over half rows, the two halves of a row in the two CTAs of a cluster."""
    threads, per, nvec = config.threads, config.per, config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm = 2 * slots
    head = threads * per
    nv = per // width
    nvals = nvec * width
    load_step, keep_step, take = onchip_part(config, width, word)

    @cuda.jit(**vec_jit(threads, config.min_blocks, False))
    def k(x, w, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        xs = cuda.shared.array(2, float32)  # this CTA's half-row sums, by row parity (read by the partner)
        part = cuda.shared.array(0, uint32)
        v = cuda.local.array(per, float32)
        t = cuda.local.array(nvals, float32)
        tw = cuda.local.array(width, float32)
        to = cuda.local.array(width, float32)
        tid = cuda.threadIdx.x
        rank = cuda.blockIdx.x & 1
        clusters = cuda.gridDim.x >> 1
        rows = x.shape[0]
        n = x.shape[1]
        h = n >> 1  # this CTA's columns of each row
        c0 = rank * h
        nt = (h - head) // width
        row = cuda.blockIdx.x >> 1
        if row >= rows:  # both CTAs of a cluster leave here together (the same row): no DSMEM touched
            return
        xr = x[row, c0 : c0 + h]
        wr = w[c0 : c0 + h]
        load_row(v, xr, h, float32(0.0))
        acc = float32(0.0)
        j = tid
        while j < nt:
            load_step(t, xr, j, nt, float32(0.0))
            for e in range(nvals):
                acc += t[e] * t[e]
            keep_step(t, part, j, nt)
            j += nvec * threads
        for e in range(per):
            acc += v[e] * v[e]
        base = 0
        par = 0
        while row < rows:
            tot = bsum(acc, sm, base)
            if tid == 0:
                xs[par] = tot
            cluster_sync()  # both halves' sums are in their slots
            tot += peer_f32(xs, par, rank ^ 1)
            inv = float32(1.0) / math.sqrt(tot / float32(n) + eps)
            base = slots - base
            par ^= 1
            nxt = row + clusters
            more = nxt < rows
            xn = x[nxt if more else row, c0 : c0 + h]
            orow = out[row, c0 : c0 + h]
            for q in range(nv):
                col = col_of(q)
                ldg_into(tw, 0, wr, col)
                for e in range(width):
                    to[e] = v[q * width + e] * inv * tw[e]
                stg_from(orow, col, to, 0)
            acc = float32(0.0)
            j = tid
            while j < nt:
                if more:
                    load_step(t, xn, j, nt, float32(0.0))
                for u in range(nvec):
                    i = j + u * threads
                    if i < nt:
                        col = head + i * width
                        ldg_into(tw, 0, wr, col)
                        take(to, part, i, nt)
                        for e in range(width):
                            to[e] = to[e] * inv * tw[e]
                        stg_from(orow, col, to, 0)
                if more:
                    for e in range(nvals):
                        acc += t[e] * t[e]
                    keep_step(t, part, j, nt)
                j += nvec * threads
            if more:
                load_row(v, xn, h, float32(0.0))
                for e in range(per):
                    acc += v[e] * v[e]
            row = nxt
        cluster_sync()  # the partner's last read of xs is done before this CTA's shared memory goes

    return k


def ln_cluster(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """layernorm's make_onchip ("overlap") over half rows: both halves shift by the row's first element (the
    whole row's, so their shifted sums add), and the two (sum, sum of squares) meet as rmsnorm's sum does."""
    threads, per, nvec = config.threads, config.per, config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bsum2, slots = make_block_sum2(threads), row_slots(threads)
    nsm = 4 * slots
    head = threads * per
    nv = per // width
    nvals = nvec * width
    load_step, keep_step, take = onchip_part(config, width, word)

    @cuda.jit(**vec_jit(threads, config.min_blocks, False))
    def k(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        xs = cuda.shared.array(4, float32)  # (sum, sum of squares) by row parity, read by the partner
        part = cuda.shared.array(0, uint32)
        v = cuda.local.array(per, float32)
        t = cuda.local.array(nvals, float32)
        tw = cuda.local.array(width, float32)
        tb = cuda.local.array(width, float32)
        tid = cuda.threadIdx.x
        rank = cuda.blockIdx.x & 1
        clusters = cuda.gridDim.x >> 1
        rows = x.shape[0]
        n = x.shape[1]
        fn = float32(n)
        h = n >> 1
        c0 = rank * h
        nt = (h - head) // width
        row = cuda.blockIdx.x >> 1
        if row >= rows:
            return
        ldg_into(tb, 0, x[row], 0)  # the row's first element: the shift of both halves
        shift = tb[0]
        xr = x[row, c0 : c0 + h]
        wr = w[c0 : c0 + h]
        br = b[c0 : c0 + h]
        load_row(v, xr, h, float32(0.0))
        s = float32(0.0)
        q2 = float32(0.0)
        j = tid
        while j < nt:
            load_step(t, xr, j, nt, shift)
            for e in range(nvals):
                d = t[e] - shift
                s += d
                q2 += d * d
            keep_step(t, part, j, nt)
            j += nvec * threads
        for e in range(per):
            d = v[e] - shift
            s += d
            q2 += d * d
        base = 0
        par = 0
        while row < rows:
            s, q2 = bsum2(s, q2, sm, base)
            if tid == 0:
                xs[2 * par] = s
                xs[2 * par + 1] = q2
            cluster_sync()
            s += peer_f32(xs, 2 * par, rank ^ 1)
            q2 += peer_f32(xs, 2 * par + 1, rank ^ 1)
            base = 2 * slots - base
            par ^= 1
            dmean = s / fn
            rstd = float32(1.0) / math.sqrt(abs(q2 / fn - dmean * dmean) + eps)
            mean = shift + dmean
            nxt = row + clusters
            more = nxt < rows
            nrow = nxt if more else row
            xn = x[nrow, c0 : c0 + h]
            orow = out[row, c0 : c0 + h]
            for q in range(nv):
                col = col_of(q)
                ldg_into(t, 0, wr, col)
                ldg_into(tb, 0, br, col)
                for e in range(width):
                    t[e] = (v[q * width + e] - mean) * rstd * t[e] + tb[e]
                stg_from(orow, col, t, 0)
            ldg_into(tb, 0, x[nrow], 0)
            shift = tb[0]
            s = float32(0.0)
            q2 = float32(0.0)
            j = tid
            while j < nt:
                for u in range(nvec):
                    i = j + u * threads
                    if i < nt:
                        col = head + i * width
                        ldg_into(tw, 0, wr, col)
                        ldg_into(tb, 0, br, col)
                        take(t, part, i, nt)
                        for e in range(width):
                            t[e] = (t[e] - mean) * rstd * tw[e] + tb[e]
                        stg_from(orow, col, t, 0)
                if more:
                    load_step(t, xn, j, nt, shift)
                    for e in range(nvals):
                        d = t[e] - shift
                        s += d
                        q2 += d * d
                    keep_step(t, part, j, nt)
                j += nvec * threads
            if more:
                load_row(v, xn, h, float32(0.0))
                for e in range(per):
                    d = v[e] - shift
                    s += d
                    q2 += d * d
            row = nxt
        cluster_sync()

    return k


def sm_cluster(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """softmax's make_onchip ("early") over half rows. Each half's (max, sum): the block's max mb, the block's
    sum rescaled to it (to 0 where the half is all -inf, so such a half adds 0, not NaN), then one exchange and
    the merge M = max of the two, S = each sum x exp(its max - M). The shipped kernel's NaN / inf rules hold:
    a NaN or a +inf makes S NaN; a row all -inf gives exp(-inf - -inf) = NaN, as the whole-row kernel."""
    threads, per, nvec = config.threads, config.per, config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bmax, bsum, half = make_block_max(threads), make_block_sum(threads), row_slots(threads)
    smem_size = 4 * half
    head = threads * per
    nv = per // width
    nvals = nvec * width
    load_step, keep_step, take = onchip_part(config, width, word)

    @cuda.jit(**vec_jit(threads, config.min_blocks, False))
    def k(x, out):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(smem_size, float32)
        xs = cuda.shared.array(4, float32)  # (max, sum) by row parity, read by the partner
        part = cuda.shared.array(0, uint32)
        v = cuda.local.array(per, float32)
        t = cuda.local.array(nvals, float32)
        to = cuda.local.array(width, float32)
        tid = cuda.threadIdx.x
        rank = cuda.blockIdx.x & 1
        clusters = cuda.gridDim.x >> 1
        rows = x.shape[0]
        n = x.shape[1]
        h = n >> 1
        c0 = rank * h
        nt = (h - head) // width
        row = cuda.blockIdx.x >> 1
        if row >= rows:
            return
        xr = x[row, c0 : c0 + h]
        load_row(v, xr, h, NEG_INF)
        m, s = _fold(NEG_INF, float32(0.0), v, per, True)
        j = tid
        while j < nt:
            load_step(t, xr, j, nt, NEG_INF)
            m, s = _fold(m, s, t, nvals, True)
            keep_step(t, part, j, nt)
            j += nvec * threads
        base = 0
        par = 0
        while row < rows:
            mb = bmax(m, sm, base)
            r = mb if mb != NEG_INF else float32(0.0)
            sb = bsum(s * math.exp(m - r), sm, base + half)
            if tid == 0:
                xs[2 * par] = mb
                xs[2 * par + 1] = sb
            cluster_sync()
            mp = peer_f32(xs, 2 * par, rank ^ 1)
            sp = peer_f32(xs, 2 * par + 1, rank ^ 1)
            big = mb if mb > mp else mp  # (a NaN never compares greater: the max stays a number)
            sfull = sb * math.exp(mb - big) + sp * math.exp(mp - big)
            mb = big
            base = 2 * half - base
            par ^= 1
            inv = float32(1.0) / sfull
            nxt = row + clusters
            more = nxt < rows
            xn = x[nxt if more else row, c0 : c0 + h]
            orow = out[row, c0 : c0 + h]
            for q in range(nv):
                for e in range(width):
                    to[e] = _fast_exp(v[q * width + e] - mb) * inv
                stg_from(orow, col_of(q), to, 0)
            m = NEG_INF
            s = float32(0.0)
            j = tid
            while j < nt:
                if more:
                    load_step(t, xn, j, nt, NEG_INF)
                for u in range(nvec):
                    i = j + u * threads
                    if i < nt:
                        take(to, part, i, nt)
                        for e in range(width):
                            to[e] = _fast_exp(to[e] - mb) * inv
                        stg_from(orow, head + i * width, to, 0)
                if more:
                    m, s = _fold(m, s, t, nvals, True)
                    keep_step(t, part, j, nt)
                j += nvec * threads
            if more:
                load_row(v, xn, h, NEG_INF)
                m, s = _fold(m, s, v, per, True)
            row = nxt
        cluster_sync()

    return k


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _Config(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint),
                ("bx", ctypes.c_uint), ("by", ctypes.c_uint), ("bz", ctypes.c_uint),
                ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("nattrs", ctypes.c_uint)]  # fmt: skip


def _attrs(spread: bool) -> Any:
    """The launch attributes: the cluster dimension (id 4: CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) and, with
    `spread`, the cluster scheduling policy (id 5: CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
    value 1: CU_CLUSTER_SCHEDULING_POLICY_SPREAD), which asks for a cluster's CTAs on different SMs."""
    attrs = (_Attr * 2)()
    attrs[0].id = 4
    attrs[0].value[0], attrs[0].value[1], attrs[0].value[2] = CLUSTER, 1, 1
    attrs[1].id = 5
    attrs[1].value[0] = 1
    return attrs, 2 if spread else 1


def max_clusters(kern: Any, block: int, smem: int, spread: bool = False) -> int:
    """cuOccupancyMaxActiveClusters: clusters of CLUSTER CTAs of `block` threads and `smem` dynamic bytes the
    GPU holds at once (the persistent grid's size: more would run as a second wave)."""
    from kernels.runtime.launch import LaunchError, _driver

    k = kern.here()
    attrs, na = _attrs(spread)
    cfg = _Config(CLUSTER, 1, 1, block, 1, 1, smem, None, attrs, na)
    q = _driver().cuOccupancyMaxActiveClusters
    q.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(_Config)]
    n = ctypes.c_int()
    rc = q(ctypes.byref(n), k._func, ctypes.byref(cfg))
    if rc != 0 or n.value < 1:
        raise LaunchError(f"cuOccupancyMaxActiveClusters failed (CUresult {rc}, {n.value})")
    return n.value


def cluster_launcher(kern: Any, grid: int, block: int, smem: int, spread: bool = False) -> Any:
    """launch(args): `kern` (a kernels.runtime.launch.Kernel) as clusters of CLUSTER CTAs through
    cuLaunchKernelEx, on the default stream, with the Kernel's own parameter block."""
    from kernels.runtime.launch import LaunchError, _driver

    k = kern.here()
    attrs, na = _attrs(spread)
    cfg = _Config(grid, 1, 1, block, 1, 1, smem, None, attrs, na)
    ex = _driver().cuLaunchKernelEx
    ex.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    assert grid % CLUSTER == 0

    def launch(args: Any) -> None:
        with k._lock:
            k.pack(args)
            rc = ex(ctypes.byref(cfg), k._func, k._params, None)
        if rc != 0:
            raise LaunchError(f"cuLaunchKernelEx (clusters of {CLUSTER}) failed with CUresult {rc}")

    launch.keep = (attrs, cfg)  # type: ignore[attr-defined]  # the structs cfg points into stay alive
    return launch


def make_where(threads: int, min_blocks: int):  # type: ignore[no-untyped-def]
    """A kernel of the cluster kernel's block size, launch bounds and (at launch) shared memory that writes
    each CTA's SM: where the scheduler puts the two halves of a row."""
    from ptx_asm import special_register

    smid = special_register("smid", 32)

    @cuda.jit(**vec_jit(threads, min_blocks, False))
    def where(out):  # type: ignore[no-untyped-def]
        part = cuda.shared.array(0, uint32)
        if cuda.threadIdx.x == 0:
            part[0] = uint32(0)
            out[cuda.blockIdx.x] = smid()

    return where


OPS = os.environ.get("CL_OPS", "rmsnorm,layernorm,softmax").split(",")
MODS = {"rmsnorm": rms_mod, "layernorm": ln_mod, "softmax": sm_mod}
BUILD = {"rmsnorm": rms_cluster, "layernorm": ln_cluster, "softmax": sm_cluster}


def ptxas_report() -> int:
    from kernels.runtime import ptx

    for op in OPS:
        for dt in (BF16, np.dtype(np.float16)):
            p = ptx.compile_one(BUILD[op](ONCHIP_MID_ROWS, 8, dt == BF16), MODS[op]._SIGS[dt], (9, 0))
            r = ptx._ptxas(p, (9, 0), False)
            print(
                f"{op} cluster {dt.name}: registers {r.get('registers')}, spills {r.get('spill_bytes')}, "
                f"mapa {p.count('mapa')}, barrier.cluster {p.count('barrier.cluster')}",
                r.get("ptxas", "") if r.get("registers") is None else "",
            )
    return 0


def _row_err(got: np.ndarray, ref: np.ndarray) -> float:
    """The worst row's max |got - ref| / max |ref|: per row, so a row whose halves met the wrong partner
    sum shows even where the other rows are right."""
    return float((np.abs(got - ref).max(axis=1) / np.abs(ref).max(axis=1)).max())


def main() -> int:
    from kernels.harness.bench import SETS, time_interleaved
    from kernels.runtime import arrays, device
    from kernels.runtime.arrays import HostSync, operand
    from kernels.runtime.launch import dynamic_smem, kernel

    rng = np.random.default_rng(0)
    copy = device.peaks()["mem_gbs"]
    nsm = device.describe().get("sm_count") or 132
    cfg = ONCHIP_MID_ROWS
    report: dict[str, Any] = {"device": device.describe().get("name"), "copy_gbs": copy, "rows": []}
    ok = True
    where = kernel(
        make_where(cfg.threads, cfg.min_blocks), "void(int32[::1])", on_load=dynamic_smem(cfg.smem)
    )
    kinds = ("shipped", "cluster", "spread")
    for op in OPS:
        m = MODS[op]
        for dt in DTYPES:
            built = kernel(BUILD[op](cfg, 8, dt == BF16), m._SIGS[dt], on_load=dynamic_smem(cfg.smem))
            for rows, cols in SHAPES:
                h = cols // 2
                assert cols % 16 == 0 and cfg.threads * cfg.per < h <= cfg.cols, (rows, cols)
                shipped_k = m._K.pick("vector", dt, True, cols, rows)[0]  # auto takes vector here
                assert getattr(shipped_k, "kernel", shipped_k) is m._K.chip_k[dt], (
                    "the baseline is not the on-chip kernel"
                )
                # the shared part's bytes, as the product sizes its launches
                smem = (h - cfg.threads * cfg.per) * 2
                # rows at scales 2^-3 .. 2^3 and the second half of each row 3x the first (softmax: rows
                # shifted by -3 .. 3 and the second half by 3 more): a half that met the wrong partner's
                # values (or the previous row's) gives a wrong row, which the per-row check sees
                scale = (2.0 ** rng.integers(-3, 4, (rows, 1))).astype(np.float32)
                halves = np.where(np.arange(cols) < h, np.float32(1.0), np.float32(3.0)).astype(np.float32)
                z = rng.standard_normal((rows, cols), dtype=np.float32)
                z = (
                    (z + np.log2(scale) + (halves - 1) * 1.5)
                    if op == "softmax"
                    else (z * 2 + 0.5) * scale * halves
                )
                x0 = z.astype(dt)
                del z
                w_h = (1 + 0.5 * rng.standard_normal(cols, dtype=np.float32)).astype(dt)
                b_h = (0.5 * rng.standard_normal(cols, dtype=np.float32)).astype(dt)
                # the other input sets: the same rows rolled (set s's row r is x0's row r - 7s), so the host
                # makes one set; the check reads every row at up to 300 rows, else 256 rows drawn at random
                # (a stride would see only the clusters it divides: a row's cluster is its position mod the
                # cluster count), and the float64 reference is computed for the x0 rows those are
                xs_h = [np.roll(x0, 7 * s, axis=0) for s in range(SETS)]
                pick = np.arange(rows) if rows <= 300 else np.sort(rng.choice(rows, 256, replace=False))
                src = [(pick - 7 * s) % rows for s in range(SETS)]
                need = np.unique(np.concatenate(src))
                f0 = x0[need].astype(np.float32)
                if op == "rmsnorm":
                    ref_need = rms_mod.reference(f0, w_h, 1e-6)
                elif op == "layernorm":
                    ref_need = ln_mod.reference(f0, w_h, b_h, 1e-5)
                else:
                    ref_need = sm_mod.reference(f0)
                del f0
                refs = [ref_need[np.searchsorted(need, r)].astype(np.float32) for r in src]
                xs = [arrays.to_device(x) for x in xs_h]
                w, b = arrays.to_device(w_h), arrays.to_device(b_h)
                outs = {p: [arrays.to_device(np.zeros((rows, cols), dt)) for _ in range(SETS)] for p in kinds}
                sync = HostSync()
                fits = {p: max_clusters(built, cfg.threads, smem, spread=p == "spread") for p in kinds[1:]}
                grids = {p: min(fits[p], rows) * CLUSTER for p in kinds[1:]}
                for p in kinds[1:]:
                    if fits[p] < nsm:
                        print(
                            f"warning: only {fits[p]} clusters of {CLUSTER} fit ({p}) on {nsm} SMs: fewer than one per SM",
                            flush=True,
                        )
                placed = {}  # where the scheduler puts a cluster's two CTAs (the same block, shared memory, policy)
                for p in kinds[1:]:
                    sm_of = arrays.to_device(np.full(grids[p], -1, np.int32))
                    cluster_launcher(where, grids[p], cfg.threads, smem, spread=p == "spread")(
                        (operand("out", sm_of, sync),)
                    )
                    cuda.synchronize()
                    ids = arrays.to_host(sm_of).reshape(-1, CLUSTER)
                    placed[p] = {
                        "same_sm_clusters": int((ids[:, 0] == ids[:, 1]).sum()),
                        "clusters": int(ids.shape[0]),
                        "sms_used": int(len(set(ids.ravel().tolist()))),
                    }

                def args_of(s: int, o: Any) -> tuple[Any, ...]:
                    if op == "rmsnorm":
                        return (
                            operand("x", xs[s], sync),
                            operand("w", w, sync),
                            operand("out", o, sync),
                            np.float32(1e-6),
                        )
                    if op == "layernorm":
                        return (
                            operand("x", xs[s], sync),
                            operand("w", w, sync),
                            operand("b", b, sync),
                            operand("out", o, sync),
                            np.float32(1e-5),
                        )
                    return (operand("x", xs[s], sync), operand("out", o, sync))

                def shipped(a: dict[str, int]) -> None:
                    s, o = a["s"], outs["shipped"][a["s"]]
                    if op == "rmsnorm":
                        rms_mod.rmsnorm(xs[s], w, o)
                    elif op == "layernorm":
                        ln_mod.layernorm(xs[s], w, b, o)
                    else:
                        sm_mod.softmax(xs[s], o)

                ops = {p: [args_of(s, outs[p][s]) for s in range(SETS)] for p in kinds[1:]}
                go = {
                    p: cluster_launcher(built, grids[p], cfg.threads, smem, spread=p == "spread")
                    for p in kinds[1:]
                }
                # each provider starts on another input set, so no call reads what the call before it just read
                sets = [[{"s": (s + k) % SETS} for s in range(SETS)] for k in range(len(kinds))]
                provs = [(shipped, sets[0], None)] + [
                    (lambda a, p=p: go[p](ops[p][a["s"]]), sets[k], None) for k, p in enumerate(kinds[1:], 1)
                ]
                for fn, ss, _ in provs:
                    for a in ss:
                        fn(a)
                cuda.synchronize()
                t = time_interleaved(provs, 30)
                cuda.synchronize()
                got = {
                    p: [arrays.to_host(outs[p][s])[pick].astype(np.float32) for s in range(SETS)]
                    for p in kinds
                }
                errs = {p: max(_row_err(got[p][s], refs[s]) for s in range(SETS)) for p in kinds}
                vs_shipped = {
                    p: max(_row_err(got[p][s], got["shipped"][s]) for s in range(SETS)) for p in kinds[1:]
                }
                # against float64: one bf16 rounding is up to 2^-8 of a row's max; against the shipped kernel,
                # whose sums run in another order, two roundings. A half that met the wrong sum errs by ~1
                ok &= max(errs.values()) < 5e-3 and max(vs_shipped.values()) < 1e-2
                us = {p: float(np.median(t[i])) for i, p in enumerate(kinds)}
                nbytes = 2 * rows * cols * dt.itemsize
                rec = {
                    "op": op,
                    "dtype": dt.name,
                    "rows": rows,
                    "cols": cols,
                    "grids": grids,
                    "max_active_clusters": fits,
                    "sms": nsm,
                    "placement": placed,
                    "us": us,
                    "err_worst_row": errs,
                    "vs_shipped_worst_row": vs_shipped,
                    "over_shipped": {p: us["shipped"] / us[p] for p in kinds[1:]},
                    "of_copy": {p: nbytes / us[p] / 1e3 / copy for p in kinds},
                }
                report["rows"].append(rec)
                print(
                    f"{op} {dt.name} {rows}x{cols}: "
                    + ", ".join(f"{p} {us[p]:.2f} us ({rec['of_copy'][p]:.3f} of copy)" for p in kinds)
                    + "; over shipped "
                    + ", ".join(f"{p} {rec['over_shipped'][p]:.3f}x" for p in kinds[1:])
                    + f"; worst row err {max(errs.values()):.2e}, vs shipped {max(vs_shipped.values()):.2e}",
                    flush=True,
                )
                print(f"  clusters that fit {fits}, grids {grids}, placement {placed}", flush=True)
            try:
                print(
                    f"{op} cluster {dt.name}: registers {list(built.dispatcher.get_regs_per_thread().values())}, local bytes {list(built.dispatcher.get_local_mem_per_thread().values())}"
                )
            except Exception as e:  # noqa: BLE001
                print(f"{op} cluster {dt.name}: no resource figures ({e})")
    dest = Path(os.environ.get("OUT", "."), "onchip_cluster.json")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(ptxas_report() if "--ptxas" in sys.argv else main())
