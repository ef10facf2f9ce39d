"""CPU per process of the node's stack probe, beside a bare interpreter start, in the environment verify uses
(solfleet_kernels.kernels_env): where the probe's ~50 ms go (docs/playbooks.md, 2026-12-05 second session).

    PYTHONPATH=$PWD .venv/bin/python lab/stack_probe_cost.py [--python PATH] [--runs 20]

Rows: `python -c pass`, `python -S -c pass` (no site: the .pth files' imports are the difference),
`import importlib.metadata`, and the probe itself (solfleet_artifact._PROBE over the four stack pins).
Not part of the suite.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import ansible.module_utils as amu

REPO = Path(__file__).resolve().parents[1]
amu.__path__.append(
    str(REPO / "playbooks" / "module_utils")
)  # the node side's modules, as Ansible loads them
from ansible.module_utils import solfleet_artifact, solfleet_kernels  # noqa: E402


def cost(argv: list[str], env: dict[str, str], runs: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per run of `argv`, from this process's reaped children."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    for _ in range(runs):
        subprocess.run(argv, env=env, capture_output=True, check=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return cpu / runs * 1e3, (time.perf_counter() - t0) / runs * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="the node's solfleet_python (default: this one)")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    env = solfleet_kernels.kernels_env(None, "/tmp", True)
    want = json.dumps(solfleet_artifact.STACK_DISTS)
    py = args.python
    rows = [
        ("python -c pass", [py, "-c", "pass"]),
        ("python -S -c pass", [py, "-S", "-c", "pass"]),
        ("python -c 'import importlib.metadata'", [py, "-c", "import importlib.metadata"]),
        ("stack probe (solfleet_artifact._PROBE)", [py, "-c", solfleet_artifact._PROBE, want]),
    ]
    for label, argv in rows:
        cpu, wall = cost(argv, env, args.runs)
        print(f"{label:42s} cpu {cpu:6.1f} ms  wall {wall:6.1f} ms")


if __name__ == "__main__":
    main()
