#!/usr/bin/env bash
# One device call on the H200 for clip_grad_norm's table path (issue 13: "clip_grad_norm over 300 tensors of
# Llama-3-8B sizes, <= 3 launches, >= 0.90 of copy"): `verify` of clip_grad_norm at its GPU verify shapes,
# the GPU tests of tests/kernels/test_clip_grad_norm.py, the host overhead rows, then benchmarks/clip_llama.py
# (the whole model's 291 gradients, ours vs torch), a short table last.
# Run from the repo root:   OUT=/some/dir bash benchmarks/h200_clip.sh
#   PY=/opt/torch/.venv/bin/python3 by default. Needs .whl/numpy-2.4*cp312*.whl (the image's numpy 2.5 breaks
#   numba-cuda 0.30.4) and .whl/test/ (pytest and its dependencies: the image has none). CLIP_ARGS go to
#   clip_llama.py. Deadlines from the start: verify 120 s, tests 300 s, overhead 360 s, bench 560 s.
set -uo pipefail
OUT=${OUT:-/tmp/h200-clip}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/h200-llm-cache} PYTHONPATH=$PWD
t0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
PY=${PY:-/opt/torch/.venv/bin/python3}
SITE=/tmp/h200-llm-site
WHL=$(ls .whl/numpy-2.4*cp312*manylinux*x86_64*.whl 2>/dev/null | head -1)
[ -n "$WHL" ] || { echo "no .whl/numpy-2.4*cp312*.whl carried"; exit 2; }
mkdir -p "$SITE" && timeout 60 $PY -m zipfile -e "$WHL" "$SITE" || exit 2
for w in .whl/test/*.whl; do [ -f "$w" ] && timeout 30 $PY -m zipfile -e "$w" "$SITE"; done
export PYTHONPATH="$SITE:$PYTHONPATH"
timeout 15 nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv \
  >"$OUT/nvidia-smi.csv" 2>&1
timeout "$(left 120)" $PY -m kernels verify --ops clip_grad_norm --shapes verify --json >"$OUT/verify.json" \
  2>"$OUT/verify.err"
echo "== verify rc=$? after $(( $(date +%s) - t0 )) s"
timeout 20 $PY - "$OUT/verify.json" <<'PYEOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("verify: no JSON:", e); sys.exit(0)
res = d.get("results", [])
print(f"verify ok={d.get('ok')} simulated={d.get('simulated')} {sum(r['ok'] for r in res)}/{len(res)} cases")
for r in res:
    if not r["ok"] or "llama" in r["case"]:
        print(f"  {r['dtype']:9} {r['case']:28} {str(r.get('path')):9} ok={r['ok']} rel={r.get('rel_err')} "
              f"{r.get('error') or ''}")
PYEOF
timeout "$(left 300)" $PY -m pytest -q -p no:cacheprovider \
  ${PYTEST_FILES:-tests/kernels/test_clip_grad_norm.py tests/kernels/test_replay_gpu.py tests/kernels/test_launch.py} \
  >"$OUT/pytest.txt" 2>&1
echo "== pytest rc=$? after $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/pytest.txt")"
grep -E "^FAILED|^ERROR" "$OUT/pytest.txt" | head -10
timeout "$(left 360)" $PY -m kernels bench --overhead --json >"$OUT/overhead.json" 2>"$OUT/overhead.err"
echo "== overhead rc=$? after $(( $(date +%s) - t0 )) s"
timeout 20 $PY -c "
import json, sys
d = json.load(open('$OUT/overhead.json'))
for r in d['overhead']:
    if 'clip' in r['call'] or 'dispatcher' in r['call'] or 'Kernel.launch' in r['call']:
        print(f\"  {r['call']:<48}{r['median_us']:>8.2f} us {r.get('error') or ''}\")
" 2>&1 | tail -8
timeout "$(left 560)" $PY benchmarks/clip_llama.py --out "$OUT" ${CLIP_ARGS:-} >"$OUT/clip-llama.log" 2>&1
echo "== clip_llama rc=$? after $(( $(date +%s) - t0 )) s"
grep -E "Error|Traceback" "$OUT/clip-llama.log" | head -5
cat "$OUT/clip-llama.txt" 2>/dev/null || tail -20 "$OUT/clip-llama.log"
exit 0
