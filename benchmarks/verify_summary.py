"""Summarise a `python -m kernels verify --json` report on a device call: the verdict, every failing case,
and the worst relative error per op and dtype.

    python benchmarks/verify_summary.py VERIFY.json
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as fh:
            d = json.load(fh)
    except (OSError, ValueError) as e:
        print(f"verify: no JSON in {path}: {e}")
        return 1
    res = d.get("results", [])
    ok = sum(bool(r.get("ok")) for r in res)
    print(
        f"verify ok={d.get('ok')} simulated={d.get('simulated')} {ok}/{len(res)} cases;",
        f"error={d.get('error')}",
    )
    for r in res:
        if not r.get("ok"):
            line = (f"  FAIL {r['op']} {r['dtype']} {r['case']} path={r.get('path')} rel={r.get('rel_err')} "
                    f"{r.get('error') or ''}")  # fmt: skip
            print(line[:300])
    worst: dict[tuple[str, str], float] = {}
    for r in res:
        if r.get("rel_err") is not None:
            k = (r["op"], r["dtype"])
            worst[k] = max(worst.get(k, 0.0), float(r["rel_err"]))
    print("worst rel_err:", ", ".join(f"{o} {dt} {v:.1e}" for (o, dt), v in sorted(worst.items())))
    return 0 if d.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
