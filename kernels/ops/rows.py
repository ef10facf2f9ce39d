"""What the row operators (rmsnorm, layernorm, softmax) share: one table of shapes, so they stay comparable,
the kernel set per dtype (`RowKernels`), and how a kernel body reads and writes its elements (`RowIO`).

A row kernel body is written once, as a factory over a `RowIO`: `io.load(x[i])` widens an element to fp32,
`out[i] = io.store(y)` narrows an fp32 result to the element type. fp32 and fp16 take `NATIVE` (numba's own
`float32` cast both ways: a no-op on fp32, a conversion on fp16 loads, and the array store rounds fp16 to
nearest even as before), so their generated code is what the hand-written bodies compiled to. bf16 takes
`WORDS`: the arrays are raw uint16 words (kernels.primitives.bf16), widened exactly and stored with integer
round-to-nearest-even, NaN kept NaN; the simulator runs the same bodies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypedDict

import numpy as np
from numba import cuda, float32, uint32

from kernels.primitives.bf16 import bf16_to_f32, bits_f32, f32_bits, f32_to_bf16
from kernels.primitives.cache_hints import ldg_hint_into
from kernels.primitives.reductions import BLOCK, PER, VEC_ROW_JIT
from kernels.primitives.vector import AUTO_VECTOR, VEC_BYTES, WIDTH, choose, ldg_into, make_row_io
from kernels.registry import SPECIALS, Case, Choice
from kernels.runtime.arrays import BF16, SIMULATED
from kernels.runtime.launch import Kernel, dynamic_smem, kernel, sm_count, smem_optin

_DTYPES = ("float32", "float16", "bfloat16")
F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
MAX_GRID = 2**31 - 1


@dataclass(frozen=True)
class RowIO:
    """How a row kernel body converts its elements: `load(e)` -> fp32, `store(f)` -> the element type (the
    value assigned into the output array). Both are numba-callable (a type or an inline device function)."""

    name: str
    load: Any
    store: Any


NATIVE = RowIO("native", float32, float32)  # fp32 / fp16 arrays: numba's casts (fp16 store rounds RNE)
WORDS = RowIO("bf16-words", bf16_to_f32, f32_to_bf16)  # bf16 as uint16 words (kernels.primitives.bf16)
IO_OF: dict[np.dtype, RowIO] = {F32: NATIVE, F16: NATIVE, BF16: WORDS}

# bf16 tolerances of the three row ops (norm ||out - ref|| / ||ref||, per element as kernels.harness.verify).
# A correctly rounded bf16 result is within u = 2^-8 = 3.91e-3 of the float64 value, relatively, element by
# element (8 significant bits), so neither error can pass u for a kernel whose fp32 result is right; both are
# set just above it. Measured (lab/bf16_rows_error.py, simulator, every sim case, 12 seeds): norm <= 1.82e-3
# (rmsnorm), 1.75e-3 (layernorm), 2.41e-3 (softmax: a few large outputs carry the norm); per element <=
# 2.93e-3; the outputs are the round-to-nearest-even of the float64 result bit for bit in >= 99.9% of the
# elements, one ulp off elsewhere. A store that truncates errs up to 2^-7 = 7.8e-3 per element: it fails the
# per-element bound at GPU verify shapes, and tests/kernels/test_bf16.py's rounding check at any shape.
BF16_TOL = 4e-3
BF16_ELEM_TOL = 5e-3


@dataclass(frozen=True)
class VectorRows:
    """The op's plain vector kernel (`_make_vec`): BLOCK threads x PER values, one block per row."""

    fastmath: bool = False  # numba's fastmath flag (exp as ex2.approx, fast division)

    @property
    def label(self) -> str:
        return "vector-fastmath" if self.fastmath else "vector"


@dataclass(frozen=True)
class BlockedRows:
    """softmax's `make_rows_blocked`: the vector kernel with another block shape, reducers whose shared
    slots alternate between rows, and launch bounds. threads x per must cover BLOCK x PER."""

    threads: int
    per: int  # values per thread
    min_blocks: int  # launch_bounds' blocks per SM
    fastmath: bool

    label = "blocked"


@dataclass(frozen=True)
class Half2Rows:
    """layernorm's `make_rows_half2` (fp16): an output stage in packed halves with the weight / bias loads
    batched. threads x per must cover BLOCK x PER."""

    threads: int
    per: int  # values per thread
    min_blocks: int  # launch_bounds' blocks per SM
    full_rows: bool  # rows of exactly threads x per skip the per-vector column checks
    wb_early: bool  # load weight / bias before the reduction's barrier
    group: int  # weight / bias vectors loaded per batch (0: all)

    label = "half2"


@dataclass(frozen=True)
class WideRows:
    """The op's 16-byte-load register kernel at another block shape: `threads` threads x `per` values hold
    rows of up to threads x per columns (rmsnorm / layernorm / fused_add_rmsnorm: `_make_vec` with that
    shape, rmsnorm's `_make_packed` when packed, with the add in front for fused_add_rmsnorm; softmax:
    `make_rows_blocked`, or `make_rows_packed` when packed).
    `min_blocks`: launch_bounds' blocks per SM (the register cap). `packed`: the row held as packed pairs
    (`packed_row_io`: one uint32 per two columns, unpacked where used), so a thread's `per` values take
    per / 2 registers and twice the rows fit an SM. `wb_shared` (layernorm): the row in registers as the
    plain shape, the weight and bias vectors copied into dynamic shared memory by cp.async while the row
    loads (wb_shared_bytes a block; WIDE_WB_SHARED), where the device holds min_blocks such blocks an SM
    (wb_shared_fits)."""

    threads: int
    per: int  # values per thread, a multiple of the vector width
    min_blocks: int
    packed: bool = False
    wb_shared: bool = False

    @property
    def cols(self) -> int:
        return self.threads * self.per

    @property
    def label(self) -> str:
        kind = "packed" if self.packed else "wb-shared" if self.wb_shared else "block"
        return f"{kind}-{self.threads}x{self.per}"

    def wb_shared_bytes(self, itemsize: int) -> int:
        """Dynamic shared memory of a `wb_shared` block: a weight and a bias vector of `cols` values."""
        return 2 * self.cols * itemsize


@dataclass(frozen=True)
class StreamRows:
    """The 16-byte streaming kernel of an op (its `make_stream_vec`): rows past what the op's vector
    kernels hold in registers (vector_cols: 32768 columns in fp16 / bf16 with the WIDE_ROWS shapes). One
    block of `threads` per row reads the row twice with 16-byte loads, `vectors` of them in flight per
    thread: pass 1 (the row's statistics) marks it evict_last in L2, pass 2 re-reads it evict_first (its
    last use) and writes. `min_blocks`: launch_bounds' blocks per SM."""

    threads: int
    vectors: int  # 16-byte vectors in flight per thread in each pass
    min_blocks: int

    label = "stream-vector"


@dataclass(frozen=True)
class OnChipRows:
    """Rows past what registers hold, kept on chip and read once (an op's `make_onchip`; fp16 / bf16): one
    block of `threads` per row holds its first threads x per columns in registers (16-byte loads, as the
    WIDE_ROWS kernels) and the rest in dynamic shared memory as packed pairs, one 32-bit word per two columns
    (onchip_pairs), 2 bytes a column, up to `smem` bytes (`cols`: 16384 + 230400 / 2 = 131584 columns with
    ONCHIP_ROWS, inside sm_90's 232448-byte opt-in). Each thread's pairs sit in its own slots (pair p, columns
    2p and 2p + 1, of column vector j of the shared part at word p * nt + j, nt vectors in all), so no
    barrier guards them, and a warp's accesses hit 32 consecutive 32-bit words (no bank conflict): 4 shared
    stores and 4 loads per 16-byte vector. `vectors`: 16-byte loads in flight per thread in the shared part.
    `min_blocks`: launch_bounds' blocks per SM."""

    threads: int
    per: int
    vectors: int
    smem: int
    min_blocks: int
    from_cols: int  # the narrowest row it takes (narrower rows stream: measured faster there)

    label = "on-chip"

    @property
    def cols(self) -> int:
        """The longest row held: the registers' columns and the shared memory's, 2 bytes each (a 32-bit
        word per pair)."""
        return self.threads * self.per + self.smem // 2

    def takes(self, n: int) -> bool:
        """Whether a row of `n` (aligned, past vector_cols) columns runs on chip: never one the register
        part alone would hold (the kernel stores that part with no bounds check)."""
        return self.threads * self.per < n and self.from_cols <= n <= self.cols


RowConfig = VectorRows | BlockedRows | Half2Rows | WideRows | StreamRows | OnChipRows

# The vector-path kernel of each row op and dtype, where it is not the plain `_make_vec` kernel without
# fastmath. Chosen from the side-by-side H200 timings in benchmarks/notes-memory.md (which also records the
# variants that lost and their commits). A dtype listed here takes its vector kernel on "auto" even when
# it is not in AUTO_VECTOR.
ROW_KERNELS: dict[str, dict[np.dtype, RowConfig]] = {
    "layernorm": {
        F16: Half2Rows(threads=128, per=32, min_blocks=8, full_rows=True, wb_early=False, group=2),
        F32: VectorRows(fastmath=False),
    },
    # bf16: the fp16 kernel (its 16-byte loads take bf16 words as they take halves)
    "softmax": {
        F16: BlockedRows(threads=256, per=16, min_blocks=8, fastmath=True),
        BF16: BlockedRows(threads=256, per=16, min_blocks=8, fastmath=True),
    },
    "rmsnorm": {F32: VectorRows(fastmath=False)},
}


# The row shapes of LLM nodes that one block of BLOCK x PER (4096 columns) fits badly: 1024-column rows
# leave three quarters of its threads idle, and rows past 4096 columns would take the streaming kernel (two
# reads of the row, scalar loads). The 2-byte dtypes' vector path runs these shapes instead: a row of n
# columns takes the smallest kernel, of these and the op's own BLOCK x PER one, that holds it (ties: the
# op's own). Every shape is 32 values (four 16-byte vectors) per thread and one thread per 32 columns, with
# as many blocks per SM as 64 registers a thread allow (32 blocks of one warp for 1024 columns, one block
# of 1024 threads for 32768). Chosen on the H200 (2026-12-05, lab/rows_shapes_ab.py, bf16, 2^25 elements;
# benchmarks/h200/rows-shapes-ab-2026-12-05.txt) from 2-3 candidates per width against the shapes before
# (128 x 8, 512 x 16, 1024 x 16): of copy, rmsnorm / softmax / layernorm at 1024 0.87 / 0.91 / 0.86 (was
# 0.81 / 0.77 / 0.66), 2048 0.89 / 0.91 / 0.85 (0.69 / 0.64 / 0.59, the op's own kernel), 5120 0.87 / 0.92 /
# 0.84 (0.56 / 0.49 / 0.42), 8192 0.84 / 0.88 / 0.83 (0.84 / 0.79 / 0.64), 16384 0.86 / 0.80 / 0.79 (0.60 /
# 0.53 / 0.52). 64 x 16 beat 32 x 32 by 1 % for rmsnorm at 1024 and 1024 x 16 / 2 beat 512 x 32 by 1 % for
# softmax at 16384: within the spread, one rule kept. fp16 runs the same shapes (the same loads and stores;
# not timed at these widths). ptxas sm_90: 28-63 registers, no spills (layernorm 32 x 32: 68, 30 blocks fit).
WIDE_ROWS: tuple[WideRows, ...] = (
    WideRows(threads=32, per=32, min_blocks=32),
    WideRows(threads=64, per=32, min_blocks=16),
    WideRows(threads=160, per=32, min_blocks=6),
    WideRows(threads=256, per=32, min_blocks=4),
    WideRows(threads=512, per=32, min_blocks=2),
    WideRows(threads=1024, per=32, min_blocks=1),
)
WIDE_DTYPES: tuple[np.dtype, ...] = (F16, BF16)
# Per op, shapes that replace the WIDE_ROWS shape of the same width: the row held as packed pairs
# (WideRows.packed), twice the rows per SM. Measured on an H100 (2026-12-06, twelfth session,
# lab/packed_rows_ab.py -> benchmarks/h100/2026-12-06/twelfth/packed/, two calls, interleaved with the kernel
# auto took before, 2^25 elements, every output against float64), x that kernel at 32768 / 16384 / 8192:
# rmsnorm at the same threads (32 registers where it had 54-55) bf16 1.023-1.026 / 1.026-1.035 / 1.035-1.036,
# fp16 1.000-1.011 / 1.006 / 1.010; softmax at half the threads x 64 values (56 registers; each exp computed
# again in the write pass: a packed pair cannot keep an fp32 exp) bf16 1.062-1.087 / 1.016-1.032 /
# 0.998-1.032, fp16 1.052-1.087 / 1.003 / 1.002. layernorm gained 1.7-3.2 % in bf16 at 32768, nothing
# beyond the spread at 8192-16384, and lost 2-5 % in fp16: it keeps WIDE_ROWS. Rows of 5121-8191 columns
# take the 8192 shape. ptxas sm_90: no spills.
WIDE_PACKED: dict[str, tuple[WideRows, ...]] = {
    "rmsnorm": (
        WideRows(threads=256, per=32, min_blocks=8, packed=True),
        WideRows(threads=512, per=32, min_blocks=4, packed=True),
        WideRows(threads=1024, per=32, min_blocks=2, packed=True),
    ),
    "softmax": (
        WideRows(threads=128, per=64, min_blocks=8, packed=True),
        WideRows(threads=256, per=64, min_blocks=4, packed=True),
        WideRows(threads=512, per=64, min_blocks=2, packed=True),
    ),
    # rmsnorm's shapes with the add in front (rmsnorm._make_packed, `add`), at 6 / 3 blocks per SM where
    # rmsnorm's 8 / 4 spill (ptxas sm_90: 40 registers, no spills; the WIDE_ROWS kernels 53-55). Measured
    # on an H100 (2026-12-07, sixteenth session, lab/fused_packed_ab.py ->
    # benchmarks/h100/2026-12-07/fused-packed/, interleaved with the WIDE_ROWS kernel of the same width, 2^25
    # elements, every output against float64, residual bit for bit): x that kernel bf16 1.024 / 1.034, fp16
    # 1.028 / 1.039 at 8192 / 16384 (0.945-0.947 of copy); the spilling 8 / 4-block builds 0.984-1.000. 32768
    # columns keep WIDE_ROWS: 1024 x 32 at 2 blocks ran 1.010-1.021x but spills 16-48 bytes
    # (tests/kernels/test_ptx.py refuses spills).
    "fused_add_rmsnorm": (
        WideRows(threads=256, per=32, min_blocks=6, packed=True),
        WideRows(threads=512, per=32, min_blocks=3, packed=True),
    ),
}


# Per op, shapes whose weight and bias vectors are copied into shared memory (WideRows.wb_shared), in place
# of the WIDE_ROWS shape of the same width where the device holds them (wb_shared_fits; else that shape runs).
# Measured on an H100 (2026-12-07, twenty-second session, lab/layernorm_wb_smem_ab.py ("wb_early", the same
# kernel body) -> benchmarks/h100/2026-12-07/twentysecond/ln-wb-ab/, two calls, interleaved with the shipped
# kernel, 2^25 elements, every output against float64 and bit-equal to the shipped kernel's): x the WIDE_ROWS
# kernel of that width at 16384 columns 1.036-1.041 (bf16 and fp16; 0.87 -> 0.90-0.91 of copy); at 32768
# 0.96-0.99 and at 8192 level (0.98-1.00), so those keep WIDE_ROWS. This kernel as shipped, through the op's
# launcher (an H100, 2026-12-07, twenty-third session, lab/layernorm_wb_shared_check.py ->
# benchmarks/h100/2026-12-07/twentythird/wb-check/, bit-equal, 2 resident blocks an SM), x the plain 512 x 32
# kernel: 1.033-1.039 at 16384 (0.908-0.909 of copy), 1.015-1.027 at 12288, 0.994-0.995 at 8200 (rows of
# 8193-16383 columns take it, with padding lanes). ptxas sm_90: 60 (fp16) / 64 (bf16) registers, no spills.
WIDE_WB_SHARED: dict[str, tuple[WideRows, ...]] = {
    "layernorm": (WideRows(threads=512, per=32, min_blocks=2, wb_shared=True),),
}
# Room for a block's shared memory besides its weight and bias (the reductions' 128 static bytes at 512
# threads), as ONCHIP_STATIC_BYTES. wb_shared_fits compares with smem_optin, one block's limit (an SM's shared
# memory less the 1 KB the system reserves a block): 2 x (64 KB + 1 KB) there leaves room for both reserves
# (133,376 bytes an SM at 512 x 32 with them, of sm_90's 233,472 and sm_80's 167,936).
WB_SHARED_STATIC_BYTES = 1024


def wide_shapes(op: str | None = None) -> tuple[WideRows, ...]:
    """WIDE_ROWS with `op`'s WIDE_PACKED and WIDE_WB_SHARED shapes in place of the shapes of the same width
    (wide_here: a wb_shared shape as this device runs it)."""
    by_cols = {c.cols: c for c in (*WIDE_PACKED.get(op or "", ()), *WIDE_WB_SHARED.get(op or "", ()))}
    return tuple(by_cols.get(c.cols, c) for c in WIDE_ROWS)


def plain_shape(shape: WideRows) -> WideRows:
    """The WIDE_ROWS shape (as it runs here) of a shape's width: what runs where a device cannot hold a
    wb_shared shape."""
    same = [c for c in map(for_machine, WIDE_ROWS) if isinstance(c, WideRows) and c.cols == shape.cols]
    if not same:
        raise ValueError(f"{shape.label}: no WIDE_ROWS shape of its {shape.cols} columns to fall back to")
    return same[0]


def wb_shared_fits(shape: WideRows, dt: np.dtype) -> bool:
    """Whether this device holds a wb_shared shape (as it runs here: for_machine's) as measured: min_blocks
    blocks of its weight and bias (wb_shared_bytes) and static shared memory within what one block may opt in
    to (sm_90: 227 KB, sm_80: 163 KB hold the 2 x 65 KB of layernorm's 512 x 32 in fp16 / bf16; sm_86 /
    sm_89's 99 KB do not, and GPUs before sm_80, which have no cp.async, opt in to less still)."""
    return smem_optin() >= shape.min_blocks * (shape.wb_shared_bytes(dt.itemsize) + WB_SHARED_STATIC_BYTES)


# Rows past vector_cols (32768 columns in fp16 / bf16: LLM vocabularies of 128256 / 131072): 1024 threads,
# four vectors in flight each (64 KB per SM, twice the ~31 KB Little's law asks at 4.1 TB/s), one block per
# SM (the grid is the SM count, pick), so ~132 rows are between their two passes at once: 33 MB of bf16 rows
# of 128256, inside the 50 MB L2 (fp32 rows of 128256: 68 MB, past it). Chosen on the H200 (2026-12-04,
# lab/stream_vec_variants.py, bf16 and fp32 at 65536 and 128256) from 1024 x 1 / 2 / 4, 512 x 2 / 4 at 2
# blocks per SM and 256 x 4 at 4: four vectors beat two by 1-10 % in all 12 cases, and were the fastest shape
# or within 1 % of it in 11; softmax bf16 at 65536 took 12 % less time at 256 x 4 x 4, which took 23 % more
# at 128256 (four times the rows between passes, past L2). ptxas sm_90: 40-64 registers, no spills.
STREAM_ROWS = StreamRows(threads=1024, vectors=4, min_blocks=1)
# Rows of ONCHIP_ROWS.from_cols up to .cols fp16 / bf16 columns (128256-131584: Llama-3's vocabulary, 131072),
# for the ops with a `make_onchip`, on GPUs that let a block opt in to its shared memory (chip_fits: sm_90),
# instead of STREAM_ROWS: 16 values x 1024 threads in registers, the rest in up to 225 KB of dynamic shared
# memory (sm_90 allows 227 KB a block) as packed pairs, one 32-bit word per two columns (OnChipRows: 4 shared
# stores and 4 loads per 16-byte vector, where 16-bit words took 8 and 8). One read of the row instead of two.
# Two 16-byte loads in flight per thread in the shared part, under launch_bounds(1024, 1)'s cap of 64
# registers: ptxas sm_90 (registers, spill bytes) of rmsnorm fp16 / bf16 at two (56, 0) / (64, 0), three
# (64, 0) / (64, 24), four (64, 116) / (64, 220); layernorm at two (64, 0) / (60, 0), three (64, 0) / (64, 0),
# four (64, 140) / (64, 140). Three spill in rmsnorm bf16, and two is what was timed. (Since the kernels share
# onchip_part, at two: rmsnorm 48 / 54, layernorm 48 / 51, softmax 62 / 59, no spills; since the next row
# loads in the write pass, 2026-12-06: rmsnorm 64, layernorm 46-48, softmax 64, no spills.)
# Measured on an H100 (2026-12-05, lab/onchip_ab.py -> benchmarks/h100/2026-12-05/onchip/, rmsnorm, fp16 and
# bf16 alike), with the shared part as 16-bit words at three vectors, against the streaming kernel:
# 1.11-1.12x at 128256 and 131072 columns (0.76 of copy against 0.68), even at 40960 (0.99-1.00x), slower at
# 65536 (0.94-0.95x): it takes rows from 128256 columns, the narrowest width measured to win. The pairs at two
# vectors, rmsnorm bf16 only (lab/onchip/rmsnorm_packed.py, lab/onchip_ab.py OA_PACKED=1 at d27bf21; an H100,
# 2026-12-05): 1.06x the words at 128256 and 131072 (55.2 against 58.5 us, 0.80 of copy against 0.76), 1.05x
# at 65536, level at 40960. The shipped pair builds of all three ops (an H100, 2026-12-06, lab/onchip_ab.py ->
# benchmarks/h100/2026-12-06/chip512/): 1.08-1.16x streaming at 261 x 128256, fp16 and bf16 alike (rmsnorm
# 0.77 of copy, layernorm 0.72, softmax 0.78). Under the simulator it takes every
# row past vector_cols (for_machine) that ONCHIP_MID_ROWS does not, so that its tests reach every tail.
ONCHIP_ROWS = OnChipRows(threads=1024, per=16, vectors=2, smem=225 * 1024, min_blocks=1, from_cols=128256)
# Rows of 32776 to 65536 fp16 / bf16 columns, on the same GPUs, instead of STREAM_ROWS: the same kernels
# (each op's make_onchip) as two blocks of 512 threads per SM, 8192 columns in registers and up to 112 KB of
# shared memory each (2 x 112 KB and the blocks' static and reserved bytes fit sm_90's 228 KB per SM), so one
# block's reductions and write pass overlap the other's loads, where one 1024-thread block per SM leaves the
# SM's loads idle and lost to the streaming kernel (0.92-1.02x). Measured on an H100 (2026-12-06,
# lab/onchip_ab.py's chip512 -> benchmarks/h100/2026-12-06/chip512/, through the ops' own pick, against the
# streaming kernel, fp16 and bf16 alike): rmsnorm 1.08x at 1024 x 40960 (0.86 of copy against 0.80),
# 1.04-1.05x at 512 x 65536 (0.83); layernorm 1.08-1.09x (0.81) and 1.02-1.03x (0.79); softmax 1.18-1.22x
# (0.82) and 1.06-1.09x (0.82-0.83). Below 40960, as shipped (an H100, 2026-12-06, eighth session,
# lab/onchip_ab.py -> benchmarks/h100/2026-12-06/mid-from/ and mid-shipped/, 1024 rows): 1.01-1.13x at
# 32776 (the first aligned width past vector_cols), 1.10-1.26x at 33280, 34816 and 36864 (0.78-0.86 of copy
# against 0.62-0.77 streaming). So it takes every aligned row past what registers hold, from 32776 columns,
# up to 65536. ptxas sm_90: 46-64 registers, no spills (the same kernels as ONCHIP_ROWS').
ONCHIP_MID_ROWS = OnChipRows(threads=512, per=16, vectors=2, smem=112 * 1024, min_blocks=2, from_cols=32776)
# narrowest first: RowKernels.pick takes the first shape that holds the row
ONCHIP_SHAPES: tuple[OnChipRows, ...] = (ONCHIP_MID_ROWS, ONCHIP_ROWS)
ONCHIP_DTYPES: tuple[np.dtype, ...] = (F16, BF16)
# The dtypes whose "auto" path takes that kernel on a GPU: all three. Measured on the H200 (2026-12-04,
# lab/wide_rows_ab.py -> benchmarks/h200/stream-vector-ab-2026-12-04.txt) against the scalar streaming
# kernel it replaces: 1.7-5.5x in bf16 / fp16 at 65536-131072 columns (32769-65535 not timed: the
# register kernel holds 32768 and the margin at 65536 is 1.7x or more), 1.04-2.9x in fp32 at 8192-131072.
# path="scalar" keeps the scalar streaming kernel for the A/B.
STREAM_VECTOR_AUTO: tuple[np.dtype, ...] = (F16, BF16, F32)
# Where "auto" takes it only further out than vector_cols, from the narrowest width measured to win. fp32
# rows of 4097-8191 columns (hidden sizes 5120-7168) were not timed: there the whole row is the tail, under
# the ~31 KB in flight per SM Little's law asks, and 8192 won narrowly (rmsnorm 1.04x, layernorm 1.11x).
# fp32 softmax at 8192 ran 0.99x the scalar kernel (two vectors per thread), 0.92x (four, the tail one
# vector at a time), 0.96x (as committed): two exps per element, not the loads, bound it there; 1.12x at
# 16384 (benchmarks/h200/stream-vector-ab*-2026-12-04.txt).
STREAM_VECTOR_AUTO_FROM: dict[tuple[str, np.dtype], int] = {
    ("rmsnorm", F32): 8192,
    ("fused_add_rmsnorm", F32): 8192,  # rmsnorm's rule for its passes; fp32 not timed for this op
    ("layernorm", F32): 8192,
    ("softmax", F32): 16384,
}


def stream_vector_auto(op: str, dt: np.dtype, n: int) -> bool:
    """Whether "auto" takes `op`'s 16-byte streaming kernel for aligned rows of `n` columns of `dt` past
    vector_cols (on a GPU only: the simulator's tests name the path)."""
    return not SIMULATED and dt in STREAM_VECTOR_AUTO and n >= STREAM_VECTOR_AUTO_FROM.get((op, dt), 0)


# the row ops built with a 16-byte streaming kernel / an on-chip kernel (RowKernels registers them), for
# row_path_of
STREAM_VEC_OPS: set[str] = set()
ONCHIP_OPS: set[str] = set()


def chip_fits(shape: OnChipRows = ONCHIP_ROWS) -> bool:
    """Whether this device holds an on-chip shape as it was measured: min_blocks blocks of its shared memory
    (smem and the kernels' few hundred static bytes) within what one block may opt in to, which on these GPUs
    is an SM's shared memory less 1 KB. sm_90's 227 KB holds ONCHIP_ROWS' 225 KB and ONCHIP_MID_ROWS' two
    blocks of 112 KB; sm_80's 163 KB and sm_86 / sm_89's 99 KB hold neither, and there those rows stream
    (ONCHIP_MID_ROWS would fit one block per SM on sm_80, the layout that lost to the streaming kernel)."""
    held = for_machine(shape)
    assert isinstance(held, OnChipRows)
    return smem_optin() >= held.min_blocks * (held.smem + ONCHIP_STATIC_BYTES)


ONCHIP_STATIC_BYTES = 1024  # room for the kernels' static shared memory (the block reductions: 256-512 B)


class WithShared:
    """A Kernel launched with `shared` bytes of dynamic shared memory (RowKernels.pick's on-chip kernels):
    the same launch / bind calls as the Kernel, so the op's launcher needs no other branch."""

    __slots__ = ("kernel", "shared")

    def __init__(self, k: Kernel, shared: int) -> None:
        self.kernel, self.shared = k, shared

    def launch(self, grid: int, block: int, args: Any, stream: Any = 0) -> None:
        self.kernel.launch(grid, block, args, self.shared, stream)

    def bind(self, grid: int, block: int, args: Any) -> Any:
        return self.kernel.bind(grid, block, args, self.shared)


def for_machine(config: RowConfig) -> RowConfig:
    """`config` as it runs here: under the simulator blocked / half2 kernels take BLOCK threads x PER values
    (the same longest row as the vector kernel there) and one block per SM, and WideRows / StreamRows 1/32
    of their threads (as many vectors per thread, rows 32 times shorter; OnChipRows 1/32 of its shared
    memory too); otherwise unchanged."""
    if isinstance(config, OnChipRows):
        if not SIMULATED:
            return config
        return replace(config, threads=config.threads // 32, smem=config.smem // 32, from_cols=0)
    if isinstance(config, (WideRows, StreamRows)):
        return replace(config, threads=max(1, config.threads // 32), min_blocks=1) if SIMULATED else config
    if isinstance(config, (BlockedRows, Half2Rows)):
        if config.threads * config.per < BLOCK * PER:
            raise ValueError(f"{config}: threads x per must cover {BLOCK} x {PER}")
        if SIMULATED:
            return replace(config, threads=BLOCK, per=PER, min_blocks=1)
    return config


def _half_pair_intrinsics() -> tuple[Any, Any, Any]:
    """fp16 pairs in a uint32 on a GPU (onchip_pairs): fptrunc to half (cvt.rn.f16.f32), its 16 bits
    zero-extended, the high value shifted up; and back: the low / high 16 bits as a half, widened (exact)."""
    from llvmlite import ir
    from numba.core import types as nt
    from numba.cuda.extending import intrinsic

    i16, i32, half = ir.IntType(16), ir.IntType(32), ir.HalfType()

    def bits(context: Any, builder: Any, val: Any, ty: Any) -> Any:
        f = context.cast(builder, val, ty, nt.float32)
        return builder.zext(builder.bitcast(builder.fptrunc(f, half), i16), i32)

    def widen(builder: Any, low16: Any) -> Any:
        return builder.fpext(builder.bitcast(builder.trunc(low16, i16), half), ir.FloatType())

    @intrinsic
    def pack_halves(typingctx, lo, hi):  # type: ignore[no-untyped-def]
        if not (isinstance(lo, nt.Float) and isinstance(hi, nt.Float)):
            raise TypeError(f"pack_halves packs two floats, got {lo}, {hi}")
        sig = nt.uint32(lo, hi)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            low = bits(context, builder, args[0], sig.args[0])
            high = bits(context, builder, args[1], sig.args[1])
            return builder.or_(low, builder.shl(high, ir.Constant(i32, 16)))

        return sig, codegen

    def unpacker(shift: int) -> Any:
        @intrinsic
        def unpack(typingctx, p):  # type: ignore[no-untyped-def]
            if not isinstance(p, nt.Integer):
                raise TypeError(f"an fp16 pair is an integer, got {p}")
            sig = nt.float32(p)

            def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
                u = context.cast(builder, args[0], sig.args[0], nt.uint32)
                return widen(builder, builder.lshr(u, ir.Constant(i32, shift)) if shift else u)

            return sig, codegen

        return unpack

    return pack_halves, unpacker(0), unpacker(16)


# The on-chip rows' pairs (onchip_pairs). Under the simulator plain Python on numpy scalars (a simulated
# device-function call takes a per-module lock: kernels.primitives.bf16), on a GPU inline device functions
# (bf16: integer arithmetic on the fp32 bits) and intrinsics (fp16).
def _pack_words(lo: Any, hi: Any) -> Any:
    low = f32_bits(lo) >> uint32(16)  # type: ignore[no-untyped-call]
    return uint32(low | (f32_bits(hi) & uint32(0xFFFF0000)))  # type: ignore[no-untyped-call]


def _word_lo(p: Any) -> Any:
    return bits_f32(uint32(p) << uint32(16))  # type: ignore[no-untyped-call]


def _word_hi(p: Any) -> Any:
    return bits_f32(uint32(p) & uint32(0xFFFF0000))  # type: ignore[no-untyped-call]


if SIMULATED:

    def _pack_halves(lo: Any, hi: Any) -> Any:
        low = np.uint32(np.float16(np.float32(lo)).view(np.uint16))
        return low | (np.uint32(np.float16(np.float32(hi)).view(np.uint16)) << np.uint32(16))

    def _half_lo(p: Any) -> Any:
        return np.float32(np.uint16(np.uint32(p) & np.uint32(0xFFFF)).view(np.float16))

    def _half_hi(p: Any) -> Any:
        return np.float32(np.uint16(np.uint32(p) >> np.uint32(16)).view(np.float16))

else:
    _pack_words, _word_lo, _word_hi = (
        cuda.jit(device=True, inline="always")(f) for f in (_pack_words, _word_lo, _word_hi)
    )
    _pack_halves, _half_lo, _half_hi = _half_pair_intrinsics()


def onchip_pairs(word: bool) -> tuple[Any, Any, Any]:
    """(pack, unpack_lo, unpack_hi) of an on-chip row's shared part (kernels.ops.rows.OnChipRows): two
    columns in one uint32, `pack(lo, hi)` of two fp32 values, `unpack_lo(p)` / `unpack_hi(p)` them back as
    fp32. bf16 (`word`): the high halves of the two fp32 bit patterns (lo's in the low half; exact for values
    loaded from bf16); fp16: the two values rounded to fp16 (exact for values loaded from fp16), lo's bits
    in the low half. Both give back every such value bit for bit (NaN stays NaN)."""
    return (_pack_words, _word_lo, _word_hi) if word else (_pack_halves, _half_lo, _half_hi)


def shared_vec_reader(word: bool) -> Any:
    """take(t, part, i): the 16-byte vector i of a uint32 shared array (words 4i .. 4i + 3, as
    kernels.primitives.cp_async.cp16 copied it: column 2p in word p's low half) into t[0:8] as fp32, with
    one 16-byte shared load (lds4); bf16 words (`word`) or fp16 halves, widened exactly (onchip_pairs)."""
    from kernels.primitives.cp_async import lds4

    _, lo, hi = onchip_pairs(word)

    @cuda.jit(device=True, inline="always")
    def take(t, part, i):  # type: ignore[no-untyped-def]
        a, b, c, d = lds4(part, 4 * i)
        t[0] = lo(a)
        t[1] = hi(a)
        t[2] = lo(b)
        t[3] = hi(b)
        t[4] = lo(c)
        t[5] = hi(c)
        t[6] = lo(d)
        t[7] = hi(d)

    return take


def packed_row_io(width: int, threads: int, per: int, word: bool) -> tuple[Any, Any, Any, Any]:
    """make_row_io for a row held as packed pairs (WideRows.packed): the thread's vectors at the same columns,
    kept in a uint32 local array of per // 2 words, pair p of vector q at word q * width // 2 + p
    (onchip_pairs: exact for values loaded from bf16 words, `word`, or from fp16).

      load_row(v, t, xr, n, fill): v's pairs = xr[col_q:col_q + width] for each vector q, or two `fill`s (a
        value bf16 / fp16 hold exactly: 0, -inf) past the row's end; t: a float32 local array of width
      col_of(q): the first column of this thread's vector q
      lo(p) / hi(p): a pair's two values (its even and odd column) as fp32"""
    nv, hw = per // width, width // 2
    pack, lo, hi = onchip_pairs(word)
    _, col_of = make_row_io(width, threads, per)  # the same columns as the unpacked kernels'

    @cuda.jit(device=True, inline="always")
    def load_row(v, t, xr, n, fill):  # type: ignore[no-untyped-def]
        for q in range(nv):
            if n >= threads * per or col_of(q) < n:  # full rows: no compare, every load back to back
                ldg_into(t, 0, xr, col_of(q))
                for p in range(hw):
                    v[q * hw + p] = pack(t[2 * p], t[2 * p + 1])
            else:
                for p in range(hw):
                    v[q * hw + p] = pack(fill, fill)

    return load_row, col_of, lo, hi


def onchip_part(config: OnChipRows, width: int, word: bool) -> tuple[Any, Any, Any]:
    """The shared part of an on-chip row (each op's `make_onchip`), device functions over the kernel's
    dynamic shared array `part` (uint32) of the row's nt vectors past its threads x per register columns:
      load_step(t, xr, j, nt, fill): t[u * width:(u + 1) * width] = vector j + u * threads of the shared part,
        u < config.vectors, every load issued before any is used; `fill` in the slots of vectors past nt
      keep_step(t, part, j, nt): those vectors into the thread's own slots, packed pairs (onchip_pairs): pair
        p of vector i at word p * nt + i: a warp hits 32 consecutive words, and no barrier is needed
      take(t, part, i, nt): vector i back into t[0:width]"""
    threads, nvec = config.threads, config.vectors
    head = config.threads * config.per
    pairs = width // 2  # columns 2p, 2p + 1 of a vector share a uint32 word
    pack, unpack_lo, unpack_hi = onchip_pairs(word)

    @cuda.jit(device=True, inline="always")
    def load_step(t, xr, j, nt, fill):  # type: ignore[no-untyped-def]
        for u in range(nvec):
            if j + u * threads < nt:
                ldg_into(t, u * width, xr, head + (j + u * threads) * width)
            else:
                for e in range(width):
                    t[u * width + e] = fill

    @cuda.jit(device=True, inline="always")
    def keep_step(t, part, j, nt):  # type: ignore[no-untyped-def]
        for u in range(nvec):
            if j + u * threads < nt:
                for p in range(pairs):
                    part[p * nt + j + u * threads] = pack(t[u * width + 2 * p], t[u * width + 2 * p + 1])

    @cuda.jit(device=True, inline="always")
    def take(t, part, i, nt):  # type: ignore[no-untyped-def]
        for p in range(pairs):
            pw = part[p * nt + i]
            t[2 * p] = unpack_lo(pw)
            t[2 * p + 1] = unpack_hi(pw)

    return load_step, keep_step, take


def wide_for(dt: np.dtype, n: int, op: str | None = None) -> WideRows | None:
    """The shape of `wide_shapes(op)` (as it runs here) a vector row of `n` columns takes in `dt`; None: the
    op's own BLOCK x PER kernel holds it best, or `dt` has no other shapes, or no shape holds it (see
    vector_cols). wide_here: the shape this device runs."""
    if dt not in WIDE_DTYPES:
        return None
    shapes = [c for c in map(for_machine, wide_shapes(op)) if isinstance(c, WideRows) and c.cols >= n]
    best = min(shapes, key=lambda c: c.cols, default=None)
    if best is None or (n <= BLOCK * PER and best.cols >= BLOCK * PER):
        return None
    return best


def run_here(shape: WideRows, dt: np.dtype) -> WideRows:
    """A shape (as it runs here) as this device runs it in `dt`: a wb_shared shape the device cannot hold
    (wb_shared_fits) becomes the WIDE_ROWS shape of its width."""
    return plain_shape(shape) if shape.wb_shared and not wb_shared_fits(shape, dt) else shape


def wide_here(dt: np.dtype, n: int, op: str | None = None) -> WideRows | None:
    """wide_for's shape as this device runs it (run_here)."""
    shape = wide_for(dt, n, op)
    return None if shape is None else run_here(shape, dt)


def vector_cols(dt: np.dtype) -> int:
    """The longest row the vector path holds in registers in `dt` (longer rows stream)."""
    # every op's: WIDE_PACKED keeps WIDE_ROWS' widths
    wide = (
        [c.cols for c in map(for_machine, WIDE_ROWS) if isinstance(c, WideRows)] if dt in WIDE_DTYPES else []
    )
    return max([BLOCK * PER, *wide])


def make_stream_loads(config: StreamRows, width: int) -> tuple[Any, Any]:
    """The loads of the 16-byte streaming kernels (each op's make_stream_vec), for a thread whose first
    column is `col`: `step(v, row, col, policy)` fills v with the config.vectors vectors at col, col + span,
    ... (span = threads x width); `tail(v, row, col, n, policy)` those of them that start inside the row,
    fewer than config.vectors (what the full steps leave). All of a call's loads issue before any is used;
    `policy` is kernels.primitives.cache_hints' l2_evict_last or l2_evict_first."""
    nvec, span = config.vectors, config.threads * width

    @cuda.jit(device=True, inline="always")
    def step(v, row, col, policy):  # type: ignore[no-untyped-def]
        for u in range(nvec):
            ldg_hint_into(v, u * width, row, col + u * span, policy)

    @cuda.jit(device=True, inline="always")
    def tail(v, row, col, n, policy):  # type: ignore[no-untyped-def]
        for u in range(nvec - 1):
            if col + u * span < n:
                ldg_hint_into(v, u * width, row, col + u * span, policy)

    return step, tail


def vec_jit(threads: int, min_blocks: int, fastmath: bool) -> dict[str, Any]:
    """cuda.jit options of a vector row kernel: launch_bounds(threads, min_blocks), or VEC_ROW_JIT's cap
    for the BLOCK-thread kernels when `min_blocks` is 0; numba's fastmath flag when asked. None under the
    simulator (its jit takes neither)."""
    if SIMULATED:
        return {}
    if not min_blocks and threads != BLOCK:
        raise ValueError(f"a {threads}-thread row kernel needs its own min_blocks")
    kw: dict[str, Any] = {"launch_bounds": (threads, min_blocks)} if min_blocks else dict(VEC_ROW_JIT)
    if fastmath:
        kw["fastmath"] = True
    return kw


def row_grid(k: Kernel, threads: int, persistent: bool, rows: int) -> int:
    """Blocks to launch: one per row, or for grid-stride (persistent) kernels every block the SMs hold at
    once (the driver's occupancy answer), never more blocks than rows."""
    if persistent:
        return min(rows, sm_count() * k.resident_blocks(threads))
    return min(rows, MAX_GRID)


class RowKernels:
    """One row op's kernels per dtype: `plain` (streaming, rows longer than BLOCK * PER), `reg` (the row in
    registers), `vec` (`reg` with 16-byte loads and stores; dtypes with a vector width), `row` / `row_k` (the
    ROW_KERNELS entry of the dtype, where it has one: (function, threads per block, grid-stride?) and its
    launchable kernel), `wide` / `wide_k` (the op's `wide_shapes` of the WIDE_DTYPES, by (dtype, shape)) and
    `svec` / `svec_k` (the STREAM_ROWS kernel of every dtype with a vector kernel, where the op has one),
    `chip` / `chip_k` (the ONCHIP_ROWS kernel of the ONCHIP_DTYPES, where the op has one; `chip_shape` its
    config as it runs here) and `mid` / `mid_k` / `mid_shape` (the same for ONCHIP_MID_ROWS).
    `stream(io)` / `reg(io)` build the streaming / register kernel for a RowIO (one dispatcher per RowIO:
    fp32 and fp16 share NATIVE's), `row_kernel(config, width, word=...)` an entry's or a shape's function
    (`word`, required: bf16 words, which packed shapes pack as words, not as halves),
    `make_vec(width)` the vector kernel (None: no vector kernel in any dtype, and no wide shapes),
    `stream_vec(config, width)` the 16-byte streaming kernel (None: rows past vector_cols stream with scalar
    loads)."""

    def __init__(
        self,
        name: str,
        sigs: dict[np.dtype, str],
        *,
        stream: Callable[[RowIO], Any],
        reg: Callable[[RowIO], Any],
        make_vec: Callable[[int], Any] | None,
        row_kernel: Callable[..., tuple[Any, int, bool]] | None,
        stream_vec: Callable[[StreamRows, int], Any] | None = None,
        onchip: Callable[[OnChipRows, int, bool], Any] | None = None,
    ) -> None:
        self.name, self.sigs = name, sigs
        ios = {IO_OF[dt] for dt in sigs}
        streams, regs = {io: stream(io) for io in ios}, {io: reg(io) for io in ios}
        self.stream_fns = {dt: streams[IO_OF[dt]] for dt in sigs}
        self.reg_fns = {dt: regs[IO_OF[dt]] for dt in sigs}
        self.plain = {dt: kernel(self.stream_fns[dt], sig) for dt, sig in sigs.items()}
        self.reg = {dt: kernel(self.reg_fns[dt], sig) for dt, sig in sigs.items()}
        # an op with no vector kernel (make_vec None) runs the register / streaming kernels in every dtype,
        # as bf16 does, and has no ROW_KERNELS entry
        self.vec_fns = {dt: make_vec(WIDTH[dt]) for dt in sigs if dt in WIDTH} if make_vec else {}
        self.vec = {dt: kernel(fn, sigs[dt]) for dt, fn in self.vec_fns.items()}
        configs = ROW_KERNELS.get(name, {})
        if configs and row_kernel is None:
            raise ValueError(f"{name}: ROW_KERNELS lists {name} but it has no row_kernel factory")
        self.row = {
            dt: row_kernel(for_machine(c), WIDTH[dt], word=dt == BF16)
            for dt, c in configs.items()
            if row_kernel
        }
        self.row_k = {dt: kernel(fn, sigs[dt]) for dt, (fn, _, _) in self.row.items()}
        shapes = [c for c in map(for_machine, wide_shapes(name)) if isinstance(c, WideRows)]
        # a wb_shared shape's WIDE_ROWS shape too: what runs on a device that cannot hold the wb_shared one
        shapes += [plain_shape(c) for c in shapes if c.wb_shared]
        self.wide = {
            (dt, c): row_kernel(c, WIDTH[dt], word=dt == BF16)[0]
            for dt in sigs
            if dt in WIDE_DTYPES and dt in self.vec_fns and row_kernel
            for c in shapes
        }
        self.wide_k = {
            (dt, c): kernel(fn, sigs[dt], on_load=dynamic_smem(c.wb_shared_bytes(dt.itemsize)))
            if c.wb_shared
            else kernel(fn, sigs[dt])
            for (dt, c), fn in self.wide.items()
        }
        sv = for_machine(STREAM_ROWS)
        assert isinstance(sv, StreamRows)
        self.svec_shape: StreamRows = sv
        self.svec = {dt: stream_vec(sv, WIDTH[dt]) for dt in self.vec_fns} if stream_vec else {}
        if stream_vec:
            STREAM_VEC_OPS.add(name)
        self.svec_k = {dt: kernel(fn, sigs[dt]) for dt, fn in self.svec.items()}
        oc, mid = for_machine(ONCHIP_ROWS), for_machine(ONCHIP_MID_ROWS)
        assert isinstance(oc, OnChipRows) and isinstance(mid, OnChipRows)
        self.chip_shape: OnChipRows = oc
        self.chip = (
            {dt: onchip(oc, WIDTH[dt], dt == BF16) for dt in ONCHIP_DTYPES if dt in sigs} if onchip else {}
        )
        if onchip:
            ONCHIP_OPS.add(name)
        self.chip_k = {
            dt: kernel(fn, sigs[dt], on_load=dynamic_smem(oc.smem)) for dt, fn in self.chip.items()
        }
        self.mid_shape: OnChipRows = mid
        self.mid = (
            {dt: onchip(mid, WIDTH[dt], dt == BF16) for dt in ONCHIP_DTYPES if dt in sigs} if onchip else {}
        )
        self.mid_k = {dt: kernel(fn, sigs[dt], on_load=dynamic_smem(mid.smem)) for dt, fn in self.mid.items()}

    def pick(
        self, path: str, dt: np.dtype, aligned: bool, n: int, rows: int
    ) -> tuple[Kernel | WithShared, int, int]:
        """(kernel, threads per block, grid) for `path`: the vector kernel when `choose` takes it, or on
        "auto" for a dtype that ROW_KERNELS lists (that entry's kernel, used instead of the plain `vec`), at
        the op's shape (wide_shapes) that `wide_for` names where it names one; for aligned rows past
        vector_cols the on-chip kernel of the narrowest ONCHIP_SHAPES shape that takes the row (rows of 32776
        to 65536 and of 128256 to 131584 columns in the ONCHIP_DTYPES, where the op has one, and the device
        fits it), else the 16-byte streaming kernel where the op has one (path "vector", or "auto" where
        stream_vector_auto allows: the STREAM_VECTOR_AUTO dtypes on a GPU, from the STREAM_VECTOR_AUTO_FROM
        widths); else the register kernel for rows that fit a block, the streaming one beyond.
        `aligned`: the operands meet `vector_ok`."""
        ok = aligned and n <= vector_cols(dt)
        streams = path == "vector" or (path == "auto" and stream_vector_auto(self.name, dt, n))
        if aligned and not ok and streams:
            # the narrowest on-chip shape that holds the row (ONCHIP_SHAPES' order), min_blocks blocks per SM
            # (what its shared memory and registers hold), striding over the rows
            for config, held, chips in (
                (ONCHIP_MID_ROWS, self.mid_shape, self.mid_k),
                (ONCHIP_ROWS, self.chip_shape, self.chip_k),
            ):
                if dt in chips and held.takes(n) and chip_fits(config):
                    shared = (n - held.threads * held.per) * dt.itemsize
                    grid = min(rows, held.min_blocks * sm_count())
                    return WithShared(chips[dt], shared), held.threads, grid
        if aligned and not ok and dt in self.svec_k and streams:
            # one block per SM, striding over the rows: launch_bounds' 1 is a floor, and a kernel of <= 32
            # registers would fit 2 per SM, twice the rows between their passes, past what L2 holds
            return self.svec_k[dt], self.svec_shape.threads, min(rows, sm_count())
        if dt not in self.vec:
            if path == "vector":
                raise ValueError(
                    f"path: 'vector' has no {dt} kernel; use 'auto' or 'scalar' for {dt} operands"
                )
            choose(path, dt, False)  # the same check of the path's name
        elif path == "vector" and aligned and not ok:
            raise ValueError(
                f"path: 'vector' holds rows of up to {vector_cols(dt)} columns in {dt}, not {n}; "
                "use 'auto' or 'scalar' (the streaming kernel)"
            )
        elif choose(path, dt, ok) or (ok and path == "auto" and dt in self.row and not SIMULATED):
            shape = wide_here(dt, n, self.name)
            if shape is not None:
                if (dt, shape) not in self.wide_k:  # the op was built without it: never fall back silently
                    raise RuntimeError(f"{self.name}: no {shape.label} kernel built for {dt} rows of {n}")
                wk = self.wide_k[(dt, shape)]
                grid = min(rows, MAX_GRID)
                if shape.wb_shared:  # one block a row, as the plain shape, with its weight and bias part
                    return WithShared(wk, shape.wb_shared_bytes(dt.itemsize)), shape.threads, grid
                return wk, shape.threads, grid
            entry = self.row.get(dt)
            if entry is None:
                return self.vec[dt], BLOCK, min(rows, MAX_GRID)
            _, threads, persistent = entry
            k = self.row_k[dt]
            return k, threads, row_grid(k, threads, persistent, rows)
        return (self.reg if n <= BLOCK * PER else self.plain)[dt], BLOCK, min(rows, MAX_GRID)

    def ptx_kernels(self) -> tuple[tuple[str, Any, str], ...]:
        """The offline-PTX list: the register and streaming kernels for every dtype, the vector kernels for
        the dtypes that have one, and the ROW_KERNELS kernels for the dtypes that list one."""
        sigs = self.sigs
        kinds = (("reg", self.reg_fns), ("stream", self.stream_fns), ("vec", self.vec_fns))
        out = [
            (f"{self.name}_{kind}_{dt.name}", fns[dt], sig)
            for kind, fns in kinds
            for dt, sig in sigs.items()
            if dt in fns
        ]
        out += [(f"{self.name}_row_{dt.name}", fn, sigs[dt]) for dt, (fn, _, _) in self.row.items()]
        out += [(f"{self.name}_{c.label}_{dt.name}", fn, sigs[dt]) for (dt, c), fn in self.wide.items()]
        out += [(f"{self.name}_{StreamRows.label}_{dt.name}", fn, sigs[dt]) for dt, fn in self.svec.items()]
        out += [(f"{self.name}_{OnChipRows.label}_{dt.name}", fn, sigs[dt]) for dt, fn in self.chip.items()]
        out += [(f"{self.name}_{OnChipRows.label}-mid_{dt.name}", f, sigs[dt]) for dt, f in self.mid.items()]
        return tuple(out)


def _cases(shapes: list[tuple[str, int, int]], **extra: int) -> tuple[Case, ...]:
    return tuple(Case(label, {"rows": m, "cols": n, **extra}, dt) for label, m, n in shapes for dt in _DTYPES)


class RowCases(TypedDict):
    sim_cases: tuple[Case, ...]
    verify_cases: tuple[Case, ...]
    bench_cases: tuple[Case, ...]
    special_cases: tuple[Case, ...]


# GPU verify rows (rows, cols) for the WIDE_ROWS shapes, 16-byte aligned in fp16 / bf16: 1024 (32 x 32),
# 2048 (64 x 32), 5120 (160 x 32), 6008 and 8192 (256 x 32: padding lanes, full), 16384 (512 x 32), 32768
# (1024 x 32), and past them 65536 and Llama-3's vocabulary, 128256: on chip in fp16 / bf16 on sm_90
# (ONCHIP_MID_ROWS, ONCHIP_ROWS, for the ops with a make_onchip), else the 16-byte streaming kernel
# (STREAM_ROWS); fp32 streams from 5120, with that kernel where STREAM_VECTOR_AUTO_FROM allows (8192 and 16384
# in rmsnorm / layernorm, 16384 in softmax, 32768, 65536, 128256)
_WIDE_VERIFY = (
    (257, 1024), (129, 2048), (65, 5120), (41, 6008), (33, 8192), (17, 16384), (9, 32768), (7, 65536),
    (5, 128256),
)  # fmt: skip


def row_cases() -> RowCases:
    """sim: 3 rows of 133 (register path: <= 32 threads x PER), 2 rows of 601 (streaming path, its
    4-wide unrolled loop and its tail); verify: odd widths on both paths (1001 and 64: registers, 5003:
    streaming), and on a GPU the aligned widths of every WIDE_ROWS shape (_WIDE_VERIFY);
    bench: 16384 x 4096, 537 MB (fp32) / 268 MB (fp16) moved; specials (kernels.registry.poison): rows 0, 2,
    3 hold NaN, +inf, -inf; 136 columns (the vector / fp16 row kernel on a GPU, registers in the simulator),
    601 (registers on a GPU, streaming in the simulator) and on a GPU 5003 (streaming), 8200 (the
    512 x 32 shape in fp16 / bf16, its padding lanes beside the specials), 49152 and 128256 (on chip in fp16 /
    bf16 where ONCHIP_MID_ROWS / ONCHIP_ROWS run, else the 16-byte streaming kernel, STREAM_ROWS)."""
    return RowCases(
        sim_cases=_cases([("tiny-odd", 3, 133), ("long-odd", 2, 601)]),
        verify_cases=_cases(
            [("odd", 37, 1001), ("wide-odd", 129, 5003), ("narrow", 1031, 64)]
            + ([] if SIMULATED else [(f"wide-{n}", m, n) for m, n in _WIDE_VERIFY])
        ),
        bench_cases=_cases([("16384x4096", 16384, 4096)]),
        special_cases=_cases(
            [("specials", 4, 136), ("specials-odd", 4, 601)]
            + (
                []
                if SIMULATED
                else [
                    ("specials-long", 4, 5003),
                    ("specials-wide", 4, 8200),
                    ("specials-mid", 4, 49152),
                    ("specials-vocab", 4, 128256),
                ]
            ),  # fmt: skip
            **{SPECIALS: 1},
        ),
    )


def row_path_of(op: str) -> Any:
    """row_path for `op`, naming the ROW_KERNELS kernel (e.g. "blocked", "vector-fastmath") where `op` has
    one for the case's dtype."""

    def path(case: Case) -> str:
        p = row_path(case)
        dt = np.dtype(case.dtype)
        n = case.params["cols"]
        if p == "stream" and op in STREAM_VEC_OPS and _stream_vector(op, dt, n):
            here = [(s, for_machine(s)) for s in ONCHIP_SHAPES]
            on_chip = any(isinstance(c, OnChipRows) and c.takes(n) and chip_fits(s) for s, c in here)
            if op in ONCHIP_OPS and dt in ONCHIP_DTYPES and on_chip:
                return OnChipRows.label
            return StreamRows.label
        if p == "vector" and (shape := wide_here(dt, case.params["cols"], op)) is not None:
            return shape.label
        config = ROW_KERNELS.get(op, {}).get(dt)
        if config is None or SIMULATED or p == "stream" or (case.params["cols"] * dt.itemsize) % VEC_BYTES:
            return p
        return config.label

    return path


def row_choice_of(op: str) -> Any:
    """row_path_of(op) with its reason and tier (kernels.registry.Choice)."""
    path_of = row_path_of(op)

    def choose(case: Case) -> Choice:
        p = path_of(case)
        n, dt = case.params["cols"], np.dtype(case.dtype)
        if SIMULATED:
            return Choice(p, "simulated", "the CUDA simulator runs the register or streaming kernel")
        if p == OnChipRows.label:
            return Choice(p, "primary", f"rows of {n} columns pass the {vector_cols(dt)} a block holds in"
                          " registers: the rest in shared memory, the row read once")  # fmt: skip
        if p == StreamRows.label:
            return Choice(p, "primary", f"rows of {n} columns pass the {vector_cols(dt)} a block holds in"
                          f" registers: {VEC_BYTES}-byte loads, the row read twice")  # fmt: skip
        if p == "stream":
            held = vector_cols(dt) if (n * dt.itemsize) % VEC_BYTES == 0 else BLOCK * PER
            return Choice(p, "fallback", f"rows of {n} columns pass the {held} a block holds in "
                          "registers: the streaming kernel")  # fmt: skip
        if (n * dt.itemsize) % VEC_BYTES and (dt in AUTO_VECTOR or dt in ROW_KERNELS.get(op, {})):
            return Choice(p, "fallback", f"rows of {n * dt.itemsize} bytes are not a multiple of "
                          f"{VEC_BYTES}: scalar loads instead of the vector kernel")  # fmt: skip
        if p == "vector":
            return Choice(p, "primary", f"{dt}: {VEC_BYTES}-byte vector loads, the row in registers")
        if p == "register":
            return Choice(p, "primary", f"{dt}: the row in registers, one element per load")
        if (shape := wide_here(dt, n, op)) is not None:
            where = "as packed pairs in the registers" if shape.packed else "in the registers"
            wb = ", weight and bias copied to shared memory during the row's loads" if shape.wb_shared else ""
            return Choice(p, "primary", f"{dt}: {VEC_BYTES}-byte vector loads, the row {where} of "
                          f"{shape.threads} threads x {shape.per} values{wb} (rows.wide_shapes)")  # fmt: skip
        return Choice(p, "primary", f"{dt}: the kernel tuned for it (rows.ROW_KERNELS[{op!r}])")

    return choose


def _stream_vector(op: str, dt: np.dtype, n: int) -> bool:
    """Whether "auto" streams `op`'s rows of `n` columns of `dt` with 16-byte loads (RowKernels.pick's
    rule)."""
    return stream_vector_auto(op, dt, n) and (n * dt.itemsize) % VEC_BYTES == 0 and n > vector_cols(dt)


def row_path(case: Case) -> str:
    """The kernel a row op's "auto" launcher takes for `case` on this machine (verify/bench record it):
    "vector" (16-byte loads; device allocations are 256-byte aligned, so only the row length decides),
    "register" (rows of <= BLOCK * PER, scalar loads) or "stream" (longer rows). The vector path of the
    WIDE_DTYPES holds rows past BLOCK * PER too (vector_cols); row_path_of names its shape."""
    n = case.params["cols"]
    dt = np.dtype(case.dtype)
    if not SIMULATED and dt in AUTO_VECTOR and (n * dt.itemsize) % VEC_BYTES == 0 and n <= vector_cols(dt):
        return "vector"
    if n > BLOCK * PER:
        return "stream"
    return "register"
