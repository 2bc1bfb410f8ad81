"""Everything a GPU can tell us about the kernels, in one run of under ten minutes on an H100/H200.

    python tests/benchmarks/gpu_check.py [--out benchmarks]          (make gpu-check)
    python tests/benchmarks/gpu_check.py --smoke [--out DIR]         (CPU, tiny sizes: every step, for CI)

Steps, each recorded with its outcome and time; the script exits non-zero if any fails:
1. tests: the kernel tests with KVX_TEST_DEVICE set to this device, which includes every kernel on the GPU
   against the same kernel on the CPU, and every kernel on the `meta` device under the mixed-device guard;
2. endpoints: every kernel endpoint once through the server (in-process), each answering 200 from this device;
3. benchmark: bench_kernels on this device (bf16 on CUDA, as the pages' formulas count 2-byte elements;
   CUDA events; the L2 cache flushed between repeats) against SDPA (flash backend where it runs) and the
   measured copy bandwidth of HBM and of a cache-sized buffer;
4. memory: each kernel's peak memory (torch.cuda.max_memory_allocated on a GPU; peak resident set on the
   CPU) against kernel_specs' estimate: on a GPU a peak above the estimate fails;
and writes gpu-report.json and gpu-report.md labelled with the device.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_kernels  # noqa: E402  (this folder is not a package)

from kvx.compute.kernel_specs import KERNELS, describe_device  # noqa: E402
from kvx.compute.kernels.timing import device  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# One modest request per endpoint (the server's defaults are larger; these keep the run short).
ENDPOINT_BODIES = {
    "mla": {"context": 4096, "repeats": 3},
    "paged": {"context": 2048, "batch": 8, "repeats": 3},
    "eviction": {"sequences": 4},
    "quantization": {"sequences": 4},
    "cross-layer": {"sequences": 4},
    "cross-model": {"fit_sequences": 8, "eval_sequences": 2},
    "decode": {"weight_mb": 64, "kv_mb": 16, "repeats": 3},
}
SMOKE_BODIES = {
    "mla": {"context": 64, "repeats": 1},
    "paged": {"context": 64, "batch": 2, "repeats": 1},
    "eviction": {"sequences": 1},
    "quantization": {"sequences": 1},
    "cross-layer": {"sequences": 1},
    "cross-model": {"fit_sequences": 4, "eval_sequences": 1},
    "decode": {"weight_mb": 1, "kv_mb": 1, "repeats": 1},
}


def step_tests(dev, smoke: bool) -> dict:
    files = ["tests/compute/test_kernel_devices.py"] + ([] if smoke else ["tests/compute/test_kernels.py"])
    select = ["-k", "agree or meta_device_without or guard"] if smoke else []
    env = {**os.environ, "KVX_TEST_DEVICE": dev.type}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files, *select],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    tail = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]
    if out.returncode != 0:
        raise AssertionError(f"kernel tests failed on {dev.type}: {tail}\n{out.stdout[-3000:]}")
    return {"summary": tail, "files": files}


def step_endpoints(dev, smoke: bool) -> dict:
    from fastapi.testclient import TestClient

    from kvx.compute.app import create_app
    from kvx.compute.settings import Settings
    client = TestClient(create_app(Settings(site_dir=ROOT / "build" / "none")))
    answers = {}
    for name, body in (SMOKE_BODIES if smoke else ENDPOINT_BODIES).items():
        started = time.perf_counter()
        r = client.post(f"/api/v1/kernels/{name}", json=body)
        deadline = time.monotonic() + 240
        while r.status_code == 202 and time.monotonic() < deadline:
            time.sleep(0.2)
            r = client.get(r.json()["status_url"])
        if r.status_code != 200:
            raise AssertionError(f"POST /api/v1/kernels/{name} answered {r.status_code}: {r.text[:500]}")
        j = r.json()
        if j["device"] != dev.type:
            raise AssertionError(f"/kernels/{name} ran on {j['device']}, not {dev.type}")
        answers[name] = {"seconds": round(time.perf_counter() - started, 3), "device": j["device"],
                         "threads": j["result"].get("threads"), "timer": j["result"].get("timer")}
    return answers


def step_benchmark(dev, smoke: bool) -> dict:
    report = bench_kernels.run(smoke=smoke, flush=dev.type == "cuda", eviction=not smoke, dev=dev)
    for row in report["paged"]:
        for name, err in row["errors"].items():
            limit = 1e-6 if report["dtype"] == "float32" else 2e-2
            if err > limit:
                raise AssertionError(f"paged {name} at {row['context']} tokens: error {err:.2g} > {limit:g}")
    return report


def _rss_peak_since_reset() -> tuple[int, int]:
    def field(name):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(name))
    return field("VmRSS"), field("VmHWM")


def step_memory(dev, smoke: bool) -> dict:
    rows = {}
    for name, body in (SMOKE_BODIES if smoke else ENDPOINT_BODIES).items():
        k = KERNELS[name]
        request = k.request(**body)
        estimate = k.memory(request)
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            k.run(request, lambda *a: None)
            torch.cuda.synchronize()
            measured = torch.cuda.max_memory_allocated() - base
            if measured > estimate["device"]:
                raise AssertionError(f"{name}: peak GPU memory {measured:,} B is over the estimate "
                                     f"{estimate['device']:,} B")
            rows[name] = {"measured_device_bytes": measured, "estimate_device_bytes": estimate["device"],
                          "estimate_host_bytes": estimate["host"]}
        else:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
                base, _ = _rss_peak_since_reset()
            except OSError:
                base = None
            k.run(request, lambda *a: None)
            measured = _rss_peak_since_reset()[1] - base if base is not None else None
            rows[name] = {"measured_host_bytes": measured, "estimate_host_bytes": estimate["host"] + estimate["device"]}
    return rows


STEPS = [("tests", step_tests), ("endpoints", step_endpoints), ("benchmark", step_benchmark),
         ("memory", step_memory)]


def markdown(report: dict) -> str:
    d = report["device"]
    lines = [f"# GPU check: {d['device_name']} ({d['device']}, torch {d['torch']})", "",
             f"Run {report['date']} with `{report['command']}`{' (smoke: tiny sizes, measures nothing)' if report['smoke'] else ''}; "
             f"{report['seconds']:.0f} s in all. Produced by tests/benchmarks/gpu_check.py.", "",
             "| step | outcome | seconds |", "|---|---|---:|"]
    for name, s in report["steps"].items():
        lines.append(f"| {name} | {'ok' if s['ok'] else 'FAILED: ' + s['error'].splitlines()[0][:120]} | {s['seconds']:.1f} |")
    bench = report["steps"].get("benchmark", {}).get("result")
    if bench:
        lines += ["", f"Benchmark: {bench['dtype']}, timer {bench['timer']}, cache flush {bench['flush']}; copy bandwidth "
                      f"(large buffer) {bench['copy_bytes_per_s'] / 1e9:.1f} GB/s.", "",
                  "MLA decode, batch 1 (time; formula bytes ÷ time as a share of the large copy / of a cache-sized copy):",
                  "", "| context | naive | plain MHA cache | absorbed | absorbed (old) | absorbed ÷ MHA |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for row in bench["mla"]:
            cells = [f"{row[f]['seconds'] * 1e6:.1f} µs ({row[f]['bandwidth_share']:.0%} / {row[f]['cache_copy_share']:.0%})"
                     for f in ("naive", "materialized", "absorbed", "absorbed_old")]
            lines.append(f"| {row['context']:,} | " + " | ".join(cells) + f" | {row['absorbed_over_mha']:.2f}× |")
        lines += ["", "Paged decode (batch as shown; errors against float64):", "",
                  "| batch | context | paged | SDPA contiguous | paged ÷ SDPA | SDPA flash, full length | old paged | "
                  "max error |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for row in bench["paged"]:
            flash = row.get("sdpa_flash_full_length_seconds")
            lines.append(f"| {row['batch']} | {row['context']:,} | {row['paged_seconds'] * 1e6:.1f} µs | "
                         f"{row['contiguous_seconds'] * 1e6:.1f} µs | {row['paged_over_contiguous']:.2f}× | "
                         f"{'-' if flash is None else f'{flash * 1e6:.1f} µs'} | {row['paged_old_seconds'] * 1e6:.1f} µs | "
                         f"{row['max_error']:.1e} |")
    mem = report["steps"].get("memory", {}).get("result")
    if mem:
        lines += ["", "Peak memory per kernel against the admission estimate (kernel_specs):", "",
                  "| kernel | measured | estimate |", "|---|---:|---:|"]
        for name, m in mem.items():
            measured = m.get("measured_device_bytes", m.get("measured_host_bytes"))
            est = m.get("estimate_device_bytes", m.get("estimate_host_bytes"))
            lines.append(f"| {name} | {'-' if measured is None else f'{measured / 1e6:,.1f} MB'} | {est / 1e6:,.1f} MB |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: every step, for CI")
    ap.add_argument("--out", default=None, help="where gpu-report.md/.json go (default benchmarks/, or "
                                                "test-results/gpu-check-smoke with --smoke)")
    a = ap.parse_args(argv)
    dev = torch.device("cpu") if a.smoke else device()
    if not a.smoke and dev.type != "cuda":
        print("gpu-check: no CUDA device here; run with --smoke for the CPU dry run.", file=sys.stderr)
        return 2
    out = Path(a.out or ("test-results/gpu-check-smoke" if a.smoke else ROOT / "benchmarks"))
    started = time.perf_counter()
    report = {"device": describe_device() if not a.smoke else {**describe_device(), "device": "cpu",
                                                                "device_name": "CPU"},
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "command": "python tests/benchmarks/gpu_check.py" + (" --smoke" if a.smoke else ""),
              "smoke": a.smoke, "steps": {}}
    for name, fn in STEPS:
        t0 = time.perf_counter()
        try:
            result = fn(dev, a.smoke)
            report["steps"][name] = {"ok": True, "seconds": time.perf_counter() - t0, "result": result}
        except Exception as err:     # record and go on: one failed step must not hide the others' results
            report["steps"][name] = {"ok": False, "seconds": time.perf_counter() - t0,
                                     "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        print(f"gpu-check {name}: {'ok' if report['steps'][name]['ok'] else 'FAILED'} "
              f"({report['steps'][name]['seconds']:.1f} s)", flush=True)
    report["seconds"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-report.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "gpu-report.md").write_text(markdown(report))
    failed = [n for n, s in report["steps"].items() if not s["ok"]]
    for n in failed:
        print(f"--- {n} ---\n{report['steps'][n]['traceback']}", file=sys.stderr)
    print(f"gpu-check: {'FAILED: ' + ', '.join(failed) if failed else 'all steps ok'}; report in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
