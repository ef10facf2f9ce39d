#!/usr/bin/env bash
# The sixteenth session's device call (carry .whl). On whichever GPU comes, each step on its own deadline
# (seconds from the start), everything packed into $OUT/sixteenth.tgz after each step:
#   H200 (unless TABLE=0): benchmarks/h200_latest.sh for the table's missing rows (fused_add_rmsnorm with its
#      packed shapes, swiglu, rope, cast_fp8, residual_add; the registry step: cast, clip_grad_norm, gemm,
#      o_proj against CuPy), until 490 s; then lab/inplace_ab.py until TOTAL (TOTAL under 560: the table
#      alone, until TOTAL - 10);
#   otherwise: lab/inplace_ab.py (in-place residual against Liger's out-of-place S) until 130 s;
#      lab/fused_packed_ab.py at 1024 / 2048 / 5120 columns (packed shapes with more loads in flight than
#      WIDE_ROWS', its docstring) until 280 s; then the GPU tests of fused_add_rmsnorm (the whole file: the
#      packed shapes shipped this session) until TOTAL.
#   TOTAL under 400, on any GPU: lab/inplace_ab.py until 110 s, then the narrow widths' A/B until TOTAL;
#   under 300, the narrow widths first (until 3/4 of TOTAL), then lab/inplace_ab.py.
#   OUT=dir [TOTAL=580] [TABLE=0] bash lab/gpu_call_sixteenth.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-sixteenth}; mkdir -p "$OUT/s"
TOTAL=${TOTAL:-580}
t0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
now() { echo "at $(( $(date +%s) - t0 )) s"; }
pack() { tar czf "$OUT/sixteenth.tgz" -C "$OUT" s; }
source benchmarks/h200_env.sh || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/s/gpu.txt"

probe() {  # $1: deadline
  OUT="$OUT/s" timeout -k 5 "$(left "$1")" $PY lab/inplace_ab.py > "$OUT/s/inplace.txt" 2>&1
  echo "== inplace rc=$? $(now)"; grep -A30 "^shape " "$OUT/s/inplace.txt" || tail -20 "$OUT/s/inplace.txt"
  pack
}

narrow() {  # $1: deadline
  OUT="$OUT/s" FP_COLS=1024,2048,5120 FP_SHAPES="1024:64x16/32p,1024:64x16/24p,2048:64x32/24p,2048:128x16/16p,5120:160x32/9p,5120:320x16/6p" \
    timeout -k 5 "$(left "$1")" $PY lab/fused_packed_ab.py > "$OUT/s/fused-narrow.txt" 2>&1
  echo "== fused narrow rc=$? $(now)"; grep -A30 "^dtype " "$OUT/s/fused-narrow.txt" || tail -20 "$OUT/s/fused-narrow.txt"
  pack
}

if [ "$TOTAL" -lt 300 ]; then  # a shorter one: the narrow widths first
  narrow $(( TOTAL * 3 / 4 ))
  probe "$TOTAL"
elif [ "$TOTAL" -lt 400 ]; then  # a short call, on any GPU: the two probes
  probe 110
  narrow "$TOTAL"
elif [ "${TABLE:-1}" = 1 ] && grep -q H200 "$OUT/s/gpu.txt"; then
  T_END=$(( TOTAL >= 560 ? 490 : TOTAL - 10 ))  # a shorter call: the table alone, to the end
  LLM_OPS=fused_add_rmsnorm,swiglu,rope,cast_fp8,residual_add GEMM=0 LLM_DEADLINE=$(( T_END - 150 )) \
    REG_DEADLINE=$(( T_END - 35 )) OUT="$OUT/s/table" timeout -k 5 "$(left "$T_END")" bash benchmarks/h200_latest.sh \
    > "$OUT/s/table.txt" 2>&1
  echo "== table rc=$? $(now)"; grep -E "^== |rows, " "$OUT/s/table.txt"
  pack
  [ "$TOTAL" -ge 560 ] && probe "$TOTAL"
else
  probe 130
  narrow 280
  timeout -k 5 "$(left "$TOTAL")" $PY -m pytest -q -p no:cacheprovider tests/kernels/test_fused_add_rmsnorm.py \
    > "$OUT/s/pytest-fused.txt" 2>&1
  echo "== pytest rc=$? $(now)"; tail -5 "$OUT/s/pytest-fused.txt"
  pack
fi
pack && rm -rf "$OUT/s"
