"""Deploy benchmark: N real sshd nodes on 127.0.0.1, driven through the `solfleet` CLI, per-phase timings.

    .venv/bin/python benchmarks/deploy_bench.py --nodes 4 16

For each N it starts N sshd nodes (tests/e2e/sshd_fleet.py), builds two artifacts with `solfleet build`, and
times three deploys: the first version onto empty nodes, a second version (push + activate, `previous` set),
and a re-deploy of that version (idempotent no-op). Per phase it prints the median and max over hosts:
push (the `solfleet | Push artifact` task's event duration), unpack+check, verify, activate, health (the node
module's `phases`). `runner` is the wall time ansible-runner spent (first to last event); `no-verify` is that
minus the slowest host's verify+health, i.e. the push + unpack + check + activate path that ansistrano's
50-task role covers (33 s for 4 nodes, 125 s for 16 on this kind of machine, FACTS.md).
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from sshd_fleet import SshdFleet  # noqa: E402  (the fixture code, reused as a library)

PHASES = ("push", "unpack_check", "verify", "activate", "health")


def cli(work: Path, spec: Path, *args: str) -> float:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SOLFLEET_WORK"] = str(work)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "--fleet", str(spec), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(
            f"solfleet {' '.join(args)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return elapsed


def latest_events(work: Path, seen: set[Path]) -> list[dict[str, object]]:
    """job_events of the runs that appeared since the last call (one operation = one or more runner runs)."""
    events = []
    for path in work.glob("fleets/*/runs/*/**/job_events/*.json"):
        if path in seen:
            continue
        seen.add(path)
        events.append(json.loads(path.read_text()))
    return events


def phase_table(events: list[dict[str, object]]) -> tuple[dict[str, list[float]], float, dict[str, float]]:
    per_phase: dict[str, list[float]] = {p: [] for p in PHASES}
    verify_health: dict[str, float] = {}
    stamps = []
    for event in events:
        stamps.append(datetime.fromisoformat(str(event["created"])))
        data = event.get("event_data") or {}
        assert isinstance(data, dict)
        if event.get("event") not in ("runner_on_ok", "runner_on_failed"):
            continue
        host = str(data.get("host"))
        if str(data.get("task", "")).endswith("Push artifact"):
            per_phase["push"].append(float(data.get("duration") or 0.0))
        solfleet = (data.get("res") or {}).get("solfleet")
        if isinstance(solfleet, dict) and "phases" in solfleet:
            phases = solfleet["phases"]
            for name in PHASES[1:]:
                if name in phases:
                    per_phase[name].append(float(phases[name]))
            verify_health[host] = float(phases.get("verify", 0.0)) + float(phases.get("health", 0.0))
    runner_wall = (max(stamps) - min(stamps)).total_seconds() if stamps else 0.0
    return per_phase, runner_wall, verify_health


def fmt(values: list[float]) -> str:
    if not values:
        return "      -      "
    return f"{statistics.median(values):5.2f}/{max(values):5.2f}"


def bench(n: int, verify_ops: str, base: Path) -> list[str]:
    fleet = SshdFleet(base / f"n{n}", count=n).start()
    rows = []
    try:
        spec = fleet.write_spec(base / f"fleet-{n}.yml")
        work, dist = base / f"work-{n}", base / "dist"
        for version in ("1.0.0", "1.1.0"):
            if not (dist / f"solfleet-ops-{version}.tar.gz").exists():
                cli(work, spec, "build", "--version", version, "--out", str(dist))
        seen: set[Path] = set()
        for label, version in (("first", "1.0.0"), ("second", "1.1.0"), ("re-deploy", "1.1.0")):
            artifact = dist / f"solfleet-ops-{version}.tar.gz"
            wall = cli(
                work,
                spec,
                "deploy",
                "--version",
                version,
                "--artifact",
                str(artifact),
                "--yes",
                "--verify-ops",
                verify_ops,
            )
            per_phase, runner_wall, verify_health = phase_table(latest_events(work, seen))
            no_verify = runner_wall - max(verify_health.values(), default=0.0)
            cells = "  ".join(fmt(per_phase[p]) for p in PHASES)
            rows.append(f"{n:>3} {label:<9} {wall:6.1f} {runner_wall:6.1f} {no_verify:9.1f}  {cells}")
    finally:
        fleet.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 16], help="fleet sizes (default 4 16)")
    parser.add_argument("--verify-ops", default="residual_add", help="ops verify runs on every node")
    args = parser.parse_args()
    if any(n < 1 or n > 64 for n in args.nodes):
        parser.error(f"--nodes {args.nodes}: each size must be 1..64")
    print(
        f"deploy benchmark: {os.cpu_count()} CPUs, verify ops: {args.verify_ops};"
        " phases in s as median/max over hosts"
    )
    header = "  N run        cli  runner no-verify  " + "  ".join(f"{p:>11}" for p in PHASES)
    print(header)
    with tempfile.TemporaryDirectory(prefix="solfleet-bench-") as tmp:
        for n in args.nodes:
            for row in bench(n, args.verify_ops, Path(tmp)):
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
