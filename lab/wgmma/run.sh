#!/usr/bin/env bash
# One device call on the H200: numba-cuda's stack check, the wgmma GEMM's correctness (small odd-ish shapes in
# full, 4096^3 and 8192x2560x2560 on sampled rows, against float64), then timing side by side with cuBLAS
# (torch) at 4096^3, 8192x2560x2560 and the o_proj shape, and SASS facts. Run from the repo root:
#   OUT=/some/dir bash lab/wgmma/run.sh [--quick]
# Needs numpy < 2.5 for numba-cuda 0.30.4: when the image's numpy is 2.5+, a numpy 2.4 cp312 manylinux wheel
# in .whl/ is unpacked into a private directory first on PYTHONPATH (and an ml_dtypes wheel there, if one is
# carried, likewise). Expected wall time ~60-120 s (numba + NVRTC + LTO compiles of ~10 kernels dominate);
# hard limit 220 s. Short table last; full results in $OUT/wgmma.json.
set -uo pipefail
OUT=${OUT:-/tmp/wgmma-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/wgmma-cache} PATH=$PATH:/usr/local/cuda/bin  # nvdisasm for the SASS facts
PY=${PY:-python3}
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  >"$OUT/nvidia-smi.csv" 2>&1
NPV=$($PY -c "import numpy; print(numpy.__version__)" 2>/dev/null)
SITE=/tmp/wgmma-site
if $PY -c "import sys, numpy; sys.exit(0 if tuple(map(int, numpy.__version__.split('.')[:2])) >= (2, 5) else 1)"; then
  WHL=$(ls .whl/numpy-2.4*cp312*manylinux*x86_64*.whl 2>/dev/null | head -1)
  if [ -z "$WHL" ]; then echo "numpy $NPV here breaks numba-cuda 0.30.4 and no .whl/numpy-2.4*cp312*.whl was carried"; exit 2; fi
  mkdir -p "$SITE" && $PY -m zipfile -e "$WHL" "$SITE" || exit 2
  for w in .whl/ml_dtypes-*cp312*.whl; do [ -f "$w" ] && $PY -m zipfile -e "$w" "$SITE"; done
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
$PY -c "import numpy, numba, ml_dtypes, torch; print('numpy', numpy.__version__, 'numba', numba.__version__, 'ml_dtypes', ml_dtypes.__version__, 'torch', torch.__version__)" 2>&1 | tail -2
echo "== setup $(( $(date +%s) - t0 )) s"
timeout 220 $PY lab/wgmma/bench.py --out "$OUT" "$@" >"$OUT/bench.txt" 2>&1
echo "bench rc=$? after $(( $(date +%s) - t0 )) s"
grep -E "ERROR|FAIL" "$OUT/bench.txt" | head -20
echo "---- nvidia-smi"; cat "$OUT/nvidia-smi.csv"
echo "---- table"; sed -n '/^shape /,$p' "$OUT/bench.txt"
[ -n "$(sed -n '/^shape /p' "$OUT/bench.txt")" ] || tail -30 "$OUT/bench.txt"
exit 0
