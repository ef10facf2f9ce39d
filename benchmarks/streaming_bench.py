"""Local vs streaming execution, side by side in one run: wall time of one `solfleet deploy` of the same
artifact bytes (a new MANIFEST version each time, so every deploy pushes, verifies and activates) to the same
N sshd nodes on 127.0.0.1, alternating the modes round by round.

    .venv/bin/python benchmarks/streaming_bench.py --nodes 3 --rounds 3

Not part of the test suite.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO / "tests"))  # loopback.py, which sshd_fleet imports

from deploy_bench import cli  # noqa: E402  (the same timed CLI call as the deploy benchmark)
from e2e_driver import VERIFY_OPS, retag  # noqa: E402
from sshd_fleet import SshdFleet  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="solfleet-streaming-bench-") as tmp:
        base = Path(tmp)
        sshd = SshdFleet(base / "sshd", count=args.nodes).start()
        try:
            spec = sshd.spec(fleet="bench")
            specs = {}
            for mode in ("local", "streaming"):
                specs[mode] = base / f"{mode}.yml"
                specs[mode].write_text(yaml.safe_dump({**spec, "execution": {"mode": mode}}, sort_keys=False))
            work, dist = base / "work", base / "dist"
            cli(work, specs["local"], "build", "--version", "0.0.1", "--out", str(dist))
            seed = dist / "solfleet-ops-0.0.1.tar.gz"
            deploy = ["deploy", "--verify-ops", VERIFY_OPS, "--yes"]
            # onto empty nodes first (not timed), so every timed deploy is onto a release
            cli(work, specs["local"], *deploy, "--version", "0.0.1", "--artifact", str(seed))
            times: dict[str, list[float]] = {"local": [], "streaming": []}
            for r in range(args.rounds):
                order = ("local", "streaming") if r % 2 == 0 else ("streaming", "local")
                for mode in order:
                    version = f"0.{r + 1}.{0 if mode == 'local' else 1}"
                    artifact = retag(seed, dist / f"solfleet-ops-{version}.tar.gz", version)
                    s = cli(work, specs[mode], *deploy, "--version", version, "--artifact", str(artifact))
                    times[mode].append(s)
                    print(f"round {r + 1} {mode:9s} {s:6.1f} s", flush=True)
        finally:
            sshd.stop()
    print(f"\n| mode | {args.nodes} nodes: deploy wall time, median of {args.rounds} | runs |")
    print("|---|---|---|")
    for mode, values in times.items():
        print(f"| {mode} | {statistics.median(values):.1f} s | {', '.join(f'{v:.1f}' for v in values)} |")


if __name__ == "__main__":
    main()
