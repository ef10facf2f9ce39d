"""The cp.async tile's epilogue before and after its bias / R reads were hoisted (wg_epilogue, eleventh
session), each arm timed against torch in its own process by benchmarks/h200_bf16.py.

    python lab/cp_epi_ab.py before|after -- --out DIR --only "o_proj bfloat16 wgmma,..."

`before` builds the cp.async tile from lab/cp_epi_before/wgmma.cu (wgmma.cu as at commit 832ce86, with that
commit's `wg_store2` from wgmma_epi.cuh inline: one R read per store, LSLS... in SASS), the package's headers
otherwise; `after` from the package (LLL...SSS...). The TMA tile is the package's in both arms (a control).
(The first run of this script, 2026-12-06, patched the header too, so its `before` arms could not build the
TMA control; their cp.async rows are as here.) Run the arms alternately
(after, before, after, before): each process's ratio to torch is measured side by side in that process.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from kernels.ops.gemm import wgmma  # noqa: E402

BEFORE = Path(__file__).with_name("cp_epi_before")


def main() -> int:
    arm, sep, *rest = sys.argv[1:]
    assert arm in ("before", "after") and sep == "--", __doc__
    if arm == "before":
        wgmma.CU_FILE = BEFORE / "wgmma.cu"
    print(f"arm {arm}: {wgmma.CU_FILE}", flush=True)
    import h200_bf16

    sys.argv = ["h200_bf16.py", *rest]
    return h200_bf16.main()


if __name__ == "__main__":
    raise SystemExit(main())
