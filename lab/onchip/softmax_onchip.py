# ruff: noqa
"""Lab record (not shipped, not imported): softmax's on-chip kernel, the layout of rmsnorm's `make_onchip`
(kernels/ops/rmsnorm.py) with the streaming kernel's online max / sum. Measured on an H100 (2026-12-05,
benchmarks/h100/2026-12-05/onchip-softmax/, lab/onchip_ab.py with it registered): 0.83-0.88x the streaming
kernel at 40960-131072 columns, fp16 and bf16, so it was taken out of kernels/ops/softmax.py. 64 registers,
no spills. The source as it was (it lived in kernels/ops/softmax.py, registered with RowKernels(onchip=...)):
"""

def make_onchip(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """Rows past what registers hold, read once (kernels.ops.rows.OnChipRows; fp16 / bf16 `word`s), the
    layout of rmsnorm's `make_onchip`: pass 1 loads the row's first threads x per columns into registers and
    streams the rest into the thread's own shared-memory slots, folding every value into the thread's online
    (max, sum) as the streaming kernel does; the block merges them; pass 2 writes exp(v - max) / sum from
    registers and from shared memory. One read of the row where the streaming kernel takes two."""
    threads, per, nvec = config.threads, config.per, config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bmax, bsum, half = make_block_max(threads), make_block_sum(threads), row_slots(threads)
    smem_size = 4 * half  # max and sum slots, two halves each: they alternate between rows
    head = threads * per  # columns held in registers
    nv = per // width
    nvals = nvec * width  # a name, not an expression: numba folds names into local array sizes
    elem, narrow, widen = onchip_words(word)
    jit_kw: dict[str, Any] = {} if SIMULATED else {"launch_bounds": (threads, config.min_blocks)}

    @cuda.jit(**jit_kw)
    def k(x, out):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(smem_size, float32)
        part = cuda.shared.array(0, elem)  # the shared part: nt vectors of `width` words, word-major
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
            load_row(v, xr, n, NEG_INF)
            m = NEG_INF
            s = float32(0.0)
            j = tid
            while j < nt:
                for u in range(nvec):  # every load of the step in flight before any is used
                    if j + u * threads < nt:
                        ldg_into(t, u * width, xr, head + (j + u * threads) * width)
                for u in range(nvec):
                    if j + u * threads < nt:
                        for e in range(width):
                            f = t[u * width + e]
                            m, s = _push(m, s, f)
                            part[e * nt + j + u * threads] = narrow(f)
                j += nvec * threads
            for e in range(per):
                m, s = _push(m, s, v[e])
            mb = bmax(m, sm, base)
            # a thread that saw only -inf has s = 0 and adds 0; an all -inf row is NaN (as streaming)
            s = bsum(s * math.exp(m - mb), sm, base + half)
            base = 2 * half - base
            inv = float32(1.0) / s
            orow = out[row]
            for q in range(nv):
                for e in range(width):
                    t[e] = math.exp(v[q * width + e] - mb) * inv
                stg_from(orow, col_of(q), t, 0)
            j = tid
            while j < nt:  # this thread's own slots: no other thread reads or writes them
                for e in range(width):
                    t[e] = math.exp(widen(part[e * nt + j]) - mb) * inv
                stg_from(orow, head + j * width, t, 0)
                j += threads
            row += cuda.gridDim.x

    return k


