"""kernels.harness.overhead's registry rows: every op x dtype gets a host-time row, and a row that cannot run
says why instead of hiding the others. Under the simulator the times are the simulator's (meaningless as
host overhead); what is tested is the table's coverage and that the timed calls ran the op."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from kernels import registry
from kernels.harness import overhead
from kernels.registry import all_ops


def test_registry_rows_cover_every_dtype_of_an_op_and_run_it() -> None:
    rows = overhead.registry_rows(calls=2, ops=("swiglu",))
    spec = all_ops()["swiglu"]
    assert [r["call"].split(",")[0] for r in rows] == [f"swiglu {dt}" for dt in spec.dtypes]
    for r in rows:
        assert "error" not in r, r
        assert math.isfinite(r["median_us"]) and r["p10_us"] <= r["median_us"] <= r["p90_us"], r


def test_registry_rows_report_a_failing_op_and_go_on(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    ops = all_ops()
    spec = ops["swiglu"]

    def broken(args):  # type: ignore[no-untyped-def]
        raise RuntimeError("no kernel for this device")

    monkeypatch.setattr(registry, "all_ops", lambda: ops | {"swiglu": replace(spec, launch=broken)})
    rows = overhead.registry_rows(calls=2, ops=("swiglu", "residual_add"))
    failed = [r for r in rows if r["call"].startswith("swiglu")]
    ran = [r for r in rows if r["call"].startswith("residual_add")]
    assert len(failed) == len(spec.dtypes) and all("no kernel for this device" in r["error"] for r in failed)
    assert all(np.isnan(r["median_us"]) for r in failed)
    assert len(ran) == len(all_ops()["residual_add"].dtypes) and all("error" not in r for r in ran)
