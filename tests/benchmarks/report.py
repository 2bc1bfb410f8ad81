"""Gathers the benchmarks' JSON into the committed report: benchmarks/report.json and benchmarks/REPORT.md.

    python tests/benchmarks/report.py [--bench test-results/bench] [--out benchmarks]

Reads bench.json (pages), kernels.json, server.json, load.json and radix.json, whichever exist, and writes one
readable table per part. Every speed is next to the baseline measured in the same run, because these
machines are noisy: the ratios are what to compare between runs.
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path


def load(bench: Path, name: str):
    path = bench / name
    return json.loads(path.read_text()) if path.exists() else None


def drawn(cold: dict) -> str:
    """When the first screen was drawn and when every plot was (runs before the page drew its plots below the
    first screen after it drew them all at once, as "first_plot_ms")."""
    if "first_screen_ms" not in cold:
        return f"{cold['first_plot_ms']:,} ms (all)"
    return f"{cold['first_screen_ms']:,} ms; {cold['all_plots_ms']:,} ms"


def pages_md(b: dict) -> list[str]:
    subset = " (a subset of the pages)" if b.get("subset") else ""
    pace = {"settled": "each change came once the previous one was drawn",
            "read": "each change came a second after the previous one was on screen, as a reader's does",
            "back-to-back": "each change came as soon as the previous reply was applied"}.get(
        b.get("pace"), "each change came as soon as the previous reply was applied (before --pace)")
    lines = [f"Baseline: a bare page whose module worker only loads Pyodide core, loaded cold in a fresh profile "
             f"right before each page; median {b['baseline_py_ready_ms']:,} ms in this run{subset}. Each page "
             f"is loaded in its own fresh persistent profile; bytes are counted at the server (compressed as "
             f"sent, cache hits 0). Round trips: {pace}; {trip_is(b)}; Python's part is the model's time in the worker; the "
             f"host probe (where measured) is one CPython replay of the load balancer's heaviest trace, median of "
             f"nine, right before and after the page's changes: how fast this drifting host was while they were "
             f"timed.", "",
             "| page | first screen drawn; every plot drawn | Python ready, cold (× its baseline: median over the cold loads) | boot | first "
             "change 1 s after ready (cold, median over the cold loads; after a reload) / the rest, median (its twin: the "
             "same change once more, at the end) | round trip "
             "p50 / p95 | on screen p50 / p95 | Python p50 / p95 | first visit on the wire | reload | second page |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for slug, r in b["pages"].items():
        w = r["wire_bytes"]
        lines.append(f"| {slug} | {drawn(r['cold'])} | {r['cold']['py_ready_ms']:,} ms "
                     f"({r['cold_ready_over_baseline']:.2f}) | {r['cold'].get('boot') or '-'} | "
                     f"{r['first_change_ms']:.0f}{reload_first(r)} / {r['rest_median_ms']:.0f}{again(r)} ms | "
                     f"{r['round_trip_ms']['median']:.1f} / {r['round_trip_ms']['p95']:.1f} ms{by_load(r)} | "
                     f"{painted(r)} | "
                     f"{r['python_ms']['median']:.1f} / {r['python_ms']['p95']:.1f} ms{probe(r)} | "
                     f"{w['cold'] / 1e6:.2f} MB | {w['warm'] / 1e3:.1f} KB | {w['second_page'] / 1e3:.1f} KB "
                     f"({r['second_page']['page']}) |")
    lines += first_change_parts_md(b)
    timeouts = b.get("timeouts", [])
    lines += ["", f"Loads that did not become ready within 90 s (each then retried once): {len(timeouts)}."]
    lines += [f"- {t['url'].split('/')[-1]}: {t['status']}" for t in timeouts]
    return lines


PARTS = {"waiting": "waiting to be sent", "to_worker": "to the worker", "worker": "in the worker",
         "python": "Python's share of it", "back": "back", "drawing": "taken into the plots"}


def first_change_parts_md(b: dict) -> list[str]:
    """Where the first change's extra time went: each part of its round trip less that part's median over the
    same load's other changes (kvx-page.js, parts), the median over the cold loads."""
    pages = {slug: r["first_change_parts_over_rest_ms"] for slug, r in b["pages"].items()
             if r.get("first_change_parts_over_rest_ms")}
    if not pages:
        return []
    lines = ["", "The first change against the rest, part by part (ms; the first change's part less the median of "
             "the same part over that load's other changes; median over the cold loads):", "",
             "| page | " + " | ".join(PARTS.values()) + " |", "|---|" + "---:|" * len(PARTS)]
    for slug, parts in pages.items():
        lines.append(f"| {slug} | " + " | ".join(f"{parts[k]:+.2f}" for k in PARTS) + " |")
    twins = {slug: r for slug, r in b["pages"].items() if r.get("first_less_twin")}
    if twins:
        lines += ["", "The first change against its twin (bench_pages.first_against_twin: the same change once more "
                  "at the end, the one like-for-like of a first change), part by part (ms; median over the cold "
                  "loads of the first's part less the twin's), the whole change and the page's part of it (the "
                  "change less Python's part: where a model keeps its answers, the twin's Python is a lookup), "
                  "each with its firsts above their twins, the one-sided sign test's p and the 95% upper bound of "
                  "the median difference (at most); no slower where neither p is under 0.05 (under 5 loads it "
                  "cannot tell):", "",
                  "| page | " + " | ".join(PARTS.values()) + " | whole change | page's part | no slower |",
                  "|---|" + "---:|" * (len(PARTS) + 2) + "---|"]
        bound = lambda t: "" if t.get("upper_95_ms") is None else f", at most {t['upper_95_ms']:+.2f}"
        cell = lambda t: (f"{t['median_ms']:+.2f} ({t['above']} of {t['loads']} above, p {t['sign_test_p']:.2f}"
                          f"{bound(t)})") if t else "-"
        for slug, r in twins.items():
            whole, page, parts = r["first_less_twin"], r.get("first_less_twin_page"), r["first_less_twin_parts_ms"]
            tests = [whole] + ([page] if page else [])
            verdict = ("too few loads" if any(t["no_slower"] is None for t in tests)
                       else "yes" if all(t["no_slower"] for t in tests) else "no")
            lines.append(f"| {slug} | " + " | ".join(f"{parts[k]:+.2f}" for k in PARTS) +
                         f" | {cell(whole)} | {cell(page)} | {verdict} |")
    return lines


def kernels_md(k: dict) -> list[str]:
    d = k["device"]
    lines = [f"Device: {d['device']} ({d['device_name']}, torch {d['torch']}, {d['threads']} threads). "
             f"Baseline: this machine's copy bandwidth in the same run, {k['copy_bytes_per_s'] / 1e9:.1f} GB/s.", "",
             "MLA decode, one layer of the trained MLA model, batch 1, float32 (time; bytes the formula says "
             "move ÷ time, as a share of the machine's copy bandwidth and, after the semicolon, of a copy the "
             "size of the cache, which like the cache fits in L3):", "",
             "| context | naive | plain MHA cache | absorbed | absorbed, 8-float build | absorbed, the previous kernel "
             "| absorbed ÷ MHA cache (previous) |", "|---:|---:|---:|---:|---:|---:|---:|"]
    forms = ("naive", "materialized", "absorbed", "absorbed_narrow", "absorbed_old")
    for row in k["mla"]:
        cells = []
        for f in forms:
            if f not in row:
                cells.append("-")
                continue
            small = f"; {row[f]['cache_copy_share']:.1%}" if "cache_copy_share" in row[f] else ""
            cells.append(f"{row[f]['seconds'] * 1e3:.3f} ms ({row[f]['bandwidth_share']:.1%}{small})")
        old = (f" ({row['absorbed_old']['seconds'] / row['materialized']['seconds']:.2f}×)"
               if "absorbed_old" in row else "")
        lines.append(f"| {row['context']:,} | " + " | ".join(cells) +
                     f" | {row['absorbed']['seconds'] / row['materialized']['seconds']:.2f}×{old} |")
    if k["mla"] and "absorbed_implementation" in k["mla"][0]:
        lines += ["", f"Absorbed: {k['mla'][0]['absorbed_implementation']}; the previous kernel: "
                      f"{k['mla'][0].get('absorbed_old_implementation', '-')}."]
        if "absorbed_narrow" in k["mla"][0]:
            lines += [f"The 8-float build is the same kernel compiled without AVX-512 (-mno-avx512f), timed in the "
                      f"same run: absorbed ÷ it " + ", ".join(f"{r['absorbed_over_narrow']:.2f}×" for r in k["mla"])
                      + " at " + " / ".join(f"{r['context'] // 1024}K" for r in k["mla"]) + "."]
    lines += ["", "Paged vs contiguous decode, batch 8:", "", "| context | paged | contiguous | paged ÷ contiguous "
              "| max error | paged share of copy bandwidth |", "|---:|---:|---:|---:|---:|---:|"]
    for row in k["paged"]:
        lines.append(f"| {row['context']:,} | {row['paged_seconds'] * 1e3:.2f} ms | "
                     f"{row['contiguous_seconds'] * 1e3:.2f} ms | {row['paged_seconds'] / row['contiguous_seconds']:.2f}× | "
                     f"{row['max_error']:.1e} | {row['paged_bandwidth_share']:.1%} |")
    lines += ["", "Eviction evaluation (8 recall sequences of 512 tokens, budget 25%):", ""]
    for row in k["eviction"]:
        lines.append("- " + ", ".join(f"{key} {v:.3g}" if isinstance(v, float) else f"{key} {v}"
                                      for key, v in row.items()))
    return lines


def server_md(s: dict) -> list[str]:
    lines = [f"Baseline: GET /api/v1/health, {s['health_ms']} ms median in the same run.", "",
             "| endpoint | status | cold | cached (median) | cached ÷ health |", "|---|---:|---:|---:|---:|"]
    for r in s["endpoints"]:
        lines.append(f"| {r['kind']} `{r['name']}` | {r['status']} | {r['cold_ms']:,.1f} ms | {r['cached_ms']} ms | "
                     f"{r['cached_over_health']} |")
    return lines


def load_md(x: dict) -> list[str]:
    from load_server import table   # the load test's own table
    return [table(x), "", f"Cached p99 under load ÷ without: {x['cached_p99_ratio_load_vs_baseline']:.2f}; server "
                          f"peak memory (VmHWM) {x['server_peak_rss_mb']:.0f} MB."]


def trip_is(b: dict) -> str:
    """What the run's round trips measured: until the reply was in the plots' sources (the round trip as issue 16
    counts it), and since 2026-12-02's seventh session also until the end of the frame that shows the change."""
    said = "a round trip runs from the change sent to the reply applied to the plots' sources"
    if any("round_trip_p95_by_load_ms" in r for r in b["pages"].values()):
        said += " (every cold load's changes together; the table gives each load's p95 after the pooled one)"
    if any("painted_ms" in r for r in b["pages"].values()):
        return (said + "; \"on screen\" runs on to the end of the frame that shows it (BokehJS takes the data in "
                "and repaints its canvases: what a reader waits for)")
    return said + " (this run did not measure the repaint after it)"


def by_load(r: dict) -> str:
    """Each cold load's own round-trip p95, where the run pooled several loads' changes."""
    p95s = r.get("round_trip_p95_by_load_ms")
    return f" (each load's p95: {', '.join(f'{x:.1f}' for x in p95s)})" if p95s and len(p95s) > 1 else ""


def painted(r: dict) -> str:
    """The round trip until the change was on screen, where the run measured it."""
    a = r.get("painted_ms")
    if not a:
        return "-"
    first = f"; first change {r['first_change_painted_ms']:.0f} / the rest {r['rest_painted_median_ms']:.0f}" \
        if "rest_painted_median_ms" in r else ""
    return f"{a['median']:.1f} / {a['p95']:.1f} ms{first}"


def probe(r: dict) -> str:
    """How fast the host was before and after the page's changes (bench_pages.host_probe), where measured."""
    p = r.get("host_probe_ms")
    return f" (host probe {p[0]:.1f} / {p[1]:.1f} ms)" if p else ""


def again(r: dict) -> str:
    """The first change made once more at the end, where the run measured it: its twin (from 2026-12-05, the opening
    value back and then the first value; from 2026-12-03 to then, the first value again after the rest's last)."""
    if "twin_ms" in r:
        return f" (twin {r['twin_ms']:.0f})"
    return f" ({r['first_value_again_ms']:.0f})" if "first_value_again_ms" in r else ""


def reload_first(r: dict) -> str:
    """The first change after a reload, where the run measured one (from 2026-12-02's fourth session)."""
    return f"; {r['first_change_after_reload_ms']:.0f}" if "first_change_after_reload_ms" in r else ""


def probes(x: dict) -> str:
    """How the attack suite probed, as its report says (runs before 2026-12-02's fourth session probed both every
    50 ms and did not say)."""
    if "probe_every_s" not in x:
        return "health and a static page probed every 50 ms"
    return f"health probed every {1000 * x['probe_every_s']:g} ms, a static page every {x['static_every']}th time"


def attack_md(x: dict) -> list[str]:
    from attack_server import table   # the attack suite's own table
    slow = next((p for p in x["phases"] if p["phase"] == "slow"), None)
    slow_line = "" if slow is None else (f" Slow connections: {slow['opened']:,} opened, {slow['closed_by_server']:,} "
                                         f"closed by the server; its log grew {slow['log_growth_bytes']:,} bytes "
                                         f"meanwhile.")
    return [f"`kvx serve` on 127.0.0.1 under `ulimit -n {x['open_file_limit']}`, about {x['seconds_per_phase']:g} s a "
            f"phase; {probes(x)} on fresh connections from a separate process. "
            f"Errors are answers other than 2xx, a 422 refusal or a 429/503 with Retry-After, and failed probes. "
            f"Peak RSS is the server and its job processes together.", "", table(x), "",
            f"Worst health p99 ÷ baseline: {x['worst_ratio']:.2f} (target at most 3); errors: {x['errors']} "
            f"(target 0).{slow_line}"]


def radix_md(r: dict) -> list[str]:
    lines = [f"One replica's radix tree over a {r['rows'][-1]['requests']:,}-request conversation-like trace, a "
             f"{r['cache_blocks']:,}-block (10M-token) cache. Baseline: a dict-insert loop over the same hash ids.",
             "", "| share | requests | blocks | evicted | wall | CPU | ÷ baseline (wall) | hit rate |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in r["rows"]:
        lines.append(f"| {x['share']:.0%} | {x['requests']:,} | {x['blocks']:,} | {x.get('evicted_blocks', 0):,} | "
                     f"{x['seconds']:.3f} s | {x['cpu_seconds']:.3f} s | {x['ratio_to_baseline']:.1f}x | "
                     f"{x['hit_rate']:.1%} |")
    lines += ["", f"Growth 100% ÷ 10%: {r['growth_100_over_10']:.1f}x wall, {r['growth_cpu']:.1f}x CPU for "
                  f"{r['growth_blocks']:.1f}x the blocks (n log n: {r['n_log_n']:.1f}); 100% ÷ 30% (both evicting): "
                  f"{r['growth_100_over_30_cpu']:.2f}x CPU for {r['blocks_100_over_30']:.2f}x the blocks."]
    if r.get("walk"):
        lines.append("The old whole-tree walk per evicted leaf: " + ", ".join(
            f"{w['seconds']:.2f} s at {w['share']:.0%}" for w in r["walk"]) + ".")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="test-results/bench")
    ap.add_argument("--out", default="benchmarks")
    a = ap.parse_args()
    bench, out = Path(a.bench), Path(a.out)
    parts = {"pages": load(bench, "bench.json"), "kernels": load(bench, "kernels.json"),
             "server": load(bench, "server.json"), "load": load(bench, "load.json"),
             "radix": load(bench, "radix.json"), "attack": load(bench, "attack.json")}
    md = ["# kvx benchmark report", "",
          f"Written {datetime.date.today().isoformat()} by `make bench` (tests/benchmarks/). Speeds vary by machine; "
          "compare the ratios against each part's baseline, which was measured in the same run.", ""]
    sections = [("Pages (tests/benchmarks/bench_pages.py, headless Chromium)", "pages", pages_md),
                ("Kernels (tests/benchmarks/bench_kernels.py)", "kernels", kernels_md),
                ("Compute server, per endpoint (tests/benchmarks/bench_server.py)", "server", server_md),
                ("Compute server under load (tests/benchmarks/load_server.py)", "load", load_md),
                ("Radix prefix cache replay (tests/benchmarks/bench_radix.py)", "radix", radix_md),
                ("Compute server under attack (tests/benchmarks/attack_server.py)", "attack", attack_md)]
    for title, key, render in sections:
        md += [f"## {title}", ""]
        md += render(parts[key]) if parts[key] else ["Not measured in this run."]
        md.append("")
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(parts, indent=1) + "\n")
    (out / "REPORT.md").write_text("\n".join(md))
    print(f"wrote {out / 'REPORT.md'} and {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
