#!/usr/bin/env bash
# Device calls of issue 13's vocabulary-row slice, from the repo root with .whl/ (numpy 2.4 cp312),
# .whl/test/ (pytest) and .whl/bench/ (liger_kernel) carried:   STEPS=... OUT=... bash lab/stream_vec_h200.sh
# STEPS (comma-separated, in this order when listed):
#   ab        lab/wide_rows_ab.py alone on the GPU (AB_COLS, default 32768-131072; AB_DTYPES bf16/fp16/fp32)
#   check     verify of rmsnorm, layernorm, softmax at the GPU verify shapes beside tests/kernels/test_bf16.py
#   llm       benchmarks/h200_llm.py for the three row ops (ours vs torch eager vs Liger, the bf16 width sweep)
#   variants  lab/stream_vec_variants.py (StreamRows shapes against the committed one)
set -uo pipefail
OUT=${OUT:-/tmp/sv-out}; mkdir -p "$OUT"
STEPS=${STEPS:-ab,check}
PY=${PY:-/opt/torch/.venv/bin/python3}
SITE=/tmp/sv-site; mkdir -p "$SITE"
for w in .whl/numpy-2.4*cp312*.whl .whl/test/*.whl .whl/bench/*.whl; do [ -f "$w" ] && timeout 60 $PY -m zipfile -e "$w" "$SITE"; done
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
t0=$(date +%s)
has() { case ",$STEPS," in *",$1,"*) return 0;; esac; return 1; }
smi() { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/nvidia-smi.csv" 2>&1; }
$PY -c "import numpy, numba_cuda, ml_dtypes, pytest; print('numpy', numpy.__version__, 'numba-cuda', numba_cuda.__version__)"
smi
if has ab; then
  AB_COLS=${AB_COLS:-32768,65536,128256,131072} AB_DTYPES=${AB_DTYPES:-bfloat16,float16,float32} AB_RESIDUAL=0 OUT="$OUT" \
    timeout ${AB_TIMEOUT:-220} $PY lab/wide_rows_ab.py > "$OUT/ab.txt" 2>&1
  echo "== A/B rc=$? after $(( $(date +%s) - t0 )) s"; smi
fi
if has check; then
  timeout 240 $PY -m kernels verify --ops rmsnorm,layernorm,softmax --shapes verify --json > "$OUT/verify.json" 2> "$OUT/verify.err" &
  VPID=$!
  timeout 270 $PY -m pytest -q tests/kernels/test_bf16.py -p no:cacheprovider -rf > "$OUT/pytest-bf16.txt" 2>&1; echo "== pytest rc=$?"
  wait $VPID; echo "== verify rc=$? after $(( $(date +%s) - t0 )) s"
  $PY - "$OUT/verify.json" <<'PYEOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("verify: no JSON:", e); sys.exit(0)
res = d.get("results", [])
print(f"verify ok={d.get('ok')} simulated={d.get('simulated')} {sum(r['ok'] for r in res)}/{len(res)} cases")
for r in res:
    if not r["ok"] or "vocab" in str(r.get("case", "")) or "128256" in str(r.get("case", "")):
        print(f"  {r['op']:10} {r['dtype']:9} {r['case']:16} {str(r.get('path')):14} ok={r['ok']} rel={r.get('rel_err')} elem={r.get('elem_err')} {r.get('error') or ''}")
PYEOF
  tail -3 "$OUT/verify.err"; tail -6 "$OUT/pytest-bf16.txt"
fi
if has llm; then
  timeout ${LLM_TIMEOUT:-260} $PY benchmarks/h200_llm.py --out "$OUT" --ops rmsnorm,layernorm,softmax > "$OUT/llm.txt" 2>&1
  echo "== llm bench rc=$? after $(( $(date +%s) - t0 )) s"; smi
fi
if has variants; then
  OUT="$OUT" timeout ${VAR_TIMEOUT:-200} $PY lab/stream_vec_variants.py > "$OUT/variants.txt" 2>&1
  echo "== variants rc=$? after $(( $(date +%s) - t0 )) s"; smi
fi
echo "---- nvidia-smi (name, driver, sm clock, max, temp, power)"; cat "$OUT/nvidia-smi.csv"
has ab && { echo "---- A/B"; sed -n '/^op /,$p' "$OUT/ab.txt"; grep -E "Error|Traceback" "$OUT/ab.txt" | head -5; }
has llm && { echo "---- llm"; sed -n '/^op /,$p' "$OUT/llm.txt" | head -80; grep -E "Error|Traceback" "$OUT/llm.txt" | head -5; }
has variants && { echo "---- variants"; sed -n '/^op /,$p' "$OUT/variants.txt"; grep -E "Error|Traceback" -A3 "$OUT/variants.txt" | head -12; }
exit 0
