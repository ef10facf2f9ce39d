"""kernels/ops/gemm/mma.cu: the tensor-core tile's CUDA C compiles (NVRTC, sm_90, LTO-IR, no GPU needed)
with no diagnostics for the production configuration and every macro switch, and the Python side names /
sizes configurations consistently. The simulator cannot link CUDA C, so the numerics of this path are
checked on the GPU (tests marked gpu, `python -m kernels verify`); this catches source errors here.
Runs in a subprocess: NVRTC is unavailable under the simulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = """
import json
from numba.cuda.cudadrv import nvrtc
from kernels.ops.gemm import mma
C = mma.Config
cfgs = [mma.DEFAULT, C(bk=32, late=False, cpy32=False, epi=False), C(epi=False), C(bn=256, wn=4),
        C(stages=4, bk=32)]
out = {}
for cfg in cfgs:
    code = mma.link_code(cfg)
    src = open(code).read() if isinstance(code, str) else code.data
    src = src.decode() if isinstance(src, bytes) else src
    try:
        _, log = nvrtc.compile(src, cfg.tag + ".cu", (9, 0), ltoir=True)
        out[cfg.tag] = "".join(log or []).strip("\\x00 \\n")
    except Exception as e:  # noqa: BLE001
        out[cfg.tag] = "ERROR " + repr(e)
print(json.dumps(out))
"""


def test_cuda_source_compiles_clean_for_every_switch():  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    p = subprocess.run([sys.executable, "-c", CODE], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(res) == 5
    for tag, log in res.items():
        assert log == "", (tag, log[:2000])


def test_config_names_and_shared_memory():  # type: ignore[no-untyped-def]
    from kernels.ops.gemm import mma

    d = mma.DEFAULT
    assert mma.link_code(d) == str(mma.CU_FILE)  # production links the file as it is: macros' defaults
    assert d.smem_bytes == 3 * (128 + 128) * 64 * 2 and d.threads == 128
    # unaligned shapes run the scalar-load kernels of a 32-wide-slice configuration (no spills there)
    assert d.unaligned.bk == 32 and d.unaligned.unaligned == d.unaligned
    c = mma.Config(bk=64, epi=True, late=True, cpy32=True, minb=2)
    assert c.smem_bytes == 3 * 256 * 64 * 2
    src = mma.link_code(c).data
    src = src.decode() if isinstance(src, bytes) else src
    for macro in ("HG_BK 64", "HG_EPI 1", "HG_LATE 1", "HG_CPY32 1", f"HG_SUFFIX _{c.tag}"):
        assert f"#define {macro}\n" in src
    assert "HG_MBAR" not in src and "HG_PERSIST" not in src  # removed after round 2 (notes-mma.md)
    variants = [mma.Config(), mma.Config(epi=False), mma.Config(late=False), mma.Config(cpy32=False),
                mma.Config(minb=3), mma.Config(bk=32), mma.Config(group_m=16)]  # fmt: skip
    assert len({v.tag for v in variants}) == len(variants)  # distinct kernel names when linked together
