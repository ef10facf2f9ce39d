#!/usr/bin/env bash
# The operator service on the H200, end to end over loopback, beside the in-process call.
#   benchmarks/serve_h200.sh bench   (< 4 min) residual_add 1x4096 fp16 and o_proj [16,512,2560] fp16 at
#                                    concurrency 1, 8, 32: tritonclient binary mode vs Engine.run on host arrays
#   benchmarks/serve_h200.sh soak    (< 7 min) 5 min of residual_add at concurrency 32: errors, device memory
#                                    over time, p99 of the first vs the last minute
# Run from the repo root with the wheels of docs/service.md ("Performance") in .whl/. Writes $OUT/*.json and
# the server log; prints a short table last.
set -euo pipefail
MODE=${1:-bench}
case "$MODE" in bench|soak) ;; *) echo "usage: $0 bench|soak" >&2; exit 2 ;; esac
OUT=${OUT:-/tmp/serve-$MODE}
mkdir -p "$OUT"
PY=python3
if [ -z "${SERVE_BENCH_DRY:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else  # SERVE_BENCH_DRY=1: a few seconds at tiny shapes, to check the script itself on a CPU machine (simulator)
  PY=${PYTHON:-python3}
  export PYTHONPATH=$PWD NUMBA_ENABLE_CUDASIM=1
fi
export PYTHONUNBUFFERED=1
"$PY" - "$MODE" "$OUT" <<'PY'
import json, multiprocessing as mp, os, signal, subprocess, sys, time, urllib.request
import numpy as np

MODE, OUT = sys.argv[1], sys.argv[2]
PORT = 18600
CASES = {"residual_add": {"x": (1, 4096), "r": (1, 4096)},
         "o_proj": {"attn": (16, 512, 2560), "w": (2560, 2560), "residual": (16, 512, 2560)}}
if MODE == "soak":
    CASES = {"residual_add": CASES["residual_add"]}
CONC = (1, 8, 32) if MODE == "bench" else (32,)
SECONDS = {"residual_add": 8.0, "o_proj": 8.0} if MODE == "bench" else {"residual_add": 300.0}
if os.environ.get("SERVE_BENCH_DRY"):
    CASES = {"residual_add": {"x": (1, 40), "r": (1, 40)},
             "o_proj": {"attn": (1, 3, 8), "w": (8, 8), "residual": (1, 3, 8)}}
    CONC, SECONDS = ((1, 2) if MODE == "bench" else (2,)), {"residual_add": 3.0, "o_proj": 3.0}
    if MODE == "soak":
        CASES, SECONDS = {"residual_add": CASES["residual_add"]}, {"residual_add": 62.0}


def host_inputs(op, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for n, s in CASES[op].items():
        a = rng.standard_normal(s).astype(np.float32)
        if n == "w":
            a /= np.sqrt(s[0])
        out[n] = a.astype(np.float16)
    return out


def pct(xs, q):
    return float(np.percentile(np.asarray(xs) * 1e6, q)) if xs else float("nan")


def in_process(op, n):
    """Engine.run: the service's own execution path (host -> device -> launch -> host), no HTTP."""
    from kernels.registry import all_ops
    from kernels.serve.config import from_mapping
    from kernels.serve.engine import Engine
    from kernels.serve.models import V2_OF, catalogue, plan
    cfg = from_mapping({"memory_limit_mb": 4096, "service": {"max_concurrency": 1}})
    eng = Engine(cfg=cfg)
    model = catalogue(all_ops())[op]
    host = host_inputs(op)
    p = plan(model, {k: (v.shape, V2_OF[v.dtype]) for k, v in host.items()}, {}, memory_limit=cfg.memory_limit_bytes)
    def call():
        return eng.pool.submit(eng.run, model, p, host).result()
    for _ in range(10):
        call()
    lat = []
    t_end = time.perf_counter() + min(SECONDS[op], 5.0)
    while time.perf_counter() < t_end and len(lat) < n:
        t0 = time.perf_counter(); call(); lat.append(time.perf_counter() - t0)
    eng.pool.shutdown()
    return {"p50_us": pct(lat, 50), "p99_us": pct(lat, 99), "n": len(lat)}


def worker(args):
    op, seconds, q = args
    import tritonclient.http as th
    c = th.InferenceServerClient(f"127.0.0.1:{PORT}", network_timeout=120, connection_timeout=120)
    ins = []
    for n, a in host_inputs(op).items():
        t = th.InferInput(n, list(a.shape), "FP16"); t.set_data_from_numpy(a, binary_data=True); ins.append(t)
    outs = [th.InferRequestedOutput("out", binary_data=True)]
    for _ in range(5):
        c.infer(op, ins, outputs=outs)
    q.get()  # start together
    lat, errs, stamps = [], [], []
    t_start = time.perf_counter(); t_end = t_start + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        try:
            c.infer(op, ins, outputs=outs)
            lat.append(time.perf_counter() - t0); stamps.append(t0 - t_start)
        except Exception as e:  # noqa: BLE001
            errs.append(f"{type(e).__name__}: {e}"[:200])
    c.close()
    return lat, stamps, errs


def metric(name):
    txt = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=10).read().decode()
    for line in txt.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def load(op, conc, seconds, mem_trace=None):
    ctx = mp.get_context("fork")  # the workers use no CUDA; a heredoc main cannot be re-imported by spawn
    with ctx.Manager() as man:
        q = man.Queue()
        with ctx.Pool(conc) as pool:
            res = pool.map_async(worker, [(op, seconds, q) for _ in range(conc)])
            time.sleep(2 + conc * 0.15 if op == "residual_add" else 10)  # workers import and warm up
            for _ in range(conc):
                q.put(1)
            t0 = time.monotonic()
            while not res.ready():
                if mem_trace is not None:
                    mem_trace.append((round(time.monotonic() - t0, 1), metric("solfleet_serve_device_memory_used_bytes")))
                res.wait(5)
            parts = res.get()
    lat = [x for p in parts for x in p[0]]; stamps = [x for p in parts for x in p[1]]
    errs = [x for p in parts for x in p[2]]
    r = {"op": op, "concurrency": conc, "seconds": seconds, "n": len(lat), "errors": len(errs),
         "error_samples": errs[:5], "p50_us": pct(lat, 50), "p99_us": pct(lat, 99), "req_s": len(lat) / seconds}
    if MODE == "soak":
        lat_a, st_a = np.asarray(lat), np.asarray(stamps)
        first, last = lat_a[st_a < 60], lat_a[st_a >= seconds - 60]
        r["p99_first_min_us"], r["p99_last_min_us"] = pct(first.tolist(), 99), pct(last.tolist(), 99)
    return r


results = {"mode": MODE, "in_process": {}, "service": []}
for op in CASES:
    results["in_process"][op] = in_process(op, 2000)
    print("in-process", op, results["in_process"][op], flush=True)

cfg = os.path.join(OUT, "config.yaml")
with open(cfg, "w") as f:
    f.write(f"memory_limit_mb: 4096\ntimeout_ms: 30000\nlog_level: info\nservice:\n  port: {PORT}\n"
            f"  max_concurrency: 4\n  max_queue: 512\n  self_test_ops: [residual_add, o_proj]\n"
            f"  state_dir: {OUT}/run\n")
log = open(os.path.join(OUT, "server.log"), "wb")
srv = subprocess.Popen([sys.executable, "-m", "kernels.serve", "--config", cfg], stdout=log, stderr=subprocess.STDOUT)
t0 = time.monotonic()
while True:
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{PORT}/v2/health/ready", timeout=2).status == 200:
            break
    except Exception:  # noqa: BLE001
        pass
    if srv.poll() is not None or time.monotonic() - t0 > 150:
        print(open(os.path.join(OUT, "server.log")).read()); sys.exit("server did not become ready")
    time.sleep(0.5)
results["ready_s"] = round(time.monotonic() - t0, 1)
print("server ready in", results["ready_s"], "s", flush=True)
mem = []
try:
    for op in CASES:
        for conc in CONC:
            r = load(op, conc, SECONDS[op], mem if MODE == "soak" else None)
            ip = results["in_process"][op]
            r["overhead_p50_us"] = r["p50_us"] - ip["p50_us"]
            r["ratio_p50"] = r["p50_us"] / ip["p50_us"]
            results["service"].append(r)
            print(json.dumps(r), flush=True)
    results["device_memory_trace"] = mem
    results["metrics_rejected"] = metric('solfleet_serve_requests_total')
finally:
    srv.send_signal(signal.SIGTERM)
    results["server_exit"] = srv.wait(timeout=60)
with open(os.path.join(OUT, f"{MODE}.json"), "w") as f:
    json.dump(results, f, indent=1)

print(f"\n== serve {MODE} (H200, loopback, tritonclient binary) ; server exit {results['server_exit']}")
print(f"{'op':13} {'conc':>4} {'p50 us':>9} {'p99 us':>9} {'req/s':>8} {'errors':>6} {'inproc p50':>10} {'ovh p50':>8} {'x':>5}")
for r in results["service"]:
    ip = results["in_process"][r["op"]]
    print(f"{r['op']:13} {r['concurrency']:>4} {r['p50_us']:>9.0f} {r['p99_us']:>9.0f} {r['req_s']:>8.0f} "
          f"{r['errors']:>6} {ip['p50_us']:>10.0f} {r['overhead_p50_us']:>8.0f} {r['ratio_p50']:>5.2f}")
if MODE == "soak":
    r = results["service"][0]
    used = [m for _, m in mem if m is not None]
    print(f"p99 first minute {r['p99_first_min_us']:.0f} us, last minute {r['p99_last_min_us']:.0f} us "
          f"({(r['p99_last_min_us'] / r['p99_first_min_us'] - 1) * 100:+.1f} %)")
    if used:
        print(f"device memory used: min {min(used) / 2**20:.0f} MiB, max {max(used) / 2**20:.0f} MiB, "
              f"last {used[-1] / 2**20:.0f} MiB over {len(used)} samples")
PY
