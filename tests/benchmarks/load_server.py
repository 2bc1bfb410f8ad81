"""A bounded load test of `kvx serve` on loopback: do cached answers stay fast while heavy kernels queue?

    python tests/benchmarks/load_server.py [--site build/site] [--clients 32] [--seconds 20] [--heavy 8]
                                           [--max-ratio 3] [--out test-results/bench]

Starts `kvx serve` in a second process on a free port, then runs two phases of the same length:

1. baseline: `--clients` concurrent clients (httpx.AsyncClient) that loop over the cached endpoints:
   health, every explainer's POST with its defaults, and static pages and scripts;
2. load: the same clients plus `--heavy` clients that each keep a real kernel request in flight (paged
   attention and a decode read, with parameters that change every time, so nothing is cached); a 202 is
   polled until its job ends or the phase does.

Reports throughput and p50/p99 latency per endpoint class in each phase, the count of 429/503 answers
(each must carry Retry-After), the ratio of cached p99 under load to the baseline, and the server's peak
resident memory (VmHWM from /proc). Writes load.json under --out. Exits 1 if any answer was an error other
than a 429/503 with Retry-After, a connection failed, or cached p99 under load exceeded --max-ratio times
the baseline's.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).parents[2]
CLASSES = ("health", "explainer", "static", "heavy")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_site() -> Path:
    """A stand-in site when none is built: a page and a script, enough to time static answers."""
    site = Path(tempfile.mkdtemp(prefix="kvx-load-site-"))
    (site / "static").mkdir()
    (site / "index.html").write_text("<!doctype html><title>kvx</title><script>let x = 1;</script><p>kvx</p>" * 20)
    (site / "static" / "kvx-page.js").write_text("// page runtime stand-in\n" * 400)
    return site


def static_paths(site: Path) -> list[str]:
    pages = sorted(p.relative_to(site).as_posix() for p in site.glob("*.html"))
    scripts = sorted(p.relative_to(site).as_posix() for p in (site / "static").glob("*") if p.is_file())
    return ["/" + p for p in (pages + scripts)[:12]] or ["/"]


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Recorder:
    def __init__(self):
        self.rows: list[tuple[str, int, float, bool]] = []   # (class, status, seconds, has Retry-After)
        self.failures: list[str] = []

    def add(self, kind: str, r: httpx.Response | None, seconds: float, error: str = "") -> None:
        if r is None:
            self.failures.append(f"{kind}: {error}")
            return
        retry = "retry-after" in r.headers
        self.rows.append((kind, r.status_code, seconds, retry))
        ok = r.status_code < 400 or (r.status_code in (429, 503) and retry)
        if not ok:
            self.failures.append(f"{kind}: {r.status_code} {r.request.method} {r.request.url.path} {r.text[:200]}")

    def summary(self, seconds: float) -> dict:
        out = {}
        for kind in CLASSES:
            rows = [r for r in self.rows if r[0] == kind]
            if not rows:
                continue
            times = sorted(t for _, _, t, _ in rows)
            out[kind] = {"requests": len(rows), "per_s": len(rows) / seconds,    # over the phase's set length
                         "p50_ms": 1000 * statistics.median(times),
                         "p99_ms": 1000 * times[min(len(times) - 1, int(0.99 * len(times)))],
                         "max_ms": 1000 * times[-1],
                         "busy_429_503": sum(s in (429, 503) for _, s, _, _ in rows),
                         "busy_with_retry_after": sum(s in (429, 503) and ra for _, s, _, ra in rows),
                         "accepted_202": sum(s == 202 for _, s, _, _ in rows),
                         "errors": sum(s >= 400 and not (s in (429, 503) and ra) for _, s, _, ra in rows)}
        return out


async def timed(client: httpx.AsyncClient, rec: Recorder, kind: str, method: str, url: str, **kw):
    t0 = time.perf_counter()
    try:
        r = await client.request(method, url, **kw)
    except httpx.HTTPError as err:
        rec.add(kind, None, time.perf_counter() - t0, f"{type(err).__name__}: {err}")
        return None
    rec.add(kind, r, time.perf_counter() - t0)
    return r


async def cached_client(client, rec, until, slugs, statics, seed: int, limit: int | None):
    """Loops over the cheap endpoints: health, explainer defaults, static files."""
    plan = itertools.cycle([("health", "GET", "/api/v1/health", {})] +
                           [("explainer", "POST", f"/api/v1/explainers/{s}", {"json": {}}) for s in slugs] +
                           [("static", "GET", p, {}) for p in statics])
    for _ in range(seed % 7):
        next(plan)
    done = 0
    while time.monotonic() < until and (limit is None or done < limit):
        kind, method, url, kw = next(plan)
        await timed(client, rec, kind, method, url, **kw)
        done += 1


HEAVY = itertools.count()
BACKOFF_S = 1.0          # the most a heavy client waits after a busy answer (Retry-After says 5 s)


def heavy_request() -> tuple[str, dict]:
    """A real kernel request that is never cached: its parameters change every time."""
    n = next(HEAVY)
    if n % 2:
        return "/api/v1/kernels/decode", {"weight_mb": 64 + n % 193, "kv_mb": 8, "repeats": 3}
    return "/api/v1/kernels/paged", {"batch": 8, "context": 2048 + n % 997, "repeats": 3}


async def heavy_client(client, rec, until, limit: int | None):
    done = 0
    while time.monotonic() < until and (limit is None or done < limit):
        url, body = heavy_request()
        r = await timed(client, rec, "heavy", "POST", url, json=body)
        done += 1
        if r is not None and r.status_code in (429, 503):
            await asyncio.sleep(min(float(r.headers.get("retry-after", 1)), BACKOFF_S))   # a polite client waits
        while r is not None and r.status_code == 202 and time.monotonic() < until:
            await asyncio.sleep(0.2)
            r = await client.get(r.json()["status_url"])
            if r.status_code not in (200, 202):
                rec.add("heavy", r, 0.0)


async def phase(url: str, *, clients: int, heavy: int, seconds: float, slugs, statics,
                cached_limit: int | None = None, heavy_limit: int | None = None) -> dict:
    rec = Recorder()
    limits = httpx.Limits(max_connections=clients + heavy + 4, max_keepalive_connections=clients + heavy + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        started = time.monotonic()
        until = started + seconds
        tasks = [cached_client(client, rec, until, slugs, statics, i, cached_limit) for i in range(clients)]
        tasks += [heavy_client(client, rec, until, heavy_limit) for _ in range(heavy)]
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started
    return {"seconds": elapsed, "classes": rec.summary(seconds), "failures": rec.failures[:20],
            "failure_count": len(rec.failures)}


def cached_p99(result: dict) -> float:
    rows = [result["classes"][k] for k in ("health", "explainer", "static") if k in result["classes"]]
    return max(r["p99_ms"] for r in rows)


def table(results: dict) -> str:
    lines = ["| phase | class | requests | per s | p50 ms | p99 ms | 429/503 (with Retry-After) | 202 | errors |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in ("baseline", "load"):
        for kind, r in results[name]["classes"].items():
            lines.append(f"| {name} | {kind} | {r['requests']} | {r['per_s']:.0f} | {r['p50_ms']:.1f} | "
                         f"{r['p99_ms']:.1f} | {r['busy_429_503']} ({r['busy_with_retry_after']}) | "
                         f"{r['accepted_202']} | {r['errors']} |")
    return "\n".join(lines)


def wait_ready(url: str, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kvx serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/api/v1/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("kvx serve did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", default=None, help="a built site (default build/site if built, else a tiny one)")
    ap.add_argument("--clients", type=int, default=32, help="concurrent clients on the cached endpoints")
    ap.add_argument("--heavy", type=int, default=8, help="concurrent clients sending real kernel requests")
    ap.add_argument("--seconds", type=float, default=20, help="length of each phase")
    ap.add_argument("--max-ratio", type=float, default=3.0,
                    help="fail if cached p99 under load exceeds this multiple of the baseline's")
    ap.add_argument("--out", default="test-results/bench")
    a = ap.parse_args()
    site = Path(a.site) if a.site else ROOT / "build" / "site"
    if not (site / "index.html").exists():
        site = tiny_site()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    kvx = Path(sys.executable).with_name("kvx")
    cmd = [str(kvx) if kvx.exists() else sys.executable, *([] if kvx.exists() else ["-m", "kvx.compute.cli"]),
           "serve", "--port", str(port), "--site", str(site)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env={**os.environ})
    try:
        wait_ready(url, proc)
        slugs = [e["slug"] for e in httpx.get(f"{url}/api/v1/explainers").json()]
        statics = static_paths(site)
        for s in slugs:                                  # first answers are computed; later ones are cached
            httpx.post(f"{url}/api/v1/explainers/{s}", json={}, timeout=60)
        results = {"site": str(site), "clients": a.clients, "heavy_clients": a.heavy, "phase_seconds": a.seconds,
                   "cpus": os.cpu_count()}
        results["baseline"] = asyncio.run(phase(url, clients=a.clients, heavy=0, seconds=a.seconds,
                                                slugs=slugs, statics=statics))
        results["load"] = asyncio.run(phase(url, clients=a.clients, heavy=a.heavy, seconds=a.seconds,
                                            slugs=slugs, statics=statics))
        results["server_peak_rss_mb"] = peak_rss_mb(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    results["cached_p99_ratio_load_vs_baseline"] = cached_p99(results["load"]) / cached_p99(results["baseline"])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(f"\ncached p99 under load / baseline: {results['cached_p99_ratio_load_vs_baseline']:.2f}; "
          f"server peak RSS {results['server_peak_rss_mb']:.0f} MB; {a.clients} cached + {a.heavy} heavy clients, "
          f"{a.seconds:g} s per phase, {os.cpu_count()} CPUs; written {out / 'load.json'}")
    failures = results["baseline"]["failures"] + results["load"]["failures"]
    if results["cached_p99_ratio_load_vs_baseline"] > a.max_ratio:
        failures.append(f"cached p99 under load is {results['cached_p99_ratio_load_vs_baseline']:.2f} x the "
                        f"baseline's, over --max-ratio {a.max_ratio:g}")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
