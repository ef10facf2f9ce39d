"""kernels.runtime.ptx: every registered kernel compiles to PTX for sm_90 with no GPU, with ptxas register
counts where ptxas is installed. Runs in a subprocess: offline compilation is unavailable under the
simulator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = """
import json
from kernels.runtime.ptx import compile_all
res = compile_all((9, 0))
print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "ptx"}
                  | {"has_entry": ".entry" in (v["ptx"] or "")} for k, v in res.items()}))
"""


def test_compile_all_for_sm90():  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    p = subprocess.run([sys.executable, "-c", CODE], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=600, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
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
    assert mine <= {v["op"] for v in res.values()}
    for name, info in res.items():
        assert info["cc"] == "9.0"
        if info["op"] not in mine:
            continue  # other ops' kernels are checked by their own tests
        assert info["has_entry"] and info["error"] is None, (name, info)
        if shutil.which("ptxas"):
            assert isinstance(info["registers"], int) and info["registers"] > 0, (name, info)
            assert info["spill_bytes"] == 0, (name, info)
