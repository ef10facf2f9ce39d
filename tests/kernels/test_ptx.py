"""Every registered kernel compiles to PTX for sm_90 with no GPU, with ptxas register counts where ptxas is
installed. It goes the way `solfleet build` goes (fleet.artifact.compile_targets: fleet.ptx_export's child
processes over kernels.runtime.ptx, which stop on any kernel that does not compile), through the run's
shared PTX cache (tests/conftest.py): a full compile of ~190 kernels costs minutes on a 2-core machine, and
the suite's builds of this same tree then read it instead of compiling it again."""

from __future__ import annotations

import shutil
from pathlib import Path

from fleet.artifact import compile_targets, package_files

REPO = Path(__file__).resolve().parents[2]


def test_compile_all_for_sm90():  # type: ignore[no-untyped-def]
    kernels = {rel: data for rel, data in package_files(REPO).items() if rel.startswith("kernels/")}
    targets, files, _ = compile_targets(("9.0",), root=REPO, kernels=kernels)
    assert [(t["cc"], t["ptx_status"]) for t in targets] == [("9.0", "ok")]
    records = targets[0]["kernels"]
    mine = {
        "residual_add",
        "rmsnorm",
        "layernorm",
        "softmax",
        "cast",
        "clip_grad_norm",
        "fused_add_rmsnorm",
        "swiglu",
        "cast_fp8",
        "rope",
    }
    assert mine <= {k["op"] for k in records}
    for info in records:
        if info["op"] not in mine:
            continue  # other ops' kernels are checked by their own tests
        name = info["kernel"]
        assert ".entry" in files[info["ptx"]].decode(), (name, info)
        # the plain target (later GPUs JIT it), or the one arch an arch-specific kernel names
        assert f".target {info['arch'] or 'sm_90'}\n" in files[info["ptx"]].decode(), (name, info)
        if shutil.which("ptxas"):
            assert isinstance(info["registers"], int) and info["registers"] > 0, (name, info)
            assert info["spill_bytes"] == 0, (name, info)
