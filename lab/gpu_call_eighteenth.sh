#!/usr/bin/env bash
# The full-row loads' device call (carry .whl), on whichever GPU comes. From a tree without the change (main),
# it first copies the three kernels' modules as they are into lab/loads_base/ (the A/B's base arm), then
# applies lab/full_row_loads.patch (branch full-row-loads) on the device's copy; from a tree with the change
# applied it needs lab/loads_base/ already (`git show <base>:kernels/ops/<op>.py`). Each step on its own
# deadline (seconds from the start), everything packed into $OUT/eighteenth.tgz after each step:
#   1. lab/loads_ab.py (until 3/5 of TOTAL, default 450 s): fused_add_rmsnorm's, layernorm's and rmsnorm's
#      row kernels with every load of a full row issued together (HEAD) against the base commit's
#      (lab/loads_base/), 1024-128256 columns;
#   2. H200: benchmarks/h200_latest.sh for the table's rows this change does not touch (swiglu, rope,
#      cast_fp8, residual_add, and the registry step: cast, clip_grad_norm, gemm, o_proj against CuPy),
#      until TOTAL (it needs ~300 s after step 1: pass TOTAL=580 when an H200 is asked for);
#      otherwise: the GPU tests of the changed branches (test_bf16's full-row and on-chip tests,
#      fused_add_rmsnorm's vector-path and on-chip tests: 58 in the simulator) until TOTAL; the rest of the
#      three ops' GPU tests in a later call.
# Triton's cache (the H200's table step) goes to $OUT/triton and comes back as $OUT/triton.tgz.
#   OUT=dir [TOTAL=450] bash lab/gpu_call_eighteenth.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-eighteenth}; mkdir -p "$OUT/e"
export TRITON_CACHE_DIR=$OUT/triton
t0=$(date +%s)
TOTAL=${TOTAL:-450}
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
now() { echo "at $(( $(date +%s) - t0 )) s"; }
pack() { tar czf "$OUT/eighteenth.tgz" -C "$OUT" e; }
source benchmarks/h200_env.sh || exit 2
if ! grep -q WRITE_GROUP kernels/ops/layernorm.py; then  # main: the base is this tree's kernels, then the change
  mkdir -p lab/loads_base && cp kernels/ops/{rmsnorm,fused_add_rmsnorm,layernorm}.py lab/loads_base/
  { git apply lab/full_row_loads.patch 2>/dev/null || patch -p1 < lab/full_row_loads.patch; } || exit 3
  # (inside another repository `git apply` can exit 0 having changed nothing: check that it took)
  grep -q WRITE_GROUP kernels/ops/layernorm.py || { echo "lab/full_row_loads.patch did not apply"; exit 3; }
fi
[ -f lab/loads_base/rmsnorm.py ] || { echo "lab/loads_base/ missing (see the header)"; exit 3; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/e/gpu.txt"
OUT="$OUT/e" timeout -k 5 "$(left $(( TOTAL * 3 / 5 )))" $PY lab/loads_ab.py > "$OUT/e/loads.txt" 2>&1
echo "== loads rc=$? $(now)"; grep -A40 "^op " "$OUT/e/loads.txt" || tail -20 "$OUT/e/loads.txt"
pack
if grep -q H200 "$OUT/e/gpu.txt"; then
  LLM_OPS=swiglu,rope,cast_fp8,residual_add GEMM=0 LLM_DEADLINE=$(( TOTAL - 150 - $(date +%s) + t0 )) \
    REG_DEADLINE=$(( TOTAL - 35 - $(date +%s) + t0 )) OUT="$OUT/e/table" timeout -k 5 "$(left "$TOTAL")" \
    bash benchmarks/h200_latest.sh > "$OUT/e/table.txt" 2>&1
  echo "== table rc=$? $(now)"; grep -E "^== |rows, " "$OUT/e/table.txt"
else
  timeout -k 5 "$(left "$TOTAL")" $PY -m pytest -v -p no:cacheprovider tests/kernels/test_fused_add_rmsnorm.py \
    tests/kernels/test_bf16.py -k "full_rows or onchip_rows or test_vector_path_is_the_rounded" \
    > "$OUT/e/pytest.txt" 2>&1
  echo "== pytest rc=$? $(now)"; tail -5 "$OUT/e/pytest.txt"
fi
pack
[ -d "$OUT/triton" ] && tar czf "$OUT/triton.tgz" -C "$OUT" triton && rm -rf "$OUT/triton"
rm -rf "$OUT/e"; ls -la "$OUT"
