#!/usr/bin/env bash
# The twenty-first session's device calls (carry .whl), on whichever GPU comes:
#   on an H200: "The next GPU session" item 1, the table's missing rows (benchmarks/h200_latest.sh with the
#               second half of the LLM ops; its registry step times clip, cast, gemm and o_proj), then the
#               layernorm A/B below if time is left;
#   otherwise (or STEP=ab): lab/layernorm_prefetch_ab.py (layernorm's WIDE_ROWS kernels with the next row in
#               flight), then lab/staged_rows.patch applied and its GPU tests (test_bf16's staged / wide /
#               packed rows, test_layernorm), then item 3, lab/clip_bench_spread.py (fp16, fp32), until TOTAL s.
#   STEP=tests: the GPU tests of rmsnorm and fused_add_rmsnorm (the write-pass refactor), until TOTAL s
#   STEP=ab2: lab/layernorm_prefetch_ab.py's shared form on 2 or 4 consecutive rows a block, until TOTAL s
#   OUT=dir [STEP=auto|ab|ab2|table|tests] [TOTAL=560] bash lab/gpu_call_twentyfirst.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-twentyfirst}; TOTAL=${TOTAL:-560}; STEP=${STEP:-auto}
t0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
mkdir -p "$OUT"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "== device: $name"
source benchmarks/h200_env.sh || exit 2
ab() {
  mkdir -p "$OUT/ln-ab"; OUT=$OUT/ln-ab timeout -k 5 "$(left $1)" $PY lab/layernorm_prefetch_ab.py > "$OUT/ln-ab.txt" 2>&1
  echo "== layernorm A/B rc=$? after $(( $(date +%s) - t0 )) s"; tail -13 "$OUT/ln-ab.txt"
}
probe() {
  for dt in float16 float32; do
    mkdir -p "$OUT/clip-$dt"; DTYPE=$dt OUT=$OUT/clip-$dt timeout -k 5 "$(left $1)" $PY lab/clip_bench_spread.py > "$OUT/clip-$dt.txt" 2>&1
    echo "== clip probe $dt rc=$? after $(( $(date +%s) - t0 )) s"; tail -6 "$OUT/clip-$dt.txt"
  done
}
staged() {  # lab/staged_rows.patch (layernorm's rows staged in shared memory, as it would ship): its GPU tests
  { git apply lab/staged_rows.patch 2>/dev/null || patch -p1 < lab/staged_rows.patch; } > "$OUT/staged-apply.txt" 2>&1 \
    || { echo "== lab/staged_rows.patch did not apply"; return; }
  timeout -k 5 "$(left $1)" $PY -m pytest -q -p no:cacheprovider tests/kernels/test_bf16.py -k "staged or wide or packed" \
    tests/kernels/test_layernorm.py > "$OUT/pytest-staged.txt" 2>&1
  echo "== staged pytest rc=$? after $(( $(date +%s) - t0 )) s"; tail -6 "$OUT/pytest-staged.txt"
}
[[ $STEP == auto ]] && STEP=$([[ $name == *H200* ]] && echo table || echo ab)
if [[ $STEP == table ]]; then
  LLM_OPS=fused_add_rmsnorm,swiglu,rope,cast_fp8,residual_add GEMM=0 LLM_DEADLINE=330 REG_DEADLINE=470 \
    OUT=$OUT/table bash benchmarks/h200_latest.sh > "$OUT/table.txt" 2>&1
  echo "== table rc=$? after $(( $(date +%s) - t0 )) s"; tail -30 "$OUT/table.txt"
elif [[ $STEP == ab2 ]]; then  # the staged layernorm on the hardware's scheduling: 2 or 4 rows a block
  mkdir -p "$OUT/ln-ab2"; OUT=$OUT/ln-ab2 AB_OPS=layernorm AB_VARIANTS=shared,rows2,rows4 \
    timeout -k 5 "$(left "$TOTAL")" $PY lab/layernorm_prefetch_ab.py > "$OUT/ln-ab2.txt" 2>&1
  echo "== layernorm A/B 2 rc=$? after $(( $(date +%s) - t0 )) s"; tail -13 "$OUT/ln-ab2.txt"
elif [[ $STEP == tests ]]; then  # the write-pass refactor (rmsnorm.make_scale_write; its SASS is identical)
  timeout -k 5 "$(left "$TOTAL")" $PY -m pytest -q -p no:cacheprovider tests/kernels/test_rmsnorm.py \
    tests/kernels/test_fused_add_rmsnorm.py > "$OUT/pytest.txt" 2>&1
  echo "== pytest rc=$? after $(( $(date +%s) - t0 )) s"; tail -6 "$OUT/pytest.txt"
else
  ab 200
  staged 360
  probe "$TOTAL"
fi
