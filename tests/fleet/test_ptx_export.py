"""fleet.ptx_export on the real kernels: each op compiles in its own process, so the PTX bytes do not
depend on how many run at once (numba numbers functions in compile order within a process), and bad
arguments get exit 2 with the allowed values. Three small ops keep it to ~30 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OPS = "cast,cast_bf16,residual_add"


def export(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"} | {
        "PYTHONDONTWRITEBYTECODE": "1"
    }
    return subprocess.run(
        [sys.executable, "-m", "fleet.ptx_export", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_ptx_bytes_do_not_depend_on_the_number_of_processes() -> None:
    one, two = export("9.0", "--jobs", "1", "--ops", OPS), export("9.0", "--jobs", "2", "--ops", OPS)
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    assert one.stdout == two.stdout
    records = json.loads(one.stdout)
    assert {r["op"] for r in records} == set(OPS.split(","))
    assert [r["kernel"] for r in records] == sorted(r["kernel"] for r in records)
    assert all(".entry" in r["ptx"] for r in records)
    # an op compiled alone is the same bytes as inside the set: no number leaks from one op to the next
    # (cast: scheduled after residual_add's 6 kernels, so in the same process it would carry their numbers)
    alone = {r["kernel"]: r["ptx"] for r in json.loads(export("9.0", "--ops", "cast").stdout)}
    assert alone and all(r["ptx"] == alone[r["kernel"]] for r in records if r["op"] == "cast")


def test_bad_arguments_exit_2_naming_what_is_allowed() -> None:
    for args, says in (
        (("9",), "cc: '9' is not MAJOR.MINOR (e.g. 9.0)"),
        (("9.0", "--jobs", "0"), "--jobs: 0 is not allowed; give 1 or more"),
        (("9.0", "--ops", "sgemm"), "--ops: sgemm not registered; ops: cast, cast_bf16, cast_fp8,"),
    ):
        proc = export(*args)
        assert proc.returncode == 2 and says in proc.stderr, (args, proc.returncode, proc.stderr)
        assert proc.stdout == ""
