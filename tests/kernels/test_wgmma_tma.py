"""The TMA-fed warp-specialized wgmma tile (kernels/ops/gemm/wgmma_tma.py, gemm's "wgmma_tma" path): what it
is built as and where it may be asked for (no GPU), and on a cc 9.0 GPU: every ragged shape of the lab's
checks through gemm and o_proj, replays on new arrays, a caller's own graph capture, and a full map table
(the cp.async tile takes over, never a wrong result). The offline sm_90a link of these kernels is in
test_wgmma.py (slow). auto does not take this path yet: these GPU tests passing is the condition for it."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
from numba import cuda

from kernels.ops import gemm as g
from kernels.ops.gemm import gemm, select_path, wgmma, wgmma_tma
from kernels.ops.o_proj import o_proj
from kernels.runtime import arrays, launch
from kernels.runtime.arrays import BF16, SIMULATED

F16 = np.dtype(np.float16)
TMA = "wgmma_tma"
ON_CC90 = not SIMULATED and cuda.is_available() and wgmma.available()
needs_cc90 = pytest.mark.skipif(not ON_CC90, reason="needs a cc 9.0 (sm_90a) GPU")
# the lab's check shapes (lab/wgmma_ws/bench.py): tile multiples, ragged M / N / K, one row, K of one slice
SHAPES = [(256, 512, 128), (129, 200, 136), (77, 264, 72), (300, 392, 1000), (1, 8, 8), (1000, 1000, 64)]


def test_the_product_builds_the_persistent_one_cta_form() -> None:
    src = wgmma_tma.source(wgmma_tma.key_of(BF16, True, True))
    head = src[: src.index(wgmma.cu_text(wgmma_tma.CU_FILE))]  # the defines in front of the file
    defines = dict(line.split()[1:3] for line in head.splitlines())
    assert defines["WS_PERSIST"] == "1" and defines["WS_CLUSTER"] == "1"
    assert defines["WS_BN"] == "256" and defines["WS_STAGES"] == "4"
    assert defines["WS_OUT"] == "1" and defines["WS_RES"] == "1" and defines["WS_DT"] == "0"
    assert defines["WS_TIMEOUT_NS"] == "60000000000ull"  # not the lab's 2 s
    assert wgmma_tma.SMEM_BYTES <= 227 * 1024
    # both Hopper tiles get the shared wgmma wrappers spliced in, once, and no include for NVRTC to resolve
    for text in (src, wgmma.source(wgmma.key_of(F16, False, False, False), wgmma.DEFAULT)):
        assert not [line for line in text.splitlines() if line.startswith("#include")]
        assert text.count("void wg_mma_n256_bf16(") == text.count("void wg_mma_n128_f16(") == 1
    assert wgmma_tma.grid(4096, 4096, 132) == 132 and wgmma_tma.grid(1, 8, 132) == 1
    with pytest.raises(TypeError, match="float32"):
        wgmma_tma.key_of(np.dtype(np.float32), False, False)


def test_auto_takes_it_on_cc90_only() -> None:
    for dt in (BF16, F16):
        assert select_path(path="wgmma_tma", dtype=dt, cc=(9, 0), simulated=False) == "wgmma_tma"
        assert select_path(path="auto", dtype=dt, cc=(9, 0), simulated=False) == "wgmma_tma"
        for cc in ((8, 0), (10, 0)):
            assert select_path(path="auto", dtype=dt, cc=cc, simulated=False) != "wgmma_tma"
        for cc, simulated in (((8, 0), False), ((10, 0), False), (None, True)):
            with pytest.raises(ValueError, match="wgmma_tma"):
                select_path(path="wgmma_tma", dtype=dt, cc=cc, simulated=simulated)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        select_path(path="wgmma_tma", dtype=np.dtype(np.float32), cc=(9, 0), simulated=False)


def _host(shape: tuple[int, ...], dt: np.dtype, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal(shape).astype(dt)


def _rel(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


@needs_cc90
@pytest.mark.gpu
@pytest.mark.parametrize("dt", [BF16, F16], ids=str)
@pytest.mark.parametrize("mnk", SHAPES, ids=str)
def test_gemm_and_o_proj_take_the_tma_tile(dt: np.dtype, mnk: tuple[int, int, int]) -> None:
    m, n, k = mnk
    rng = np.random.default_rng(m + n + k)
    a, b, r = _host((m, k), dt, rng), _host((k, n), dt, rng), _host((m, n), dt, rng)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    da, db, dr = arrays.to_device(a), arrays.to_device(b), arrays.to_device(r)
    table = wgmma_tma.table()
    before = len(table)
    c = cuda.to_device(np.full((m, n), np.nan, np.float32))  # an unwritten element stays NaN
    gemm(da, db, c, path=TMA)
    assert len(table) == before + 1  # the TMA tile's maps were made: it ran
    assert _rel(c.copy_to_host(), ref) <= 1e-5
    out = arrays.to_device(np.full((m, n), np.nan, dt))
    o_proj(da, db, dr, out=out, path=TMA)
    got = arrays.to_host(out).astype(np.float64)
    want = ref + r.astype(np.float64)
    assert len(table) == before + 2  # o_proj's kernel: its own maps (another key)
    assert np.isfinite(got).all()
    assert _rel(got, want) <= (2.0**-8 if dt == BF16 else 2.0**-10)


@needs_cc90
@pytest.mark.gpu
def test_replays_on_new_arrays_look_up_their_own_maps() -> None:
    """Four calls of one layout, each on new arrays with new data: the FastCache replay must launch with the
    maps of the call's own A and B (stale maps would read the first call's operands)."""
    rng = np.random.default_rng(5)
    m, n, k = 200, 264, 136
    g._FAST_GEMM.clear()  # room for this layout (the cache keeps at most FastCache.MAX per context)
    table = wgmma_tma.table()
    before = len(table)
    kept = []  # every call's arrays stay alive: four distinct addresses, four pairs of maps
    for call in range(4):
        a, b = _host((m, k), BF16, rng), _host((k, n), BF16, rng)
        da, db = arrays.to_device(a), arrays.to_device(b)
        c = cuda.to_device(np.full((m, n), np.nan, np.float32))
        kept.append((da, db, c))
        if call:  # the layout is in the FastCache: this call replays
            assert g._FAST_GEMM.find((da, db, c), TMA)[0] is not None
        gemm(da, db, c, path=TMA)
        assert _rel(c.copy_to_host(), a.astype(np.float64) @ b.astype(np.float64)) <= 1e-5
    assert len(table) == before + 4


@needs_cc90
@pytest.mark.gpu
def test_a_callers_capture_takes_the_cp_async_tile_for_operands_without_maps() -> None:
    """Inside a caller's own graph capture a synchronous map copy cannot run: a pair of operands not seen
    before runs on the cp.async tile (the table does not grow), a pair seen before on the TMA tile; the
    caller's graph computes both right."""
    rng = np.random.default_rng(6)
    m, n, k = 264, 520, 136  # a layout no other test here uses: no FastCache entry, no maps yet
    a, b = _host((m, k), F16, rng), _host((k, n), F16, rng)
    a2 = _host((m, k), F16, rng)
    da, db, da2 = arrays.to_device(a), arrays.to_device(b), arrays.to_device(a2)
    c, c2 = cuda.device_array((m, n), np.float32), cuda.device_array((m, n), np.float32)
    gemm(da, db, c, path=TMA)  # validated and its maps made outside the capture
    gemm(da2, db, c2, path="wgmma")  # the cp.async kernel compiled and loaded outside it too
    cuda.synchronize()
    table = wgmma_tma.table()
    before = len(table)
    s = cuda.stream()
    hs = ctypes.c_void_p(launch._stream_handle(s))
    lib = launch._driver()
    assert lib.cuStreamBeginCapture_v2(hs, 2) == 0  # 2: CU_STREAM_CAPTURE_MODE_RELAXED
    try:
        gemm(da, db, c, path=TMA, stream=s)  # maps made before: the TMA tile
        gemm(da2, db, c2, path=TMA, stream=s)  # a new A: no maps can be made now
    finally:
        graph = ctypes.c_void_p()
        rc_end = lib.cuStreamEndCapture(hs, ctypes.byref(graph))
    assert rc_end == 0 and graph.value, f"the caller's capture was broken: cuStreamEndCapture -> {rc_end}"
    assert len(table) == before
    c.copy_to_device(np.full((m, n), np.nan, np.float32))
    c2.copy_to_device(np.full((m, n), np.nan, np.float32))
    ex = ctypes.c_void_p()
    assert lib.cuGraphInstantiateWithFlags(ctypes.byref(ex), graph, ctypes.c_ulonglong(0)) == 0
    try:
        assert lib.cuGraphLaunch(ex, hs) == 0
        s.synchronize()
    finally:
        lib.cuGraphExecDestroy(ex)
        lib.cuGraphDestroy(graph)
    assert _rel(c.copy_to_host(), a.astype(np.float64) @ b.astype(np.float64)) <= 1e-5
    assert _rel(c2.copy_to_host(), a2.astype(np.float64) @ b.astype(np.float64)) <= 1e-5


@needs_cc90
@pytest.mark.gpu
def test_a_full_map_table_falls_back_to_the_cp_async_tile() -> None:
    ctx = launch.context()
    saved = wgmma_tma._TABLES.get(ctx)
    wgmma_tma._TABLES[ctx] = full = wgmma_tma.MapTable(size=0)
    try:
        rng = np.random.default_rng(7)
        m, n, k = 131, 208, 144  # a layout no other test here uses: the launch goes through the table
        a, b = _host((m, k), BF16, rng), _host((k, n), BF16, rng)
        c = cuda.device_array((m, n), np.float32)
        gemm(arrays.to_device(a), arrays.to_device(b), c, path=TMA)
        assert len(full) == 0
        assert _rel(c.copy_to_host(), a.astype(np.float64) @ b.astype(np.float64)) <= 1e-5
    finally:
        if saved is None:
            del wgmma_tma._TABLES[ctx]
        else:
            wgmma_tma._TABLES[ctx] = saved


class _Driver:
    """The five driver entry points MapTable uses, in Python (no GPU here): it records each call, holds the
    thread's capture mode, and keeps what each copy wrote by device address."""

    def __init__(self, copy_rc: int = 0) -> None:
        self.mode = 0  # CU_STREAM_CAPTURE_MODE_GLOBAL, the thread's default
        self.calls: list[str] = []
        self.memory: dict[int, bytes] = {}
        self.copy_rc = copy_rc
        self.mode_during_copy: list[int] = []

    def cuThreadExchangeStreamCaptureMode(self, mode: Any) -> int:
        self.calls.append("exchange")
        self.mode, mode._obj.value = mode._obj.value, self.mode
        return 0

    def cuStreamCreate(self, stream: Any, flags: Any) -> int:
        self.calls.append(f"create {flags.value}")
        stream._obj.value = 0x5170
        return 0

    def cuMemcpyHtoDAsync_v2(self, dst: Any, src: Any, n: Any, stream: Any) -> int:
        self.calls.append("copy")
        self.mode_during_copy.append(self.mode)
        self.memory[dst.value] = src.raw[: n.value]
        return self.copy_rc

    def cuStreamSynchronize(self, stream: Any) -> int:
        self.calls.append(f"sync {stream.value:#x}")
        return 0


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> _Driver:
    if ON_CC90:
        pytest.skip("stand-in driver test: runs where there is no cc 9.0 GPU")
    drv = _Driver()
    slab = type("Slab", (), {"device_ctypes_pointer": ctypes.c_void_p(0x7000_0000)})()
    monkeypatch.setattr(launch, "_driver", lambda: drv)
    monkeypatch.setattr(launch, "capturing", lambda hs: hs.value == 0xCA97)
    monkeypatch.setattr(cuda, "device_array", lambda n, dt: slab)
    monkeypatch.setattr(wgmma_tma, "maps_of", lambda key, a, b, m, n, k: bytes([a % 251, b % 251]) * 128)
    return drv


def test_map_table_slots_capture_and_capacity(driver: _Driver) -> None:
    key = wgmma_tma.key_of(BF16, False, False)
    t = wgmma_tma.MapTable(size=2)
    first = t.address(key, 10, 20, 64, 64, 64)
    assert first == 0x7000_0000 and driver.memory[first] == bytes([10, 20]) * 128
    # the write ran relaxed, on a private non-blocking stream, and the thread's own mode came back
    assert driver.mode_during_copy == [2] and driver.mode == 0
    assert driver.calls == ["exchange", "create 1", "copy", "sync 0x5170", "exchange"]
    assert t.address(key, 10, 20, 64, 64, 64) == first and driver.calls.count("copy") == 1  # written once
    # the caller's stream is being captured: nothing is written, the caller takes the cp.async tile
    assert t.address(key, 11, 20, 64, 64, 64, stream=0xCA97) is None and driver.calls.count("copy") == 1
    assert t.address(key, 11, 20, 64, 64, 64) == first + 256  # the next slot; the stream made once
    assert t.address(key, 12, 20, 64, 64, 64) is None and len(t) == 2  # full
    assert driver.calls.count("create 1") == 1


def test_a_failed_map_write_is_no_maps_and_restores_the_capture_mode(driver: _Driver) -> None:
    driver.copy_rc = 1  # CUDA_ERROR_INVALID_VALUE
    t = wgmma_tma.MapTable(size=4)
    assert t.address(wgmma_tma.key_of(F16, True, True), 10, 20, 64, 64, 64) is None
    assert len(t) == 0 and driver.mode == 0 and driver.calls[-1] == "exchange"
