"""Compute server latency per endpoint, cold (first call) and cached, on loopback.

    python tests/benchmarks/bench_server.py [--repeats 20] [--out test-results/bench]

Every explainer endpoint with its defaults, and every kernel with its default request: the first call
computes (a kernel job may answer 202 and is polled to the end), later calls come from the server's
cache. The baseline is GET /api/v1/health in the same run, so "cached / health" is the cache's cost
over an empty answer. Writes server.json and prints a table. Not a test: the figures vary by machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench_pages import serve      # the same loopback server as the page benchmark
from kvx.explainers.registry import REGISTRY


def timed(client: httpx.Client, method: str, url: str, body=None) -> tuple[float, int]:
    """ms until the answer is complete (a 202 job is polled until it is no longer queued or running)."""
    t0 = time.perf_counter()
    r = client.request(method, url, json=body)
    if r.status_code == 202:
        poll = url.split("/api/")[0] + r.json()["status_url"]
        while (r := client.get(poll)).status_code == 202 or r.json().get("status") in ("queued", "running"):
            time.sleep(0.05)
    return (time.perf_counter() - t0) * 1e3, r.status_code


def median(xs):
    return round(statistics.median(xs), 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="test-results/bench")
    a = ap.parse_args()
    server, base = serve(Path(tempfile.mkdtemp()))     # the API alone: an empty site
    rows = []
    with httpx.Client(timeout=600) as client:
        kernels = client.get(f"{base}/api/v1/kernels").json()
        health = [timed(client, "GET", f"{base}/api/v1/health")[0] for _ in range(a.repeats)]
        targets = [("explainer", slug, f"{base}/api/v1/explainers/{slug}", {}) for slug in REGISTRY]
        targets += [("kernel", name, f"{base}/api/v1/kernels/{name}", {}) for name in sorted(k["name"] for k in kernels)]
        for kind, name, url, body in targets:
            cold, status = timed(client, "POST", url, body)
            cached = [timed(client, "POST", url, body)[0] for _ in range(a.repeats)]
            rows.append({"kind": kind, "name": name, "status": status, "cold_ms": round(cold, 2),
                         "cached_ms": median(cached), "cached_over_health": round(median(cached) / median(health), 2)})
    server.should_exit = True
    report = {"health_ms": median(health), "endpoints": rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "server.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"baseline GET /api/v1/health: {report['health_ms']} ms (median of {a.repeats})")
    print(f"{'endpoint':28} {'status':>6} {'cold ms':>10} {'cached ms':>10} {'x health':>9}")
    for r in rows:
        print(f"{r['kind'] + ' ' + r['name']:28} {r['status']:>6} {r['cold_ms']:>10} {r['cached_ms']:>10} "
              f"{r['cached_over_health']:>9}")
    return 0 if all(r["status"] == 200 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
