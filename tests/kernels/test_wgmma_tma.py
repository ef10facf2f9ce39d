"""The TMA-fed warp-specialized wgmma tile (kernels/ops/gemm/wgmma_tma.py, the "wgmma_tma" path of gemm,
o_proj and linear): what it is built as, where it may be asked for and how its replays pass their pointers
(no GPU), and on a cc 9.0 GPU: every ragged shape of the lab's checks through gemm and o_proj (with and
without a bias), linear's bias and activation epilogues, replays on new arrays, a caller's own graph
capture, and a full map table (the cp.async tile takes over, never a wrong result). The offline sm_90a link
of these kernels is in test_wgmma.py (slow). auto takes this path on cc 9.0 (first passed on an H100,
2026-12-05)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numba import cuda

from kernels.ops import gemm as g
from kernels.ops import linear as lin
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
# linear's (M, K, N): M not a multiple of 128, N a multiple of 8 but not of 256, K not a multiple of 64
LINEAR_SHAPES = [(129, 72, 200), (300, 1000, 392), (77, 136, 264), (1, 8, 8)]


def _defines(src: str) -> dict[str, str]:
    head = src[: src.index(wgmma.cu_text(wgmma_tma.CU_FILE))]  # the defines in front of the file
    return dict(line.split()[1:3] for line in head.splitlines())


def test_the_product_builds_the_persistent_one_cta_form() -> None:
    defines = _defines(wgmma_tma.source(wgmma.key_of(BF16, True, False, True)))
    assert defines["WS_PERSIST"] == "1" and defines["WS_CLUSTER"] == "1"
    assert defines["WS_BN"] == "256" and defines["WS_STAGES"] == "4"
    assert defines["WS_OUT"] == "1" and defines["WS_RES"] == "1" and defines["WS_DT"] == "0"
    assert defines["WS_BIAS"] == "0" and defines["WS_ACT"] == "0"
    assert defines["WS_TIMEOUT_NS"] == "60000000000ull"  # not the lab's 2 s
    assert wgmma_tma.SMEM_BYTES <= 227 * 1024
    assert wgmma_tma.grid(4096, 4096, 132) == 132 and wgmma_tma.grid(1, 8, 132) == 1
    with pytest.raises(TypeError, match="float32"):
        wgmma.key_of(np.dtype(np.float32), False, False, False)


def test_both_tiles_splice_one_copy_of_the_wrappers_and_the_activation() -> None:
    """Both Hopper tiles get the wgmma wrappers, fences and descriptor and the epilogue (16-bit words, the
    activation, the pair store, the tile epilogue) spliced in once each, and no include for NVRTC to resolve;
    both call the one epilogue with their own WS_ / WG_ type, output, bias, residual, activation and chunk."""
    tma = wgmma_tma.source(wgmma.key_of(BF16, True, True, False, True, "silu"))
    cp = wgmma.source(wgmma.key_of(F16, True, True, False, True, "silu"), wgmma.DEFAULT)
    for text in (tma, cp):
        assert not [line for line in text.splitlines() if line.startswith("#include")]
        assert text.count("void wg_mma_n256_bf16(") == text.count("void wg_mma_n128_f16(") == 1
        assert text.count("float wg_x_sigmoid(") == text.count("float wg_act(") == 1
        assert "1.5957691216057308f" in text and text.count("ex2.approx.ftz.f32 %0") == 1  # gelu_tanh: 2u
        start = text.index("float wg_x_sigmoid(")
        body = text[start : text.index("\n}\n", start)]
        assert "rcp.approx.f32 %0" in body and "/" not in body  # no IEEE division
        helpers = ("float wg_to_f32(", "u32 wg_pack(", "void wg_put2(", "void wg_epilogue(", "u64 wg_desc(")
        for helper in (*helpers, "u32 wg_smem("):
            assert text.count(helper) == 1, helper  # one definition, shared
        assert text.count("wg_act<ACT>(") == 2  # the shared store applies the activation to both columns
        assert text.count("wg_put2<DT, OUT, ACT>(") == 1  # only the shared epilogue stores
    # each tile hands the shared epilogue its own type, output, bias, residual, activation and chunk
    assert tma.count("wg_epilogue<WS_DT, WS_OUT, WS_BIAS, WS_RES, WS_ACT, WS_BN, WS_EPI_J>(") == 1
    assert cp.count("wg_epilogue<WG_DT, WG_OUT, WG_BIAS, WG_RES, WG_ACT, WG_BN, WG_EPI_J>(") == 1


def test_a_tile_without_its_include_lines_is_refused(tmp_path: Path) -> None:
    text = wgmma_tma.CU_FILE.read_text()
    for header in wgmma.HEADERS:
        line = f'#include "{header.name}"\n'
        for bad in (text.replace(line, ""), text.replace(line, line + line)):
            cu = tmp_path / "tile.cu"
            cu.write_text(bad)
            with pytest.raises(RuntimeError, match=header.name):
                wgmma.cu_text(cu)


@pytest.mark.parametrize("act", wgmma.ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True])
def test_bias_and_activation_keys_set_their_defines(bias: bool, act: str) -> None:
    key = wgmma.key_of(F16, True, bias, False, bt=True, act=act)
    d = _defines(wgmma_tma.source(key))
    assert (d["WS_BIAS"], d["WS_ACT"], d["WS_BT"], d["WS_RES"], d["WS_DT"], d["WS_OUT"]) == (
        str(int(bias)), str(wgmma.ACTIVATIONS.index(act)), "1", "0", "1", "1",
    )  # fmt: skip
    assert d["WS_NAME"] == wgmma_tma.name_of(key)
    # each key its own kernel name (the NVRTC source and link names follow it)
    names = {
        wgmma_tma.name_of(wgmma.key_of(dt, o, b, r, bt, a))
        for dt in (F16, BF16) for o in (False, True) for b in (False, True) for r in (False, True)
        for bt in (False, True) for a in wgmma.ACTIVATIONS
    }  # fmt: skip
    assert len(names) == 2 * 2 * 2 * 2 * 2 * 3


def test_an_unknown_activation_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(
        ValueError, match="activation: 'relu' is not supported; allowed: none, silu, gelu_tanh"
    ):
        wgmma.key_of(BF16, True, True, False, True, "relu")
    with pytest.raises(ValueError, match="allowed: none, silu, gelu_tanh"):
        wgmma.Key("bf16", True, False, False, True, "gelu")


def test_auto_takes_it_on_cc90_only() -> None:
    for dt in (BF16, F16):
        assert select_path(path="wgmma_tma", dtype=dt, cc=(9, 0), simulated=False) == "wgmma_tma"
        assert select_path(path="auto", dtype=dt, cc=(9, 0), simulated=False) == "wgmma_tma"
        for cc in ((8, 0), (10, 0)):
            assert select_path(path="auto", dtype=dt, cc=cc, simulated=False) != "wgmma_tma"
        for other, simulated in (((8, 0), False), ((10, 0), False), (None, True)):
            with pytest.raises(ValueError, match="wgmma_tma"):
                select_path(path="wgmma_tma", dtype=dt, cc=other, simulated=simulated)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        select_path(path="wgmma_tma", dtype=np.dtype(np.float32), cc=(9, 0), simulated=False)


def test_linear_takes_the_path_on_cc90_only() -> None:
    for dt in (BF16, F16):
        assert lin.select_path(path=TMA, dtype=dt, cc=(9, 0), simulated=False) == TMA
        assert lin.select_path(path="auto", dtype=dt, cc=(9, 0), simulated=False) == TMA
        for cc, simulated in (((8, 0), False), ((10, 0), False), (None, True)):
            with pytest.raises(ValueError, match="wgmma_tma"):
                lin.select_path(path=TMA, dtype=dt, cc=cc, simulated=simulated)
    assert lin.shape_path(TMA, 200, 72) == TMA
    assert lin.shape_path(TMA, 129, 67) == "portable"  # the wgmma tiles' shape rule


class _Bound:
    """kernels.runtime.launch.Bound's pointer writes, in Python: `launch(ptrs)` records the kernel
    arguments a launch would get (each pointer to the argument `ptr_args` names)."""

    def __init__(self, args: tuple[int, ...], ptr_args: tuple[int, ...]) -> None:
        self.args, self.ptr_args = args, ptr_args
        self.launched: list[tuple[int, ...]] = []

    def launch(self, ptrs: Any, stream: Any = 0) -> None:
        args = list(self.args)
        for i, p in zip(self.ptr_args, ptrs, strict=True):
            args[i] = p
        self.launched.append(tuple(args))


@pytest.mark.parametrize(("res", "bias"), [(False, False), (True, False), (False, True), (True, True)])
def test_a_replay_passes_each_pointer_to_its_argument(
    monkeypatch: pytest.MonkeyPatch, res: bool, bias: bool
) -> None:
    """The FastCache order (a, b, out[, res][, bias]) to the TMA kernel's (maps, c, bias, res, m, n, k), with
    the maps of the replay's own A and B; without maps, to the cp.async tile of the same key."""
    key = wgmma.key_of(BF16, True, bias, res, bt=True, act="silu")
    bound: list[_Bound] = []
    calls: list[dict[str, Any]] = []

    class Table:
        def address(self, key: Any, a: int, b: int, m: int, n: int, k: int, stream: Any = 0) -> int | None:
            return None if a == 0xBAD else 0x10000 + a + b

    class Kern:
        def bind(self, grid: Any, block: Any, args: Any, shared: int, ptr_args: Any) -> _Bound:
            bound.append(_Bound(tuple(args), tuple(ptr_args)))
            return bound[-1]

    monkeypatch.setattr(launch, "context", lambda: 1)
    monkeypatch.setattr(launch, "sm_count", lambda ctx: 132)
    monkeypatch.setattr(wgmma_tma, "table", lambda ctx=None: Table())
    monkeypatch.setattr(wgmma_tma, "_kernel", lambda key: Kern())
    monkeypatch.setattr(wgmma, "launch", lambda **kw: calls.append(kw))
    m, n, k = 300, 392, 136
    rp, bp = (0x300 if res else 0), (0x400 if bias else 0)
    rep = g._tma_replay(a=0x100, b=0x200, bias=bp, res=rp, out=0x500, m=m, n=n, k=k, key=key)
    assert bound[0].args == (0x10300, 0x500, bp, rp, m, n, k)
    p = (0x1100, 0x1200, 0x1500) + ((0x1300,) if res else ()) + ((0x1400,) if bias else ())
    rep.launch(p, 7)
    want_res, want_bias = (0x1300 if res else 0), (0x1400 if bias else 0)
    assert bound[0].launched == [(0x12300, 0x1500, want_bias, want_res, m, n, k)]
    rep.launch((0xBAD, *p[1:]), 7)  # no maps: the cp.async tile, same key, same operands
    assert calls == [
        dict(a=0xBAD, b=0x1200, bias=want_bias, res=want_res, out=0x1500, m=m, n=n, k=k, key=key, stream=7)
    ]


@pytest.mark.parametrize("path", ["wgmma", TMA])
@pytest.mark.parametrize(("res", "bias"), [(False, False), (True, False), (False, True), (True, True)])
def test_the_cp_async_replay_passes_each_pointer_to_its_argument(
    monkeypatch: pytest.MonkeyPatch, path: str, res: bool, bias: bool
) -> None:
    """run_hopper on the cp.async tile (asked for, or the TMA tile without maps): one launch with every
    operand, and a replay taking the FastCache order (a, b, out[, res][, bias]) to the kernel's (a, b, bias,
    res, out, m, n, k)."""
    key = wgmma.key_of(BF16, True, bias, res)
    bound: list[_Bound] = []
    calls: list[dict[str, Any]] = []

    def bind(*, ptr_args: tuple[int, ...], **kw: Any) -> _Bound:
        bound.append(_Bound((kw["a"], kw["b"], kw["bias"], kw["res"], kw["out"], kw["m"], kw["n"], kw["k"]),
                            ptr_args))  # fmt: skip
        return bound[-1]

    monkeypatch.setattr(wgmma_tma, "launch", lambda **kw: False)  # no tensor maps for these operands
    monkeypatch.setattr(wgmma, "launch", lambda **kw: calls.append(kw))
    monkeypatch.setattr(wgmma, "bind", bind)
    m, n, k = 300, 392, 136
    rp, bp = (0x300 if res else 0), (0x400 if bias else 0)
    rep = g.run_hopper(a=0x100, b=0x200, bias=bp, res=rp, out=0x500, m=m, n=n, k=k, key=key, path=path,
                       stream=3, replay=True)  # fmt: skip
    assert calls == [dict(a=0x100, b=0x200, bias=bp, res=rp, out=0x500, m=m, n=n, k=k, key=key, stream=3)]
    assert rep is not None
    p = (0x1100, 0x1200, 0x1500) + ((0x1300,) if res else ()) + ((0x1400,) if bias else ())
    rep.launch(p, 7)
    want_bias, want_res = (0x1400 if bias else 0), (0x1300 if res else 0)
    assert bound[0].launched == [(0x1100, 0x1200, want_bias, want_res, 0x1500, m, n, k)]


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
@pytest.mark.parametrize("dt", [BF16, F16], ids=str)
@pytest.mark.parametrize("mnk", SHAPES, ids=str)
def test_o_proj_and_gemm_with_a_bias_take_the_tma_tile(dt: np.dtype, mnk: tuple[int, int, int]) -> None:
    """The bias epilogue, added before the residual (o_proj: 16-bit out) and alone (gemm's fp32 output
    through run_matmul: no public op adds a bias there)."""
    m, n, k = mnk
    rng = np.random.default_rng(2 * m + n + k)
    a, b, r, bias = (
        _host((m, k), dt, rng),
        _host((k, n), dt, rng),
        _host((m, n), dt, rng),
        _host((n,), dt, rng),
    )
    ab = a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64)
    da, db, dr, dbias = (arrays.to_device(x) for x in (a, b, r, bias))
    table = wgmma_tma.table()
    before = len(table)
    out = arrays.to_device(np.full((m, n), np.nan, dt))
    o_proj(da, db, dr, dbias, out=out, path=TMA)
    assert len(table) == before + 1  # the TMA tile's maps were made: it ran
    got = arrays.to_host(out).astype(np.float64)
    assert np.isfinite(got).all()
    assert _rel(got, ab + r.astype(np.float64)) <= (2.0**-8 if dt == BF16 else 2.0**-10)
    c = cuda.to_device(np.full((m, n), np.nan, np.float32))
    ops = [arrays.operand(name, x) for name, x in (("a", da), ("b", db), ("bias", dbias), ("c", c))]
    g.run_matmul(ops[0], ops[1], ops[2], None, ops[3], TMA)
    assert len(table) == before + 2  # its own key: its own maps
    assert _rel(c.copy_to_host(), ab) <= 1e-5


@needs_cc90
@pytest.mark.gpu
@pytest.mark.parametrize("tile", [TMA, "wgmma"])
@pytest.mark.parametrize("dt", [BF16, F16], ids=str)
@pytest.mark.parametrize("mnk", SHAPES, ids=str)
def test_o_proj_in_place_on_each_hopper_tile(
    tile: str, dt: np.dtype, mnk: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """out is the residual itself (an in-place residual add, with a bias): the epilogue both tiles share
    (`wg_epilogue`) reads a chunk's bias and R words before it stores any of them, so every element must
    still be its own R plus its product, partial tiles (rows past M, columns past N) included."""
    from kernels.ops import o_proj as o_proj_module

    m, n, k = mnk
    rng = np.random.default_rng(3 * m + n + k)
    a, b, r, bias = (_host(shape, dt, rng) for shape in ((m, k), (k, n), (m, n), (n,)))
    want = a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64) + r.astype(np.float64)
    da, db, dr, dbias = (arrays.to_device(x) for x in (a, b, r, bias))
    # every launch of the cp.async tile (wgmma.launch) is recorded; for the TMA tile it is not run either,
    # so that where the TMA tile has no maps (its direct launch or a FastCache replay falls back to the
    # cp.async tile) nothing is written and the check fails
    cp_launches: list[dict[str, Any]] = []
    real = wgmma.launch

    def spy(**kw: Any) -> Any:
        cp_launches.append(kw)
        return real(**kw) if tile == "wgmma" else None

    monkeypatch.setattr(wgmma, "launch", spy)
    o_proj_module._FAST.clear()  # a launch, not an earlier test's replay of this layout
    assert o_proj(da, db, dr, dbias, out=dr, path=tile) is dr
    if tile == TMA:
        assert not cp_launches
    else:  # the cp.async tile wrote it
        assert len(cp_launches) == 1 and cp_launches[0]["key"].res and cp_launches[0]["key"].bias
    got = arrays.to_host(dr).astype(np.float64)
    assert np.isfinite(got).all()
    assert _rel(got, want) <= (2.0**-8 if dt == BF16 else 2.0**-10)


def _linear_problem(dt: np.dtype, m: int, k: int, n: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(dt)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(dt)  # y ~ N(0, 1): the activations' curved part
    return x, w, (0.5 * rng.standard_normal(n)).astype(dt)


@needs_cc90
@pytest.mark.gpu
@pytest.mark.parametrize("dt", [BF16, F16], ids=str)
@pytest.mark.parametrize("act", wgmma.ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_linear_takes_the_tma_tile_for_each_epilogue(dt: np.dtype, act: str, with_bias: bool) -> None:
    """linear's NT layout with its bias and activation, on ragged shapes: the result is its own epilogue's
    (not another activation's, not with the bias left out or added where there is none)."""
    tol = lin.SPEC.tolerance[dt.name]
    table = wgmma_tma.table()
    for i, (m, k, n) in enumerate(LINEAR_SHAPES):
        x, w, b = _linear_problem(dt, m, k, n, seed=m + k + n)
        bias = b if with_bias else None
        dx, dw = arrays.to_device(x), arrays.to_device(w)
        dbias = arrays.to_device(b) if with_bias else None
        out = arrays.to_device(np.full((m, n), np.nan, dt))
        before = len(table)
        lin.linear(dx, dw, dbias, out, activation=act, path=TMA)
        assert len(table) == before + 1, (m, k, n)  # the TMA tile ran
        got = arrays.to_host(out).astype(np.float64)
        assert np.isfinite(got).all(), (m, k, n)
        assert _rel(got, lin.reference(x, w, bias, act)) <= tol, (m, k, n)
        if i == 0:  # 129 x 200 outputs: every other epilogue is far off
            others = [lin.reference(x, w, bias, o) for o in wgmma.ACTIVATIONS if o != act]
            others.append(lin.reference(x, w, None if with_bias else b, act))
            assert all(_rel(got, ref) > 10 * tol for ref in others)


@needs_cc90
@pytest.mark.gpu
def test_linear_replays_on_new_arrays_with_their_own_maps_and_bias() -> None:
    """FastCache replays of linear with a bias: new x, new weight, a new bias alone; each call's result is
    its own operands' (stale maps or a stale bias pointer would give the first call's)."""
    m, k, n, act = 200, 136, 264, "silu"
    lin._FAST.clear()
    table = wgmma_tma.table()
    before = len(table)
    x0, w0, b0 = _linear_problem(BF16, m, k, n, seed=11)
    x1, w1, b1 = _linear_problem(BF16, m, k, n, seed=12)
    _, _, b2 = _linear_problem(BF16, m, k, n, seed=13)
    dx0, dw0, dx1, dw1 = (arrays.to_device(a) for a in (x0, w0, x1, w1))
    calls = [(x0, w0, b0, dx0, dw0), (x1, w0, b1, dx1, dw0), (x1, w1, b1, dx1, dw1), (x1, w1, b2, dx1, dw1)]
    kept = []  # every call's arrays stay alive: distinct addresses
    for call, (x, w, b, dx, dw) in enumerate(calls):
        db = arrays.to_device(b)
        out = arrays.to_device(np.full((m, n), np.nan, BF16))
        kept.append((db, out))
        if call:  # the layout is in the FastCache: this call replays
            assert lin._FAST.find((dx, dw, out, db), (act, TMA))[0] is not None
        lin.linear(dx, dw, db, out, activation=act, path=TMA)
        ref = lin.reference(x, w, b, act)
        assert _rel(arrays.to_host(out).astype(np.float64), ref) <= lin.SPEC.tolerance["bfloat16"], call
    assert len(table) == before + 3  # three (x, weight) pairs; the last call's new bias needs no maps


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
        # o_proj with a bias, linear with a bias and an activation: the cp.async tile of the same key
        r, bias = _host((m, n), BF16, rng), _host((n,), BF16, rng)
        out = arrays.to_device(np.full((m, n), np.nan, BF16))
        o_proj(arrays.to_device(a), arrays.to_device(b), arrays.to_device(r), arrays.to_device(bias), out=out,
               path=TMA)  # fmt: skip
        want = a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64) + r.astype(np.float64)
        assert _rel(arrays.to_host(out).astype(np.float64), want) <= 2.0**-8
        x, w, lb = _linear_problem(BF16, m, k, n, seed=8)
        lout = arrays.to_device(np.full((m, n), np.nan, BF16))
        dx, dw, dlb = arrays.to_device(x), arrays.to_device(w), arrays.to_device(lb)
        lin.linear(dx, dw, dlb, lout, activation="gelu_tanh", path=TMA)
        assert len(full) == 0
        want = lin.reference(x, w, lb, "gelu_tanh")
        assert _rel(arrays.to_host(lout).astype(np.float64), want) <= lin.SPEC.tolerance["bfloat16"]
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
    key = wgmma.key_of(BF16, False, False, False)
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
    assert t.address(wgmma.key_of(F16, True, False, True), 10, 20, 64, 64, 64) is None
    assert len(t) == 0 and driver.mode == 0 and driver.calls[-1] == "exchange"
