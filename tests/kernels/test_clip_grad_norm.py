"""clip_grad_norm: norm and in-place scaling against the float64 reference; the no-clip branch leaves the
arrays bit-identical; validation errors."""

from __future__ import annotations

import ctypes
import dataclasses
import itertools

import numpy as np
import pytest
from numba import cuda
from opcheck import (
    ON_GPU,
    assert_case_passes,
    case_id,
    fake_graph_class,
    needs_device,
    needs_gpu,
    small_cases,
)

from kernels.ops import clip_grad_norm as op
from kernels.registry import Case
from kernels.runtime import arrays, launch
from kernels.runtime.launch import Kernel


@needs_device
@pytest.mark.parametrize("case", small_cases(op.SPEC), ids=case_id)
def test_cases(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


@needs_device
def test_numpy_inplace_and_return_value():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng()
    grads = [rng.standard_normal(n).astype(np.float32) for n in (33, 70, 5)]
    before = [g.copy() for g in grads]
    norm, scaled = op.reference(before, 0.5)
    got = op.clip_grad_norm(grads, 0.5)
    assert isinstance(got, float) and abs(got - norm) / norm < 1e-6
    for g, s in zip(grads, scaled, strict=True):
        np.testing.assert_allclose(g, s, rtol=1e-6)


@needs_device
def test_no_clip_leaves_arrays_untouched():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng()
    g = cuda.to_device(rng.standard_normal(300).astype(np.float16))
    before = g.copy_to_host()
    norm_out = cuda.device_array(1, np.float32)
    assert op.clip_grad_norm([g], 1e6, norm_out=norm_out) is norm_out
    np.testing.assert_array_equal(g.copy_to_host(), before)
    ref = np.sqrt(np.sum(before.astype(np.float64) ** 2))
    assert abs(norm_out.copy_to_host()[0] - ref) / ref < 1e-5


@needs_device
def test_validation_errors():  # type: ignore[no-untyped-def]
    g = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="grads: expected a non-empty list of arrays"):
        op.clip_grad_norm([], 1.0)
    with pytest.raises(ValueError, match="max_norm: expected a positive finite number, got 0"):
        op.clip_grad_norm([g], 0)
    with pytest.raises(TypeError, match=r"grads\[1\]: dtype float16 must match grads\[0\]'s dtype float32"):
        op.clip_grad_norm([g, np.ones(4, np.float16)], 1.0)
    with pytest.raises(ValueError, match=r"grads\[0\]: expected a C-contiguous array"):
        op.clip_grad_norm([np.ones((4, 4), np.float32)[:, 1]], 1.0)
    with pytest.raises(ValueError, match=r"norm_out: expected shape \(1,\)"):
        op.clip_grad_norm([g], 1.0, norm_out=cuda.device_array(2, np.float32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", op.SPEC.bench_cases, ids=case_id)
def test_bench_shapes(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


@needs_device
@pytest.mark.parametrize(
    "path, dtype",
    [(p, d) for p in ("per_array", "two_pass", "table") for d in ("float32", "float16")]
    + [("per_array", "bfloat16"), ("table", "bfloat16")],
)
def test_every_path(path, dtype):  # type: ignore[no-untyped-def]
    dtype = np.dtype(arrays.BF16 if dtype == "bfloat16" else dtype)
    rng = np.random.default_rng()
    # odd sizes: scalar tails shorter than a vector, and one array longer than a vector tile (1024 under the
    # simulator)
    grads = [(rng.standard_normal(n) * 0.1).astype(dtype) for n in (101, 7, 1100, 33)]
    before = [g.copy() for g in grads]
    full = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in before)))
    norm, scaled = op.reference(before, full / 3.0)  # clips: scale ~ 1/3, not exact in binary
    got = op.clip_grad_norm(grads, full / 3.0, path=path)
    assert abs(got - norm) / norm < 1e-5
    tol = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 4e-3}[dtype.name]
    for g, s in zip(grads, scaled, strict=True):
        g64 = g.astype(np.float64)
        assert np.linalg.norm(g64 - s) / np.linalg.norm(s) < tol


@needs_device
def test_path_selection_and_errors():  # type: ignore[no-untyped-def]
    many = [np.full(3, 1.0, np.float32) for _ in range(op.SLOTS + 1)]
    got = op.clip_grad_norm(many, 1.0)  # auto: more than SLOTS arrays take the table path
    assert abs(got - np.sqrt(3.0 * (op.SLOTS + 1))) < 1e-4
    with pytest.raises(
        ValueError, match=rf"path: 'two_pass' cannot run here: {op.SLOTS + 1} arrays \(at most {op.SLOTS}\)"
    ):
        op.clip_grad_norm(many, 1.0, path="two_pass")
    bf = [np.ones(3, arrays.BF16)]
    with pytest.raises(
        ValueError, match="path: 'two_pass' cannot run here: dtype bfloat16; use 'auto', 'table'"
    ):
        op.clip_grad_norm(bf, 1.0, path="two_pass")
    ws = cuda.device_array(1, np.float64)
    for path in ("two_pass", "table"):
        with pytest.raises(ValueError, match=f"path: '{path}' cannot run here: a workspace was given"):
            op.clip_grad_norm([np.ones(3, np.float32)], 1.0, workspace=ws, path=path)
    with pytest.raises(
        ValueError, match="path: 'fused' is not a path; expected one of: auto, two_pass, table, per_array"
    ):
        op.clip_grad_norm([np.ones(3, np.float32)], 1.0, path="fused")


@needs_device
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_table_is_two_pass_bit_for_bit(dtype):  # type: ignore[no-untyped-def]
    # the same tiles dealt to the same blocks, the same partials summed in the same order: the same bits,
    # the norm and every scaled element, clipped or not
    grads, full = _hint_arrays(dtype, 11)
    for max_norm in (full / 3.0, 2.0 * full):
        got = {}
        for launches in (op.two_pass_launches, op.table_launches):
            dev = [cuda.to_device(g) for g in grads]
            flat = [arrays.operand(f"g{i}", d).flat() for i, d in enumerate(dev)]
            no = cuda.device_array(1, np.float32)
            for k, grid, args in launches(flat, arrays.operand("norm_out", no), max_norm):
                k.launch(grid, op.BLOCK, args)
            got[launches] = (no.copy_to_host(), [d.copy_to_host() for d in dev])
        (n2, o2), (nt, ot) = got.values()
        np.testing.assert_array_equal(nt, n2)
        for a, b in zip(ot, o2, strict=True):
            np.testing.assert_array_equal(
                a.view(np.uint16 if dtype == "float16" else np.uint32),
                b.view(np.uint16 if dtype == "float16" else np.uint32),
            )


@needs_device
@pytest.mark.parametrize("grid", [5, 11])
def test_table_finds_each_tiles_row_when_blocks_skip_rows(grid, monkeypatch):  # type: ignore[no-untyped-def]
    """A block's next tile can lie many rows on (tiny arrays, a grid wider than the simulator's 2 blocks;
    on a GPU the grid is the device's): the norm and every scaled array against float64, each array at its
    own scale, so a tile taken from the wrong row, or at the wrong offset, shows."""
    monkeypatch.setattr(op, "SIM_GRID", grid)
    monkeypatch.setattr(op, "_grids", {})
    rng = np.random.default_rng(grid)
    sizes = [1, 2, 3] * 9 + [20000] + [5, 1] * 8 + [9000, 1]
    grads = [(rng.standard_normal(n) * 2.0 ** (i % 7 - 3)).astype(np.float32) for i, n in enumerate(sizes)]
    full = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads)))
    norm, scaled = op.reference(grads, full / 2.0)
    dev = [cuda.to_device(g) for g in grads]
    got = op.clip_grad_norm(dev, full / 2.0, path="table")
    assert abs(got - norm) / norm < 1e-5
    for i, (d, s) in enumerate(zip(dev, scaled, strict=True)):
        np.testing.assert_allclose(d.copy_to_host(), s, rtol=1e-5, atol=0, err_msg=f"array {i}")


@needs_device
def test_table_takes_two_launches_for_any_number_of_arrays(monkeypatch):  # type: ignore[no-untyped-def]
    # Llama-3-8B has 291 parameter tensors; per_array would take 1 + 2N launches
    launched = []
    real = Kernel.launch

    def counting(self, *a, **k):  # type: ignore[no-untyped-def]
        launched.append(self.sig)
        return real(self, *a, **k)

    monkeypatch.setattr(Kernel, "launch", counting)
    rng = np.random.default_rng(3)
    grads = [(rng.standard_normal(n) * 0.1).astype(np.float16) for n in (5, 40, 3, 17) * 10]
    full = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads)))
    norm, scaled = op.reference(grads, full / 2.0)
    dev = [cuda.to_device(g) for g in grads]
    got = op.clip_grad_norm(dev, full / 2.0)  # auto: 40 arrays > SLOTS
    assert launched == [op._TABLE_SIGS["norm"], op._TABLE_SIGS["scale"]]
    assert abs(got - norm) / norm < 1e-5
    for d, s in zip(dev, scaled, strict=True):
        assert np.linalg.norm(d.copy_to_host() - s) / np.linalg.norm(s) < 1e-3


@needs_device
def test_table_is_kept_per_rows_and_bounded():  # type: ignore[no-untyped-def]
    op._tables.clear()
    cfg = op.two_pass_config(np.dtype(np.float32))
    dev = [cuda.to_device(np.ones(n, np.float32)) for n in (10, 20, 30)]
    flat = [arrays.operand(f"g{i}", d).flat() for i, d in enumerate(dev)]
    tab, tq, tc = op.table_for(flat, cfg)
    fns = op.table_fns(np.dtype(np.float32), cfg)
    assert (tq, tc) == (3, 3) and fns["tq"] > 30 and fns["tc"] > 30  # one (partial) tile per array
    rows = tab.dev.copy_to_host()
    assert rows.shape == (3, 4) and list(rows[:, 1]) == [10, 20, 30]
    assert list(rows[:, op.TAB_FIRST_Q]) == list(rows[:, op.TAB_FIRST_C]) == [0, 1, 2]  # first tiles
    assert op.table_for(flat, cfg)[0] is tab  # the same rows: the same device table, nothing uploaded
    assert op.table_for(flat[:2], cfg)[0] is not tab
    for k in range(op.TABLES_MAX + 3):  # bounded: the oldest go first
        op.table_for([arrays.operand("g", cuda.to_device(np.ones(k + 1, np.float32))).flat()], cfg)
    assert len(op._tables) == op.TABLES_MAX


def test_llama3_8b_sizes():  # type: ignore[no-untyped-def]
    sizes = op.llama3_8b_sizes()
    assert len(sizes) == 291 and sum(sizes) == 8_030_261_248  # Llama-3-8B: 8.03 B parameters
    assert min(op.llama3_8b_sizes(4096)) == 1 and max(op.llama3_8b_sizes(4096)) == 128256


class _Ptr:
    def __init__(self, p: int) -> None:
        self.device_pointer = p


class _FakeDeviceArray:
    """Looks like a numba device array to kernels.runtime.arrays (pointer, shape, strides, dtype), with a
    real-looking pointer even under the simulator: the lean launcher's parameter words are checked without a
    GPU."""

    device_ctypes_pointer = None  # the class-level marker kernels.runtime.arrays looks for

    def __init__(self, shape, dtype, ptr, strides=None):  # type: ignore[no-untyped-def]
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.strides = strides or arrays.c_strides(shape, self.dtype.itemsize)
        self.gpu_data = _Ptr(ptr)

    def reshape(self, shape):  # type: ignore[no-untyped-def]
        return _FakeDeviceArray(shape, self.dtype, self.gpu_data.device_pointer)


_FakeDeviceArray.__module__ = "numba.cuda.fake"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fast_parameter_blocks_match_kernel_pack(dtype):  # type: ignore[no-untyped-def]
    # the lean launcher (GPU only) writes each kernel's whole parameter block with one struct.pack_into; it
    # must be byte for byte what Kernel.pack writes for the general path's arguments, with the same grid
    dt = np.dtype(dtype)
    grads = [_FakeDeviceArray((n,), dt, (1 << 40) + 4096 * i) for i, n in enumerate((100003, 5, 77))]
    grads.append(_FakeDeviceArray((3, 40), dt, 1 << 39))  # N-d: seen flat
    no = _FakeDeviceArray((1,), np.float32, 1 << 41)
    assert all(arrays.is_device_array(a) for a in (*grads, no))
    fv = op.fast_values(grads, no)
    assert fv is not None
    got_dt, words, p_no = fv
    assert got_dt is dt and p_no == 1 << 41 and len(words) == 7 * len(grads)
    plan = op._FastPlan(dt, op.TWO_PASS_DEFAULT[dt])
    padded = words + plan.empty_words * (op.SLOTS - len(grads))
    flat = [arrays.operand(f"g{i}", g).flat() for i, g in enumerate(grads)]
    launches = op.two_pass_launches(flat, arrays.operand("norm_out", no), 2.5)
    assert len(launches) == len(plan.kernels)
    for i, (k, grid, args) in enumerate(launches):
        ref = Kernel(k.dispatcher, k.sig)
        ref.build_plan()
        ref.pack(args)
        assert plan.pack(i, padded, p_no, 2.5) == grid
        assert list(plan.kernels[i]._block) == list(ref._block), i


class _FakeTableCall:
    """Stands in for op._TableCall (a real one uploads a table): records the max_norm of each launch."""

    made: list[_FakeTableCall] = []

    def __init__(self, dt, words, p_no):  # type: ignore[no-untyped-def]
        self.words, self.launched, self.closed = words, [], False
        _FakeTableCall.made.append(self)

    def launch(self, mx, hs):  # type: ignore[no-untyped-def]
        self.launched.append(mx)

    def close(self):  # type: ignore[no-untyped-def]
        self.closed = True


def test_fast_plan_repeat_call_launches_the_blocks_a_fresh_pack_writes(monkeypatch):  # type: ignore[no-untyped-def]
    # a repeat call on the same cached values skips the packing; new arrays repack; a new max_norm alone
    # goes to the table call over the same arrays (the next test's graph story)
    monkeypatch.setattr(launch, "GRAPH_REPLAY", False)  # direct launches only (graphs: the test below)
    monkeypatch.setattr(op, "_TableCall", _FakeTableCall)
    _FakeTableCall.made.clear()
    dt = np.dtype(np.float32)
    plan = op._FastPlan(dt, op.TWO_PASS_DEFAULT[dt])
    seen: list[tuple[int, list[int]]] = []

    def fake(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # type: ignore[no-untyped-def]
        k = next(k for k in plan.kernels if k._params is params)
        seen.append((gx, list(k._block)))
        return 0

    for k in plan.kernels:
        k._launch, k._func = fake, 0
    no = _FakeDeviceArray((1,), np.float32, 1 << 41)
    assert arrays.is_device_array(no)  # registers the fake type's extractor (the test can run alone)

    def expect(fv, mx):  # type: ignore[no-untyped-def]
        ref = op._FastPlan(dt, op.TWO_PASS_DEFAULT[dt])
        padded = fv[1] + ref.empty_words * (op.SLOTS - len(fv[1]) // 7)
        return [(ref.pack(i, padded, fv[2], mx), list(k._block)) for i, k in enumerate(ref.kernels)]

    fv1 = op.fast_values([_FakeDeviceArray((1000,), dt, 1 << 40)], no)
    fv2 = op.fast_values([_FakeDeviceArray((5000,), dt, 1 << 42), _FakeDeviceArray((7,), dt, 1 << 43)], no)
    steps = ((fv1, 1.0), (fv1, 1.0), (fv1, 2.0), (fv2, 2.0), (fv2, 2.0), (fv1, 2.0), (fv1, 3.0))
    moving_steps = (2, 6)  # (fv1, 2.0) after (fv1, 1.0); (fv1, 3.0) after (fv1, 2.0): only max_norm moved
    for step, (fv, mx) in enumerate(steps):
        seen.clear()
        before = [len(t.launched) for t in _FakeTableCall.made]
        plan.launch(fv, mx, None)
        if step in moving_steps:
            table = _FakeTableCall.made[-1]
            assert seen == [] and table.launched[-1] == mx and table.words is fv[1], step
        else:
            assert seen == expect(fv, mx), step
            assert [len(t.launched) for t in _FakeTableCall.made] == before, step
    (table,) = _FakeTableCall.made  # one table call for fv1's values, kept across fv2's calls
    assert table.launched == [2.0, 3.0] and not table.closed
    # path="two_pass" asked for by the caller: a max_norm that moves alone stays on two_pass's kernels
    seen.clear()
    plan.launch(fv1, 4.0, None, moving_ok=False)
    assert seen == expect(fv1, 4.0) and table.launched == [2.0, 3.0]


def test_fast_plan_replays_a_graph_from_the_second_identical_call(monkeypatch):  # type: ignore[no-untyped-def]
    # (values, max_norm) seen twice in a row: captured once, replayed after; new values launch directly, a
    # new max_norm alone goes to the table call; the graph captures the blocks a fresh pack of that call
    # writes; the oldest graph goes past GRAPHS_MAX
    monkeypatch.setattr(op, "GRAPHS_MAX", 2)
    monkeypatch.setattr(op, "_TableCall", _FakeTableCall)
    _FakeTableCall.made.clear()
    dt = np.dtype(np.float32)
    plan = op._FastPlan(dt, op.TWO_PASS_DEFAULT[dt])
    direct: list[int] = []

    def fake(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # type: ignore[no-untyped-def]
        direct.append(gx)
        return 0

    for k in plan.kernels:
        k._launch, k._func = fake, 0

    class FakeGraph(fake_graph_class(direct)):  # type: ignore[misc]
        def __init__(self, record):  # type: ignore[no-untyped-def]
            super().__init__(record)
            self.blocks = [list(k._block) for k in plan.kernels]  # what the capture saw

    monkeypatch.setattr(launch, "LaunchGraph", FakeGraph)
    no = _FakeDeviceArray((1,), np.float32, 1 << 41)
    assert arrays.is_device_array(no)  # registers the extractor, as a validating call would (run alone)
    fvs = [
        op.fast_values([_FakeDeviceArray((1000 * (i + 1),), dt, (1 << 40) + (i << 20))], no) for i in range(3)
    ]
    made = FakeGraph.made

    def fresh_blocks(fv, mx):  # type: ignore[no-untyped-def]
        ref = op._FastPlan(dt, op.TWO_PASS_DEFAULT[dt])
        padded = fv[1] + ref.empty_words * (op.SLOTS - len(fv[1]) // 7)
        for i in range(len(ref.kernels)):
            ref.pack(i, padded, fv[2], mx)
        return [list(k._block) for k in ref.kernels]

    plan.launch(fvs[0], 1.0, None)
    assert len(direct) == 2 and not made
    plan.launch(fvs[0], 1.0, None)  # the second identical call: captured and replayed
    assert len(direct) == 2 and len(made) == 1 and made[0].replays == 1 and len(made[0].captured) == 2
    assert made[0].blocks == fresh_blocks(fvs[0], 1.0)
    plan.launch(fvs[0], 1.0, None)
    assert len(direct) == 2 and len(made) == 1 and made[0].replays == 2
    plan.launch(fvs[0], 2.0, None)  # a new max_norm alone: the table call over the same arrays
    assert len(direct) == 2 and len(made) == 1 and _FakeTableCall.made[-1].launched == [2.0]
    plan.launch(fvs[0], 1.0, None)  # back to 1.0: its graph (captured with 1.0) replays
    assert len(direct) == 2 and made[0].replays == 3
    for fv in fvs[1:]:  # two more graphs: the first one (the oldest) is closed and dropped
        plan.launch(fv, 1.0, None)
        plan.launch(fv, 1.0, None)
    assert len(made) == 3 and made[0].closed and not made[1].closed and not made[2].closed
    assert made[2].blocks == fresh_blocks(fvs[2], 1.0)
    plan.launch(fvs[0], 1.0, None)  # its graph is gone: a direct launch (repack) again
    assert len(direct) == 2 + 4 + 2 and made[0].replays == 3


def test_table_call_replays_one_graph_whatever_max_norm_does(monkeypatch):  # type: ignore[no-untyped-def]
    # the table path's lean call on one set of arrays: direct launches first, a graph from the second call
    # on; a new max_norm updates the graph's scale launch in place (never a new capture, never a direct
    # launch), with exactly the block the general path packs for that call
    dt = np.dtype(np.float16)
    grads = [_FakeDeviceArray((1000 + 7 * i,), dt, (1 << 40) + (i << 20)) for i in range(12)]
    no = _FakeDeviceArray((1,), np.float32, 1 << 41)
    assert all(arrays.is_device_array(a) for a in (*grads, no))
    fv = op.fast_values(grads, no, table=True)
    assert fv is not None and op.fast_values(grads, no) is None  # 12 arrays: not two_pass's
    call = op._TableCall(*fv)
    direct: list[tuple[int, list[int]]] = []

    def fake(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # type: ignore[no-untyped-def]
        k = next(k for k in call.kernels if k._params is params)
        direct.append((gx, list(k._block)))
        return 0

    for k in call.kernels:
        k._launch, k._func = fake, 0
    FakeGraph = fake_graph_class(direct)
    monkeypatch.setattr(launch, "LaunchGraph", FakeGraph)
    flat = [arrays.operand(f"g{i}", g).flat() for i, g in enumerate(grads)]

    def packed(mx):  # type: ignore[no-untyped-def]
        # what the general path's Kernel.pack writes for this call
        out = []
        for k, grid, args in op.table_launches(flat, arrays.operand("norm_out", no), mx):
            ref = Kernel(k.dispatcher, k.sig)
            ref.build_plan()
            ref.pack(args)
            out.append((grid, list(ref._block)))
        return out

    call.launch(1.0, None)
    assert direct == packed(1.0) and not FakeGraph.made
    direct.clear()
    call.launch(2.0, None)  # the second call: captured (with 2.0) and replayed
    (g,) = FakeGraph.made
    assert g.updatable and g.captured == packed(2.0) and g.replays == 1 and not direct
    call.launch(2.0, None)
    call.launch(3.0, None)  # a new max_norm: the scale launch updated in place, then replayed
    assert g.replays == 3 and g.updates == [(1, packed(3.0)[1][1])] and not direct
    call.launch(3.0, None)
    call.launch(2.0, None)
    assert g.replays == 5 and [u[0] for u in g.updates] == [1, 1] and g.updates[-1][1] == packed(2.0)[1][1]
    assert len(FakeGraph.made) == 1 and not direct
    call.close()
    assert g.closed


def test_two_pass_config_drops_the_l2_hints_below_cc_8(monkeypatch):  # type: ignore[no-untyped-def]
    # createpolicy / ld.global.L2::cache_hint need sm_80: a cc 7.x GPU runs the same config without them
    monkeypatch.setattr(op, "SIMULATED", False)
    for dt in (np.dtype(np.float32), np.dtype(np.float16)):
        d = op.TWO_PASS_DEFAULT[dt]
        assert d.l2_keep_mb >= 0  # the hints are on by default
        monkeypatch.setattr(op, "compute_capability", lambda: (9, 0))
        assert op.two_pass_config(dt) is d
        monkeypatch.setattr(op, "compute_capability", lambda: (7, 5))
        old = op.two_pass_config(dt)
        assert old.l2_keep_mb == -1
        assert dataclasses.replace(old, l2_keep_mb=d.l2_keep_mb) == d  # the same tiles and occupancy


def test_fast_values_declines_what_the_general_path_must_check():  # type: ignore[no-untyped-def]
    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    ok = _FakeDeviceArray((64,), f32, 1 << 40)
    no = _FakeDeviceArray((1,), f32, 1 << 41)
    assert arrays.is_device_array(ok)
    assert op.fast_values([ok], no) is not None
    bad = {
        "misaligned": [_FakeDeviceArray((64,), f32, (1 << 40) + 4)],
        "mixed dtypes": [ok, _FakeDeviceArray((64,), f16, 1 << 40)],
        "strided": [_FakeDeviceArray((64,), f32, 1 << 40, strides=(8,))],
        "empty": [_FakeDeviceArray((0,), f32, 1 << 40)],
        "float64": [_FakeDeviceArray((64,), np.float64, 1 << 40)],
        "numpy": [np.ones(64, np.float32)],
        "too many": [ok] * (op.SLOTS + 1),
        "none": [],
    }
    for why, grads in bad.items():
        assert op.fast_values(grads, no) is None, why
    assert op.fast_values((ok,), no) is not None  # a tuple is fine
    assert op.fast_values([ok], _FakeDeviceArray((2,), f32, 1 << 41)) is None
    assert op.fast_values([ok], _FakeDeviceArray((1,), f16, 1 << 41)) is None
    assert op.fast_values([ok], np.zeros(1, np.float32)) is None


def test_item_ids_key_is_the_ids_in_order(monkeypatch):  # type: ignore[no-untyped-def]
    # the lean calls' key: equal exactly when the same objects come in the same order, list or tuple alike,
    # in the one-read form (CPython) and in the portable tuple of ids it falls back to elsewhere
    import sys

    if sys.implementation.name == "cpython":
        assert op._read_ids is not None  # the fast form is the one in use here
    for reader, n in itertools.product((op._read_ids, None), (300, op._READ_PAST + 1, op._READ_PAST, 2)):
        monkeypatch.setattr(op, "_read_ids", reader)
        objs = [object() for _ in range(n)]
        key = op.item_ids(objs)
        assert op.item_ids(tuple(objs)) == key and hash(op.item_ids(list(objs))) == hash(key)
        others = {
            "one item replaced": [*objs[: n // 2], object(), *objs[n // 2 + 1 :]],
            "two swapped": [objs[1], objs[0], *objs[2:]],
            "one more": [*objs, objs[0]],
            "one fewer": objs[:-1],
            "empty": [],
        }
        for why, seq in others.items():
            assert op.item_ids(seq) != key, (why, n)
        if reader is not None and n > op._READ_PAST:
            assert key == b"".join(id(o).to_bytes(tuple.__itemsize__, sys.byteorder) for o in objs)


def test_cached_values_live_only_as_long_as_the_arrays():  # type: ignore[no-untyped-def]
    import gc

    f32 = np.dtype(np.float32)
    a = _FakeDeviceArray((64,), f32, 1 << 40)
    no = _FakeDeviceArray((1,), f32, 1 << 41)
    assert arrays.is_device_array(a)
    first = op.cached_values([a], no)
    assert first is not None and op.cached_values((a,), no) is first  # a hit: the same object back
    key = (op.item_ids([a]), id(no))
    assert key in op._words
    del a
    gc.collect()
    assert key not in op._words  # dropped with the array: its id can be reused safely
    assert op.cached_values([np.ones(4, np.float32)], no) is None  # numpy: never the fast path


@needs_device
def test_auto_runs_two_pass():  # type: ignore[no-untyped-def]
    # "auto" on aligned arrays of at most SLOTS takes two_pass, here and in the registry's path label
    rng = np.random.default_rng()
    for dt in (np.float32, np.float16):
        case = Case("8x9-clip", {"count": 8, "elems": 9, "clip": 1}, np.dtype(dt).name)
        assert op._case_path(case) == "two_pass"
        grads = [(rng.standard_normal(n) * 0.1).astype(dt) for n in (300, 9)]
        before = [g.copy() for g in grads]
        full = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in before)))
        norm, scaled = op.reference(before, full / 2.0)
        got = op.clip_grad_norm(grads, full / 2.0)
        assert abs(got - norm) / norm < 1e-5
        tol = 1e-6 if dt == np.float32 else 1e-3
        for g, s in zip(grads, scaled, strict=True):
            assert np.linalg.norm(g - s) / np.linalg.norm(s) < tol


# L2 cache-policy hints (TwoPassConfig.l2_keep_mb). Under the simulator a hinted access is a plain one,
# so these check what the hint code paths index: every whole tile read once in the norm pass whichever policy
# it gets (the kept / not-kept split at any tile), every element scaled once, nothing written without a clip.
# Sizes (simulator: BLOCK 32, norm tiles of 512 fp32 / 1024 fp16 elements): several whole tiles per array,
# tails shorter than a vector, and one array shorter than a tile.
_HINT_SIZES = (2100, 7, 101, 3000, 1030, 33)


def _hint_arrays(dtype: str, seed: int) -> tuple[list[np.ndarray], float]:
    rng = np.random.default_rng(seed)
    dt = arrays.BF16 if dtype == "bfloat16" else np.dtype(dtype)
    grads = [(rng.standard_normal(n) * 0.1).astype(dt) for n in _HINT_SIZES]
    full = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads)))
    return grads, full


def _hint_run(dtype, cfg, max_norm, grads, launches=op.two_pass_launches):  # type: ignore[no-untyped-def]
    dev = [arrays.to_device(g) for g in grads]
    flat = [arrays.operand(f"g{i}", d).flat() for i, d in enumerate(dev)]
    no = cuda.device_array(1, np.float32)
    for k, grid, args in launches(flat, arrays.operand("norm_out", no), max_norm, cfg):
        k.launch(grid, op.BLOCK, args)
    return float(no.copy_to_host()[0]), [arrays.to_host(d) for d in dev]


@needs_device
@pytest.mark.parametrize(
    "dtype, launches",
    [(d, op.two_pass_launches) for d in ("float32", "float16")]
    + [(d, op.table_launches) for d in ("float32", "float16", "bfloat16")],
    ids=["two_pass-float32", "two_pass-float16", "table-float32", "table-float16", "table-bfloat16"],
)
@pytest.mark.parametrize("keep_mb", [0, 1, -1])
def test_hint_configs_match_float64(dtype, launches, keep_mb):  # type: ignore[no-untyped-def]
    cfg = op.TwoPassConfig(4, 2, 4, 4, l2_keep_mb=keep_mb)
    grads, full = _hint_arrays(dtype, 5)
    norm, scaled = op.reference(grads, full / 3.0)
    got, out = _hint_run(dtype, cfg, full / 3.0, grads, launches)
    assert abs(got - norm) / norm < 1e-5
    tol = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 4e-3}[dtype]
    for g, s in zip(out, scaled, strict=True):
        assert np.linalg.norm(g.astype(np.float64) - s) / np.linalg.norm(s) < tol
    # no clip: arrays bit-identical, the norm still reported
    got, out = _hint_run(dtype, cfg, 2.0 * full, grads, launches)
    assert abs(got - full) / full < 1e-5
    for g, before in zip(out, grads, strict=True):
        np.testing.assert_array_equal(g, before)


@needs_device
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prepared_clip_matches_float64_with_max_norm_new_each_call(dtype):  # type: ignore[no-untyped-def]
    # prepare() once over a set of device arrays, then calls with max_norm new each time (clipping and not),
    # new contents between calls: each call right against float64, norm returned in norm_out
    dt = np.dtype(arrays.BF16 if dtype == "bfloat16" else dtype)
    tol = {"float32": 1e-5, "bfloat16": 4e-3}[dtype]
    rng = np.random.default_rng(21)
    sizes = [5, 300, 1001, 1, 77] * 2 + [64]  # 11 arrays: more than two_pass's SLOTS
    grads = [arrays.to_device(np.zeros(n, dt)) for n in sizes]
    prepared = op.prepare(grads)
    for call, factor in enumerate((0.5, 2.0, 0.3, 0.7)):
        host = [rng.standard_normal(n).astype(np.float32).astype(dt) for n in sizes]
        for dev, h in zip(grads, host, strict=True):
            arrays.words(dev).copy_to_device(arrays.host_words(h))
        total, want = op.reference(host, 1.0)
        got_norm = prepared(total * factor)
        assert got_norm is prepared.norm_out
        assert abs(float(arrays.to_host(got_norm)[0]) - total) <= 1e-4 * total, call
        _, want = op.reference(host, total * factor)
        for dev, w in zip(grads, want, strict=True):
            out = arrays.to_host(dev).astype(np.float64)
            err = float(np.max(np.abs(out - w)) / max(float(np.max(np.abs(w))), 1e-30))
            assert err <= tol, f"call {call}: rel err {err:.3g}"


@needs_device
def test_prepare_refuses_what_it_cannot_hold():  # type: ignore[no-untyped-def]
    f32 = np.float32
    dev = [cuda.to_device(np.ones(8, f32)), cuda.to_device(np.ones(8, f32))]
    with pytest.raises(ValueError, match="grads: expected a non-empty list of device arrays"):
        op.prepare([])
    with pytest.raises(ValueError, match=r"grads\[1\]: prepare takes device arrays .* got a numpy array"):
        op.prepare([dev[0], np.ones(8, f32)])
    with pytest.raises(TypeError, match=r"grads\[1\]: dtype float16 must match grads\[0\]'s dtype float32"):
        op.prepare([dev[0], cuda.to_device(np.ones(8, np.float16))])
    with pytest.raises(ValueError, match=r"grads\[0\]: expected a non-empty array"):
        op.prepare([cuda.device_array(0, f32)])
    with pytest.raises(TypeError, match="norm_out: dtype"):
        op.prepare(dev, norm_out=cuda.device_array(1, np.float64))
    prepared = op.prepare(dev)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="max_norm: expected a positive finite number"):
            prepared(bad)


def test_prepared_call_launches_its_table_and_stays_in_its_context(monkeypatch):  # type: ignore[no-untyped-def]
    # the lean path (driver stubbed, the real _TableCall): a prepared call hands max_norm to its table call
    # and looks at no array (the caller's list may change afterwards): direct launches first, one graph
    # from the second call on, a new max_norm updated in place; its partials are its own; a call from
    # another CUDA context (GPU) than the one it was prepared in is refused, as are arrays whose storage
    # can move in place
    if ON_GPU:
        pytest.skip("stubbed-driver test: runs where there is no GPU")
    monkeypatch.setattr(op, "USE_DISPATCHER", False)
    monkeypatch.setattr(launch, "USE_DISPATCHER", False)
    ctx = [0xA]
    monkeypatch.setattr(launch, "context", lambda: ctx[0])
    direct: list[tuple[int, list[int]]] = []

    def prepare(self):  # type: ignore[no-untyped-def]
        self._func = 0
        self.build_plan()

        def fake(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # type: ignore[no-untyped-def]
            blk = ctypes.cast(params[0], ctypes.POINTER(ctypes.c_int64))
            direct.append((gx, [blk[i] for i in range(12)]))
            return 0

        self._launch = fake
        self._ready = True

    monkeypatch.setattr(launch.Kernel, "_prepare", prepare)
    FakeGraph = fake_graph_class(direct)
    monkeypatch.setattr(launch, "LaunchGraph", FakeGraph)
    monkeypatch.setattr(launch, "capturing", lambda hs: False)  # no caller's capture on stream 0x77
    dt = np.dtype(np.float16)
    grads = [_FakeDeviceArray((1000 + 8 * i,), dt, (1 << 40) + (i << 20)) for i in range(12)]
    no = _FakeDeviceArray((1,), np.float32, 1 << 41)
    prepared = op.prepare(grads, norm_out=no)
    other = op.prepare(grads[:10], norm_out=no)
    call = prepared._call
    assert call is not None and call.part.dev is not other._call.part.dev  # partials of its own
    tab = call.tab.dev.copy_to_host()
    assert [tuple(r) for r in tab[:, :2]] == [((1 << 40) + (i << 20), 1000 + 8 * i) for i in range(12)]
    fns = op.table_fns(dt, op.two_pass_config(dt))
    for col, tile in ((op.TAB_FIRST_Q, fns["tq"]), (op.TAB_FIRST_C, fns["tc"])):  # prefix sums of tile counts
        assert list(tab[:, col]) == [sum(-(-(1000 + 8 * k) // tile) for k in range(i)) for i in range(12)]
    grads[3] = None  # the caller's list changes: the prepared set does not
    assert prepared(0.5) is no and len(direct) == 2 and not FakeGraph.made  # the first call: direct
    assert prepared(0.5, stream=0x77) is no and len(FakeGraph.made) == 1  # the second: one graph
    assert prepared(0.25) is no and prepared(0.125) is no  # new max_norms: updated in place, no capture
    (g,) = FakeGraph.made
    assert g.replays == 3 and [u[0] for u in g.updates] == [1, 1] and len(direct) == 2
    ctx[0] = 0xB
    with pytest.raises(RuntimeError, match="another CUDA context"):
        prepared(0.5)
    assert g.replays == 3

    class _TorchLike:  # an object with __cuda_array_interface__ whose storage its owner may replace
        def __init__(self, ptr: int, shape: tuple[int, ...] = (64,), typestr: str = "<f2") -> None:
            self.ptr, self.shape, self.typestr = ptr, shape, typestr

        @property
        def __cuda_array_interface__(self) -> dict[str, object]:
            return {
                "shape": self.shape,
                "typestr": self.typestr,
                "data": (self.ptr, False),
                "strides": None,
                "version": 3,
            }

    _TorchLike.__module__ = "torch"
    with pytest.raises(ValueError, match=r"grads\[1\]: prepare takes numba or CuPy device arrays"):
        op.prepare([grads[0], _TorchLike(1 << 42)], norm_out=no)
    with pytest.raises(ValueError, match=r"norm_out: prepare takes numba or CuPy device arrays"):
        op.prepare([grads[0]], norm_out=_TorchLike(1 << 43, (1,), "<f4"))
