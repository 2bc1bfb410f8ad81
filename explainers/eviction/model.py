"""Keep the sinks, keep the heavy hitters: which tokens a bounded KV cache keeps, and what it costs.

An eviction policy keeps a budget of a prompt's tokens in each layer's cache and drops the rest; the
tokens after the prompt then attend only to what was kept. Which tokens a policy keeps, and what that
costs in loss, agreement and recall, cannot be computed in a browser: it needs a trained model's real
attention. So the numbers here are the project's own trained model (`gqa-large`) run through the real
kernels (compute/kernels/eviction.py) at build time by compute/bakers/eviction.py, and stored in
baked.json with the device they ran on. This module only selects, arranges and words them.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import dataclasses
import html
import math

from ..core import baked
from ..core.params import ParamError, Params, choice, integer, number
from ..core.summaries import listing, pct, sig, summaries
from ..core.units import bytes_si, thousands

SLUG = "eviction"
POLICIES = ("full", "random", "streaming_llm", "no_sinks", "h2o", "observed", "snapkv")
TITLES = {
    "full": "full cache",
    "random": "random",
    "streaming_llm": "StreamingLLM (4 sinks + recent; as kvpress's StreamingLLMPress)",
    "no_sinks": "StreamingLLM, sinks evicted (recent only)",
    "h2o": "H2O, as its paper states it (heavy hitters + recent)",
    "observed": "observed attention, as kvpress's ObservedAttentionPress (no recent window)",
    "snapkv": "SnapKV (what the prompt's end attends to; as kvpress's SnapKVPress)",
}
SHORT = {"full": "full cache", "random": "random", "streaming_llm": "StreamingLLM", "no_sinks": "no sinks",
         "h2o": "H2O (paper)", "observed": "observed (kvpress)", "snapkv": "SnapKV"}
PROSE = {"full": "the full cache", "random": "random eviction", "streaming_llm": "StreamingLLM",
         "no_sinks": "StreamingLLM without its sinks", "h2o": "H2O (as its paper states it)",
         "observed": "kvpress's observed attention", "snapkv": "SnapKV"}
RULES = ("streaming_llm", "no_sinks", "h2o", "observed", "snapkv")     # the policies that choose by a rule
LAYERS, KV_HEADS = 4, 2          # gqa-large (compute/lm/train.py CONFIGS; a test checks the baked config)
BYTES_PER_NUMBER = 2             # the cache in bf16, as the kernel counts its bytes
SINK_TOKENS = 4


def data() -> dict:
    """The baked kernel results (the site build's fresh ones when it has made them)."""
    return baked.load(SLUG)


def budget_percents() -> list[int]:
    return [round(b * 100) for b in data()["budgets"]]


@dataclasses.dataclass(frozen=True)
class EvictionParams(Params):
    policy: str = choice("h2o", POLICIES, help="Which tokens the cache keeps: " + "; ".join(
        f"{k} = {v}" for k, v in TITLES.items()))
    budget: float = number(20, unit="% of the prompt", min=5, max=100,
                           help="Share of the prompt's tokens kept, snapped to the nearest measured budget "
                                "(5, 10, 20, 35, 50 or 100%)")
    layer: int = integer(1, unit="layer", min=0, max=LAYERS - 1, help="Which layer's attention and cache to show")
    kv_head: int = integer(0, unit="KV head", min=0, max=KV_HEADS - 1,
                           help="Which KV head's kept tokens to show (each KV head keeps its own)")

    def __post_init__(self):
        super().__post_init__()
        c = data()["config"]
        if self.layer >= c["n_layers"]:
            raise ParamError("layer", f"layer must be between 0 and {c['n_layers'] - 1}; got {self.layer}.")
        if self.kv_head >= c["n_kv_heads"]:
            raise ParamError("kv_head", f"kv_head must be between 0 and {c['n_kv_heads'] - 1}; got {self.kv_head}.")


def snapped(budget: float) -> int:
    """The index of the measured budget nearest to `budget` percent (the lower one on a tie)."""
    pcts = budget_percents()
    return min(range(len(pcts)), key=lambda i: (abs(pcts[i] - budget), pcts[i]))


def budget_tokens(fraction: float, prompt: int) -> int:
    """The kernel's rule (compute/kernels/eviction.py kept_count), which is kvpress's compute_n_kept with
    compression ratio 1 − fraction: whole tokens, floored, at least one; 1 − (1 − f) in floating point."""
    compression_ratio = 1 - fraction
    return max(1, int(prompt * (1 - compression_ratio)))


def unhex(mask: str, n: int) -> list[bool]:
    """A hex bit mask (position 0 the top bit of the first digit) as n booleans."""
    bits = "".join(f"{int(ch, 16):04b}" for ch in mask)
    return [b == "1" for b in bits[:n]]


def kept_mask(policy: str, i: int, layer: int, kv_head: int) -> list[bool]:
    """Which prompt tokens of the shown recall sequence this policy keeps at budget index i."""
    d = data()
    n = d["shown"]["prefix"]
    if policy == "full" or d["budgets"][i] >= 1.0:
        return [True] * n
    return unhex(d["shown"]["kept"][policy][i][layer][kv_head], n)


def runs(flags: list[bool]) -> list[tuple[int, int, bool]]:
    """Consecutive equal flags as (start, end, flag)."""
    out, start = [], 0
    for j in range(1, len(flags) + 1):
        if j == len(flags) or flags[j] != flags[start]:
            out.append((start, j, flags[start]))
            start = j
    return out


# ---- results ------------------------------------------------------------------------------------------
def evaluate(p: EvictionParams) -> dict:
    d = data()
    i = snapped(p.budget)
    text, recall = d["text"], d["recall"]
    t, r = text["results"][p.policy], recall["results"][p.policy]
    full_t, full_r = text["results"]["full"], recall["results"]["full"]
    kept = kept_mask(p.policy, i, p.layer, p.kv_head)
    needle_positions = [j for s, e in d["shown"]["needles"] for j in range(s, e)]
    sinks = d["sinks"][p.layer]
    per_token = d["config"]["cache_numbers_per_token"] * BYTES_PER_NUMBER
    return {
        "budget_percent": budget_percents()[i],
        "budget_fraction": d["budgets"][i],
        "snapped": budget_percents()[i] != p.budget,
        "text_prompt_tokens": text["prefix"],
        "recall_prompt_tokens": recall["prefix"],
        "text_budget_tokens": t["budget_tokens"][i],
        "recall_budget_tokens": r["budget_tokens"][i],
        "kept_tokens": recall["prefix"] if p.policy == "full" else r["budget_tokens"][i],
        "text_loss_bits": t["loss_bits"][i],
        "text_full_loss_bits": full_t["loss_bits"][i],
        "text_loss_delta_bits": round(t["loss_bits"][i] - full_t["loss_bits"][i], 6),
        "text_top1": t["top1"][i],
        "recall_byte_acc": r["recall_byte_acc"][i],
        "recall_exact": r["recall_exact"][i],
        "recall_full_byte_acc": full_r["recall_byte_acc"][i],
        "recall_loss_bits": r["loss_bits"][i],
        "recall_top1": r["top1"][i],
        "recall_chance": recall["chance"],
        "cache_bytes_per_token": per_token,
        "cache_bytes_kept": (recall["prefix"] if p.policy == "full" else r["budget_tokens"][i]) * per_token,
        "cache_bytes_full": recall["prefix"] * per_token,
        "shown_kept": sum(kept),
        "needle_tokens": len(needle_positions),
        "needle_tokens_kept": sum(kept[j] for j in needle_positions if j < len(kept)),
        "sink_share_first_token": sinks["first_token"],
        "sink_share_first_4": sinks["first_4"],
        "uniform_share_first_4": sinks["uniform_first_4"],
        "top1pct_share": sinks["top1pct"],
        "device": d["provenance"]["device"],
        "model": d["provenance"].get("model", "gqa-large"),
    }


def provenance_label() -> str:
    pr = data()["provenance"]
    return (f"measured on {pr['device']} with torch {pr['torch']}, model {pr.get('model', 'gqa-large')}, "
            f"baked {pr['baked_on']} by `{pr['command']}`")


# ---- what the page draws --------------------------------------------------------------------------------
@baked.derived(maxsize=1)
def curves() -> dict:
    d = data()
    out = {"budget": budget_percents()}
    for name in POLICIES:
        out[f"loss_{name}"] = d["text"]["results"][name]["loss_bits"]
        out[f"top1_{name}"] = d["text"]["results"][name]["top1"]
        out[f"recall_{name}"] = d["recall"]["results"][name]["recall_byte_acc"]
    return out


@baked.derived(maxsize=LAYERS)
def attention_cells(layer: int) -> dict:
    """The layer's binned attention map (lower triangle) as rectangles: centre, size, mass."""
    d = data()["shown"]
    b = d["map_bin"]
    cells = d["map"][layer]
    n = int((math.isqrt(8 * len(cells) + 1) - 1) // 2)
    x, y, mass = [], [], []
    k = 0
    for i in range(n):
        for j in range(i + 1):
            x.append(j * b + b / 2)
            y.append(i * b + b / 2)
            mass.append(max(cells[k], 1e-6))
            k += 1
    return {"x": x, "y": y, "mass": mass}


def evicted_band(kept: list[bool], top: int) -> dict:
    """Evicted prompt tokens as columns over the queries after the prompt, which cannot see them."""
    prefix = len(kept)
    cols = {"left": [], "right": [], "bottom": [], "top": []}
    for s, e, flag in runs(kept):
        if not flag:
            cols["left"].append(s)
            cols["right"].append(e)
            cols["bottom"].append(prefix)
            cols["top"].append(top)
    return cols


def strip(kept: list[bool]) -> dict:
    cols = {"left": [], "right": [], "state": []}
    for s, e, flag in runs(kept):
        cols["left"].append(s)
        cols["right"].append(e)
        cols["state"].append("kept" if flag else "evicted")
    return cols


def received(p: EvictionParams, kept: list[bool]) -> dict:
    """Per prompt token of the shown sequence: the mean attention the questions give it, and the attention
    summed over the prompt's own queries (H2O's score), in this layer and KV head."""
    d = data()["shown"]
    mass = d["received"][p.layer][p.kv_head]
    return {"x": list(range(len(mass))), "mass": [max(m, 1e-6) for m in mass],
            "score": [max(m, 1e-4) for m in d["accumulated"][p.layer][p.kv_head]],
            "state": ["kept" if k else "evicted" for k in kept], "char": list(d["chars"][:len(mass)])}


@baked.derived(maxsize=1)
def sinks_source() -> dict:
    s = data()["sinks"]
    return {"layer": [f"layer {x['layer']}" for x in s],
            "first_4": [x["first_4"] * 100 for x in s], "uniform": [x["uniform_first_4"] * 100 for x in s],
            "first_token": [x["first_token"] * 100 for x in s], "top1pct": [x["top1pct"] * 100 for x in s],
            "label": [f"{x['first_4']:.1%} (uniform {x['uniform_first_4']:.1%})" for x in s]}


def page_data(p: EvictionParams) -> dict:
    r = evaluate(p)
    at, sources, summaries_ = _drawn(p.policy, snapped(p.budget), p.layer, p.kv_head)
    return {
        **at,
        "sources": sources,
        "ranges": {},
        "formula": formula(p, r),
        "readouts": readouts(p, r),
        "notes": notes(p, r),
        "texts": {**at["texts"], "findings": findings(p), "provenance": provenance_html(),
                  "rule": rule_text(p), **summaries_},
        "run": {"kernel": "eviction", "request": run_request(p)},
    }


# What the plots draw depends on the policy, the snapped budget, the layer and the KV head only, 336 states in
# all: kept for the states a reader goes back to (a budget slider moves between six), as the decode frames are.
@baked.derived(maxsize=32)
def _drawn(policy: str, i: int, layer: int, kv_head: int) -> tuple[dict, dict, dict]:
    """The opening frame, the page's sources and their summaries in words."""
    d = data()
    p = EvictionParams(policy=policy, budget=budget_percents()[i], layer=layer, kv_head=kv_head)
    r = evaluate(p)
    kept = kept_mask(policy, i, layer, kv_head)
    seq_len = d["config"]["seq_len"]
    at = frame_data(p, frames() - 1)            # open on the whole run; reset steps from the cut
    here = {"budget": [r["budget_percent"]], "loss": [r["text_loss_bits"]], "top1": [r["text_top1"]],
            "recall": [r["recall_byte_acc"]],
            "label": [f"{SHORT[p.policy]} at {r['budget_percent']}%: {r['text_loss_bits']:.3f} bits/byte"]}
    full_loss = d["text"]["results"]["full"]["loss_bits"][0]
    full_recall = d["recall"]["results"]["full"]["recall_byte_acc"][0]
    sources = {
        **at["sources"],
        "curve": curves(),
        "reference": {"budget": [0, 100], "loss": [full_loss, full_loss], "top1": [1.0, 1.0],
                      "recall": [full_recall, full_recall], "chance": [d["recall"]["chance"]] * 2},
        "here": here,
        "map": attention_cells(p.layer),
        "band": evicted_band(kept, seq_len),
        "strip": strip(kept),
        "needles": {"left": [s for s, _ in d["shown"]["needles"]], "right": [e for _, e in d["shown"]["needles"]]},
        "received": received(p, kept),
        "sinks": sinks_source(),
    }
    return at, sources, plot_summaries(sources, layer)


def plot_summaries(sources: dict, layer: int) -> dict:
    """The map and the plots against budget in words, from the columns they draw."""
    strip_, needles = sources["strip"], sources["needles"]
    prompt = max(strip_["right"])
    kept_at = {j for a, b, st in zip(strip_["left"], strip_["right"], strip_["state"]) if st == "kept"
               for j in range(a, b)}
    secret = [j for a, b in zip(needles["left"], needles["right"]) for j in range(a, b)]
    runs_ = sum(st == "evicted" for st in strip_["state"])
    cells = sources["map"]
    seq = max(cells["x"]) + min(cells["x"])
    kept = (f"the policy keeps {len(kept_at)} of the prompt's {prompt} tokens ({pct(len(kept_at) / prompt)}) and "
            f"evicts the other {prompt - len(kept_at)} in {runs_} {'run' if runs_ == 1 else 'runs'}, hidden from the "
            f"{thousands(seq - prompt)} question tokens after the cut" if runs_ else
            f"the policy keeps all {prompt} of the prompt's tokens for the {thousands(seq - prompt)} question tokens "
            f"after the cut")
    amap = (f"Layer {layer}'s attention over a {thousands(seq)}-token sequence: {kept}; "
            f"{sum(j in kept_at for j in secret)} of the {len(secret)} tokens in the {len(needles['left'])} SECRET "
            f"lines are kept.")
    rc = sources["received"]
    in_secret = set(secret)

    def share(col, keep):
        total = sum(col)
        return sum(v for x, v, st in zip(rc["x"], col, rc["state"]) if keep(x, st)) / total if total else 0.0
    top = max(range(len(rc["score"])), key=rc["score"].__getitem__)
    score = (f"The prompt's own queries give the most attention to position {top} ({_char(rc['char'][top])}, summed "
             f"weight {sig(rc['score'][top])}); the kept tokens hold {pct(share(rc['score'], lambda x, st: st == 'kept'))} "
             f"of all that weight.")
    recv = (f"The questions give {pct(share(rc['mass'], lambda x, st: st == 'kept'))} of their attention to kept tokens "
            f"and {pct(share(rc['mass'], lambda x, st: x in in_secret))} to the SECRET lines, whose kept tokens get "
            f"{pct(share(rc['mass'], lambda x, st: x in in_secret and st == 'kept'))}.")
    sk = sources["sinks"]
    sinks = ("Share of each query's attention on the first 4 tokens: " + listing([f"{name} {sig(v)}%" for name, v in
                                                                                 zip(sk["layer"], sk["first_4"])])
             + f", against {sig(sk['uniform'][0])}% if attention were spread evenly.")
    c, ref, here = sources["curve"], sources["reference"], sources["here"]
    at = c["budget"][0]
    words = {"loss": ("Bits per byte on held-out text", lambda v: f"{v:.3f}"),
             "top1": ("Top-1 agreement with the full cache", pct),
             "recall": ("Answer bytes recalled", pct)}
    out = {}
    for key, (what, fmt) in words.items():
        out[key] = (f"{what} at a {at}% budget: " + listing([f"{SHORT[n]} {fmt(c[f'{key}_{n}'][0])}"
                                                             for n in POLICIES if n != "full"])
                    + f"; the full cache {fmt(ref[key][0])}. The chosen policy, {here['label'][0].split(':')[0]}: "
                      f"{fmt(here[key][0])}." + (f" Chance is {fmt(ref['chance'][0])}." if key == "recall" else ""))
    return summaries(amap=amap, score=score, recv=recv, sinks=sinks, **out)


def decode_summaries(sources: dict, k: int, steps: int, prompt: int) -> dict:
    """The decode raster at frame k and the loss so far, in words, from what they draw."""
    life = sources["life"]
    cached = [a for a, st in zip(life["left"], life["state"]) if st != "evicted"]
    evicted = sum(st == "evicted" for st in life["state"]) + len(sources["cut"]["left"])
    marks = dict(zip(sources["marks"]["what"], sources["marks"]["x"]))
    now = "" if "evicted now" not in marks else f"; position {int(marks['evicted now'])} is evicted at this step"
    raster = (f"After decode step {k} of {steps}: the cache holds {len(cached)} tokens, "
              f"{sum(a < prompt for a in cached)} from the {prompt}-token prompt and {sum(a >= prompt for a in cached)} "
              f"decoded; {evicted} have been evicted{now}.")
    sl = sources["steploss"]
    steploss = (f"Mean loss of the decoded bytes over {len(sl['step'])} steps: this policy {sl['policy'][-1]:.3f} "
                f"bits per byte, the full cache {sl['full'][-1]:.3f}; after the first step {sl['policy'][0]:.3f} "
                f"and {sl['full'][0]:.3f}.")
    return summaries(raster=raster, steploss=steploss)


# ---- decoding with a bounded cache: on-demand frames -----------------------------------------------------
def decode_state(policy: str, layer: int, kv_head: int) -> dict:
    """Each position's entry and eviction step in the decode simulation, for one layer and KV head."""
    dec = data()["decode"]
    pol = dec["policies"][policy]
    prompt, length = dec["prompt"], dec["length"]
    cut = unhex(pol["cut"][layer][kv_head], prompt)
    victims = [int(pol["victims"][layer][kv_head][k:k + 2], 16) for k in range(0, len(pol["victims"][layer][kv_head]), 2)]
    enter = [0] * prompt + [t - prompt + 1 for t in range(prompt, length)]
    leave = [None if cut[j] else 0 for j in range(prompt)] + [None] * (length - prompt)
    for step, v in enumerate(victims, start=1):
        if v != 0xFF:
            leave[v] = step
    return {"enter": enter, "leave": leave, "victims": victims, "cut": cut}


def streaming_cache(sinks: int, size: int, generating: int) -> list[int]:
    """StreamingLLM's rolling cache (Xiao et al., sec. 3.2, Figure 4): the KV positions held while generating
    token `generating` with `size` slots, the first `sinks` of them never evicted."""
    recent = max(sinks, generating - (size - sinks))
    return list(range(min(sinks, generating))) + list(range(recent, generating))


def cached_at(state: dict, k: int) -> list[int]:
    """Positions in the cache at frame k (after step k's eviction)."""
    return [j for j, (e, l) in enumerate(zip(state["enter"], state["leave"])) if e <= k and (l is None or l > k)]


def frames() -> int:
    dec = data()["decode"]
    return dec["length"] - dec["prompt"] + 1


def _char(ch: str) -> str:
    """A baked display character in words where a font may lack its glyph."""
    return {" ": "a space", "⏎": "a newline", "␂": "the start token", "⇥": "a tab", "◆": "a value byte"}.get(ch, ch)


def frame_data(p: EvictionParams, frame: int) -> dict:
    """Frame k: the cache after decode step k (k = 0: the cut at the end of the prompt)."""
    return _frame(p.policy, p.layer, p.kv_head, max(0, min(frames() - 1, int(frame))))


@baked.derived(maxsize=256)          # a reader steps back and forth through a policy's frames: about 10 KB each
def _frame(policy: str, layer: int, kv_head: int, k: int) -> dict:
    p = EvictionParams(policy=policy, layer=layer, kv_head=kv_head)
    dec = data()["decode"]
    prompt, length = dec["prompt"], dec["length"]
    st = decode_state(p.policy, p.layer, p.kv_head)
    life = {"left": [], "right": [], "bottom": [], "top": [], "state": []}
    for j in range(length):
        e, l = st["enter"][j], st["leave"][j]
        if e > k or l == 0:
            continue
        gone = l is not None and l <= k
        life["left"].append(j)
        life["right"].append(j + 1)
        life["bottom"].append(e)
        life["top"].append((l if gone else k + 1))
        life["state"].append("evicted" if gone else ("sink" if j < SINK_TOKENS and p.policy == "streaming_llm"
                                                    else "cached"))
    cut = {"left": [j for j in range(prompt) if st["leave"][j] == 0],
           "right": [j + 1 for j in range(prompt) if st["leave"][j] == 0]}
    cut["bottom"], cut["top"] = [-1.0] * len(cut["left"]), [0.0] * len(cut["left"])
    now = cached_at(st, k)
    chars = dec["chars"]
    pol = dec["policies"][p.policy]
    steps = len(pol["loss_bits"])
    cumulative = {"step": [], "policy": [], "full": []}
    a = b = 0.0
    for s in range(steps):
        a += pol["loss_bits"][s]
        b += dec["policies"]["full"]["loss_bits"][s]
        cumulative["step"].append(s + 1)
        cumulative["policy"].append(a / (s + 1))
        cumulative["full"].append(b / (s + 1))
    victim = st["victims"][k - 1] if k >= 1 and st["victims"][k - 1] != 0xFF else None
    marks = {"x": [], "y": [], "what": []}
    if k >= 1:
        marks["x"].append(prompt + k - 1 + 0.5)
        marks["y"].append(k + 0.5)
        marks["what"].append("new token")
    if victim is not None:
        marks["x"].append(victim + 0.5)
        marks["y"].append(k + 0.5)
        marks["what"].append("evicted now")
    sources = {"life": life, "cut": cut, "marks": marks,
               "cursor": {"step": [k, k], "bits": [0, max(cumulative["policy"] + cumulative["full"] + [1])]},
               "steploss": cumulative}
    return {
        "sources": sources,
        "animation": {"mode": "on_demand", "frames": frames(), "frame": k,
                      "caption": caption(p, k, st, now, victim)},
        "texts": {"decode_text": decode_html(chars, now, k, prompt, victim),
                  **decode_summaries(sources, k, frames() - 1, prompt)},
    }


def caption(p: EvictionParams, k: int, st: dict, now: list[int], victim: int | None) -> str:
    dec = data()["decode"]
    prompt, budget, chars = dec["prompt"], dec["budget"], dec["chars"]
    pol = dec["policies"][p.policy]
    where = f"layer {p.layer}, KV head {p.kv_head}"
    if k == 0:
        kept = [j for j in range(prompt) if st["cut"][j]]
        first = kept[:6]
        return (f"Step 0/{frames() - 1}: the {prompt}-byte prompt was prefilled with the full cache. At its end "
                f"{TITLES[p.policy]} keeps {len(kept)} of its {prompt} tokens ({where}; positions "
                f"{', '.join(map(str, first))}{', …' if len(kept) > len(first) else ''}). The cache holds "
                f"{'every token' if p.policy == 'full' else f'{budget} tokens'} from here on.")
    t = prompt + k - 1
    before = len(cached_at(st, k - 1))
    text = (f"Step {k}/{frames() - 1}: the byte at position {t} ({_quoted(chars[t])}) attends to "
            f"{'every earlier token' if p.policy == 'full' else f'the {before} cached tokens'} and itself")
    if victim is not None:
        text += (f", then {PROSE[p.policy]} evicts position {victim} ({_quoted(chars[victim])}): it "
                 f"{data()['decode']['rules'][p.policy]}")
    text += "."
    if k - 1 < len(pol["predicted"]):
        guess, full_guess = pol["predicted"][k - 1], dec["policies"]["full"]["predicted"][k - 1]
        text += (f" It predicts {_quoted(_byte(guess))} next (the full cache: {_quoted(_byte(full_guess))}); "
                 f"mean loss so far "
                 f"{sum(pol['loss_bits'][:k]) / k:.2f} bits/byte against "
                 f"{sum(dec['policies']['full']['loss_bits'][:k]) / k:.2f} with the full cache.")
    return text


def _quoted(ch: str) -> str:
    """One byte for a caption: quoted if it is a printable character, in words otherwise."""
    word = _char(ch) if len(ch) == 1 else ch
    return f"“{word}”" if len(word) == 1 else word


def _byte(b: int) -> str:
    if b == 10:
        return "a newline"
    if b == 32:
        return "a space"
    return chr(b) if 32 < b < 127 else f"0x{b:02x}"


def decode_html(chars: str, now: list[int], k: int, prompt: int, victim: int | None) -> str:
    """The decoded text so far, cached bytes highlighted, the evicted faded, the newest outlined."""
    cached = set(now)
    t = prompt + k - 1 if k >= 1 else prompt - 1
    parts = []
    for j, ch in enumerate(chars[:t + 1]):
        style = ("background:#bbf7d0;" if j in cached else "color:#6b7280;")
        if j == victim:
            style = "background:#fecaca;text-decoration:line-through;"
        if j == t:
            style += "outline:2px solid #111827;"
        shown = "BOS" if ch == "␂" else ch
        parts.append(f'<span style="{style}">{html.escape(shown)}</span>')
        if ch == "⏎":
            parts.append("<br>")
    return ('<div style="font-family:ui-monospace,monospace;font-size:15px;line-height:1.6;white-space:pre-wrap">'
            + "".join(parts) + "</div>")


# ---- words and formulas ---------------------------------------------------------------------------------
def rule_text(p: EvictionParams) -> str:
    d = data()
    s = d["settings"]
    i = snapped(p.budget)
    pct = budget_percents()[i]
    rules = {
        "full": "Keeps every prompt token: the reference every other policy is scored against.",
        "random": f"Keeps a uniformly random {pct}% of the prompt per layer and KV head (seeded, seed "
                  f"{s['random_seed']}): the baseline a scoring rule has to beat to be worth computing. "
                  + random_verdict(i),
        "streaming_llm": f"Keeps the first {s['sinks']} tokens (the attention sinks) and the most recent ones "
                         f"(Xiao et al., ICLR 2024, sec. 3.2); the same tokens as kvpress's StreamingLLMPress.",
        "no_sinks": "StreamingLLM with its sinks evicted: only the most recent tokens, i.e. window attention "
                    "(Xiao et al., sec. 3.1 and Table 2: window attention fails once the first tokens go).",
        "h2o": f"Keeps the tokens with the most attention summed over all the prompt's queries (the heavy "
               f"hitters), plus the most recent {s['h2o_recent_share']:.0%} of the budget, as the H2O paper states "
               "it (Zhang et al., NeurIPS 2023, sec. 3.2 and 4.1). Not kvpress's ObservedAttentionPress, which "
               "divides by the number of queries and keeps no recent window: that is the next policy.",
        "observed": "Keeps the tokens with the highest attention per query that sees them (the sum over the "
                    "prompt's queries divided by how many of them come after the token), averaged over each KV "
                    "head's query heads, with no recent window: kvpress's ObservedAttentionPress "
                    "(presses/observed_attention_press.py), which cites H2O but is a different rule.",
        "snapkv": f"Keeps the tokens the prompt's last {s['snapkv_window']} queries (its observation window) "
                  f"attend to most, average-pooled over {s['snapkv_kernel']} neighbours, plus the window itself "
                  "(Li et al., NeurIPS 2024, sec. 4 and Listing 1); kvpress's SnapKVPress and its defaults. "
                  + (f"At {pct}% the budget is smaller than the window, so only window tokens are kept, and which "
                     "of them (all tie on top) is torch.topk's pick, as in kvpress."
                     if d["recall"]["results"]["snapkv"]["budget_tokens"][i] < s["snapkv_window"] else ""),
    }
    return f"<b>{TITLES[p.policy]}.</b> {rules[p.policy]}"


def _listed(items: list[str]) -> str:
    """a, b and c."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _at(pcts: list[int]) -> str:
    return _listed([str(x) for x in pcts]) + "%"


def random_verdict(i: int) -> str:
    """Which rules random eviction beats at budget index i, on recall and on text, from the baked numbers."""
    d = data()
    pct = budget_percents()[i]
    if d["budgets"][i] >= 1.0:
        return "At 100% every policy keeps every token."
    rec, txt = d["recall"]["results"], d["text"]["results"]
    beaten = [SHORT[n] for n in RULES if rec["random"]["recall_byte_acc"][i] > rec[n]["recall_byte_acc"][i]]
    losing = [SHORT[n] for n in RULES if txt["random"]["loss_bits"][i] < txt[n]["loss_bits"][i]]
    out = (f"At {pct}% on this model it recalls more answer bytes than {_listed(beaten)}" if beaten else
           f"At {pct}% on this model every rule recalls at least as many answer bytes as it does")
    out += (f"; on held-out text its loss is lower than {_listed(losing)}'s." if losing else
            "; on held-out text every rule has a lower loss.")
    return out


def _sub(n: int) -> str:
    return str(n).translate(str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉"))


def formula(p: EvictionParams, r: dict) -> list[dict]:
    d = data()
    c = d["config"]
    f = r["budget_fraction"]
    n_text = d["text"]["sequences"] * (d["text"]["continuation"] - 1)
    answers = d["recall"]["answer_bytes"]
    s = d["settings"]
    which = {
        "full": ("all prompt tokens", f"{thousands(r['recall_prompt_tokens'])} of {thousands(r['recall_prompt_tokens'])}"),
        "random": ("the budget's worth of uniformly random tokens", f"{r['recall_budget_tokens']} random of "
                                                                    f"{r['recall_prompt_tokens']}"),
        "streaming_llm": ("the first 4 (sinks) + the most recent budget − 4",
                          f"4 + {max(0, r['recall_budget_tokens'] - 4)} of {r['recall_prompt_tokens']}"),
        "no_sinks": ("the most recent budget tokens", f"the last {r['recall_budget_tokens']} of "
                                                      f"{r['recall_prompt_tokens']}"),
        "h2o": ("top budget by score_j = Σ over prompt queries q, over the KV head's query heads, of a_qj; the "
                "last ⌊budget × 0.5⌋ forced in",
                f"{r['recall_budget_tokens'] - int(r['recall_budget_tokens'] * s['h2o_recent_share'])} heavy hitters + "
                f"{int(r['recall_budget_tokens'] * s['h2o_recent_share'])} recent of {r['recall_prompt_tokens']}"),
        "observed": ("top budget by score_j = mean over the KV head's query heads of (Σ over prompt queries q of "
                     "a_qj) ÷ (P − j), P the prompt's tokens: the queries that see token j",
                     f"{r['recall_budget_tokens']} by score of {r['recall_prompt_tokens']}, no recent window"),
        "snapkv": (f"top budget by mean over the KV head's query heads of avgpool{_sub(s['snapkv_kernel'])}(mean over "
                   f"the last w = {s['snapkv_window']} queries q of a_qj); the window's w tokens forced in (tied on "
                   "top when the budget is smaller)",
                   f"{max(0, r['recall_budget_tokens'] - s['snapkv_window'])} voted + "
                   f"{min(s['snapkv_window'], r['recall_budget_tokens'])} window of {r['recall_prompt_tokens']}"),
    }[p.policy]
    lines = [
        {"name": "Budget", "formula": "max(1, ⌊prompt tokens × (1 − compression ratio)⌋), compression ratio = "
                                      "1 − fraction (kvpress's compute_n_kept: whole tokens, floored)",
         "substituted": f"⌊{r['recall_prompt_tokens']} × (1 − {1 - f:g})⌋ = "
                        f"⌊{r['recall_prompt_tokens'] * (1 - (1 - f)):.6g}⌋ (recall prompt); "
                        f"⌊{r['text_prompt_tokens']} × (1 − {1 - f:g})⌋ = ⌊{r['text_prompt_tokens'] * (1 - (1 - f)):.6g}⌋ "
                        "(text prompt)",
         "result": f"{r['recall_budget_tokens']} and {r['text_budget_tokens']} tokens per layer and KV head"
                   + (f" ({p.budget:g}% snapped to {r['budget_percent']}%)" if r["snapped"] else "")},
        {"name": "Which tokens", "formula": which[0], "substituted": which[1],
         "result": f"{r['shown_kept']} kept in layer {p.layer}, KV head {p.kv_head} of the shown sequence"},
        {"name": "Cache numbers per token", "formula": "2 (K and V) × layers × KV heads × head dim",
         "substituted": f"2 × {c['n_layers']} × {c['n_kv_heads']} × {c['head_dim']}",
         "result": f"{thousands(c['cache_numbers_per_token'])} numbers"},
        {"name": "Cache bytes kept", "formula": "kept tokens × numbers per token × bytes per number",
         "substituted": f"{r['kept_tokens']} × {thousands(c['cache_numbers_per_token'])} × {BYTES_PER_NUMBER} B "
                        f"(bf16)",
         "result": f"{bytes_si(r['cache_bytes_kept'], 2)} of {bytes_si(r['cache_bytes_full'], 2)} for the whole "
                   f"prompt"},
        {"name": "Loss change (text)", "formula": "policy − full cache, bits per byte on the bytes after the prompt",
         "substituted": f"{r['text_loss_bits']:.4g} − {r['text_full_loss_bits']:.4g}",
         "result": f"{r['text_loss_delta_bits']:+.3f} bits/byte"},
        {"name": "Top-1 agreement (text)", "formula": "bytes where the top guess matches the full cache's ÷ bytes",
         "substituted": f"{round(r['text_top1'] * n_text)} ÷ {n_text}", "result": f"{r['text_top1']:.1%}"},
        {"name": "Recall accuracy", "formula": "answer bytes right ÷ answer bytes (questions after the cut)",
         "substituted": f"{round(r['recall_byte_acc'] * answers)} ÷ {answers}",
         "result": f"{r['recall_byte_acc']:.1%} (full cache {r['recall_full_byte_acc']:.1%}, chance "
                   f"{r['recall_chance']:.1%})"},
        {"name": f"Sink share (layer {p.layer})", "formula": "mean over queries t of Σ_{j<4} a_tj; uniform: "
                                                             "mean of 4 ÷ (t + 1)",
         "substituted": f"queries in the second half of {d['text']['sequences']} held-out sequences",
         "result": f"{r['sink_share_first_4']:.2%} on the first 4 tokens ({r['sink_share_first_token']:.2%} on "
                   f"the first); uniform {r['uniform_share_first_4']:.2%}"},
    ]
    return lines


def readouts(p: EvictionParams, r: dict) -> list[dict]:
    return [
        {"label": "Kept", "value": f"{r['kept_tokens']} of {r['recall_prompt_tokens']}",
         "detail": f"prompt tokens per layer and KV head: {bytes_si(r['cache_bytes_kept'])} of cache"},
        {"label": "Loss (text)", "value": f"{r['text_loss_bits']:.3f}",
         "detail": f"bits/byte, {r['text_loss_delta_bits']:+.3f} against the full cache"},
        {"label": "Top-1 agreement", "value": f"{r['text_top1']:.1%}",
         "detail": "of next-byte guesses match the full cache's"},
        {"label": "Recall", "value": f"{r['recall_byte_acc']:.1%}",
         "detail": f"of answer bytes; full cache {r['recall_full_byte_acc']:.1%}, chance {r['recall_chance']:.1%}"},
        {"label": "SECRET-line tokens kept", "value": f"{r['needle_tokens_kept']} of {r['needle_tokens']}",
         "detail": f"in the shown sequence, layer {p.layer}, KV head {p.kv_head}"},
    ]


def notes(p: EvictionParams, r: dict) -> list[str]:
    out = []
    if r["snapped"]:
        out.append(f"The budget {p.budget:g}% was snapped to the nearest measured one, {r['budget_percent']}%.")
    if p.policy == "full":
        out.append("The full cache keeps every token whatever the budget: it is the reference line.")
    elif r["budget_fraction"] >= 1.0:
        out.append("At 100% every policy keeps every token, so it is the full cache.")
    return out


def provenance_html() -> str:
    return f"Kernel results {html.escape(provenance_label())}."


def findings(p: EvictionParams) -> str:
    """What this model shows, worded from the baked numbers (so the words stay right after a re-bake)."""
    d = data()
    pcts = budget_percents()
    text, recall = d["text"]["results"], d["recall"]["results"]
    chance = d["recall"]["chance"]
    s = d["sinks"]
    top = max(s, key=lambda x: x["first_4"] / x["uniform_first_4"])
    ratio = top["first_4"] / top["uniform_first_4"]
    lo = 1 if len(pcts) > 1 else 0                              # 10%: a budget where policies differ
    if ratio >= 2:
        learned = ": this model has learned attention sinks."
    elif ratio < 1.25:
        learned = (": this model has not learned attention sinks (although every sequence starts with the same "
                   "start token, no layer dumps its spare attention there).")
    else:
        learned = ": weak sinks."
    out = [f"<b>Sinks.</b> The first 4 tokens get {top['first_4']:.1%} of the attention in layer {top['layer']}, "
           f"{ratio:.1f}× what an even spread would give them ({top['uniform_first_4']:.1%}){learned}"]
    with_s, without = text["streaming_llm"], text["no_sinks"]
    delta = without["loss_bits"][lo] - with_s["loss_bits"][lo]
    out.append(f"<b>Evicting them.</b> At {pcts[lo]}% of the prompt, StreamingLLM without its sinks scores "
               f"{without['loss_bits'][lo]:.3f} bits/byte and {without['top1'][lo]:.1%} top-1 agreement; with them "
               f"{with_s['loss_bits'][lo]:.3f} and {with_s['top1'][lo]:.1%} "
               + (f"(evicting the sinks costs {delta:.3f} bits/byte)." if delta > 0.005 else
                  f"(here the window alone does {-delta:.3f} bits/byte better)." if delta < -0.005 else
                  "(on this model evicting the sinks costs nothing measurable).")
               )
    out.append(f"<b>Heavy hitters.</b> Each query's top 1% of keys (5 of 512) carry "
               f"{min(x['top1pct'] for x in s):.0%} to {max(x['top1pct'] for x in s):.0%} of its attention, "
               f"depending on the layer.")
    others = [n for n in POLICIES if n != "full"]
    best = min(others, key=lambda n: text[n]["loss_bits"][lo])
    full_recall = recall["full"]["recall_byte_acc"][0]
    words = (f"<b>At {pcts[lo]}%.</b> The lowest text loss comes from {PROSE[best]} "
             f"({text[best]['loss_bits'][lo]:.3f} bits/byte; the full cache {text['full']['loss_bits'][0]:.3f}). ")
    if full_recall <= 2 * chance:
        words += (f"This model does not recall the planted values even with the full cache ({full_recall:.1%}; "
                  f"chance {chance:.1%}), so recall cannot tell the policies apart on it.")
    else:
        best_recall = max(others, key=lambda n: recall[n]["recall_byte_acc"][lo])
        br = recall[best_recall]["recall_byte_acc"][lo]
        words += (f"With the full cache it recalls {full_recall:.1%} of the answer bytes; "
                  + (f"at {pcts[lo]}% no policy does better than {br:.1%} ({PROSE[best_recall]}), "
                     f"chance being {chance:.1%}." if br < full_recall / 2 else
                     f"the best policy, {PROSE[best_recall]}, keeps {br:.1%}."))
    out.append(words)
    out.append(against_random())
    out.append(why_recall(lo if lo + 1 >= len(pcts) else lo + 1))
    return " ".join(out)


def against_random() -> str:
    """Where each rule does better or worse than random eviction, on text and on recall, from the baked numbers."""
    d = data()
    pcts = budget_percents()
    below = [i for i, f in enumerate(d["budgets"]) if f < 1.0]
    rec, txt = d["recall"]["results"], d["text"]["results"]
    on_text = {n: [pcts[i] for i in below if txt[n]["loss_bits"][i] > txt["random"]["loss_bits"][i]] for n in RULES}
    on_recall = {n: [pcts[i] for i in below if rec[n]["recall_byte_acc"][i] < rec["random"]["recall_byte_acc"][i]]
                 for n in RULES}
    worse_text = [f"{SHORT[n]} at {_at(v)}" for n, v in on_text.items() if v]
    worse_recall = [f"{SHORT[n]} at {_at(v)}" for n, v in on_recall.items() if v]
    out = "<b>Random against the rules.</b> On held-out text "
    out += (f"random eviction has a lower loss than {_listed(worse_text)}; every other rule beats it. "
            if worse_text else f"every rule has a lower loss than random eviction at every budget below 100%. ")
    out += ("On recall, random eviction recalls more answer bytes than " + _listed(worse_recall) + ": "
            "on this task it is not a floor the rules stay above." if worse_recall else
            "On recall, every rule recalls at least as many answer bytes as random eviction at every budget.")
    return out


def why_recall(i: int) -> str:
    """Why recall goes as it does (the baker's recall_coverage): which share of the planted lines each policy
    keeps, against the lines' share of the prompt and of the questions' attention."""
    d = data()
    cov = d["recall"]["coverage"]
    kept, lines = cov["secret_tokens_kept"], cov["on_lines"]
    pct = budget_percents()[i]
    rules = sorted(RULES, key=lambda n: -kept[n][i])
    fewer = [n for n in rules if kept[n][i] < kept["random"][i]]
    out = (f"<b>Why.</b> Recall needs the {len(d['shown']['needles'])} planted SECRET lines, wherever they sit in "
           f"the prompt: they are "
           f"{lines['tokens']:.0%} of its tokens and draw {lines['questions']:.0%} of the attention the questions "
           f"pay it with the full cache (all layers). Random eviction keeps every token with the same chance, so at "
           f"{pct}% it keeps {kept['random'][i]:.0%} of the lines' tokens (over every sequence, layer and KV head). ")
    if fewer:
        out += ("The rules choose by what the prompt's own queries attend to (H2O and observed attention: all of "
                "them; SnapKV: its last ones) or by position (StreamingLLM: the start and the end), and that is not "
                "where a later question looks: at the same budget " + _listed(
                    [f"{SHORT[n]} keeps {kept[n][i]:.0%}" for n in fewer]) + ".")
    else:
        out += "At this budget every rule keeps at least as many of the lines' tokens as random does."
    return out


# ---- "run it here": the real kernel on the compute server ----------------------------------------------
def run_request(p: EvictionParams) -> dict:
    """The server's eviction kernel on the same recall sequences the baked sweep used."""
    r = evaluate(p)
    policy = "streaming_llm" if p.policy == "no_sinks" else p.policy
    return {"model": r["model"], "policy": policy, "budget_fraction": r["budget_fraction"], "task": "recall",
            "sequences": data()["recall"]["sequences"], "sinks": 0 if p.policy == "no_sinks" else SINK_TOKENS}


def describe_run(p: EvictionParams, reply: dict) -> str:
    res, req = reply["result"], reply["params"]
    bits = 1 / math.log(2)
    name = "StreamingLLM with its sinks evicted" if req.get("policy") == "streaming_llm" and req.get("sinks") == 0 \
        else TITLES.get(req["policy"], req["policy"])
    text = (f"Measured on {reply.get('device_name', reply['device'])} ({reply['device']}, torch {reply['torch']}): "
            f"{name} keeping {res['budget']} of the {res['prefix']}-token prompt ({req['budget_fraction']:.0%}) on "
            f"{req['sequences']} recall sequences of {req['model']}, the questions scored after the cut. "
            f"Loss on the questions {res['loss'] * bits:.3f} bits/byte (full cache {res['full_loss'] * bits:.3f}), "
            f"top-1 agreement {res['top1_agreement']:.1%}")
    if "recall_byte_acc" in res:
        text += (f", recall {res['recall_byte_acc']:.1%} of answer bytes ({res['recall_exact']:.0%} of sequences "
                 f"with every answer right)")
    text += f"; {reply.get('wall_seconds', 0):.2f} s."
    d = data()
    key = "no_sinks" if req.get("policy") == "streaming_llm" and req.get("sinks") == 0 else req["policy"]
    if (req["model"] == d["provenance"].get("model", "gqa-large") and req["sequences"] == d["recall"]["sequences"]
            and req["budget_fraction"] in d["budgets"] and key in d["recall"]["results"]):
        i = d["budgets"].index(req["budget_fraction"])
        b = d["recall"]["results"][key]
        text += (f" The baked sweep ({d['provenance']['device']}) has {b['loss_bits'][i]:.3f} bits/byte and recall "
                 f"{b['recall_byte_acc'][i]:.1%} for the same setting.")
    return text
