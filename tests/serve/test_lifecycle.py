"""Limits and lifecycle of real instances: overflow, queue timeout, device faults, SIGTERM drain, and the
zero-downtime handoff between two releases on one port. Computations are made slow with the test-only
`service.testing.compute_delay_ms` (a sleep inside the compute slot) so the timing does not depend on how
busy this machine is."""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import threading
import time
from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from .conftest import Instance, free_port, make_release, start, wait_ready, write_config

DELAY_MS = 1500


def _ra_inputs(n: int = 5) -> list[th.InferInput]:
    ins = []
    for name in ("x", "r"):
        t = th.InferInput(name, [1, n], "FP32")
        t.set_data_from_numpy(np.arange(n, dtype=np.float32).reshape(1, n), binary_data=True)
        ins.append(t)
    return ins


def _wait_admitted(inst: Instance, running: int, queued: int, timeout: float = 30.0) -> None:
    """Poll the instance's own gauges until `running` requests compute and `queued` wait (a fixed sleep
    is not enough on a loaded CI machine: the requests reach the server late). The pause is gevent's: the
    client's async requests are greenlets that connect and send only while this one yields to them;
    async_infer yields 10 ms, enough on an idle machine, and time.sleep never does (seen on CI: no request
    arrived during the 10 s this waited with time.sleep, all four right after it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = (
            inst.metric("solfleet_serve_in_flight", device="0"),
            inst.metric("solfleet_serve_queued", device="0"),
        )
        if got == (running, queued):
            return
        gevent.sleep(0.02)
    raise AssertionError(f"not {running} computing and {queued} queued within {timeout} s: {got}")


def _settle(pending: list) -> None:  # type: ignore[type-arg]
    """After a test failed: let each of its requests end (a result, an error, or one read already), so it
    leaves none behind in the module's shared instance for the next test to meet."""
    for p in pending:
        with contextlib.suppress(Exception):
            p.get_result(timeout=60)


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Instance:
    d = tmp_path_factory.mktemp("serve-slow")
    port = free_port()
    cfg = write_config(
        d / "config.yaml",
        port=port,
        state_dir=d / "run",
        timeout_ms=20000,
        service={
            "max_concurrency": 2,
            "max_queue": 2,
            "self_test_ops": ["residual_add"],
            "exit_timeout_s": 20,
            "idle_grace_ms": 300,
            "testing": {"compute_delay_ms": DELAY_MS, "delay_ops": ["residual_add"]},
        },
    )
    inst = start(cfg, port)
    yield inst
    inst.stop()


def test_overflow_serves_four_rejects_six_at_once(slow: Instance) -> None:
    client = th.InferenceServerClient(slow.url, concurrency=10, network_timeout=30)
    t0 = time.monotonic()
    pending = [client.async_infer("residual_add", _ra_inputs()) for _ in range(10)]
    served, rejected, rejected_at = 0, 0, []
    for p in pending:
        try:
            out = p.get_result(timeout=30).as_numpy("out")
            assert out.tolist() == [[0.0, 2.0, 4.0, 6.0, 8.0]]
            served += 1
        except InferenceServerException as e:
            assert e.status() == "503" and "rejected" in e.message(), e
            rejected += 1
            rejected_at.append(time.monotonic() - t0)
    elapsed = time.monotonic() - t0
    assert (served, rejected) == (4, 6)
    # two rounds of two: the queued pair ran after the first; none waited past that
    assert 2 * DELAY_MS / 1000 <= elapsed < 2 * DELAY_MS / 1000 + 5
    assert (
        slow.metric("solfleet_serve_requests_total", device="0", op="residual_add", outcome="rejected") == 6
    )
    assert slow.metric("solfleet_serve_requests_total", device="0", op="residual_add", outcome="success") == 4
    client.close()


def test_rejection_carries_retry_after(slow: Instance) -> None:
    client = th.InferenceServerClient(slow.url, concurrency=4, network_timeout=30)
    pending = [client.async_infer("residual_add", _ra_inputs()) for _ in range(4)]
    done = False
    try:
        _wait_admitted(slow, running=2, queued=2)  # all four admitted
        body = json.dumps(
            {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 1], "data": [1]} for n in "xr"]}
        )
        conn = http.client.HTTPConnection("127.0.0.1", slow.port, timeout=10)
        t0 = time.monotonic()
        conn.request("POST", "/v2/models/residual_add/infer", body=body)
        r = conn.getresponse()
        r.read()
        conn.close()
        assert r.status == 503 and r.getheader("Retry-After") == "1"
        assert time.monotonic() - t0 < 0.5  # at once, not after a wait
        for p in pending:
            p.get_result(timeout=30)
        done = True
    finally:
        if not done:
            _settle(pending)
        client.close()


def test_sigterm_drains_in_flight_then_exits_0(slow: Instance) -> None:
    client = th.InferenceServerClient(slow.url, concurrency=3, network_timeout=30)
    pending = [client.async_infer("residual_add", _ra_inputs()) for _ in range(3)]
    _wait_admitted(slow, running=2, queued=1)
    slow.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5.0  # it stops accepting at once (0.3 s unloaded; polled for loaded CI)
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", slow.port, timeout=5)
        try:
            conn.connect()
        except ConnectionRefusedError:
            break  # stopped accepting
        finally:
            conn.close()
        assert time.monotonic() < deadline, "still accepting connections 5 s after SIGTERM"
        time.sleep(0.05)
    results = [p.get_result(timeout=30).as_numpy("out") for p in pending]  # all three finish
    assert all(r.tolist() == [[0.0, 2.0, 4.0, 6.0, 8.0]] for r in results)
    assert slow.proc.wait(timeout=30) == 0
    log = slow.log_text()
    assert "SIGTERM: draining" in log and "exit 0" in log
    client.close()


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Instance:
    d = tmp_path_factory.mktemp("serve-faulty")
    port = free_port()
    faults = [
        {"op": "cast", "kind": "oom", "count": 1},
        {"op": "clip_grad_norm", "kind": "oom", "count": 1},
        {"op": "softmax", "kind": "gpu", "count": 1},
    ]
    cfg = write_config(
        d / "config.yaml",
        port=port,
        state_dir=d / "run",
        timeout_ms=400,
        retry_count=1,
        service={
            "max_concurrency": 1,
            "max_queue": 4,
            "self_test_ops": ["residual_add"],
            "testing": {"compute_delay_ms": DELAY_MS, "delay_ops": ["residual_add"], "faults": faults},
        },
    )
    inst = start(cfg, port)
    yield inst
    inst.stop()


def test_queued_past_timeout_is_504_and_never_runs(faulty: Instance) -> None:
    client = th.InferenceServerClient(faulty.url, concurrency=2, network_timeout=30)
    first = client.async_infer("residual_add", _ra_inputs())
    time.sleep(0.2)
    t0 = time.monotonic()
    second = client.async_infer("residual_add", _ra_inputs())
    with pytest.raises(InferenceServerException) as e:
        second.get_result(timeout=30)
    assert e.value.status() == "504" and "timeout" in e.value.message()
    assert 0.35 < time.monotonic() - t0 < DELAY_MS / 1000  # at its deadline, while the first still computes
    first.get_result(timeout=30)
    time.sleep(0.3)
    assert faulty.metric("solfleet_serve_compute_seconds_count", device="0", op="residual_add") == 1
    assert (
        faulty.metric("solfleet_serve_requests_total", device="0", op="residual_add", outcome="timeout") == 1
    )
    client.close()


def test_transient_oom_retried_except_in_place(faulty: Instance) -> None:
    client = th.InferenceServerClient(faulty.url)
    x = th.InferInput("x", [2, 3], "FP32")
    x.set_data_from_numpy(np.full((2, 3), 1.5, dtype=np.float32), binary_data=True)
    assert client.infer("cast", [x]).as_numpy("out").tolist() == [[1.5] * 3] * 2  # retried once, then fine
    assert faulty.metric("solfleet_serve_retries_total", device="0", op="cast") == 1
    g = th.InferInput("g0", [3], "FP32")
    g.set_data_from_numpy(np.array([3.0, 4.0, 0.0], dtype=np.float32), binary_data=True)
    with pytest.raises(InferenceServerException) as e:  # in place: never retried
        client.infer("clip_grad_norm", [g], parameters={"max_norm": 1.0})
    assert e.value.status() == "503" and "not retried: the op modifies its inputs" in e.value.message()
    res = client.infer("clip_grad_norm", [g], parameters={"max_norm": 1.0})
    assert res.as_numpy("norm").tolist() == pytest.approx([5.0])
    assert res.as_numpy("g0").tolist() == pytest.approx([0.6, 0.8, 0.0], rel=1e-5)
    assert client.is_server_ready()


def test_gpu_error_marks_not_ready(faulty: Instance) -> None:
    client = th.InferenceServerClient(faulty.url)
    x = th.InferInput("x", [2, 3], "FP32")
    x.set_data_from_numpy(np.ones((2, 3), dtype=np.float32), binary_data=True)
    with pytest.raises(InferenceServerException) as e:
        client.infer("softmax", [x])
    assert e.value.status() == "500" and "CUDA_ERROR_ILLEGAL_ADDRESS" in e.value.message()
    assert client.is_server_live() and not client.is_server_ready() and not client.is_model_ready("cast")
    with pytest.raises(InferenceServerException) as e:  # nothing more runs on that context
        client.infer("softmax", [x])
    assert e.value.status() == "503" and "not ready: device error in softmax" in e.value.message()
    assert faulty.metric("solfleet_serve_ready", device="0") == 0


def test_handoff_between_releases_loses_no_request(tmp_path: Path) -> None:
    """Release 1.0.0 serves; 2.0.0 starts on the same port, self-tests, becomes ready and tells 1.0.0 to
    drain. A client loop on a keep-alive connection runs throughout: no request fails, every response names
    the release that served it, and after the handoff only 2.0.0 answers."""
    port = free_port()
    rel1, rel2 = make_release(tmp_path / "r1", "1.0.0"), make_release(tmp_path / "r2", "2.0.0")
    svc = {"self_test_ops": ["residual_add"], "idle_grace_ms": 500, "exit_timeout_s": 20}
    cfg = write_config(tmp_path / "config.yaml", port=port, state_dir=tmp_path / "run", service=svc)
    old = start(cfg, port, pythonpath=rel1)
    seen: list[str] = []
    errors: list[str] = []
    stop = threading.Event()

    def loop() -> None:
        client = th.InferenceServerClient(old.url, network_timeout=30)
        while not stop.is_set():
            try:
                seen.append(
                    client.infer("residual_add", _ra_inputs(3)).get_response()["parameters"][
                        "solfleet_version"
                    ]
                )
            except Exception as e:  # noqa: BLE001  (any failure is what this test counts)
                errors.append(f"{type(e).__name__}: {e}")
        client.close()

    def fresh() -> None:
        # a new connection per request meets the listening sockets themselves while both instances share
        # the port: the predecessor's close must not reset what the kernel had queued for it
        while not stop.is_set():
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("GET", "/v2/health/live")
                r = conn.getresponse()
                r.read()
                conn.close()
                if r.status != 200:
                    errors.append(f"new connection: status {r.status}")
            except Exception as e:  # noqa: BLE001
                errors.append(f"new connection: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=loop), *(threading.Thread(target=fresh) for _ in range(3))]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        new = start(cfg, port, pythonpath=rel2, wait=False)
        wait_ready(new)
        assert old.proc.wait(timeout=30) == 0  # drained and gone
        n = len(seen)
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert errors == []
    assert seen[0] == "1.0.0" and set(seen) == {"1.0.0", "2.0.0"}
    assert seen[n:] and set(seen[n:]) == {"2.0.0"}  # after the handoff, only the new release answers
    state = json.loads((tmp_path / "run" / "serve-0.json").read_text())
    assert state["pid"] == new.proc.pid and state["version"] == "2.0.0"
    assert "handoff: 1.0.0" in new.log_text()
    assert new.stop() == 0
