#!/usr/bin/env bash
# The eleventh session's first device call (cc 9.0; carry .whl): the cp.async tile's epilogue before and after
# its bias / R reads were hoisted (lab/cp_epi_ab.py; arms alternate, each against torch in its own process),
# auto's TMA o_proj as the control of the shared epilogue, then the GPU tests of both tiles and of o_proj /
# linear / gemm (also the tenth session's aliasing checks and in-place tests, which had not run on a GPU).
#   OUT=dir bash lab/gpu_call_eleventh_cp.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-eleventh-cp}; mkdir -p "$OUT"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader | tee "$OUT/nvidia-smi.csv"
STEPS="o_proj bfloat16 wgmma,o_proj float16 wgmma,o_proj bfloat16"
i=0
for arm in after before after before; do
  i=$((i + 1))
  timeout "$(left $(( ${T_BENCH:-300} * i / 4 )))" $PY lab/cp_epi_ab.py $arm -- --out "$OUT/ab$i-$arm" --only "$STEPS" \
    > "$OUT/ab$i-$arm.txt" 2>&1
  echo "== $arm rc=$? after $(( $(date +%s) - t0 )) s"
done
timeout "$(left ${T_TESTS:-560})" $PY -m pytest -q -p no:cacheprovider -rf tests/kernels/test_wgmma_tma.py \
  tests/kernels/test_o_proj.py tests/kernels/test_linear.py tests/kernels/test_gemm.py tests/kernels/test_wgmma.py \
  > "$OUT/pytest.txt" 2>&1
echo "== pytest rc=$? after $(( $(date +%s) - t0 )) s"
tail -4 "$OUT/pytest.txt"
for f in "$OUT"/ab*.txt; do echo "-- $f"; grep -E "^o_proj " "$f"; done
