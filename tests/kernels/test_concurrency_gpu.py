"""Launchers under the operator service's conditions, on a real GPU: several threads calling one launcher on
arrays of one layout (one FastCache entry, one parameter block), and a caller that records its own CUDA
graph on the stream it hands us. The stubbed-driver versions of both rules are in test_launch.py."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
from numba import cuda
from opcheck import needs_gpu

from kernels.ops import residual_add as ra
from kernels.runtime import launch

pytestmark = [pytest.mark.gpu, needs_gpu]
F16 = np.dtype(np.float16)


def _ref(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    out: np.ndarray = (x.astype(np.float64) + r.astype(np.float64)).astype(F16)  # one rounding of the sum
    return out


def test_threads_sharing_one_layout_each_get_their_own_sum() -> None:
    """8 threads, each accumulating out += r in place 60 times on its own arrays of one layout (one
    FastCache entry, one parameter block): small integers, so every sum is exact and any launch that took
    another thread's pointers (or none) changes some thread's final answer. A thread's first call also binds
    it to the CUDA context (threads start without one)."""
    rng = np.random.default_rng(11)
    shape = (64, 1024)
    n_threads, calls = 8, 60
    hosts = [(rng.integers(-50, 51, shape).astype(F16), rng.integers(-2, 3, shape).astype(F16))
             for _ in range(n_threads)]  # fmt: skip
    devs = [(cuda.to_device(x), cuda.to_device(r)) for x, r in hosts]
    errors: list[str] = []

    def work(t: int) -> None:
        out, r = devs[t]
        try:
            for _ in range(calls):
                ra.residual_add(out, r, out)
            cuda.synchronize()
            x, rh = hosts[t]
            want = (x.astype(np.float64) + calls * rh.astype(np.float64)).astype(F16)
            got = out.copy_to_host()
            if not np.array_equal(got, want):
                errors.append(f"thread {t}: {int(np.count_nonzero(got != want))} elements wrong")
        except Exception as e:  # noqa: BLE001  (reported below, with the thread)
            errors.append(f"thread {t}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_threads_casting_to_fp8_on_one_stream_each_get_their_own_scale() -> None:
    """8 threads calling cast_fp8 on the default stream, each on its own arrays of one layout with its own
    amax: the two launches of a call share the process's workspace, so a call whose cast read another
    call's amax partials gets the wrong scale. Every call's scale and codes are checked."""
    from kernels.ops import cast_fp8 as c8

    shape = (16, 4096)
    n_threads, calls = 8, 40
    rng = np.random.default_rng(12)
    hosts = [rng.standard_normal(shape).astype(np.float32) * (1 + 3 * t) for t in range(n_threads)]
    wants = [c8.reference(h) for h in hosts]
    errors: list[str] = []

    def work(t: int) -> None:
        try:
            x = cuda.to_device(hosts[t])
            out = cuda.device_array(shape, np.uint8)
            scale = cuda.device_array(1, np.float32)
            for i in range(calls):
                c8.cast_fp8(x, out, scale)
                got = float(scale.copy_to_host()[0])  # synchronizes the default stream
                if got != float(wants[t][1]):
                    errors.append(f"thread {t} call {i}: scale {got}, expected {float(wants[t][1])}")
                    return
            if not np.array_equal(out.copy_to_host(), wants[t][0].view(np.uint8)):
                errors.append(f"thread {t}: codes wrong")
        except Exception as e:  # noqa: BLE001  (reported below, with the thread)
            errors.append(f"thread {t}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_a_callers_own_graph_capture_records_our_launch() -> None:
    """cudaStreamBeginCapture (global mode) on the stream we are given, our op called twice on the same
    arrays inside it (a repeat call: the case that would capture and replay a graph of ours), capture ended:
    nothing ran during the capture, and replaying the caller's graph computes the sum."""
    rng = np.random.default_rng(12)
    shape = (32, 512)
    x, r = rng.standard_normal(shape).astype(F16), rng.standard_normal(shape).astype(F16)
    dx, dr = cuda.to_device(x), cuda.to_device(r)
    out = cuda.to_device(np.full(shape, np.nan, F16))
    ra.residual_add(dx, dr, out)  # validated once outside: the calls below hit the FastCache
    cuda.synchronize()
    out.copy_to_device(np.full(shape, np.nan, F16))
    s = cuda.stream()
    hs = ctypes.c_void_p(launch._stream_handle(s))
    lib = launch._driver()
    assert lib.cuStreamBeginCapture_v2(hs, 0) == 0  # 0: CU_STREAM_CAPTURE_MODE_GLOBAL
    try:
        assert launch.capturing(hs)
        ra.residual_add(dx, dr, out, stream=s)
        ra.residual_add(dx, dr, out, stream=s)
    finally:
        graph = ctypes.c_void_p()
        rc_end = lib.cuStreamEndCapture(hs, ctypes.byref(graph))
    assert rc_end == 0 and graph.value, f"the caller's capture was broken: cuStreamEndCapture -> {rc_end}"
    assert not launch.capturing(hs)
    assert np.isnan(out.copy_to_host().astype(np.float32)).all()  # captured, not run
    ex = ctypes.c_void_p()
    assert lib.cuGraphInstantiateWithFlags(ctypes.byref(ex), graph, ctypes.c_ulonglong(0)) == 0
    try:
        assert lib.cuGraphLaunch(ex, hs) == 0
        s.synchronize()
        assert np.array_equal(out.copy_to_host().view(np.uint16), _ref(x, r).view(np.uint16))
    finally:
        lib.cuGraphExecDestroy(ex)
        lib.cuGraphDestroy(graph)
    x2 = (2 * x.astype(np.float32)).astype(F16)  # and the launcher still works after it
    dx.copy_to_device(x2)
    for _ in range(3):  # direct, then its own graph, then a replay
        ra.residual_add(dx, dr, out, stream=s)
    s.synchronize()
    assert np.array_equal(out.copy_to_host().view(np.uint16), _ref(x2, r).view(np.uint16))


def _handle(ctx: object) -> int:
    """A numba Context's CUcontext as an int (a ctypes pointer or a cuda-python handle object)."""
    h = getattr(ctx, "handle", ctx)
    v = getattr(h, "value", None)
    return int(v if v is not None else h)  # type: ignore[call-overload]


def test_context_is_numbas_current_context_in_every_thread() -> None:
    """`launch.context()` (the key of every per-context cache) is numba's context of the current device, in
    the main thread and in a new thread that has none yet (where asking binds it)."""
    main = launch.context()
    assert main == _handle(cuda.current_context())
    seen: list[object] = []

    def work() -> None:
        try:
            seen.append(launch.context())
            seen.append(_handle(cuda.current_context()))
        except Exception as e:  # noqa: BLE001  (reported below)
            seen.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == [main, main], seen


@pytest.mark.skipif(len(cuda.gpus) < 2, reason="needs two GPUs in one process (the nvidia-h100-x2 kind)")
def test_two_gpus_each_run_their_own_compiled_launches() -> None:
    """A node with two GPUs driven from one process: the same op, the same layout, alternating between
    the devices (`with cuda.gpus[i]:` makes each one's context current) and repeated, so the second and
    later calls on each device are FastCache hits and graph replays. Each device computes its own sum: a
    launch with the other device's function, graph or buffers fails or computes garbage."""
    rng = np.random.default_rng(13)
    shape = (64, 2048)
    hosts = [
        (rng.integers(-50, 51, shape).astype(F16), rng.integers(-2, 3, shape).astype(F16)) for _ in range(2)
    ]
    devs = []
    for i in (0, 1):
        with cuda.gpus[i]:
            devs.append((cuda.to_device(hosts[i][0]), cuda.to_device(hosts[i][1])))
    contexts = set()
    for _ in range(5):
        for i in (0, 1):
            with cuda.gpus[i]:
                contexts.add(launch.context())
                out, r = devs[i]
                ra.residual_add(out, r, out)
    assert len(contexts) == 2
    for i in (0, 1):
        with cuda.gpus[i]:
            cuda.synchronize()
            x, r = hosts[i]
            want = (x.astype(np.float64) + 5 * r.astype(np.float64)).astype(F16)
            assert np.array_equal(devs[i][0].copy_to_host(), want), f"GPU {i}"
