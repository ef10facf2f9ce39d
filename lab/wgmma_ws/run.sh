#!/usr/bin/env bash
# One device call on the H200 for the warp-specialized TMA GEMM lab (lab/wgmma_ws). From the repo root:
#   OUT=/some/dir bash lab/wgmma_ws/run.sh [--only ws_p,base]
# numpy < 2.5 for numba-cuda 0.30.4: when the image's numpy is 2.5+, .whl/numpy-2.4*cp312*.whl (and an ml_dtypes
# wheel, if carried) is unpacked into a private directory first on PYTHONPATH, as lab/wgmma/run.sh does.
# bench.py compiles all variant families in parallel worker processes, then puts them on the GPU one at a time
# (each with a 45 s GPU-phase timeout; a hang or trap loses only that family). Budget 215 s, hard limit 232 s.
# Short table last; full results in $OUT/ws.json, per-worker logs in $OUT/worker_*.txt.
set -uo pipefail
OUT=${OUT:-/tmp/wgmma-ws-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/wgmma-ws-cache} PATH=$PATH:/usr/local/cuda/bin  # nvdisasm for SASS
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  >"$OUT/nvidia-smi.csv" 2>&1
source benchmarks/h200_env.sh || exit 2  # $PY, and numpy 2.4 from .whl where the image's numpy breaks numba-cuda
$PY -c "import torch; print('torch', torch.__version__)" 2>&1 | tail -1
echo "== setup $(( $(date +%s) - t0 )) s"
LEFT=$(( 232 - ($(date +%s) - t0) ))
timeout -k 3 $LEFT $PY lab/wgmma_ws/bench.py --out "$OUT" --budget $(( LEFT - 14 )) "$@" >"$OUT/bench.txt" 2>&1
echo "bench rc=$? after $(( $(date +%s) - t0 )) s"
grep -E "ERROR|FAIL|KILLED" "$OUT/bench.txt" "$OUT"/worker_*.txt 2>/dev/null | head -20
echo "---- nvidia-smi"; cat "$OUT/nvidia-smi.csv"
echo "---- table"; sed -n '/^variant /,$p' "$OUT/bench.txt"
[ -n "$(sed -n '/^variant /p' "$OUT/bench.txt")" ] || tail -30 "$OUT/bench.txt"
exit 0
