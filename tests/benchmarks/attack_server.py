"""The long attacks on `kvx serve`, bounded and on loopback only: does health stay fast and nothing fail?

    python tests/benchmarks/attack_server.py [--seconds 10] [--out test-results/bench]

Starts `kvx serve` on 127.0.0.1 (never another address) under `ulimit -n 1024`, with a tiny site, then runs
a baseline and five attacks, each for about `--seconds` (the slow-connection one a little longer), while a
prober in a separate process (so the attack's own GIL does not slow it) times GET /api/v1/health on fresh
connections every 10 ms (about 700 probes in ten seconds, so that a p99 is not just the slowest one or two
probes) and a static page every fifth time:

1. slow: 1,100 connections that each send a request's headers one byte every 2 s (slowloris), more than
   the server's 1,024 open files;
2. keepalive: 500 keep-alive clients, each sending a cached request (health, an explainer's defaults, a
   static page) every 1-2 s;
3. worst: 40 distinct worst-case explainer requests at once (paging and load-balancer at their maxima,
   each with its own seed, so none is cached), retried after a 429/503 until the phase ends;
4. fill: distinct-parameter requests (the cache-renting model with a new context each time) to fill the
   answer cache, the server's resident memory sampled every 0.25 s;
5. memory: kernel requests that ask for as much memory as their bounds allow (decode at 1 GB + 1 GB,
   paged at its maxima), retried after a 429/503.

For each phase: health p50/p99 and its ratio to the baseline's p99 in the same run (target at most 3), the
static probe's p99, every answer's status, errors (anything but 2xx, a 422 refusal, or 429/503 with
Retry-After; a probe that failed to connect or timed out), the server's peak resident memory (its process
and its job processes together), and the growth of its log. Writes attack.json under --out and exits 1 if
any error occurred or a ratio exceeded --max-ratio. Stops by itself: every phase has a deadline, every
socket a timeout, and the server is killed at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from load_server import free_port, tiny_site    # noqa: E402  (the same stand-in site as the load test)

HOST = "127.0.0.1"                  # loopback only, always
ROOT = Path(__file__).parents[2]
OK_REFUSALS = {422}                 # "ask for less" (too slow, too expensive, too much memory): an answer


# ---- the prober: its own process, fresh connections, raw sockets --------------------------------------------
def _get(port: int, path: str, timeout: float = 10.0) -> tuple[int | None, float]:
    t0 = time.perf_counter()
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        return int(data.split(b" ", 2)[1]), time.perf_counter() - t0
    except (OSError, ValueError, IndexError):
        return None, time.perf_counter() - t0


PROBE_EVERY_S = 0.01                # health; the static page every STATIC_EVERY-th probe
STATIC_EVERY = 5


def prober(port: int, static: str, stop, out) -> None:
    rows, n = [], 0
    while not stop.is_set():
        probes = (("health", "/api/v1/health"),) + ((("static", static),) if n % STATIC_EVERY == 0 else ())
        for kind, path in probes:
            status, seconds = _get(port, path)
            rows.append((kind, status, seconds))
        n += 1
        time.sleep(PROBE_EVERY_S)
    out.put(rows)


class Probe:
    def __init__(self, port: int, static: str):
        ctx = multiprocessing.get_context("spawn")
        self.stop, self.out = ctx.Event(), ctx.Queue()
        self.process = ctx.Process(target=prober, args=(port, static, self.stop, self.out), daemon=True)

    def __enter__(self):
        self.process.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.rows = self.out.get(timeout=60)
        self.process.join(10)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return 1000 * values[min(len(values) - 1, int(q * len(values)))]


# ---- the server and its memory ---------------------------------------------------------------------------------
def tree_rss_mb(pid: int) -> float:
    """Resident memory of the server and its job processes together."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total / 1024


async def sample_rss(pid: int, stop: asyncio.Event, peak: list[float]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], tree_rss_mb(pid))
        await asyncio.sleep(0.25)


def start_server(site: Path, port: int, log: Path) -> subprocess.Popen:
    def limit_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    env = {**os.environ, "KVX_SITE_DIR": str(site)}
    server = subprocess.Popen([sys.executable, "-m", "kvx.compute.cli", "serve", "--host", HOST, "--port", str(port)],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
                              preexec_fn=limit_files)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if _get(port, "/api/v1/health", 2)[0] == 200:
            return server
        if server.poll() is not None:
            raise RuntimeError(f"kvx serve exited: {log.read_text()[-2000:]}")
        time.sleep(0.3)
    server.kill()
    raise RuntimeError("kvx serve did not start within 120 s")


# ---- the attacks -----------------------------------------------------------------------------------------------
class Tally:
    def __init__(self):
        self.statuses: dict[str, int] = {}
        self.errors: list[str] = []

    def add(self, what: str, r: httpx.Response | None, error: str = "") -> None:
        if r is None:
            self.statuses["no answer"] = self.statuses.get("no answer", 0) + 1
            self.errors.append(f"{what}: {error}")
            return
        key = str(r.status_code)
        self.statuses[key] = self.statuses.get(key, 0) + 1
        busy = r.status_code in (429, 503) and "retry-after" in r.headers
        if not (r.status_code < 300 or r.status_code in OK_REFUSALS or busy):
            self.errors.append(f"{what}: {r.status_code} {r.text[:200]}")


async def slow_connections(port: int, until: float, count: int = 1100) -> dict:
    """Slowloris: `count` connections, each trickling a request's headers a byte every 2 s."""
    request = f"GET /api/v1/health HTTP/1.1\r\nHost: {HOST}\r\nX-Slow: {'a' * 200}\r\n\r\n".encode()
    opened = closed_by_server = refused = 0

    async def one(i: int):
        nonlocal opened, closed_by_server, refused
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 5)
        except (OSError, asyncio.TimeoutError):
            refused += 1
            return
        opened += 1
        try:
            for byte in request:
                if time.monotonic() > until:
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                try:                                  # the server closing us shows as EOF
                    if await asyncio.wait_for(reader.read(1), 2.0) == b"":
                        closed_by_server += 1
                        return
                except asyncio.TimeoutError:
                    pass
        except OSError:
            closed_by_server += 1
        finally:
            writer.close()

    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(one(i)))
        if i % 100 == 99:
            await asyncio.sleep(0.2)
    await asyncio.wait(tasks, timeout=max(1.0, until - time.monotonic() + 5))
    return {"connections": count, "opened": opened, "closed_by_server": closed_by_server,
            "failed_to_connect": refused}


async def keepalive_clients(base: str, until: float, tally: Tally, statics: list[str], count: int = 500) -> dict:
    targets = [("GET", "/api/v1/health", None), ("POST", "/api/v1/explainers/cache-renting", {})] + \
              [("GET", p, None) for p in statics]
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        async def one(i: int):
            rng = random.Random(i)
            await asyncio.sleep(rng.random() * 2)
            while time.monotonic() < until:
                method, path, body = rng.choice(targets)
                try:
                    tally.add("keepalive", await client.request(method, path, json=body))
                except httpx.HTTPError as err:
                    tally.add("keepalive", None, f"{type(err).__name__}: {err}")
                await asyncio.sleep(1 + rng.random())
        await asyncio.gather(*(one(i) for i in range(count)))
    return {"clients": count}


def worst_case_bodies(n: int = 40) -> list[tuple[str, dict]]:
    paging = {"requests": 200, "prompt_mean": 4096, "output_mean": 4096, "max_len": 16384, "block_size": 1,
              "memory_slots": 131072, "arrival_gap": 0}
    balancer = {"replicas": 16, "sessions": 64, "turns": 30, "system_prompt": 32768, "message": 16384,
                "answer": 16384, "block_size": 1}
    return [("paging", {**paging, "seed": i}) if i % 2 == 0 else ("load-balancer", {**balancer, "seed": i})
            for i in range(n)]


async def retrying(client: httpx.AsyncClient, tally: Tally, what: str, path: str, body: dict, until: float):
    """One attacker's request, sent again after each 429/503 (after its Retry-After) until answered."""
    while time.monotonic() < until:
        try:
            r = await client.post(path, json=body)
        except httpx.HTTPError as err:
            tally.add(what, None, f"{type(err).__name__}: {err}")
            return
        if r.status_code == 202:                      # a kernel job: follow it to its end (or the phase's)
            while r.status_code == 202 and time.monotonic() < until:
                await asyncio.sleep(0.5)
                try:
                    r = await client.get(r.json()["status_url"])
                except httpx.HTTPError as err:
                    tally.add(what, None, f"{type(err).__name__}: {err}")
                    return
        tally.add(what, r)
        if r.status_code not in (429, 503):
            return
        await asyncio.sleep(min(float(r.headers.get("retry-after", 1)), max(0.0, until - time.monotonic())))


async def worst_case(base: str, until: float, tally: Tally) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=50)) as client:
        await asyncio.gather(*(retrying(client, tally, f"worst {slug}", f"/api/v1/explainers/{slug}", body, until)
                               for slug, body in worst_case_bodies()))
    return {"requests": 40}


async def fill_cache(base: str, until: float, tally: Tally, clients: int = 8) -> dict:
    sent = 0
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        async def one(i: int):
            nonlocal sent
            n = 0
            while time.monotonic() < until:
                n += 1
                body = {"context": 1000 + i * 1_000_000 + n, "kv_memory_gb": 100 + (n % 300)}
                await retrying(client, tally, "fill", "/api/v1/explainers/cache-renting", body, until)
                sent += 1
        await asyncio.gather(*(one(i) for i in range(clients)))
    return {"distinct_requests": sent}


async def memory_hungry(base: str, until: float, tally: Tally) -> dict:
    bodies = [("/api/v1/kernels/decode", {"weight_mb": 1024, "kv_mb": 1024, "repeats": 15}),
              ("/api/v1/kernels/paged", {"batch": 64, "context": 16384, "heads": 64, "kv_heads": 64,
                                         "head_dim": 256, "block_size": 1}),
              ("/api/v1/kernels/decode", {"weight_mb": 1000, "kv_mb": 1000, "repeats": 14})]
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        await asyncio.gather(*(retrying(client, tally, f"memory {path}", path, body, until) for path, body in bodies))
    return {"requests": len(bodies)}


PHASES = ("slow", "keepalive", "worst", "fill", "memory")


# ---- the run -----------------------------------------------------------------------------------------------------
async def phase(name: str, port: int, pid: int, static: str, seconds: float, attack) -> dict:
    tally, stop, peak = Tally(), asyncio.Event(), [tree_rss_mb(pid)]
    sampler = asyncio.create_task(sample_rss(pid, stop, peak))
    started = time.monotonic()
    with Probe(port, static) as probe:
        until = time.monotonic() + seconds
        detail = await attack(until, tally) if attack else (await asyncio.sleep(seconds)) or {}
        await asyncio.sleep(max(0.0, until - time.monotonic()))
    stop.set()
    await sampler
    health = [s for kind, status, s in probe.rows if kind == "health" and status == 200]
    static_ok = [s for kind, status, s in probe.rows if kind == "static" and status == 200]
    probe_errors = [f"{kind} probe: {status}" for kind, status, _ in probe.rows if status != 200]
    return {"phase": name, "seconds": round(time.monotonic() - started, 1), "probes": len(probe.rows),
            "health_answered": len(health), "health_p50_ms": pct(health, 0.5), "health_p99_ms": pct(health, 0.99),
            "static_p99_ms": pct(static_ok, 0.99), "statuses": tally.statuses,
            "errors": probe_errors + tally.errors, "peak_rss_mb": round(peak[0], 1), **(detail or {})}


async def run(a) -> dict:
    site = tiny_site()
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="kvx-attack-")) / "server.log"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)     # the attacker needs more files than the server
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    server = start_server(site, port, log)
    base, static = f"http://{HOST}:{port}", "/index.html"
    s = a.seconds
    try:
        attacks = {
            "slow": (1.5, lambda until, tally: slow_connections(port, until)),
            "keepalive": (1, lambda until, tally: keepalive_clients(base, until, tally, [static])),
            "worst": (2, lambda until, tally: worst_case(base, until, tally)),
            "fill": (1, lambda until, tally: fill_cache(base, until, tally)),
            "memory": (1, lambda until, tally: memory_hungry(base, until, tally)),
        }
        phases = [await phase("baseline", port, server.pid, static, s, None)]
        for name in a.phases:
            log_before = log.stat().st_size
            stretch, attack = attacks[name]
            phases.append(await phase(name, port, server.pid, static, s * stretch, attack))
            phases[-1]["log_growth_bytes"] = log.stat().st_size - log_before
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    baseline = phases[0]["health_p99_ms"] or 1e-9
    for p in phases:
        p["health_p99_ratio"] = round((p["health_p99_ms"] or float("inf")) / baseline, 2)
    return {"open_file_limit": 1024, "seconds_per_phase": s, "probe_every_s": PROBE_EVERY_S, "static_every": STATIC_EVERY,
            "phases": phases, "server_log_bytes": log.stat().st_size,
            "errors": sum(len(p["errors"]) for p in phases),
            "worst_ratio": max(p["health_p99_ratio"] for p in phases[1:])}


def table(report: dict) -> str:
    rows = ["| phase | s | health answered | health p50 ms | health p99 ms | p99 ÷ baseline | static p99 ms | "
            "answers (status: count) | errors | peak RSS MB |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for p in report["phases"]:
        f = lambda v: "-" if v is None else f"{v:.1f}"      # noqa: E731
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(p["statuses"].items())) or "-"
        rows.append(f"| {p['phase']} | {p['seconds']} | {p['health_answered']} | {f(p['health_p50_ms'])} | "
                    f"{f(p['health_p99_ms'])} | {p['health_p99_ratio']:.2f} | {f(p['static_p99_ms'])} | {statuses} | "
                    f"{len(p['errors'])} | {p['peak_rss_mb']:.0f} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--max-ratio", type=float, default=3.0)
    ap.add_argument("--out", default="test-results/bench")
    ap.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES,
                    help="the attacks to run after the baseline, in this order (default: all five)")
    a = ap.parse_args()
    report = asyncio.run(run(a))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attack.json").write_text(json.dumps(report, indent=2))
    print(table(report))
    for p in report["phases"]:
        for e in p["errors"][:5]:
            print(f"  {p['phase']}: {e}")
    for slow in (p for p in report["phases"] if p["phase"] == "slow"):
        print(f"slow connections: {slow['opened']} opened, {slow['closed_by_server']} closed by the server; log "
              f"grew {slow['log_growth_bytes']} bytes")
    print(f"errors {report['errors']}; worst health p99 ratio {report['worst_ratio']:.2f}")
    return 0 if report["errors"] == 0 and report["worst_ratio"] <= a.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
