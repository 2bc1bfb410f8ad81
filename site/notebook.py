"""`kvx.show(slug, **params)`: an explainer live in Jupyter (or any Panel server), run by this Python.

No second copy of any explainer: the view is the page's own `view.layout` (the same Bokeh controls,
sources, ranges and texts, found by the names the page runtime uses: param:, error:, source:, range:,
text:, anim:, run:), and every change goes through `registry.page_json`, the function the page's
Pyodide worker calls, so the numbers are the page's to the last digit. What the page draws outside
Bokeh (readouts, notes, the formula with the current values) is drawn here by Panel HTML panes.
"Run it here" runs the real kernel in this process when PyTorch is installed.

Needs the `notebook` extra (Panel). Panel is imported only here, never by the models.
"""
from __future__ import annotations

import html
import importlib
import json

import panel as pn

from kvx.explainers.core.params import ParamError
from kvx.explainers.registry import get, page_json, params_from
from kvx.site import widgets

_extension_loaded = False
FRAME_MS = 350                     # one animation frame at 1x, as on the page
CSS = """
.kvx-nb-readouts { display: grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr)); gap: 0.6rem; }
.kvx-nb-readout { border: 1px solid #d1d5db; border-radius: 6px; padding: 0.4rem 0.6rem; }
.kvx-nb-label, .kvx-nb-detail { color: #4b5563; font-size: 0.85rem; }
.kvx-nb-value { font-size: 1.5rem; font-weight: 700; font-variant-numeric: tabular-nums; }
.kvx-nb-formula div { font-family: ui-monospace, 'DejaVu Sans Mono', monospace; }
.kvx-nb-notes { color: #92400e; }
"""


def _torch_available() -> bool:
    try:
        importlib.import_module("torch")
    except ImportError:
        return False
    return True


def _readouts_html(items: list[dict]) -> str:
    cards = "".join(f'<div class="kvx-nb-readout"><div class="kvx-nb-label">{html.escape(r["label"])}</div>'
                    f'<div class="kvx-nb-value">{html.escape(str(r["value"]))}</div>'
                    f'<div class="kvx-nb-detail">{html.escape(str(r.get("detail", "")))}</div></div>' for r in items)
    return f'<div class="kvx-nb-readouts">{cards}</div>'


def _formula_html(lines: list[dict]) -> str:
    rows = "".join(f'<p><b>{html.escape(l["name"])}</b><div>{html.escape(l["formula"])}</div>'
                   f'<div>= {html.escape(str(l["substituted"]))}</div><div><b>= {html.escape(str(l["result"]))}</b></div></p>'
                   for l in lines)
    return f'<div class="kvx-nb-formula"><h3>The formula, with your numbers</h3>{rows}</div>'


class NotebookExplainer:
    """One explainer's view, wired to the model in this process. `.panel` is what the notebook shows."""

    def __init__(self, slug: str, **params):
        self.explainer = get(slug)
        self.slug = slug
        start = params_from(self.explainer, {k: v for k, v in params.items()})   # ParamError on a bad value
        self.values = {k: "" if v is None else str(v) for k, v in start.as_dict().items()}
        self.data = self._ask(dict(self.values))["data"]
        view = importlib.import_module(f"kvx.explainers.{slug.replace('-', '_')}.view")
        # Each plot's summary under it, as on the page (the model's texts "summary:<key>" fill them).
        self.layout = widgets.plot_summaries(view.layout(self.explainer.params, start.as_dict(), self.data))
        self.models = {m.name: m for m in self.layout.references() if getattr(m, "name", None)}
        self.frame = 0
        self.timer = None
        self.speed = 1.0
        self.status = pn.pane.HTML("", sizing_mode="stretch_width")
        self.readouts = pn.pane.HTML("", sizing_mode="stretch_width", stylesheets=[CSS])
        self.notes = pn.pane.HTML("", sizing_mode="stretch_width", stylesheets=[CSS])
        self.formula = pn.pane.HTML("", sizing_mode="stretch_width", stylesheets=[CSS])
        self._wire()
        self._apply(self.data, keep_frame=False)
        self.panel = pn.Column(self.status, self.readouts, self.notes,
                               pn.pane.Bokeh(self.layout, sizing_mode="stretch_width"), self.formula,
                               sizing_mode="stretch_width", name=f"kvx: {self.explainer.title}")
        self.status.object = "Live: every control runs the model in this notebook's Python."

    # ---- the model, exactly as the page's worker calls it -------------------------------------------
    def _ask(self, values: dict) -> dict:
        return json.loads(page_json(self.slug, json.dumps(values)))

    def model(self, name: str):
        return self.models.get(name)

    def read_params(self) -> dict:
        return {k: str(self.model(f"param:{k}").value or "").strip() for k in self.values}

    # ---- wiring ------------------------------------------------------------------------------------
    def _wire(self):
        for k in self.values:
            self.model(f"param:{k}").on_change("value", lambda attr, old, new: self._setting or self.update())
        if self.model("anim:play") is not None:
            self.model("anim:play").on_click(self.toggle)
            self.model("anim:step").on_click(lambda: self._seek(self.frame + 1))
            self.model("anim:back").on_click(lambda: self._seek(self.frame - 1))
            self.model("anim:reset").on_click(lambda: self._seek(0))
            self.model("anim:speed").on_change("value", lambda attr, old, new: self._set_speed(new))
            self.model("anim:frame").on_change("value", lambda attr, old, new: self._slider(new))
        button = self.model("run:button")
        if button is not None:
            if _torch_available():
                button.label = "▶ Run it here, in this notebook's Python (PyTorch)"
                button.disabled = False
                button.on_click(self.run_here)
            else:
                button.label = "Run it here: PyTorch is not installed in this Python (pip install 'kvx[kernels]')"

    # ---- updates -------------------------------------------------------------------------------------
    _setting = False        # update() is moving controls: their own on_change waits for it (see update)

    def update(self, **changes):
        """Re-run the model on the controls' values (and `changes`, which also move the controls), once.

        A control's on_change runs as its value is set, so moving them one by one ran the model once per control,
        the first times on half the change (a combination that may be refused); they are moved first, quietly."""
        for k in changes:
            if k not in self.values:
                raise ParamError(k, f"{k} is not a parameter; the parameters are {', '.join(self.values)}.")
        self._setting = True
        try:
            for k, v in changes.items():
                self.model(f"param:{k}").value = "" if v is None else str(v)
        finally:
            self._setting = False
        reply = self._ask(self.read_params())
        self._show_errors(reply)
        if reply["ok"]:
            self.values = {k: "" if v is None else str(v) for k, v in reply["params"].items()}
            self._apply(reply["data"], keep_frame=True)

    def _show_errors(self, reply: dict):
        field = None if reply["ok"] else reply["field"]
        for name, m in self.models.items():
            if name.startswith("error:"):
                m.text = html.escape(reply["message"]) if name == f"error:{field}" else ""
        if not reply["ok"] and self.model(f"error:{field}") is None:
            self.notes.object = f'<div class="kvx-nb-notes">{html.escape(reply["message"])}</div>'

    def _anim(self):
        return self.data.get("animation")

    def _last(self) -> int:
        return self._anim()["frames"] - 1 if self._anim() else 0

    def _apply(self, data: dict, keep_frame: bool):
        was_at_end = self.frame >= self._last()
        self.data = data
        a = self._anim()
        for key, cols in data["sources"].items():
            if not (a and a.get("mode") != "on_demand" and key == a["source"]):   # cumulative: _show_frame
                self.model(f"source:{key}").data = cols
        for name, (start, end) in (data.get("ranges") or {}).items():
            r = self.model(f"range:{name}")
            r.start, r.end = start, end
        if a:
            self.model("anim:frame").end = max(1, self._last())
            if a.get("mode") == "on_demand":
                self._frame_local(a["frame"], a.get("caption", ""))   # the model chose the opening frame
            else:
                self._show_frame(min(self.frame, self._last()) if keep_frame and not was_at_end else self._last())
        self._texts(data.get("texts") or {})
        self.readouts.object = _readouts_html(data.get("readouts") or [])
        self.formula.object = _formula_html(data.get("formula") or [])
        notes = " ".join(data.get("notes") or [])
        self.notes.object = f'<div class="kvx-nb-notes">{html.escape(notes)}</div>' if notes else ""

    def _texts(self, texts: dict):
        for name, text in texts.items():
            m = self.model(f"text:{name}")
            if m is not None:
                m.text = text

    def _caption(self, text: str):
        if self.model("anim:caption") is not None:
            self.model("anim:caption").text = text

    # ---- animation -----------------------------------------------------------------------------------
    def _frame_local(self, k: int, caption: str | None = None):
        self.frame = k
        slider = self.model("anim:frame")
        if slider.value != k:
            self._moving = True
            slider.value = k
            self._moving = False
        if caption is not None:
            self._caption(caption)

    def _show_frame(self, k):
        a = self._anim()
        k = max(0, min(self._last(), round(k)))
        if a.get("mode") == "on_demand":
            reply = self._ask({**self.read_params(), "_frame": k})
            if reply["ok"]:
                for key, cols in reply["data"]["sources"].items():
                    self.model(f"source:{key}").data = cols
                self.data["animation"] = reply["data"]["animation"]
                self._texts(reply["data"].get("texts") or {})
                self._frame_local(reply["data"]["animation"]["frame"], reply["data"]["animation"].get("caption", ""))
            return
        full = self.data["sources"][a["source"]]
        keep = [i for i, f in enumerate(full["frame"]) if f <= k]
        self.model(f"source:{a['source']}").data = {c: [v[i] for i in keep] for c, v in full.items()}
        self._frame_local(k, a["captions"][k] if k < len(a["captions"]) else "")

    def _seek(self, k):
        self.pause()
        self._show_frame(k)

    def _slider(self, value):
        if not getattr(self, "_moving", False) and round(value) != self.frame:
            self._seek(value)

    def _set_speed(self, label: str):
        self.speed = float(label.rstrip("×") or 1)
        if self.timer is not None:
            self.pause()
            self.toggle()

    def pause(self):
        if self.timer is not None:
            self.timer.stop()
            self.timer = None
        if self.model("anim:play") is not None:
            self.model("anim:play").label = "▶ Play"

    def toggle(self, *_):
        if self.timer is not None:
            return self.pause()
        if self.frame >= self._last():
            self._show_frame(0)

        def tick():
            self._show_frame(self.frame + 1)
            if self.frame >= self._last():
                self.pause()
        self.model("anim:play").label = "⏸ Pause"
        self.timer = pn.state.add_periodic_callback(tick, period=max(20, round(FRAME_MS / self.speed)))

    # ---- "run it here": the real kernel, in this process ---------------------------------------------
    def run_here(self, *_):
        from kvx.compute.kernel_specs import run_locally       # needs torch: only when the reader asks
        run = self.data.get("run")
        if not run:
            return
        self._texts({"run_result": "Running the kernel in this Python…"})
        reply = run_locally(run["kernel"], run["request"])
        answer = self._ask({**self.read_params(), "_run_reply": json.loads(json.dumps(reply, default=str))})
        if answer["ok"]:
            self._texts(answer["data"].get("texts") or {})
        else:
            self._show_errors(answer)


def show(slug: str, **params):
    """The explainer `slug`, live, starting from `params` (the page's URL parameters, as Python values)."""
    global _extension_loaded
    if not _extension_loaded and pn.state.curdoc is None:     # in Jupyter: load Panel's JS once,
        pn.extension(inline=True)                              # into the notebook itself, not from a CDN
        _extension_loaded = True
    return NotebookExplainer(slug, **params).panel
