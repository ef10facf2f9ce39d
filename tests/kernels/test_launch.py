"""The fast launch path: on a GPU it must compute exactly what numba's dispatcher computes with the same
compiled kernel, for 1-d and 2-d arrays and float32 scalars; and it is faster. Under the simulator the
same `Kernel.launch` goes through the dispatcher (covered by every op test)."""

from __future__ import annotations

import ctypes
import gc
import sys
import time
from typing import Any

import numpy as np
import pytest
from numba import cuda
from opcheck import ON_GPU, fake_graph_class, needs_gpu

from kernels.ops import cast, cast_fp8, layernorm, residual_add, rmsnorm, rope, softmax
from kernels.runtime import arrays, launch

F32 = np.dtype(np.float32)


@pytest.mark.gpu
@needs_gpu
def test_fast_path_matches_dispatcher():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng()
    x = cuda.to_device(rng.standard_normal((37, 1001), dtype=np.float32))
    w = cuda.to_device(rng.standard_normal(1001, dtype=np.float32))
    a = cuda.device_array((37, 1001), np.float32)
    b = cuda.device_array((37, 1001), np.float32)
    k = launch.kernel(rmsnorm._K.stream_fns[F32], rmsnorm._SIGS[np.dtype(np.float32)])
    ops = [arrays.operand(n, v) for n, v in (("x", x), ("w", w), ("a", a))]
    k.launch(37, 256, (*ops, 1e-3))
    rmsnorm._K.stream_fns[F32][37, 256](x, w, b, np.float32(1e-3))
    cuda.synchronize()
    np.testing.assert_array_equal(a.copy_to_host(), b.copy_to_host())


@pytest.mark.gpu
@needs_gpu
def test_fast_path_host_overhead_below_dispatcher():  # type: ignore[no-untyped-def]
    x = cuda.to_device(np.ones((4, 256), np.float32))
    w = cuda.to_device(np.ones(256, np.float32))
    out = cuda.device_array((4, 256), np.float32)

    def per_call(fn) -> float:  # type: ignore[no-untyped-def]
        for _ in range(20):
            fn()
        t0 = time.perf_counter()
        for _ in range(500):
            fn()
        dt = (time.perf_counter() - t0) / 500
        cuda.synchronize()
        return dt

    fast = per_call(lambda: rmsnorm.rmsnorm(x, w, out))
    slow = per_call(lambda: rmsnorm._K.stream_fns[F32][4, 256](x, w, out, np.float32(1e-6)))
    assert fast < slow, (fast, slow)


def test_parameter_block_follows_numba_abi():  # type: ignore[no-untyped-def]
    # numba-cuda's _Kernel._prepare_args flattens an array into meminfo, parent, nitems, itemsize, data,
    # shape..., strides...; scalars follow as their own parameters. Built and packed with no GPU.
    k = launch.Kernel(rmsnorm._K.stream_fns[F32], "void(float16[:, ::1], float32[::1], float64, float32)")
    k.build_plan()
    x = arrays.Operand("x", 0xABC000, (3, 5), (10, 2), np.dtype(np.float16), None)
    w = arrays.Operand("w", 0xDEF000, (7,), (4,), np.dtype(np.float32), None)
    k.pack((x, w, 2.5, 0.25))
    blk = list(k._block)
    assert blk[:9] == [0, 0, 15, 2, 0xABC000, 3, 5, 10, 2]
    assert blk[9:16] == [0, 0, 7, 4, 0xDEF000, 7, 4]
    assert np.frombuffer(bytes(k._block), np.float64)[16] == 2.5
    assert k._scalars[0].value == 0.25
    assert len(k._params) == 9 + 7 + 1 + 1


def test_numba_device_arrays_take_the_direct_extractor():  # type: ignore[no-untyped-def]
    # checked in a subprocess without the simulator: the real DeviceNDArray class is what matters
    import os
    import subprocess
    import sys

    code = (
        "from numba.cuda.cudadrv.devicearray import DeviceNDArray\n"
        "from kernels.runtime import arrays\n"
        "ex = arrays._extractor_for(DeviceNDArray)\n"
        "assert ex is arrays._from_numba, ex\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]


def test_one_d_slot_takes_nd_operand_flat():  # type: ignore[no-untyped-def]
    k = launch.Kernel(rmsnorm._K.stream_fns[F32], "void(float32[::1])")
    k.build_plan()
    x = arrays.Operand("x", 0x1000, (3, 5, 7), (140, 28, 4), np.dtype(np.float32), None)
    k.pack((x,))
    assert list(k._block) == [0, 0, 105, 4, 0x1000, 105, 4]


# --- FastCache / Bound: validated launches replayed with new pointers (no GPU: the driver call stubbed) ---


class _Ptr:
    def __init__(self, p: int) -> None:
        self.device_pointer = p


class _FakeDeviceArray:
    """Looks like a numba DeviceNDArray to kernels.runtime.arrays (its extractor reads these attributes)."""

    device_ctypes_pointer = None

    def __init__(self, shape: tuple[int, ...], dtype: object, ptr: int) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)  # type: ignore[call-overload]
        self.strides = arrays.c_strides(shape, self.dtype.itemsize)
        self.gpu_data = _Ptr(ptr)

    def reshape(self, shape: tuple[int, ...]) -> _FakeDeviceArray:  # a C-contiguous view, as numba's
        return _FakeDeviceArray(shape, self.dtype, self.gpu_data.device_pointer)


_FakeDeviceArray.__module__ = "numba.cuda.fake"


def _kernels_in(values: list[object], depth: int = 2) -> list[launch.Kernel]:
    found: list[launch.Kernel] = []
    for v in values:
        if isinstance(v, launch.Kernel):
            found.append(v)
        elif isinstance(v, dict):
            found += _kernels_in(list(v.values()), depth)
        elif (
            depth
            and hasattr(v, "__dict__")
            and not isinstance(v, type)
            and type(v).__module__.startswith("kernels.")
        ):
            found += _kernels_in(list(vars(v).values()), depth - 1)
    return found


@pytest.fixture
def stubbed(monkeypatch):  # type: ignore[no-untyped-def]
    """Fast-launch kernels whose cuLaunchKernel records (function, dims, parameter block) instead. Not on a
    real GPU: the stub would replace compiled kernels' launch state that later tests use."""
    if ON_GPU:
        pytest.skip("stubbed-driver test: runs where there is no GPU")
    calls: list[tuple[object, tuple[int, ...], list[int]]] = []
    monkeypatch.setattr(launch, "USE_DISPATCHER", False)
    monkeypatch.setattr(launch, "GRAPH_REPLAY", False)  # graphs need the real driver (their test fakes them)
    monkeypatch.setattr(launch, "bind_thread", lambda: None)  # no driver to ask for a context

    def prepare(self):  # type: ignore[no-untyped-def]
        self._func = id(self)
        self.build_plan()

        def fake(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # type: ignore[no-untyped-def]
            blk = ctypes.cast(params[0], ctypes.POINTER(ctypes.c_int64))
            calls.append((func, (gx, bx), [blk[i] for i in range(9)], shared))
            return 0

        self._launch = fake
        self._ready = True

    monkeypatch.setattr(launch.Kernel, "_prepare", prepare)
    for mod in (rmsnorm, layernorm, softmax, residual_add, cast, rope, cast_fp8):
        monkeypatch.setattr(mod, "_FAST", launch.FastCache())
        # kernels an earlier simulator test made ready (dispatcher path, no parameter block) start over
        # (module-level Kernels, dicts of them, and those an op's kernel table such as rows.RowKernels holds)
        for k in _kernels_in(list(vars(mod).values())):
            monkeypatch.setattr(k, "_ready", False)
            monkeypatch.setattr(k, "_ctx", None)  # and no context's function or sibling from another test
            monkeypatch.setattr(k, "_others", {})
    return calls


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax"])
@pytest.mark.parametrize("shape", ["mid", "vocabulary"])
def test_onchip_rows_launch_and_replay_with_their_shared_memory(stubbed, op, shape):  # type: ignore[no-untyped-def]
    """The row ops' on-chip rows ask for (n - head) x itemsize bytes of dynamic shared memory at
    the first launch, and a FastCache replay on new pointers asks for the same (a replay without it would
    index past the block's shared memory), for each on-chip shape."""
    from kernels.ops.rows import ONCHIP_MID_ROWS, ONCHIP_ROWS, for_machine, vector_cols

    f16 = np.dtype(np.float16)
    c, mid = for_machine(ONCHIP_ROWS), for_machine(ONCHIP_MID_ROWS)
    # past the registers' rows: on chip, in the mid shape, or past it in the vocabulary one (the simulator's)
    cols = vector_cols(f16) + 8 * 4 if shape == "mid" else mid.cols + 8 * 4
    held = mid if shape == "mid" else c
    assert held.takes(cols) and (shape == "mid") is mid.takes(cols)
    want = (cols - held.threads * held.per) * 2

    def call(ptr: int) -> None:
        x = _FakeDeviceArray((5, cols), f16, ptr)
        w = _FakeDeviceArray((cols,), f16, ptr + 0x200000)
        out = _FakeDeviceArray((5, cols), f16, ptr + 0x100000)
        if op == "rmsnorm":
            rmsnorm.rmsnorm(x, w, out, path="vector")
        elif op == "softmax":
            softmax.softmax(x, out, path="vector")
        else:
            layernorm.layernorm(x, w, _FakeDeviceArray((cols,), f16, ptr + 0x300000), out, path="vector")

    call(0x1000000)
    call(0x5000000)  # same layout, new pointers: replayed
    assert len(stubbed) == 2 and stubbed[0][0] == stubbed[1][0]  # one kernel: the on-chip one
    assert [s[3] for s in stubbed] == [want, want] and want > 0
    assert stubbed[1][2][4] == 0x5000000


def test_bound_launch_rewrites_only_the_pointers(stubbed):  # type: ignore[no-untyped-def]
    sig = "void(float32[:, ::1], float32[::1], float32[:, ::1], float32)"
    k = launch.Kernel(rmsnorm._K.stream_fns[F32], sig)
    x = arrays.Operand("x", 0x1000, (3, 5), (20, 4), np.dtype(np.float32), None)
    w = arrays.Operand("w", 0x2000, (5,), (4,), np.dtype(np.float32), None)
    o = arrays.Operand("o", 0x3000, (3, 5), (20, 4), np.dtype(np.float32), None)
    b = k.bind(3, 256, (x, w, o, 0.5))
    b.launch((0xA000, 0xB000, 0xC000))
    k.pack((arrays.Operand("x", 0xA000, (3, 5), (20, 4), np.dtype(np.float32), None),
            arrays.Operand("w", 0xB000, (5,), (4,), np.dtype(np.float32), None),
            arrays.Operand("o", 0xC000, (3, 5), (20, 4), np.dtype(np.float32), None), 0.5))  # fmt: skip
    assert list(b._blk) == list(k._block)  # the same block the slow path packs for those pointers
    assert stubbed[-1][1] == (3, 256) and stubbed[-1][2][4] == 0xA000


def test_bound_ptr_args_rewrite_int64_address_slots(stubbed):  # type: ignore[no-untyped-def]
    # the mma replay: every argument an int64 (addresses, then sizes); ptrs go to the slots ptr_args names
    sig = "void(int64, int64, int64, int64, int64, int64, int64, int64)"
    k = launch.Kernel(rmsnorm._K.stream_fns[F32], sig)
    b = k.bind(7, 128, (1, 2, 0, 3, 4, 64, 48, 32), shared=1024, ptr_args=(0, 1, 4, 3))
    b.launch((0xA0, 0xB0, 0xC0, 0xD0))
    k.pack((0xA0, 0xB0, 0, 0xD0, 0xC0, 64, 48, 32))
    assert list(b._blk) == list(k._block) == [0xA0, 0xB0, 0, 0xD0, 0xC0, 64, 48, 32]
    assert stubbed[-1][1] == (7, 128)
    with pytest.raises(ValueError):
        b.launch((1, 2, 3))  # one pointer per named argument
    with pytest.raises(launch.LaunchError):
        launch.Kernel(rmsnorm._K.stream_fns[F32], "void(float32, int64)").bind(1, 32, (0.5, 1), ptr_args=(0,))


def test_bound_replays_a_graph_for_a_repeated_pointer_tuple(stubbed, monkeypatch):  # type: ignore[no-untyped-def]
    # the second call in a row with the same pointers captures the launch; later calls with them replay it;
    # other pointers launch directly; past GRAPHS_PER_BOUND tuples the oldest graph is closed and dropped
    monkeypatch.setattr(launch, "GRAPH_REPLAY", True)
    monkeypatch.setattr(launch, "GRAPHS_PER_BOUND", 2)

    FakeGraph = fake_graph_class(stubbed)
    monkeypatch.setattr(launch, "LaunchGraph", FakeGraph)
    made = FakeGraph.made
    sig = "void(" + ", ".join(["int64"] * 9) + ")"  # 9 slots: the stub reads the first 9 of the block
    b = launch.Kernel(rmsnorm._K.stream_fns[F32], sig).bind(5, 64, tuple(range(1, 10)), ptr_args=(0, 1))
    b.launch((0xA0, 0xB0))
    assert len(stubbed) == 1 and not made
    b.launch((0xA1, 0xB0))  # other pointers: direct
    assert len(stubbed) == 2 and not made
    b.launch((0xA1, 0xB0))  # the same twice in a row: captured (with these pointers) and replayed
    assert len(stubbed) == 2 and len(made) == 1 and made[0].replays == 1
    assert [c[2][:3] for c in made[0].captured] == [[0xA1, 0xB0, 3]] and made[0].captured[0][1] == (5, 64)
    b.launch((0xA0, 0xB0))
    b.launch((0xA1, 0xB0))  # its graph, although the block now holds 0xA0
    assert len(stubbed) == 3 and made[0].replays == 2
    for p in (0xA2, 0xA3):  # two more graphs: the first one goes
        b.launch((p, 0xB0))
        b.launch((p, 0xB0))
    assert len(made) == 3 and made[0].closed and not made[1].closed and not made[2].closed
    assert [c[2][:3] for c in made[2].captured] == [[0xA3, 0xB0, 3]]
    b.launch((0xA1, 0xB0))  # its graph was dropped: direct again, with the right pointers
    assert len(stubbed) == 6 and stubbed[-1][2][:3] == [0xA1, 0xB0, 3] and made[0].replays == 2


@pytest.mark.parametrize("opname", ["rmsnorm", "layernorm", "softmax", "residual_add", "cast"])
def test_launchers_replay_validated_layouts_only(stubbed, opname):  # type: ignore[no-untyped-def]
    f32, f16 = np.float32, np.float16

    def call(ptr: int, rows: int = 4, cols: int = 256, out_dtype: object = None) -> object:
        x = _FakeDeviceArray((rows, cols), f32, ptr)
        o = _FakeDeviceArray((rows, cols), out_dtype or (f16 if opname == "cast" else f32), ptr + 0x100000)
        w = _FakeDeviceArray((cols,), f32, ptr + 0x200000)
        if opname == "rmsnorm":
            return rmsnorm.rmsnorm(x, w, o)
        if opname == "layernorm":
            return layernorm.layernorm(x, w, w, o)
        if opname == "softmax":
            return softmax.softmax(x, o)
        if opname == "residual_add":
            return residual_add.residual_add(x, x, o)
        return cast.cast(x, o)

    call(0x1000000)  # validated, launched, stored
    first = stubbed[-1]
    call(0x5000000)  # same layout, new pointers: replayed
    assert len(stubbed) == 2 and stubbed[-1][0] == first[0] and stubbed[-1][1] == first[1]
    assert stubbed[-1][2][4] == 0x5000000 and stubbed[-1][2][2:4] == first[2][2:4]
    call(0x5000000, rows=6)  # another shape: validated again, its own grid
    assert len(stubbed) == 3 and stubbed[-1][2][2] == 6 * 256
    with pytest.raises(TypeError, match="out: dtype"):  # a bad output is never served from the cache
        call(0x5000000, out_dtype=np.float64)
    assert len(stubbed) == 3


def _validating_fails(monkeypatch):  # type: ignore[no-untyped-def]
    """From here on a call that validates its operands fails the test: what runs is the FastCache replay."""

    def refuse(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("validated again: the FastCache entry was not used")

    monkeypatch.setattr(arrays, "operand", refuse)


def test_rope_replays_validated_layouts_and_guards_overlap(stubbed, monkeypatch):  # type: ignore[no-untyped-def]
    # in place over x, read from cos / sin: a replay takes the new pointers (x's data slot is the first
    # array's, parameter 4), and a replay whose x overlaps cos is refused before any launch
    f32 = np.float32

    def call(px: int, pc: int, tokens: int = 4) -> object:
        x = _FakeDeviceArray((tokens, 2, 64), f32, px)
        return rope.rope(
            x, _FakeDeviceArray((tokens, 32), f32, pc), _FakeDeviceArray((tokens, 32), f32, 0x9000000)
        )

    call(0x1000000, 0x2000000)  # validated, launched, stored
    first = stubbed[-1]
    with monkeypatch.context() as m:
        _validating_fails(m)
        call(0x5000000, 0x6000000)  # same layout, new pointers: replayed
        with pytest.raises(ValueError, match="x: must not overlap cos"):
            call(0x5000000, 0x5000000 + 256)  # cos inside x, the cached layout: the guard refuses it
    assert len(stubbed) == 2 and stubbed[-1][:2] == first[:2] and stubbed[-1][2][4] == 0x5000000
    call(0x5000000, 0x6000000, tokens=6)  # another shape: validated again
    assert len(stubbed) == 3 and stubbed[-1][2][2] == 6 * 2 * 64


def test_cast_fp8_replays_both_launches_with_new_pointers(stubbed, monkeypatch):  # type: ignore[no-untyped-def]
    # amax (x, workspace) then cast (x, workspace, grid, out, scale): a replay launches both, each with the
    # new x (parameter 4, the first array's data slot); a call with the caller's own workspace is validated,
    # never served from the cache
    f32 = np.float32

    def call(ptr: int, **kw: object) -> object:
        x = _FakeDeviceArray((4, 256), f32, ptr)
        out = _FakeDeviceArray((4, 256), np.uint8, ptr + 0x100000)
        return cast_fp8.cast_fp8(x, out, _FakeDeviceArray((1,), f32, ptr + 0x200000), **kw)

    call(0x1000000)
    amax, cst = stubbed[-2], stubbed[-1]
    assert amax[0] != cst[0] and amax[2][4] == cst[2][4] == 0x1000000
    with monkeypatch.context() as m:
        _validating_fails(m)
        call(0x5000000)
    assert len(stubbed) == 4 and [c[0] for c in stubbed[2:]] == [amax[0], cst[0]]
    assert [c[2][4] for c in stubbed[2:]] == [0x5000000, 0x5000000]
    ws = _FakeDeviceArray((cast_fp8.parts(),), np.uint32, 0x7000000)
    call(0x5000000, workspace=ws)  # validated (both launches), not stored: the next call replays again
    assert len(stubbed) == 6 and cast_fp8._FAST.find((ws,), "auto")[0] is None
    call(0x3000000)
    assert len(stubbed) == 8 and [c[2][4] for c in stubbed[6:]] == [0x3000000, 0x3000000]
    with pytest.raises(TypeError, match="out: dtype"):
        x, bad = _FakeDeviceArray((4, 256), f32, 0x5000000), _FakeDeviceArray((4, 256), f32, 0x5100000)
        cast_fp8.cast_fp8(x, bad, _FakeDeviceArray((1,), f32, 0x5200000))
    assert len(stubbed) == 8


def test_bound_launches_directly_into_a_callers_own_capture(stubbed, monkeypatch):  # type: ignore[no-untyped-def]
    # while the caller captures the stream into its own graph (torch.cuda.graph, cudaStreamBeginCapture),
    # repeat calls launch directly, so each lands in that graph as a kernel node with its own pointers: no
    # graph of ours is captured there or replayed into it; outside the capture the replay works as before
    monkeypatch.setattr(launch, "GRAPH_REPLAY", True)
    FakeGraph = fake_graph_class(stubbed)
    monkeypatch.setattr(launch, "LaunchGraph", FakeGraph)
    asked: list[object] = []
    monkeypatch.setattr(launch, "capturing", lambda hs: asked.append(hs.value) or True)
    sig = "void(" + ", ".join(["int64"] * 9) + ")"
    b = launch.Kernel(rmsnorm._K.stream_fns[F32], sig).bind(5, 64, tuple(range(1, 10)), ptr_args=(0, 1))
    for _ in range(3):
        b.launch((0xA0, 0xB0), stream=0x77)
    assert len(stubbed) == 3 and not FakeGraph.made and asked == [0x77] * 3
    assert [c[2][:2] for c in stubbed] == [[0xA0, 0xB0]] * 3
    monkeypatch.setattr(launch, "capturing", lambda hs: False)  # the capture ended
    b.launch((0xA0, 0xB0), stream=0x77)
    b.launch((0xA0, 0xB0), stream=0x77)
    assert len(FakeGraph.made) == 1 and FakeGraph.made[0].replays == 1
    b.launch((0xA0, 0xB0))  # the legacy stream cannot be captured: not asked
    assert FakeGraph.made[0].replays == 2


def test_one_bound_shared_by_threads_launches_each_calls_own_pointers(stubbed):  # type: ignore[no-untyped-def]
    # the operator service calls launchers from several threads; a FastCache hit hands them one Bound, whose
    # pointers are written into one block: each launch must carry its own call's pointers (here p, p + 1)
    import sys
    import threading

    sig = "void(" + ", ".join(["int64"] * 9) + ")"
    b = launch.Kernel(rmsnorm._K.stream_fns[F32], sig).bind(5, 64, tuple(range(1, 10)), ptr_args=(0, 1))
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows

    def hammer(base: int) -> None:
        for i in range(3000):
            p = base + 16 * i
            b.launch((p, p + 1))

    try:
        threads = [threading.Thread(target=hammer, args=(t << 40,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert len(stubbed) == 12000
    torn = [c[2][:2] for c in stubbed if c[2][1] != c[2][0] + 1]
    assert not torn, f"{len(torn)} launches mixed two calls' pointers, e.g. {torn[:3]}"


def test_linear_replays_its_portable_launch_with_each_calls_pointers(stubbed, monkeypatch):  # type: ignore[no-untyped-def]
    # linear's FastCache hands the replay the pointers in (x, weight, out, bias) order; its portable kernel
    # takes (x, w, bias, out): every replayed launch must put each pointer in its own argument
    import functools

    from kernels.ops import linear as lin

    seen: list[list[int]] = []

    def prepare(self):  # type: ignore[no-untyped-def]
        self._func = id(self)
        self.build_plan()

        def fake(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # type: ignore[no-untyped-def]
            blk = ctypes.cast(params[0], ctypes.POINTER(ctypes.c_int64))
            seen.append(
                [blk[i] for i in (4, 13, 22, 29)]
            )  # data slots: x, w (2-d: 9 each), bias (1-d: 7), out
            return 0

        self._launch = fake
        self._ready = True

    f16 = np.dtype(np.float16)
    monkeypatch.setattr(launch.Kernel, "_prepare", prepare)
    monkeypatch.setattr(lin, "SIMULATED", False)  # the device path that stores a replay
    monkeypatch.setattr(lin, "_FAST", launch.FastCache())
    monkeypatch.setitem(lin._RESOLVED, (launch.context(), "auto", f16), "portable")
    monkeypatch.setattr(
        lin, "_portable", functools.cache(lin._portable.__wrapped__)
    )  # kernels of this test only

    def call(base: int, out_at: int = 0x3000) -> None:
        x = _FakeDeviceArray((4, 16), f16, base)
        w = _FakeDeviceArray((8, 16), f16, base + 0x1000)
        b = _FakeDeviceArray((8,), f16, base + 0x2000)
        o = _FakeDeviceArray((4, 8), f16, base + out_at)
        lin.linear(x, w, b, o, activation="silu")

    call(0x100000)  # validated and launched, its replay stored
    with monkeypatch.context() as m:
        _validating_fails(m)
        call(0x500000)  # the same layout: replayed with new pointers
        # the same layout with out inside x, w or the bias: the replay's guard refuses it, launching nothing
        for at, name in ((0x10, "x"), (0x10F0, "weight"), (0x2000, "bias")):
            with pytest.raises(ValueError, match=f"out: must not overlap {name} "):
                call(0x500000, out_at=at)
    assert seen == [[0x100000, 0x101000, 0x102000, 0x103000], [0x500000, 0x501000, 0x502000, 0x503000]]


def test_gemm_and_o_proj_replays_refuse_an_out_over_an_input(stubbed, monkeypatch):  # type: ignore[no-untyped-def]
    # FastCache keys by layout, not address: a replay with new pointers is held to the aliasing rules the
    # validating call checked. out over a / b (gemm), attn / w / bias (o_proj) or part of the residual is
    # refused with nothing launched; o_proj in place over the residual itself replays
    import functools

    from kernels.ops import gemm as g
    from kernels.ops import o_proj as op

    f16 = np.dtype(np.float16)
    for mod in (g, op):
        monkeypatch.setattr(mod, "SIMULATED", False)  # the device paths that store a replay
    monkeypatch.setattr(g, "_FAST_GEMM", launch.FastCache())
    monkeypatch.setattr(op, "_FAST", launch.FastCache())
    monkeypatch.setitem(g._RESOLVED, (launch.context(), "auto", f16), "portable")
    monkeypatch.setattr(g, "_portable", functools.cache(g._portable.__wrapped__))  # kernels of this test only

    def arr(shape: tuple[int, ...], at: int, dt: np.dtype = f16) -> _FakeDeviceArray:
        return _FakeDeviceArray(shape, dt, at)

    def gemm(base: int, out_at: int = 0x3000) -> None:
        g.gemm(arr((4, 16), base), arr((16, 8), base + 0x1000), arr((4, 8), base + out_at, np.float32))

    def o_proj(base: int, out_at: int = 0x3000, bias: bool = True) -> None:
        a, w, r = arr((4, 16), base), arr((16, 8), base + 0x1000), arr((4, 8), base + 0x2000)
        op.o_proj(a, w, r, arr((8,), base + 0x2800) if bias else None, out=arr((4, 8), base + out_at))

    def o_proj_nobias(base: int, out_at: int = 0x3000) -> None:
        o_proj(base, out_at, bias=False)

    for call in (gemm, o_proj, o_proj_nobias):
        call(0x100000)  # validated and launched, its replay stored
    launched = len(stubbed)
    with monkeypatch.context() as m:
        _validating_fails(m)
        for call in (gemm, o_proj, o_proj_nobias):
            call(0x500000)
        o_proj(0x500000, out_at=0x2000)  # out is the residual itself: allowed
        assert len(stubbed) == launched + 4
        refused = [
            (gemm, 0x10, "out: must not overlap a "),
            (gemm, 0x1010, "out: must not overlap b "),
            (gemm, 0x1000 - 0x80 + 0x10, "out: must not overlap b "),  # out (128 bytes) ending inside b
            (o_proj, 0x10, "out: must not overlap attn "),
            (o_proj, 0x1010, "out: must not overlap w "),
            (o_proj, 0x2010, "out: must be residual itself or not overlap it "),
            (o_proj, 0x2800 - 0x40 + 0x10, "out: must not overlap bias "),  # out (64 bytes) ending in bias
            (o_proj_nobias, 0x10, "out: must not overlap attn "),
            (o_proj_nobias, 0x2000 - 0x40 + 0x10, "out: must be residual itself or not overlap it "),
        ]
        for call, at, match in refused:
            with pytest.raises(ValueError, match=match):
                call(0x500000, out_at=at)
    assert len(stubbed) == launched + 4


# --- per-context state: a node with two GPUs (two CUDA contexts) in one process, the driver stubbed ---------


@pytest.fixture
def two_contexts(stubbed, monkeypatch):  # type: ignore[no-untyped-def]
    """`stubbed`, plus a current-context switch the test flips (two GPUs' primary contexts): every kernel
    load records the context it happened in, and each loaded function is a number that names its context
    (high bits) so a launch shows whose function it ran."""
    current = [0xA]
    monkeypatch.setattr(launch, "context", lambda: current[0])
    loads: list[int] = []
    stub = launch.Kernel._prepare

    def prepare(self):  # type: ignore[no-untyped-def]
        stub(self)
        loads.append(current[0])
        self._func = (current[0] << 32) | len(loads)

    monkeypatch.setattr(launch.Kernel, "_prepare", prepare)
    return current, loads


def test_a_kernel_is_loaded_once_per_context_and_launches_that_contexts_function(two_contexts, stubbed):  # type: ignore[no-untyped-def]
    # a CUfunction belongs to one context: launching context A's function while B is current is invalid
    current, loads = two_contexts
    seen: list[int] = []
    k = launch.Kernel(rmsnorm._K.stream_fns[F32], "void(" + ", ".join(["int64"] * 9) + ")",
                      on_load=seen.append)  # fmt: skip
    for ctx in (0xA, 0xB, 0xA, 0xB, 0xA):
        current[0] = ctx
        k.launch(1, 32, tuple(range(9)))
    assert loads == [0xA, 0xB], "one load per context, none repeated"
    assert [c[0] >> 32 for c in stubbed] == [0xA, 0xB, 0xA, 0xB, 0xA]
    assert [f >> 32 for f in seen] == [0xA, 0xB], "on_load ran once per context, with that context's function"
    current[0] = 0xB
    assert k.clone()._func >> 32 == 0xB  # a private copy is of the current context's function


def test_validated_launches_are_kept_per_context(two_contexts, stubbed):  # type: ignore[no-untyped-def]
    # the same layout on two GPUs: the second GPU's first call is validated and bound there, not served
    # from the first GPU's FastCache entry (whose function and graphs belong to the first context)
    current, loads = two_contexts

    def call(ptr: int) -> None:
        x = _FakeDeviceArray((4, 256), np.float32, ptr)
        w = _FakeDeviceArray((256,), np.float32, ptr + 0x100000)
        o = _FakeDeviceArray((4, 256), np.float32, ptr + 0x200000)
        rmsnorm.rmsnorm(x, w, o)

    for ctx, ptr in ((0xA, 0x1000000), (0xB, 0x5000000), (0xA, 0x9000000), (0xB, 0xD000000)):
        current[0] = ctx
        call(ptr)
    assert [c[0] >> 32 for c in stubbed] == [0xA, 0xB, 0xA, 0xB]
    assert [c[2][4] for c in stubbed] == [0x1000000, 0x5000000, 0x9000000, 0xD000000]
    assert sorted(set(loads)) == [0xA, 0xB]
    assert len(rmsnorm._FAST._d) == 2  # one entry per context; the repeat calls were hits


def test_clip_keeps_plans_and_device_buffers_per_context(two_contexts, stubbed, monkeypatch):  # type: ignore[no-untyped-def]
    # clip_grad_norm's lean call holds kernels, graphs and device buffers (the partials, the empty slots):
    # each context gets its own, and a call launches its own context's functions
    from kernels.ops import clip_grad_norm as clip

    current, _ = two_contexts
    monkeypatch.setattr(clip, "USE_DISPATCHER", False)
    for name in ("_fast_plans", "_buffers", "_empty_arrays", "_grids", "_table_calls", "_tables"):
        monkeypatch.setattr(clip, name, {})
    norm = _FakeDeviceArray((1,), np.float32, 0x7000000)
    grads = [_FakeDeviceArray((1000 + 16 * i,), np.float32, 0x1000000 * (i + 1)) for i in range(3)]
    many = [_FakeDeviceArray((64,), np.float32, 0x20000000 + 0x10000 * i) for i in range(clip.SLOTS + 2)]
    for ctx in (0xA, 0xB):
        current[0] = ctx
        assert clip.clip_grad_norm(grads, 1.0, norm_out=norm) is norm  # two_pass's plan
        assert clip.clip_grad_norm(many, 1.0, norm_out=norm) is norm  # the table call
    assert sorted(clip._fast_plans) == [(0xA, np.dtype(np.float32)), (0xB, np.dtype(np.float32))]
    pa, pb = (clip._fast_plans[(c, np.dtype(np.float32))] for c in (0xA, 0xB))
    assert [k._func >> 32 for k in pa.kernels] == [0xA, 0xA]
    assert [k._func >> 32 for k in pb.kernels] == [0xB, 0xB]
    parts = {k[0]: v for k, v in clip._buffers.items()}
    assert set(parts) == {0xA, 0xB} and parts[0xA].dev is not parts[0xB].dev
    assert {k[0] for k in clip._empty_arrays} == {0xA, 0xB} and {k[0] for k in clip._tables} == {0xA, 0xB}
    assert {k[0] for k in clip._table_calls} == {0xA, 0xB}
    assert [c[0] >> 32 for c in stubbed] == [0xA] * 4 + [0xB] * 4  # two launches per call, each its own


def test_kernel_selection_follows_each_devices_architecture(two_contexts, monkeypatch):  # type: ignore[no-untyped-def]
    # one node, an H100 (cc 9.0) and an A100 (cc 8.0): auto takes wgmma on the first and mma.sync on the
    # second, and sm_90a code is refused on the second whatever the first one compiled
    from numba import cuda as numba_cuda

    from kernels.ops import gemm
    from kernels.ops.gemm import mma, wgmma
    from kernels.runtime import device

    current, _ = two_contexts
    cc = {0xA: (9, 0), 0xB: (8, 0)}

    class _Dev:
        @property
        def compute_capability(self) -> tuple[int, int]:
            return cc[current[0]]

    monkeypatch.setattr(device, "SIMULATED", False)
    monkeypatch.setattr(gemm, "SIMULATED", False)
    monkeypatch.setattr(numba_cuda, "is_available", lambda: True)
    monkeypatch.setattr(numba_cuda, "get_current_device", _Dev)
    monkeypatch.setattr(device, "_CC", {})
    monkeypatch.setattr(gemm, "_RESOLVED", {})
    f16 = np.dtype(np.float16)
    got = []
    for ctx in (0xA, 0xB, 0xA, 0xB):
        current[0] = ctx
        got.append((gemm.resolve_path("auto", f16), mma.available(), wgmma.available()))
    assert got == [("wgmma_tma", True, True), ("mma", True, False)] * 2
    from kernels.ops import linear

    monkeypatch.setattr(linear, "SIMULATED", False)
    monkeypatch.setattr(linear, "_RESOLVED", {})
    picked = []
    for ctx in (0xA, 0xB, 0xA):
        current[0] = ctx
        picked.append(linear._resolve("auto", f16))
    assert picked == ["wgmma_tma", "portable", "wgmma_tma"]
    current[0] = 0xB
    with pytest.raises(RuntimeError, match="sm_90a"):
        wgmma._kernel(wgmma.key_of(f16, False, False, False), wgmma.DEFAULT)


def test_graph_node_update_builds_its_parameters_once(monkeypatch):  # type: ignore[no-untyped-def]
    # clip's new max_norm each call: the scale launch's block is rewritten in place and the executable graph's
    # node updated from it; the node parameters (function, dims, the block's address) are built once per
    # kernel and dims, and every update hands the driver that struct, pointing at the live block
    seen: list[tuple[int, int, int, int, int]] = []

    class _Lib:
        @staticmethod
        def cuGraphExecKernelNodeSetParams_v2(ex, node, ref):  # type: ignore[no-untyped-def]
            p = ctypes.cast(ref, ctypes.POINTER(launch._KernelNodeParams)).contents
            seen.append((ctypes.addressof(p), p.func, p.grid[0], p.block[0], p.params))
            return 0

    monkeypatch.setattr(launch, "_libcuda", _Lib())
    g = launch.LaunchGraph.__new__(launch.LaunchGraph)
    g._exec, g._nodes, g._updates = ctypes.c_void_p(1), (ctypes.c_void_p(10), ctypes.c_void_p(11)), {}
    kerns = []
    for _ in range(2):
        k = launch.Kernel(rmsnorm._K.stream_fns[F32], "void(int64, float64)")
        k.build_plan()
        k._func = ctypes.c_void_p(0xF00 + len(kerns))
        kerns.append(k)
    g.set_kernel_params(1, kerns[0], 132, 256)
    g.set_kernel_params(1, kerns[0], 132, 256)
    g.set_kernel_params(1, kerns[1], 132, 256)
    g.set_kernel_params(1, kerns[0], 264, 256)  # other dims: their own struct
    addr = [s[0] for s in seen]
    assert addr[0] == addr[1] and len(set(addr)) == 3
    assert [s[1:] for s in seen[:3]] == [
        (0xF00, 132, 256, ctypes.addressof(kerns[0]._params)),
        (0xF00, 132, 256, ctypes.addressof(kerns[0]._params)),
        (0xF01, 132, 256, ctypes.addressof(kerns[1]._params)),
    ]
    assert seen[3][1:3] == (0xF00, 264)


def test_context_asks_the_driver_and_binds_numbas_context_in_a_thread_that_has_none(monkeypatch):  # type: ignore[no-untyped-def]
    # the real launch.context() over a stub cuCtxGetCurrent (a C-callable that writes each thread's current
    # context): a thread with one gets it back without numba; a thread with none gets numba's bound first
    # (once); a thread where numba cannot bind one either gets one clear error
    import threading

    if ON_GPU:
        pytest.skip("stubbed-driver test: runs where there is no GPU")
    current = threading.local()  # each thread's current context (the callback runs in the calling thread)

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
    def get_current(out):  # type: ignore[no-untyped-def]
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = getattr(current, "ctx", 0) or None
        return 0

    class _Lib:
        cuCtxGetCurrent = get_current

    asked: list[int] = []

    def numba_binds() -> None:
        asked.append(threading.get_ident())
        if len(asked) == 1:  # numba binds in the first worker only
            current.ctx = 0xC0

    monkeypatch.setattr(launch, "SIMULATED", False)
    monkeypatch.setattr(launch, "_libcuda", _Lib())
    monkeypatch.setattr(launch, "_TLS", threading.local())  # no out-parameter left from another test
    monkeypatch.setattr(launch.cuda, "current_context", numba_binds)
    current.ctx = 0xA
    assert launch.context() == 0xA and launch.context() == 0xA and not asked
    seen: list[object] = []

    def worker() -> None:
        try:
            seen.append(launch.context())
            seen.append(launch.context())
        except launch.LaunchError as e:
            seen.append(str(e))

    for _ in range(2):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert seen[:2] == [0xC0, 0xC0] and len(asked) == 2  # bound once in the first worker
    assert "no CUDA context is current in this thread" in str(seen[2])


def test_device_facts_and_buffers_are_kept_per_context(two_contexts, monkeypatch):  # type: ignore[no-untyped-def]
    # two GPUs of different sizes: SM counts (and the persistent grids made from them), workspaces, bias
    # placeholders and occupancy are each context's own
    from numba import cuda as numba_cuda

    from kernels.ops import cast_fp8, clip_grad_norm, gemm

    current, _ = two_contexts
    sms = {0xA: 132, 0xB: 108}

    optin = {0xA: 232448, 0xB: 4096}  # an H100's 227 KB; a GPU too small for the simulator's on-chip rows

    class _Dev:
        @property
        def MULTIPROCESSOR_COUNT(self) -> int:  # noqa: N802  (numba's name)
            return sms[current[0]]

        @property
        def MAX_SHARED_MEMORY_PER_BLOCK_OPTIN(self) -> int:  # noqa: N802  (numba's name)
            return optin[current[0]]

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
    def occupancy(out, func, block, shared):  # type: ignore[no-untyped-def]
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = 8 if (func >> 32) == 0xA else 3
        return 0

    class _Lib:
        cuOccupancyMaxActiveBlocksPerMultiprocessor = occupancy

    monkeypatch.setattr(launch, "SIMULATED", False)
    monkeypatch.setattr(clip_grad_norm, "SIM_GRID", 1 << 30)  # the simulator's grid cap out of the way
    monkeypatch.setattr(launch, "_libcuda", _Lib())
    monkeypatch.setattr(numba_cuda, "get_current_device", _Dev)
    cleared = {launch: ("_SM", "_OPTIN"), clip_grad_norm: ("_grids", "_buffers"), cast_fp8: ("_workspaces",),
               gemm: ("_PLACEHOLDERS",)}  # fmt: skip
    for mod, names in cleared.items():
        for name in names:
            monkeypatch.setattr(mod, name, {})
    f32 = np.dtype(np.float32)
    cfg = clip_grad_norm.TWO_PASS_DEFAULT[f32]
    k = launch.Kernel(rmsnorm._K.stream_fns[F32], "void(float32[::1])")
    got = {}
    for ctx in (0xA, 0xB, 0xA):
        current[0] = ctx
        got.setdefault(ctx, []).append(
            (
                launch.sm_count(),
                clip_grad_norm.two_pass_grid(f32, cfg, "norm"),
                clip_grad_norm._accumulator(),
                cast_fp8._workspace_for(None, 16, ctx),
                gemm._placeholder_1d(f32),
                gemm._placeholder_1d(np.dtype(np.float16)),  # (linear's placeholder too)
                k.resident_blocks(256),
            )
        )
    (a1, a2), (b,) = got[0xA], got[0xB]
    assert (
        a1[0] == 132
        and b[0] == 108
        and a1[1] == 132 * cfg.norm_blocks_per_sm
        and b[1] == 108 * cfg.norm_blocks_per_sm
    )
    assert a1[6] == 8 and b[6] == 3
    for i in range(2, 6):  # the same buffer again in A, another one in B
        assert a1[i] is a2[i] and a1[i] is not b[i], i
    # shared memory per block: rmsnorm's on-chip rows where the device holds them (the simulator's rows past
    # vector_cols take ONCHIP_MID_ROWS' shape first), else its streaming kernel
    from kernels.ops import rows
    from kernels.runtime.arrays import BF16

    long = rows.vector_cols(BF16) + 8
    for ctx, fits in ((0xA, True), (0xB, False), (0xA, True)):
        current[0] = ctx
        assert launch.smem_optin() == optin[ctx] and rows.chip_fits() is fits
        assert rows.chip_fits(rows.ONCHIP_MID_ROWS) is fits
        k = rmsnorm._K.pick("vector", BF16, True, long, 2)[0]
        want = rmsnorm._K.mid_k[BF16] if fits else rmsnorm._K.svec_k[BF16]
        assert (k.kernel if fits else k) is want


def test_fast_cache_bound_is_per_context(two_contexts, monkeypatch):  # type: ignore[no-untyped-def]
    # FastCache keeps at most MAX layouts per context: a GPU that filled its share leaves another its own
    current, _ = two_contexts
    monkeypatch.setattr(launch.FastCache, "MAX", 2)
    cache = launch.FastCache()
    arrays_of = [(_FakeDeviceArray((4, n), np.float32, 0x1000),) for n in (16, 32, 48)]
    for objs in arrays_of:
        cache.store(objs, "opts", f"bound{objs[0].shape[1]}")  # type: ignore[arg-type]
    assert [cache.find(o, "opts")[0] for o in arrays_of] == ["bound16", "bound32", None]
    current[0] = 0xB
    cache.store(arrays_of[2], "opts", "boundB")  # type: ignore[arg-type]
    assert cache.find(arrays_of[2], "opts")[0] == "boundB" and cache.find(arrays_of[0], "opts")[0] is None


def test_clip_drops_only_its_own_contexts_tables(two_contexts, monkeypatch):  # type: ignore[no-untyped-def]
    # the device tables are bounded per context, and a full context drops its own oldest table after
    # draining its own queue: never another GPU's, which that drain does not cover
    from kernels.ops import clip_grad_norm as clip

    current, _ = two_contexts
    monkeypatch.setattr(clip, "TABLES_MAX", 2)
    monkeypatch.setattr(clip, "_tables", {})
    f32 = np.dtype(np.float32)
    cfg = clip.TWO_PASS_DEFAULT[f32]
    current[0] = 0xB
    clip._table_of(f32, cfg, ((0xB000, 64),))
    current[0] = 0xA
    for base in (0x1000, 0x2000, 0x3000):
        clip._table_of(f32, cfg, ((base, 64),))
    kept = sorted((k[0], k[3][0][0]) for k in clip._tables)
    assert kept == [(0xA, 0x2000), (0xA, 0x3000), (0xB, 0xB000)]


def test_on_load_runs_per_context_on_the_dispatcher_path_of_a_gpu(monkeypatch):  # type: ignore[no-untyped-def]
    # SOLFLEET_LAUNCH=dispatcher on a real GPU: numba launches the kernel, but its function still needs
    # on_load (mma / wgmma raise their shared-memory limit there): resolved from numba's compiled kernel,
    # once per context; nothing on the simulator's dispatcher path
    if ON_GPU:
        pytest.skip("stubbed-driver test: runs where there is no GPU")
    ctx = [0xA]

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    def kernel_get_function(out, handle):  # type: ignore[no-untyped-def]
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = (ctx[0] << 16) | handle
        return 0

    class _Lib:
        cuKernelGetFunction = kernel_get_function

    class _Compiled:
        class _codelibrary:  # noqa: N801  (numba's attribute)
            @staticmethod
            def get_cufunc() -> object:
                return type("CuFunc", (), {"handle": 0x77})()

    class _Dispatcher:
        @staticmethod
        def compile(sig: str) -> object:
            return _Compiled

    monkeypatch.setattr(launch, "USE_DISPATCHER", True)
    monkeypatch.setattr(launch, "SIMULATED", False)
    monkeypatch.setattr(launch, "_libcuda", _Lib())
    monkeypatch.setattr(launch, "context", lambda: ctx[0])
    loaded: list[int] = []
    k = launch.Kernel(_Dispatcher, "void(int64)", on_load=loaded.append)
    for c in (0xA, 0xB, 0xA, 0xB):
        ctx[0] = c
        k.here()
    assert loaded == [(0xA << 16) | 0x77, (0xB << 16) | 0x77]
    monkeypatch.setattr(launch, "SIMULATED", True)
    sim = launch.Kernel(_Dispatcher, "void(int64)", on_load=loaded.append)
    sim.here()
    assert len(loaded) == 2  # the simulator has no function to hand over


def test_compiling_for_another_gpu_never_holds_up_launches_on_the_first(two_contexts, stubbed, monkeypatch):  # type: ignore[no-untyped-def]
    # a worker thread bound to GPU B compiles this kernel's sibling (seconds for the tensor-core tiles):
    # meanwhile launches of the same kernel on GPU A go ahead
    import threading

    current, _ = two_contexts
    per_thread = threading.local()
    monkeypatch.setattr(launch, "context", lambda: getattr(per_thread, "ctx", 0xA))
    stub = launch.Kernel._prepare
    compiling, finish = threading.Event(), threading.Event()

    def prepare(self):  # type: ignore[no-untyped-def]
        if getattr(per_thread, "ctx", 0xA) == 0xB:
            compiling.set()
            finish.wait(10)
        stub(self)

    monkeypatch.setattr(launch.Kernel, "_prepare", prepare)
    k = launch.Kernel(rmsnorm._K.stream_fns[F32], "void(" + ", ".join(["int64"] * 9) + ")")
    k.launch(1, 32, tuple(range(9)))  # loaded for A
    done = threading.Event()

    def on_b() -> None:
        per_thread.ctx = 0xB
        k.launch(1, 32, tuple(range(9)))
        done.set()

    t = threading.Thread(target=on_b)
    t.start()
    try:
        assert compiling.wait(10)
        ran = threading.Event()
        a = threading.Thread(target=lambda: (k.launch(2, 32, tuple(range(9))), ran.set()))
        a.start()
        assert ran.wait(5), "a launch on GPU A waited for GPU B's compile"
        assert not done.is_set()
    finally:
        finish.set()
        t.join(10)
    assert done.is_set() and len(stubbed) == 3


def test_fast_cache_counts_each_layout_once(two_contexts, monkeypatch):  # type: ignore[no-untyped-def]
    # storing a layout again replaces it without using up the context's share; clear() empties the shares
    monkeypatch.setattr(launch.FastCache, "MAX", 2)
    cache = launch.FastCache()
    a, b = (_FakeDeviceArray((4, n), np.float32, 0x1000) for n in (16, 32))
    cache.store((a,), "opts", "first")  # type: ignore[arg-type]
    cache.store((a,), "opts", "again")  # type: ignore[arg-type]
    cache.store((b,), "opts", "second")  # type: ignore[arg-type]
    assert cache.find((a,), "opts")[0] == "again" and cache.find((b,), "opts")[0] == "second"
    cache.clear()
    cache.store((b,), "opts", "x")  # type: ignore[arg-type]
    cache.store((a,), "opts", "y")  # type: ignore[arg-type]
    assert cache.find((a,), "opts")[0] == "y" and cache.find((b,), "opts")[0] == "x"


def test_clip_bounds_its_lean_table_calls_per_context(two_contexts, monkeypatch):  # type: ignore[no-untyped-def]
    # the lean table calls (one per set of arrays) are bounded per context: a new set on GPU A drops A's
    # oldest, never B's
    from kernels.ops import clip_grad_norm as clip

    current, _ = two_contexts
    monkeypatch.setattr(clip, "USE_DISPATCHER", False)
    monkeypatch.setattr(clip, "TABLE_CALLS_MAX", 1)
    for name in ("_table_calls", "_tables", "_buffers", "_grids"):
        monkeypatch.setattr(clip, name, {})
    norm = _FakeDeviceArray((1,), np.float32, 0x7000000)

    count = max(clip.SLOTS, clip._READ_PAST) + 1  # past two_pass's slots and in item_ids' one-read form

    def grads(base: int) -> list[_FakeDeviceArray]:
        return [_FakeDeviceArray((64,), np.float32, base + 0x10000 * i) for i in range(count)]

    def ids(objs: list[_FakeDeviceArray]) -> Any:  # the key's ids, built here without item_ids
        if clip._read_ids is None:
            return tuple(map(id, objs))
        return b"".join(id(o).to_bytes(tuple.__itemsize__, sys.byteorder) for o in objs)

    sets = {"a1": grads(0x1000000), "b1": grads(0x2000000), "a2": grads(0x3000000)}
    for name, ctx in (("a1", 0xA), ("b1", 0xB), ("a2", 0xA)):
        current[0] = ctx
        assert clip.clip_grad_norm(sets[name], 1.0, norm_out=norm, path="table") is norm
    kept = {(k[0], k[1]) for k in clip._table_calls}
    assert kept == {(0xB, ids(sets["b1"])), (0xA, ids(sets["a2"]))}
    del sets["b1"]  # its arrays die: their entry goes with them (weak references), before any id is reused
    gc.collect()
    assert {(k[0], k[1]) for k in clip._table_calls} == {(0xA, ids(sets["a2"]))}


def test_dynamic_smem_raises_the_limit_only_past_the_default(monkeypatch):  # type: ignore[no-untyped-def]
    # mma / wgmma's on_load: past 48 KB of shared memory the function's limit must be raised (attribute 8,
    # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), or its launch fails; below it nothing is asked; a
    # refused request names the size and the driver's code
    calls: list[tuple[int, int, int]] = []
    rc = [0]

    class _Lib:
        class cuFuncSetAttribute:  # noqa: N801  (the driver's name)
            argtypes: object = None

            def __new__(cls, func, attr, nbytes):  # type: ignore[no-untyped-def]
                calls.append((func.value, attr, nbytes))
                return rc[0]

    monkeypatch.setattr(launch, "_libcuda", _Lib())
    launch.dynamic_smem(48 * 1024)(0xF00)
    assert calls == []
    launch.dynamic_smem(197 * 1024)(0xF00)
    assert calls == [(0xF00, 8, 197 * 1024)]
    rc[0] = 1
    with pytest.raises(launch.LaunchError, match=r"max dynamic shared = 201728 B\) failed with CUresult 1"):
        launch.dynamic_smem(197 * 1024)(0xF01)


@pytest.mark.parametrize(
    ("optin", "vocabulary", "mid"),
    [
        (232448, True, True),  # sm_90 (H100 / H200): 227 KB a block, two mid blocks fit
        (166912, False, False),  # sm_80 (A100): one mid block per SM only, the layout that lost: stream
        (101376, False, False),  # sm_86 / sm_89
    ],
)
def test_chip_fits_asks_for_every_block_a_shape_runs_per_sm(monkeypatch, optin, vocabulary, mid):  # type: ignore[no-untyped-def]
    """The on-chip shapes as a GPU runs them (not the simulator's): each needs min_blocks blocks of its shared
    memory within what one block may opt in to (an SM's shared memory less 1 KB on these GPUs)."""
    from kernels.ops import rows

    monkeypatch.setattr(rows, "SIMULATED", False)  # for_machine: the shapes as on a GPU
    monkeypatch.setattr(rows, "smem_optin", lambda: optin)
    assert rows.chip_fits(rows.ONCHIP_ROWS) is vocabulary and rows.chip_fits() is vocabulary
    assert rows.chip_fits(rows.ONCHIP_MID_ROWS) is mid
