#!/usr/bin/env bash
# The thirteenth session's two row probes, written after its device time was spent (carry .whl), packed into
# $OUT/probes.tgz (the device tool returns a few files per call); ~4 min on an H100:
#   1. lab/packed_rows_ab.py for layernorm at 8192 and 16384: make_layernorm_held (the weight and the bias
#      held as packed pairs, a persistent grid: the write pass loads nothing) beside auto's WIDE_ROWS kernel
#      and the earlier packed builds;
#   2. lab/fused_onchip_ab.py: fused_add_rmsnorm on chip against its streaming kernel (auto's today) at
#      261 x 128256, 256 x 131072, 512 x 65536 and 1024 x 40960.
# Every output is checked against float64; each probe prints its table last.
#   OUT=dir bash lab/gpu_call_thirteenth_probes.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-thirteenth-probes}; mkdir -p "$OUT/w"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/w/gpu.txt"
OUT="$OUT/w" PR_OPS=layernorm PR_COLS=8192,16384 PR_DTYPES=bfloat16,float16 timeout "$(left 260)" \
  $PY lab/packed_rows_ab.py > "$OUT/w/layernorm-held.txt" 2>&1
echo "== layernorm held rc=$? after $(( $(date +%s) - t0 )) s"; grep -A30 "^op " "$OUT/w/layernorm-held.txt"
OUT="$OUT/w" timeout "$(left 540)" $PY lab/fused_onchip_ab.py > "$OUT/w/fused-onchip.txt" 2>&1
echo "== fused on chip rc=$? after $(( $(date +%s) - t0 )) s"; grep -A20 "^dtype " "$OUT/w/fused-onchip.txt"
tar czf "$OUT/probes.tgz" -C "$OUT" w && rm -rf "$OUT/w"
