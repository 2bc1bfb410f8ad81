"""The page's Python worker answers any input within bounds in strict JSON, for every explainer.

The worker parses Python's answer with JSON.parse, which refuses NaN and Infinity: a reply that is not
strict JSON would come back as "crashed" and the page would replace its worker. This posts random
parameter sets within each explainer's bounds (and the inputs that used to break: prompt-caching's
equal multipliers and full-price reads, a model too large for its GPUs) to a worker started the way
the page starts its own, and checks each reply is a result: the model's data, or a sentence naming a
field, the same as CPython's `page_json` for the same input.
"""
from __future__ import annotations

import json
import math
import random

from kvx.explainers.registry import REGISTRY, page_json

READY_MS = 90_000
SLOW = {"paging", "load-balancer", "prefix-reuse", "agent-sessions"}   # simulators: one parameter moved at a time
KNOWN = [
    ("prompt-caching", {"read_multiplier": 1}),
    ("prompt-caching", {"write_multiplier": 1, "read_multiplier": 1}),
    ("cache-renting", {"model": "llama-3-405b", "gpu_count": 1}),
]


def within_bounds(spec: dict, rng: random.Random):
    """A value within the bounds, the bounds themselves often (as ../shared/tools/param-fuzz draws them)."""
    if spec["kind"] == "choice":
        return rng.choice(spec["choices"])
    lo, hi = spec["min"], spec["max"]
    r = rng.random()
    x = lo if r < 0.2 else hi if r < 0.4 else (
        math.exp(rng.uniform(math.log(lo), math.log(hi))) if lo > 0 and hi / lo > 100 else rng.uniform(lo, hi))
    return round(x) if spec["kind"] == "integer" else x


def cases(seed: int = 12, per_explainer: int = 3) -> list[tuple[str, dict]]:
    rng = random.Random(seed)
    out = list(KNOWN)
    for slug, e in REGISTRY.items():
        specs = e.params.describe()
        for _ in range(per_explainer):
            if slug in SLOW or rng.random() < 0.5:
                s = rng.choice(specs)
                out.append((slug, {s["name"]: within_bounds(s, rng)}))
            else:
                out.append((slug, {s["name"]: within_bounds(s, rng) for s in specs}))
    return out


def first_difference(a, b, at="") -> str | None:
    """Where two replies first differ (for the failure message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a.keys() | b.keys():
            d = first_difference(a.get(k), b.get(k), f"{at}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := first_difference(x, y, f"{at}[{i}]"))), None)
    return None if close(a, b) else f"{at}: {a!r} against {b!r}"


def close(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9,
                                                                                               abs_tol=1e-12)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    return a == b


ASK_WORKER = """async (cases) => {
  const cfg = JSON.parse(document.getElementById("kvx-config").textContent);
  const worker = new Worker(new URL(cfg.worker, location.href), { type: "module" });
  const replies = new Map();
  let ready;
  const started = new Promise((resolve, reject) => { ready = { resolve, reject }; });
  worker.onmessage = (event) => {
    const msg = event.data;
    if (msg.type === "ready") ready.resolve();
    else if (msg.type === "failed") ready.reject(new Error(msg.message));
    else if (msg.type === "result" || msg.type === "crashed") replies.get(msg.id ?? "crash")?.(msg);
  };
  worker.postMessage({ type: "init", wheel: new URL(cfg.wheel, location.href).href,
                       pyodide: new URL(cfg.pyodide, location.href).href,
                       snapshot: cfg.snapshot && new URL(cfg.snapshot, location.href).href });
  worker.postMessage({ type: "go" });           // as the page does once its first plot is drawn
  await started;
  const out = [];
  for (let i = 0; i < cases.length; i++) {       // one at a time: a crash answers the request it was working on
    const [slug, params] = cases[i];
    const reply = await new Promise((resolve) => {
      replies.set(i, resolve);
      replies.set("crash", resolve);
      worker.postMessage({ type: "run", id: i, slug, params });
    });
    // packed columns (Float64Arrays) as lists, for the comparison with CPython's plain reply
    const plain = JSON.parse(JSON.stringify(reply.reply ?? null, (k, v) => ArrayBuffer.isView(v) ? Array.from(v) : v));
    out.push({ type: reply.type, reply: plain, message: reply.message ?? null });
  }
  worker.terminate();
  return out;
}"""


def test_the_worker_answers_random_inputs_in_strict_json(offline_page, site_url):
    page = offline_page
    page.goto(f"{site_url}/prompt-caching.html")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    todo = cases()
    answers = page.evaluate(ASK_WORKER, [[slug, values] for slug, values in todo])
    assert len(answers) == len(todo)
    for (slug, values), got in zip(todo, answers):
        assert got["type"] == "result", (slug, values, got["message"])        # JSON.parse in the worker accepted it
        reply = got["reply"]
        want = json.loads(page_json(slug, json.dumps(values)))                # CPython, same input
        assert reply["ok"] == want["ok"], (slug, values, reply.get("message"))
        if not reply["ok"]:
            assert reply["field"] is not None and reply["field"] in reply["message"], reply
            assert reply["message"] == want["message"]
        else:
            assert close(reply, want), (slug, values, first_difference(reply, want))   # libm may differ in an ulp
    refusals = [a for a in answers if not a["reply"]["ok"]]
    assert any(a["reply"]["field"] == "gpu_count" for a in refusals)             # the 405B case is refused
    first = answers[0]["reply"]                                                   # read = 1: caching never pays
    assert first["ok"] and [r["value"] for r in first["data"]["readouts"] if r["label"] == "Break-even"] == ["none"]
