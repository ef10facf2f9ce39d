"""The operator service through a rollout, on real sshd nodes on 127.0.0.1: `solfleet deploy` starts each
node's service (the `process` supervisor: these nodes have no systemd), a tritonclient loop runs against
every node while the next version deploys and while it is rolled back, and no request fails. Each response
names the release that served it (`parameters.solfleet_version`), so the switch is seen from the client.
A release whose service cannot become ready fails its host, and the failure policy puts the fleet back on
the release it had, whose service never stopped answering."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import yaml
from e2e_driver import E2EFleet, retag
from loopback import free_port
from sshd_fleet import SshdFleet, sshd_missing_reason

th = pytest.importorskip("tritonclient.http")

pytestmark = pytest.mark.e2e

V1, V2, V3 = "1.0.0", "2.0.0", "3.0.0"
N = 5  # residual_add [1, N]: the loop is about the switch, not the op


def fail_self_test(d: Path) -> None:
    """The release's service reports its self-test as failed (exit 3, never ready); verify still passes."""
    path = d / "kernels" / "serve" / "__main__.py"
    source = path.read_text()
    assert "if not test.ok:" in source, "kernels/serve/__main__.py changed; update this test's breakage"
    path.write_text(source.replace("if not test.ok:", "if True:  # broken on purpose by the test"))


@dataclass
class Fleet:
    e2e: E2EFleet
    ports: dict[str, int]  # node -> service port (GPU 0)
    started: set[int] = field(default_factory=set)  # service pids seen, for the teardown

    def state(self, node: str) -> dict[str, object]:
        path = self.e2e.root(node) / "run" / "serve-0.json"
        data = json.loads(path.read_text())
        assert isinstance(data, dict)
        pid = data.get("pid")
        if isinstance(pid, int):
            self.started.add(pid)
        return data

    def served_version(self, node: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[node]}/v2", timeout=10) as r:
            return str(json.loads(r.read())["version"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    reason = sshd_missing_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the SSH e2e fleet cannot start: {reason}")
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("service-fleet")
    sshd = SshdFleet(base / "sshd", count=2)
    f: Fleet | None = None
    try:
        sshd.start()
        data = sshd.spec(fleet="svc", on_failure="rollback_fleet")
        data["defaults"]["service"] = {  # type: ignore[index]
            "enabled": True,
            "manager": "process",
            "ready_timeout_s": 180,
            "exit_timeout_s": 20,
        }
        ports = {n.name: free_port() for n in sshd.nodes}
        for node in data["nodes"]:  # type: ignore[attr-defined]
            node["service"] = {"port": ports[node["name"]]}
        for n in sshd.nodes:
            # the node config as provision writes it (JSON); self-testing one op keeps the simulator quick
            n.root.mkdir(parents=True)
            config = {
                "device_id": 0,
                "log_level": "info",
                "service": {
                    "port": ports[n.name],
                    "exit_timeout_s": 20,
                    "self_test_ops": ["residual_add"],
                    "idle_grace_ms": 500,
                },
            }
            (n.root / "config.yaml").write_text(json.dumps(config, indent=1) + "\n")
        spec = base / "fleet.yml"
        spec.write_text(yaml.safe_dump(data, sort_keys=False))
        e2e = E2EFleet(sshd=sshd, spec=spec, work=base / "work", dist=base / "dist")
        f = Fleet(e2e=e2e, ports=ports)
        yield f
    finally:
        _stop_services(sshd, f.started if f else set())
        sshd.stop()


def _stop_services(sshd: SshdFleet, seen: set[int]) -> None:
    """SIGTERM every service instance this module's deploys started (state files and the pids seen)."""
    pids = set(seen)
    for n in sshd.nodes:
        for path in (n.root / "run").glob("serve-*.json") if (n.root / "run").is_dir() else []:
            pid = json.loads(path.read_text()).get("pid")
            if isinstance(pid, int):
                pids.add(pid)
    for pid in pids:
        try:
            if b"kernels.serve" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)


class Clients:
    """Two client loops per node, each response checked and its `solfleet_version` recorded with the time it
    arrived: tritonclient with binary tensors on a keep-alive connection, and plain JSON infers on a new
    connection each (those meet the listening sockets themselves while two instances share the port)."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.ports = ports
        self.seen: dict[str, list[tuple[float, str]]] = {n: [] for n in ports}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=loop, args=(n,), daemon=True)
            for n in ports
            for loop in (self._loop, self._fresh_loop)
        ]
        self.fresh = 0  # answers on new connections

    def _loop(self, node: str) -> None:
        client = th.InferenceServerClient(f"127.0.0.1:{self.ports[node]}", network_timeout=60)
        rng = np.random.default_rng()
        while not self.stop.is_set():
            x = rng.standard_normal((1, N)).astype(np.float32)
            r = rng.standard_normal((1, N)).astype(np.float32)
            inputs = []
            for name, value in (("x", x), ("r", r)):
                t = th.InferInput(name, [1, N], "FP32")
                t.set_data_from_numpy(value, binary_data=True)
                inputs.append(t)
            try:
                result = client.infer("residual_add", inputs)
                out = result.as_numpy("out")
                assert out is not None and np.allclose(out, x + r, rtol=1e-6, atol=1e-6), (out, x + r)
                self.seen[node].append(
                    (time.monotonic(), str(result.get_response()["parameters"]["solfleet_version"]))
                )
            except Exception as exc:  # noqa: BLE001  (any failure is what this test counts)
                self.errors.append(f"{node}: {type(exc).__name__}: {exc}")
            time.sleep(0.02)
        client.close()

    def _fresh_loop(self, node: str) -> None:
        rng = np.random.default_rng()
        url = f"http://127.0.0.1:{self.ports[node]}/v2/models/residual_add/infer"
        while not self.stop.is_set():
            x, r = rng.standard_normal((2, N)).round(3).tolist()
            body = json.dumps(
                {
                    "inputs": [
                        {"name": name, "datatype": "FP32", "shape": [1, N], "data": value}
                        for name, value in (("x", x), ("r", r))
                    ]
                }
            ).encode()
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as resp:  # noqa: S310 (loopback)
                    answer = json.loads(resp.read())
                out = np.array(answer["outputs"][0]["data"], dtype=np.float32)
                want = np.array(x, dtype=np.float32) + np.array(r, dtype=np.float32)
                assert np.allclose(out, want, rtol=1e-6, atol=1e-6), (out, want)
                self.seen[node].append((time.monotonic(), str(answer["parameters"]["solfleet_version"])))
                self.fresh += 1
            except Exception as exc:  # noqa: BLE001  (any failure is what this test counts)
                self.errors.append(f"{node} (new connection): {type(exc).__name__}: {exc}")
            time.sleep(0.02)

    def __enter__(self) -> Clients:
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + 30
        while not all(self.seen.values()) and time.monotonic() < deadline and not self.errors:
            time.sleep(0.05)
        assert all(self.seen.values()), f"the client loops got no answer: {self.errors[:3]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def after(self, node: str, t: float) -> set[str]:
        return {v for at, v in self.seen[node] if at > t}


def test_deploy_then_rollback_serve_every_request(fleet: Fleet) -> None:
    e2e = fleet.e2e
    v1 = e2e.artifact(V1)
    retag(v1, e2e.dist / f"solfleet-ops-{V2}.tar.gz", V2)

    first = e2e.deploy(V1)
    assert first.rc == 0, first.output[-3000:]
    for node in fleet.ports:
        st = fleet.state(node)
        assert (st["version"], st["state"]) == (V1, "ready")
        assert fleet.served_version(node) == V1
    v1_pids = {node: fleet.state(node)["pid"] for node in fleet.ports}

    with Clients(fleet.ports) as clients:
        time.sleep(1.0)
        deploy = e2e.deploy(V2)
        done = time.monotonic()
        time.sleep(1.5)
    assert deploy.rc == 0, deploy.output[-3000:]
    assert clients.errors == []
    assert clients.fresh > 0
    for node in fleet.ports:
        versions = [v for _, v in clients.seen[node]]
        assert versions[0] == V1 and set(versions) == {V1, V2}, f"{node}: {sorted(set(versions))}"
        assert clients.after(node, done) == {V2}, f"{node} still answered with V1 after the deploy"
        assert fleet.served_version(node) == V2
        st = fleet.state(node)
        assert (st["version"], st["state"]) == (V2, "ready") and st["pid"] != v1_pids[node]
        # the replaced instance drained and exited; its log says so
        assert not Path(f"/proc/{v1_pids[node]}").exists(), f"{node}: the V1 instance is still running"
        log = (e2e.root(node) / "logs" / "serve-0.log").read_text()
        assert f"handoff: {V1}" in log and "SIGTERM: draining" in log

    with Clients(fleet.ports) as clients:
        time.sleep(1.0)
        back = e2e.cli("rollback", "--yes")
        done = time.monotonic()
        time.sleep(1.5)
    assert back.rc == 0, back.output[-3000:]
    assert clients.errors == []
    for node in fleet.ports:
        assert clients.after(node, done) == {V1}, f"{node} did not come back to V1"
        assert fleet.served_version(node) == V1 and e2e.link(node, "current") == V1


def test_service_not_ready_fails_the_host_and_the_fleet_returns(fleet: Fleet) -> None:
    """V3 verifies (its kernels are V1's) but its service's self-test fails: each host fails in the
    `service` phase, rollback_fleet puts `current` back to V1, and V1's service answers throughout."""
    e2e = fleet.e2e
    if e2e.link(next(iter(fleet.ports)), "current") != V1:
        pytest.skip("needs the fleet on V1 (runs after the deploy/rollback test)")
    retag(e2e.artifact(V1), e2e.dist / f"solfleet-ops-{V3}.tar.gz", V3, fail_self_test)
    before = {node: fleet.state(node)["pid"] for node in fleet.ports}
    with Clients(fleet.ports) as clients:
        bad = e2e.deploy(V3)
    assert bad.rc != 0, bad.output[-3000:]
    assert clients.errors == []
    assert {v for node in fleet.ports for _, v in clients.seen[node]} == {V1}
    with e2e.ledger() as conn:
        rows = conn.execute(
            "SELECT host, outcome, failed_phase, message FROM host_outcomes"
            " WHERE operation_id = ? AND step != 'undo'",
            (e2e.last_operation()["id"],),
        ).fetchall()
    failed = [r for r in rows if r["outcome"] == "failed"]
    assert failed and all(r["failed_phase"] == "service" for r in failed), [dict(r) for r in rows]
    assert all("self-test failed" in r["message"] for r in failed), [dict(r) for r in rows]
    for node in fleet.ports:
        assert e2e.link(node, "current") == V1
        assert fleet.served_version(node) == V1
        st = fleet.state(node)
        # the rollback's service run found V1 ready and changed nothing
        assert st["pid"] == before[node] and st["version"] == V1
