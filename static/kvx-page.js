//# allFunctionsCalledOnLoad
// (V8's compile hint, Chromium 136 on: every function here is compiled as the script loads, not on its first call.
// The reader's first change was the first call of onResult and the error boxes' path, which the warm-up does not
// reach: compiling them then cost 0.2-0.4 ms of that change's drawing, and nothing with the hint. Compiling the
// whole file costs about 2.8 ms more than compiling none of it (V8 in Node, this host), part of which the load
// paid anyway. Other browsers read it as a comment.)
// The page runtime shared by every explainer.
//
// The page arrives with its plots drawn from baked data. This script starts the Python worker,
// sends it every control change (the latest request wins; stale replies are dropped), and puts the
// model's reply into the named Bokeh sources, the formula and the readouts. It also drives the
// animation (play, pause, step, reset, speed, keyboard) and keeps the state in the URL.
// Names it relies on: param:<name>, error:<name>, source:<key>, range:<name>, anim:<part>, upload:<name>.

const cfg = JSON.parse(document.getElementById("kvx-config").textContent);
const html = document.documentElement;
const names = Object.keys(cfg.defaults);
const state = { data: cfg.baked, frame: 0, wantFrame: null, timer: null, speed: 1, latest: 0, sentAt: 0, ready: false,
                queued: false, applied: 0, latestFrame: 0, queuedFrame: null,
                handled: 0, handledFrame: 0 };     // the newest request and frame request whose reply came back
// ---- the first screen first ----------------------------------------------------------------------------
// BokehJS builds, lays out and paints every root of a page before any of it shows, and Python starts only after
// that (it would compete with the drawing for the CPU). On eviction that was nine plots, most of a 1.2 s first
// screen, though none of them is on it. So a plot below the first screen (a `kvx-later` box that holds the
// plot's height: site/dom_layout.py) is drawn after Python is ready, a plot a task so a change never waits
// long, or at once when the reader scrolls near it. Bokeh's own embed_items is wrapped before its script runs
// (that waits for DOMContentLoaded, which waits for this module): the same document and views, each root
// drawn as Bokeh draws it, the ones below the first screen later.
const later = new Map();     // kvx-later box -> its root model, not drawn yet
let drawRoot = null;         // (box) -> Promise: draws one of them (set once the document is embedded)
let lateObserver = null;     // draws a box the reader scrolls near
let firstScreen = null;      // a Promise: the first screen is drawn (the document exists before its views do)
const onAllDrawn = [];        // what waits for every plot to be drawn (whenAllDrawn)
function allDrawn() {
  html.setAttribute("data-kvx-all-drawn", String(Math.round(performance.now())));
  for (const f of onAllDrawn.splice(0)) f();
}
const whenAllDrawn = (f) => (html.hasAttribute("data-kvx-all-drawn") ? f() : onAllDrawn.push(f));
if (window.Bokeh && window.Bokeh.embed) window.Bokeh.embed.embed_items = firstScreenFirst(window.Bokeh.embed.embed_items);

function firstScreenFirst(standard) {
  return (docsJson, items) => (firstScreen = embedFirstScreen(standard, docsJson, items));
}

async function embedFirstScreen(standard, docsJson, items) {
  const item = items.length === 1 ? items[0] : null;
  if (!item || item.docid == null || !item.root_ids || !document.querySelector(".kvx-later")) {
    const views = await standard(docsJson, items);
    allDrawn();
    return views;
  }
  if (typeof docsJson === "string") docsJson = JSON.parse(Bokeh.require("core/util/string").unescape(docsJson));
  const d = Bokeh.require("document").Document.from_json(docsJson[item.docid]);
  const roots = d.roots();
  const elementOf = (m) => document.getElementById(item.roots[m.id]);
  const boxOf = (m) => elementOf(m)?.closest(".kvx-later") ?? null;
  // add_document_standalone draws every model of all_roots (the roots, then the document's config) into
  // roots[its index there]: here only the config, and the page draws the roots itself, the way it would.
  const config = d.all_roots.filter((m) => !roots.includes(m));
  Object.defineProperty(d, "all_roots", { configurable: true, get: () => config });
  try {
    await Bokeh.embed.add_document_standalone(d, document.body, [], item.use_for_title);
  } finally {
    delete d.all_roots;
  }
  const views = d.views_manager;
  const draw = async (m) => {
    const view = await views.build_view(m);
    view.build(elementOf(m));
    Bokeh.embed.index.add(view);
    const box = boxOf(m);
    if (box) box.style.minHeight = "";   // drawn: the plot holds its own height (narrower on a phone, say)
  };
  // Every root but the plots that may wait first (controls have no height until drawn); then, with those laid
  // out, the plots whose boxes start on the first screen. The others wait.
  for (const m of roots) if (!boxOf(m)) await draw(m);
  const bottom = window.innerHeight;
  for (const m of roots) {
    const box = boxOf(m);
    if (!box) continue;
    if (box.getBoundingClientRect().top < bottom) await draw(m);
    else later.set(box, m);
  }
  drawRoot = async (box) => {
    const entry = later.get(box);        // its root model
    if (!entry) return;
    later.delete(box);
    lateObserver?.unobserve(box);
    await draw(entry);
    if (!later.size) allDrawn();
  };
  if (!later.size) allDrawn();
  // From the reader's first scroll on (not before: a plot just below the first screen would be drawn with it),
  // a plot within a screen of what they see is drawn at once.
  if ("IntersectionObserver" in window && later.size) {
    window.addEventListener("scroll", () => {
      lateObserver = new IntersectionObserver((seen) => {
        for (const e of seen) if (e.isIntersecting) drawRoot(e.target).then(refit);   // titles fitted, as the others
      }, { rootMargin: "100% 0px" });
      for (const box of later.keys()) lateObserver.observe(box);
    }, { once: true, passive: true });
  }
  return [views];
}

// The rest, once Python is ready (or cannot start): one plot a task, in page order, when the main thread is
// idle and no reply is on its way (a plot's drawing, 50-200 ms, would hold up the reply's).
function drawTheRest() {
  if (!drawRoot || !later.size) return;
  const soon = window.requestIdleCallback ? (f) => window.requestIdleCallback(f, { timeout: 100 }) : (f) => setTimeout(f, 0);
  const next = () => {
    const box = later.keys().next().value;
    if (!box) return refit();          // their titles and labels, fitted as the first screen's were
    if (awaitingReply()) return setTimeout(() => soon(next), 20);
    drawRoot(box).then(() => soon(next));
  };
  soon(next);
}

// Per change, ms from the request sent: to its reply applied to the plots' sources (timings), and to the end of
// the frame that shows it (painted: what a reader waits for). BokehJS takes the new data in and repaints its
// canvases after the first, in that frame, which on most pages costs more than everything before it (one
// load-balancer change: 21 ms to applied, about 100 to painted).
const timings = [];
const painted = [];
// And where each change's time to applied went, ms (the benchmark's breakdown of a first change against the rest):
// waiting to be sent, on its way to the worker, in the worker (Python's share in it), on its way back, and taken
// into the plots. performance.timeOrigin puts the page's clock and the worker's on one line.
const parts = [];
const clock = () => performance.timeOrigin + performance.now();
let doc = null;
let worker = null;
const uploads = {};          // name -> text of a file the reader gave the model (data, never in the URL)

// Bokeh's get_model_by_name walks every model of the document (1.4 ms a change on load-balancer), and the
// page's models never change: look each one up once.
const models = new Map();
const model = (name) => {
  let m = models.get(name);
  if (m === undefined) {
    m = doc.get_model_by_name(name);
    if (m) models.set(name, m);
  }
  return m;
};

// A source is given new data only if its columns changed: every assignment re-renders its glyphs and the
// legends that show them, even with equal values (apply 7.7 -> 6.3 ms on cache-renting, 7.5 -> 5.5 on paging).
const sent = new Map();      // source key -> the columns it was last given
const column = (v) => Array.isArray(v) || ArrayBuffer.isView(v);    // a list, or a packed column (the worker's)
function sameColumns(a, b) {
  if (!a) return false;
  const keys = Object.keys(a);
  if (keys.length !== Object.keys(b).length) return false;
  for (const k of keys) {
    const x = a[k], y = b[k];
    if (!column(x) || !column(y) || x.length !== y.length) return false;
    for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
  }
  return true;
}
function setData(key, cols, force = false) {
  if (!force && sameColumns(sent.get(key), cols)) return;
  sent.set(key, cols);
  model(`source:${key}`).data = cols;
}
// A reply's sources, all but a cumulative animation's (showFrame gives that one the rows up to the frame).
function setSources(sources, force = false) {
  for (const [key, cols] of Object.entries(sources)) {
    if (!(anim() && key === anim().source)) setData(key, cols, force);
  }
}
const anim = () => state.data.animation;
const lastFrame = () => (anim() ? anim().frames - 1 : 0);

function setStatus(text, kind) {
  const el = document.getElementById("kvx-status");
  el.textContent = text;
  el.dataset.kind = kind;
}

// ---- URL state -----------------------------------------------------------------------------------
function urlParams(search) {
  const q = new URLSearchParams(search);
  const out = {};
  for (const k of names) if (q.has(k)) out[k] = q.get(k);
  const step = q.has("step") ? Number(q.get("step")) : NaN;       // abc -> ignored; -3 and 10^9 are clamped
  return { params: out, step: Number.isFinite(step) ? step : null };
}

function writeURL(params) {
  const q = new URLSearchParams(location.search);
  for (const k of names) {
    const dflt = cfg.defaults[k] === null ? "" : String(cfg.defaults[k]);
    if (params[k] !== "" && String(params[k]) !== dflt && Number(params[k]) !== Number(dflt)) q.set(k, params[k]);
    else q.delete(k);
  }
  // The frame is always in the address (a link opens this frame), including one a link asked for
  // that is still on its way.
  if (anim()) q.set("step", state.wantFrame !== null ? state.wantFrame : state.frame); else q.delete("step");
  const s = q.toString();
  if (s === location.search.slice(1)) return;     // the same address: replaceState costs about a millisecond
  history.replaceState(null, "", s ? `?${s}` : location.pathname);
}

// The address follows a change once the change is on screen, not while it is computed and drawn: each
// replaceState has the browser update its session history and fetch the page's icon again, work that ran on
// the same two cores as the worker's Python and the reply's drawing (cache-renting and quantization in
// Chromium, changes 0.3 s apart: round trip p95 21-23 ms with the address written at once, 11-14 ms without).
// So a change only asks for the address (urlSoon); it is written after the frame that follows the reply, or
// at once when no reply is on its way, and before the page is hidden or left.
let urlWanted = false;
let urlScheduled = false;
const awaitingReply = () => state.ready && worker !== null &&
  (state.handled < state.latest || state.handledFrame < state.latestFrame);

function urlSoon() {
  urlWanted = true;
  if (urlScheduled || awaitingReply()) return;       // the reply asks again once it is applied (afterReply)
  urlScheduled = true;
  afterNextFrame(() => {
    urlScheduled = false;
    if (!awaitingReply()) flushURL();
  });
}

// Runs fn once the next frame is done. A callback for the next animation frame runs before BokehJS's own (it
// asks for its repaint while it takes in new data, after this is called), and a task posted from it runs once
// that frame's scripts, style, layout, paint and commit are done: the "next paint" that the browser's own
// Interaction to Next Paint measures to, as closely as a page can tell.
function afterNextFrame(fn) {
  requestAnimationFrame(() => {
    const channel = new MessageChannel();
    channel.port1.onmessage = () => fn();
    channel.port2.postMessage(null);
  });
}

function flushURL() {
  if (!urlWanted) return;
  urlWanted = false;
  writeURL(readParams());
}

function afterReply() {
  if (urlWanted) urlSoon();
}

// ---- controls ------------------------------------------------------------------------------------
function readParams() {
  const p = {};
  for (const k of names) p[k] = String(model(`param:${k}`).value ?? "").trim();
  for (const [k, text] of Object.entries(uploads)) p[`_${k}`] = text;
  return p;
}

// ---- uploads: a file (say a trace) the model reads as data; sent as `_<name>` with every request -----
function decodeBase64(b64) {
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i += 1) bytes[i] = bin.charCodeAt(i);
  return new TextDecoder().decode(bytes);
}

function onUpload(widget) {
  const name = widget.name.slice("upload:".length);
  const value = Array.isArray(widget.value) ? widget.value[0] : widget.value;
  if (!value) return;
  uploads[name] = decodeBase64(value);
  request();
}

function clearUpload(name) {
  delete uploads[name];
  request();
}

function setControls(values) {
  for (const k of names) {
    const v = values[k] ?? cfg.defaults[k];
    setQuietly(model(`param:${k}`), v === null ? "" : String(v));
  }
}

// Bokeh runs a control's callback (CustomJS.execute is async) a few microtasks after its value changes, when a
// flag raised around the writing is down again: "reset all" after two changes asked Python three times, and the
// load balancer drew its answer after all three. So the page counts the changes it writes itself, and their
// callbacks ask for nothing. Microtasks all run before the next event, so no reader's change is ever counted.
const echoes = new Map();                   // control model -> callbacks still to come for values the page wrote
function setQuietly(widget, value) {
  if (widget.value === value) return;       // no change: Bokeh calls nothing
  expectEcho(widget);
  widget.value = value;
}

function expectEcho(widget) {
  echoes.set(widget, (echoes.get(widget) || 0) + 1);
}

// Events given to a control's box as a reader's would be; a value they commit is the page's own (its echo counted).
function dispatchQuietly(widget, input, events) {
  const before = widget.value;
  for (const event of events) input.dispatchEvent(event);
  if (widget.value !== before) expectEcho(widget);                // its callback is coming
}

function echoed(widget) {
  const n = echoes.get(widget) || 0;
  if (n > 1) echoes.set(widget, n - 1);
  else echoes.delete(widget);
  return n > 0;
}

// Every reply clears the messages under the controls. Only those that change are written: a Bokeh text set
// again is laid out again, and walking the document's models for the uploads' boxes on every reply cost 1-3 ms
// of the first change's drawing (0.3-0.5 ms of the next ones) on cross-model and prompt-caching.
let errorBoxes = null;
function errorBoxList() {                               // an upload's message sits under its file input
  errorBoxes ??= names.map((k) => model(`error:${k}`)).concat([...doc.all_models].filter((box) =>
    box.name && box.name.startsWith("error:") && !names.includes(box.name.slice(6))));
  return errorBoxes;
}

function showErrors(field, message) {
  for (const box of errorBoxList()) {
    const text = box.name === `error:${field}` ? message : "";
    if (box.text !== text) box.text = text;
  }
  const notes = document.getElementById("kvx-notes");
  if (field === null || !(names.includes(field) || model(`error:${field}`))) {
    const kind = message ? "error" : "";                // a refusal looks like one; the model's notes do not
    if (notes.textContent !== message || notes.dataset.kind !== kind) {
      notes.textContent = message;
      notes.dataset.kind = kind;
    }
  }
}

// A control's label as the reader sees it (the same words the control shows), for messages that would
// otherwise name the code's field ("gpu count", not "gpu_count").
function labelOf(field) {
  const widget = names.includes(field) && model(`param:${field}`);
  return (widget && widget.title) || field;
}

function labelled(field, message) {
  if (!field || !message) return message;
  return message.replace(new RegExp(`\\b${field}\\b`, "g"), labelOf(field));
}

// A required box left empty says so under the control, instead of the model quietly using its default.
function emptyRequired(params) {
  for (const spec of cfg.params || []) {
    if (spec.optional || params[spec.name] !== "") continue;
    const range = spec.kind === "choice" ? `one of ${spec.choices.join(", ")}`
      : `a number from ${spec.min} to ${spec.max}${spec.unit ? ` ${spec.unit}` : ""}`;
    return { field: spec.name, message: `${labelOf(spec.name)} needs a value: type ${range}; the box is empty.` };
  }
  return null;
}

function request() {
  const params = readParams();
  const empty = emptyRequired(params);
  if (!empty && state.ready) ask("run", params);
  urlSoon();
  if (empty) { showErrors(empty.field, empty.message); return; }
  if (!state.ready) {
    state.queued = true;
    if (state.started) {
      if (!worker) startWorker();                        // the last one died: start a new one
      setStatus("Python is warming up; your change applies as soon as it is ready.", "wait");
    }
  }
}

// Animations whose frames are not cumulative ask the model for each frame (the latest ask wins).
function requestFrame(k) {
  if (!state.ready) { state.queuedFrame = k; return; }
  ask("frame", { ...readParams(), _frame: k });
}

// At most one request of each kind (a change, a frame) is in the worker at a time; a newer one waits here, in
// place of any that waited before it, and goes once the reply comes. The worker takes its messages in order and
// evaluates each, so a frame slider dragged across 20 frames, or a choice stepped through with the arrow keys,
// had every value evaluated, and the last one drawn only after all of them: the latest ask won, but late.
const held = { run: null, frame: null };    // kind -> {params, at}: the newest ask waiting for the worker
function ask(kind, params, at = performance.now()) {
  const busy = kind === "run" ? state.handled < state.latest : state.handledFrame < state.latestFrame;
  if (busy) { held[kind] = { params, at }; return; }
  let id;
  if (kind === "run") {
    id = state.latest += 1;
    state.sentAt = at;                       // a round trip runs from the reader's change, a wait here included
    state.postedAt = clock();
  } else {
    state.latestFrame += 1;
    id = `frame-${state.latestFrame}`;
  }
  worker.postMessage({ type: "run", id, slug: cfg.slug, params });
}

// The reply to the request in the worker has come: a newer ask waiting goes now, and this reply, older than
// what the controls show, is not drawn. Returns whether one went.
function askHeld(kind) {
  const next = held[kind];
  if (next === null) return false;
  held[kind] = null;
  ask(kind, next.params, next.at);
  return true;
}

function onFrame(id, reply) {
  if (id !== `frame-${state.latestFrame}`) return;
  state.handledFrame = state.latestFrame;
  if (askHeld("frame")) return;
  afterReply();
  if (!reply.ok) return;
  if (JSON.stringify(reply.params) !== JSON.stringify(state.params)) return;   // from before a change
  const data = reply.data;
  for (const [key, cols] of Object.entries(data.sources)) setData(key, cols);
  state.data.animation = data.animation;
  applyTexts(data.texts || {});
  setText("caption", data.animation.caption || "");
  html.dataset.kvxFrame = String(data.animation.frame);
  html.dataset.kvxFrameApplied = String(Number(html.dataset.kvxFrameApplied || 0) + 1);
  afterNextFrame(() => {
    state.framePaintedAt = performance.now();
    html.dataset.kvxFramePainted = String(Number(html.dataset.kvxFramePainted || 0) + 1);
  });
}

// A long run (a big uploaded trace) says how far it is, with a bar, so a half-minute replay is never silent.
function onProgress(msg) {
  if (msg.id !== state.latest) return;
  const el = document.getElementById("kvx-status");
  setStatus(`Working: ${msg.text} (${Math.round(100 * msg.share)}%) `, "wait");
  const bar = document.createElement("progress");
  bar.max = 1;
  bar.value = msg.share;
  el.append(bar);
  state.progressShown = true;
}

function onResult(id, reply, arrival) {
  if (typeof id === "string") return id.startsWith("warm-") ? warmPassed?.(reply) : onFrame(id, reply);
  if (id !== state.latest) return;            // a newer request is on its way
  state.handled = id;
  if (askHeld("run")) return;
  afterReply();                               // runs after this reply is drawn
  if (state.progressShown) { state.progressShown = false; setStatus(state.readyText, "ready"); }
  if (!reply.ok) {
    if (reply.field in uploads) delete uploads[reply.field];   // a bad file is not kept: the next change uses the model's own data
    showErrors(reply.field, labelled(reply.field, reply.message));
    if (state.wantFrame !== null && anim()) {           // a link's step still applies to the plots kept
      const k = state.wantFrame;
      state.wantFrame = null;
      showFrame(k);
      urlSoon();
    }
    html.dataset.kvxErrors = String(Number(html.dataset.kvxErrors || 0) + 1);
    return;
  }
  showErrors(null, "");
  state.params = reply.params;
  if (!reply.data.sources) {                  // a partial reply, such as a measurement put into words
    applyTexts(reply.data.texts || {});
    html.dataset.kvxRun = String(Number(html.dataset.kvxRun || 0) + 1);
    return;
  }
  apply(reply.data, true);
  const sentAt = state.sentAt;
  timings.push(performance.now() - sentAt);
  const { at: arrivedAt, worker: inWorker } = arrival, sent = performance.timeOrigin + sentAt;
  parts.push({ waiting: state.postedAt - sent, to_worker: inWorker.received - state.postedAt,
               worker: inWorker.sent - inWorker.received, python: state.pythonMs, back: arrivedAt - inWorker.sent,
               drawing: clock() - arrivedAt });
  state.applied += 1;
  html.dataset.kvxApplied = String(state.applied);
  afterNextFrame(() => {
    painted.push(performance.now() - sentAt);
    html.dataset.kvxPainted = String(painted.length);
  });
}

// ---- drawing -------------------------------------------------------------------------------------
// `words`: false for the warm-up's later passes (warmDrawingAgain), which leave the words as they are.
function apply(data, keepFrame, words = true) {
  const wasAtEnd = state.frame >= lastFrame();
  state.data = data;
  setSources(data.sources);
  setRanges(data.ranges);
  if (anim()) {
    const slider = model("anim:frame");
    slider.end = Math.max(1, lastFrame());
    const k = keepFrame && !wasAtEnd ? Math.min(state.frame, lastFrame()) : lastFrame();
    if (state.wantFrame !== null) {
      const k = state.wantFrame;                       // a link's step, asked for with these parameters
      state.wantFrame = null;
      showFrame(k);
    } else if (anim().mode === "on_demand") {
      showFrameLocal(anim().frame, anim().caption);   // the model chose the frame to open on
    } else {
      showFrame(k);
    }
    if (keepFrame) urlSoon();                          // a reply may move the frame: the address follows
  }
  if (words) applyWords(data);
}

// The words around the plots: texts, formula, readouts and notes (plain elements, outside Bokeh's layout).
function applyWords(data) {
  applyTexts(data.texts || {});
  renderFormula(data.formula || []);
  renderReadouts(data.readouts || []);
  const notes = document.getElementById("kvx-notes");
  notes.textContent = (data.notes || []).join(" ");
  notes.dataset.kind = "note";
}

function setRanges(ranges) {
  for (const [name, [start, end]] of Object.entries(ranges || {})) {
    const r = model(`range:${name}`);
    r.start = start;
    r.end = end;
  }
}

// Texts (block tables, findings, captions, measurements) are plain elements outside Bokeh's layout
// (site/dom_layout.py): writing one costs a reflow of the page, not a re-layout of every plot.
// The model's HTML is kept as sent in `shown`, so an unchanged text is not written again and tests can
// compare it with CPython's exactly (innerHTML would give back the browser's re-serialisation).
const shown = {};
function setText(name, text) {
  if (shown[name] === text) return;
  const box = document.querySelector(`[data-kvx-text="${name}"]`);
  if (!box) return;
  shown[name] = text;
  box.innerHTML = text;
}

function applyTexts(texts) {
  for (const [name, text] of Object.entries(texts)) setText(name, text);
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function renderFormula(lines) {
  const box = document.getElementById("kvx-formula");
  box.replaceChildren(...lines.map((l) => {
    const div = el("div", "kvx-formula-line");
    div.append(el("div", "kvx-formula-name", l.name), el("div", "kvx-formula-expr", l.formula),
               el("div", "kvx-formula-sub", `= ${l.substituted}`), el("div", "kvx-formula-result", `= ${l.result}`));
    return div;
  }));
}

function renderReadouts(items) {
  const box = document.getElementById("kvx-readouts");
  box.replaceChildren(...items.map((r) => {
    const div = el("div", "kvx-readout");
    div.append(el("div", "kvx-readout-label", r.label), el("div", "kvx-readout-value", r.value),
               el("div", "kvx-readout-detail", r.detail));
    return div;
  }));
}

// ---- animation -----------------------------------------------------------------------------------
// The slider, the URL's step and the frame counter, without drawing (on-demand frames draw on reply).
function showFrameLocal(k, caption) {
  state.frame = k;
  model("anim:frame").value = k;
  if (caption !== undefined) setText("caption", caption);
  html.dataset.kvxFrame = String(k);
}

function showFrame(k) {
  const a = anim();
  k = Math.max(0, Math.min(lastFrame(), Math.round(k)));
  if (a.mode === "on_demand") {
    showFrameLocal(k);
    requestFrame(k);
    return;
  }
  state.frame = k;
  const full = state.data.sources[a.source];
  const keep = [];
  full.frame.forEach((f, i) => { if (f <= k) keep.push(i); });
  const cols = {};
  for (const [c, values] of Object.entries(full)) cols[c] = keep.map((i) => values[i]);
  setData(a.source, cols);
  setText("caption", a.captions[k] || "");
  model("anim:frame").value = k;
  html.dataset.kvxFrame = String(k);
}

function pause() {
  if (state.timer) urlSoon();
  clearInterval(state.timer);
  state.timer = null;
  model("anim:play").label = "▶ Play";
}

const animation = {
  toggle() {
    if (state.timer) return pause();
    if (state.frame >= lastFrame()) showFrame(0);
    model("anim:play").label = "⏸ Pause";
    state.timer = setInterval(() => {
      showFrame(state.frame + 1);
      if (state.frame >= lastFrame()) pause();
    }, 350 / state.speed);
  },
  step() { pause(); showFrame(state.frame + 1); urlSoon(); },
  back() { pause(); showFrame(state.frame - 1); urlSoon(); },
  reset() { pause(); showFrame(0); urlSoon(); },
  speed(label) {
    state.speed = parseFloat(label) || 1;
    if (state.timer) { pause(); animation.toggle(); }
  },
  // The slider echoes every frame we show, after state.frame is set (its callback runs microtasks later, as the
  // controls' do: setQuietly); only a reader's move, to a different frame, pauses and seeks.
  seek(value) { if (Math.round(value) !== state.frame) { pause(); showFrame(value); urlSoon(); } },
};

// ---- "run it here": the real kernel on the compute server, when one is reachable -------------------
const server = { device: null };

async function findServer() {
  const button = model("run:button");
  if (!button) return;
  try {
    const reply = await fetch(`${cfg.api}/health`, { signal: AbortSignal.timeout(2000) });
    const health = reply.ok ? await reply.json() : null;
    if (!health || health.status !== "ok") throw new Error("no server");
    server.device = health.device;
    const name = health.name && health.name !== "CPU" ? ` (${health.name})` : "";
    button.label = `▶ Run it here, on this server's ${health.device.toUpperCase()}${name}`;
    button.disabled = false;
  } catch (err) {
    button.label = "Run it here: no kvx server is reachable (showing the baked measurement)";
  }
}

function say(text) { setText("run_result", text); }

// What the server says about a job, in words: queued (with its place when the server gives one), running
// with its progress, and how long the reader has waited.
function jobState(body, started) {
  const waited = `${((performance.now() - started) / 1000).toFixed(1)} s`;
  if (body.status === "queued") {
    const place = Number.isInteger(body.position) ? `, ${body.position} job${body.position === 1 ? "" : "s"} ahead` : "";
    return `Queued on the server${place} (${waited}).`;
  }
  return `Running: ${Math.round(100 * (body.progress || 0))}%${body.message ? ` (${body.message})` : ""}, ${waited}.`;
}

const RETRIES = 12;               // a class pressing together: each waits its turn instead of giving up
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function detailOf(body) {
  const d = body && body.detail;
  return Array.isArray(d) ? d.map((x) => x.msg).join(" ") : String(d || "no reason given");
}

async function runHere() {
  const run = state.data.run;
  if (!run || !server.device) return;
  const button = model("run:button");
  button.disabled = true;
  const started = performance.now();
  html.dataset.kvxRunState = "sent";
  say("Sent to the server…");
  try {
    for (let attempt = 1; ; attempt += 1) {
      let reply = await fetch(`${cfg.api}/kernels/${run.kernel}`, {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(run.request) });
      let body = await reply.json();
      while (reply.status === 202) {            // queued or running: poll it and say which
        html.dataset.kvxRunState = body.status;
        say(jobState(body, started));
        await sleep(400);
        reply = await fetch(`${cfg.api}/jobs/${body.job}`);
        body = await reply.json();
      }
      // Busy (503 queue full, 429 this reader's share): wait as long as the server asks, then try again
      // by itself, so every student in a class gets an answer without pressing again.
      const after = Number(reply.headers.get("Retry-After"));
      if ((reply.status === 503 || reply.status === 429) && after > 0 && attempt < RETRIES) {
        html.dataset.kvxRunState = "retrying";
        html.dataset.kvxRetries = String(attempt);
        for (let left = Math.ceil(after); left > 0; left -= 1) {
          const why = reply.status === 429 ? "your earlier runs are still waiting" : "its queue is full";
          say(`The server is busy (${why}); trying again by itself in ${left} s ` +
              `(attempt ${attempt + 1} of ${RETRIES}).`);
          await sleep(1000);
        }
        continue;
      }
      if (!reply.ok) {
        html.dataset.kvxRunState = "failed";
        say(`The server could not run it: ${detailOf(body)}`);
        return;
      }
      html.dataset.kvxRunState = "done";
      // The model words the measurement next to its own prediction, in the worker.
      state.latest += 1;
      worker.postMessage({ type: "run", id: state.latest, slug: cfg.slug, params: { ...readParams(), _run_reply: body } });
      return;
    }
  } catch (err) {
    html.dataset.kvxRunState = "failed";
    say(`The server stopped answering (${err.message}); the page keeps working without it.`);
  } finally {
    button.disabled = false;
  }
}

// ---- start ---------------------------------------------------------------------------------------
function startWorker() {
  state.started = true;
  // The page's head started the first worker before BokehJS loaded (explainer.html's kvxStartWorker) and kept
  // what it said meanwhile; a replacement for one that died is started by the same function.
  const started = window.kvxEarly || window.kvxStartWorker();
  window.kvxEarly = null;
  worker = started.worker;
  const t0 = started.t0;
  worker.onmessage = (event) => {
    const msg = event.data;
    if (msg.type === "ready") {
      state.ready = true;
      html.dataset.kvxBoot = msg.from;                                    // "snapshot" or "boot" (tests, bench)
      html.dataset.kvxFrozen = String(msg.frozen);                        // objects out of the collector's reach (tests)
      // The attribute says "every control is live", which also needs the drawn page (Python often wins the race).
      drawn.then(() => {
        html.dataset.pyReadyMs = String(Math.round(performance.now()));   // since navigation start
        html.setAttribute("data-py-ready", "");
        drawTheRest();
      });
      state.readyText = `Python is ready (${((performance.now() - t0) / 1000).toFixed(1)} s): every control is live.`;
      setStatus(state.readyText, "ready");
      if (state.queued) { state.queued = false; request(); }
      else if (state.queuedFrame === null) drawn.then(warmUp);           // its reply redraws the plots
      if (state.queuedFrame !== null) { const k = state.queuedFrame; state.queuedFrame = null; requestFrame(k); }
    } else if (msg.type === "failed") {
      setStatus(`Python could not start (${msg.message}); the plots keep the precomputed values.`, "failed");
      drawn.then(drawTheRest);
    } else if (msg.type === "warmed") {
      // Once every plot is drawn: a plot drawn after it (below the first screen) would run its update paths
      // for the first time on the reader's first change.
      whenAllDrawn(() => {
        if (msg.reply.ok) warmDrawing(msg.reply.data, msg.other && msg.other.ok ? msg.other.data : null, msg.passParams);
        if (state.latest === 0) warmControls();
        html.dataset.kvxWarmed = "";                                      // tests: the drawing has been warmed
      });
    } else if (msg.type === "warm-ended") {
      html.dataset.kvxWarmUp = `${msg.runs} runs in ${Math.round(msg.ms)} ms, ended by ${msg.by}` +   // tests, bench
        (msg.reopened ? ", then the opening again" : "");
    } else if (msg.type === "result") {
      state.pythonMs = msg.ms;
      onResult(msg.id, msg.reply, { at: clock(), worker: msg.at });
    } else if (msg.type === "progress") {
      onProgress(msg);
    } else if (msg.type === "crashed") {
      workerDied(msg.message);
    }
  };
  worker.onerror = (event) => {
    event.preventDefault();
    workerDied(event.message || "an error in the worker");
  };
  for (const event of started.early) (event.type === "error" ? worker.onerror : worker.onmessage)(event);
  if (state.plotted) worker.postMessage({ type: "go" });     // else once the first screen is drawn (below)
}

// The animation as it opened: a reader who has moved or played it keeps their frame (warmDrawing's other way).
const animationAsOpened = () => state.latestFrame === 0 && state.wantFrame === null && !state.timer &&
  (!anim() || anim().mode === "on_demand" || state.frame === lastFrame());

// The reader's first change also paid for the first run of Bokeh's update and drawing paths and of the page's
// own writing of its words (JavaScript is compiled as it runs). Once the worker has evaluated the opening
// parameters and one other value (`other`), the page draws the other value's data and then the opening data
// again, in the same task, through apply(), as a reply is drawn: the browser paints only the last, the same
// picture, and the sources, ranges, words and the animation's slider, frame and caption have all run their
// update paths on data that changed. Giving the same data again alone left a first change's source update at
// 2-5 ms against 1-2 for the rest; warming the sources alone left its whole drawing at 3.1-6.7 ms against 2-3
// (2.1-6.0 with the words warmed too); warming all but the animation left the pages that animate their data
// (cache-renting, agent-sessions, disaggregation) with the slowest first changes of the arithmetic pages.
function warmDrawing(data, other, passParams) {
  if (state.latest !== 0 || !data.sources) return;               // the reader was quicker: nothing to warm
  const opening = animationAsOpened();
  const otherHere = other && warmOther(other, data);
  if (otherHere && opening) {
    apply(otherHere, false);
    apply(data, false);          // compared with what each source holds, as a reply's data is (sameColumns)
    if (passParams && passParams.length) warmDrawingAgain(passParams, data);
  } else {
    if (otherHere) {
      setSources(otherHere.sources, true);
      setRanges(otherHere.ranges);
      applyWords(otherHere);
    }
    // With no other value to compare with, the opening data given again by force (equal columns are skipped,
    // and nothing would run).
    setSources(data.sources, !other);
    setRanges(data.ranges);
    applyWords(data);
  }
  errorBoxList();                                                // found once, before a reply needs them
}

// The other value's data, cut to what the opening data gives back afterwards.
function warmOther(other, data) {
  const within = (given, kept) => Object.fromEntries(Object.entries(given || {}).filter(([k]) => k in (kept || {})));
  return { ...other, sources: { ...within(other.sources, data.sources), ...stillSources(data.sources, other.sources) },
           ranges: within(other.ranges, data.ranges), texts: within(other.texts, data.texts) };
}

// One pass left the engine's compiling of the drawing's paths to the reader's first change: it tiers a function
// up (baseline code, then optimised code) once it has run enough, and the part of that on the main thread runs in
// whatever task comes next. In Chromium traces of mla's first change, 0.4-0.7 ms of budget interrupts (baseline
// compiling) against none in the rest; twenty passes in the same task moved it to optimised code's preparing and
// installing (0.1-0.45 ms), still on the first change. So more passes follow, each in its own task and a moment
// apart, while the reader does nothing: the compiling that they start, and that finishes off the main thread, is
// installed during a pass, not during the reader's change. Each pass ends on the opening data, so the picture
// painted between them is the same. The words are left alone: the first pass ran their paths, and the readouts
// and notes are live regions, which a screen reader would read out again at each rewrite. A pass with its repaint
// takes 50-120 ms here, so of the twenty, the few that come before a reader's first change (a second after ready)
// do the most. Measured (passes that also wrote the words), with the worker's warm-up decoding its replies too
// (kvx-worker.mjs): first change less the rest's median, medians of 8 cold loads each, against the build before:
// mla +1.5 -> -0.7 ms, cross-model +1.2 -> +0.2, cache-renting +0.45 -> -0.3; disaggregation +1.3 -> +1.8 (its
// loads spread from -2 to +5 ms either way).
// Each pass after the first asks the worker for its value as a change does (a "run", id "warm-N", which does
// not end the worker's warm-up), and draws the reply it gets: the messages' paths both ways, the worker's run and
// the page's taking of a result, had run only for the reader's first change. With the benchmark's typing as a
// reader's (tests/browser/pagehooks.py, set_control), first change less the rest's median, medians of 10 cold
// loads each, passes drawn from the warm-up's copy -> from a round trip each: mla +0.95 -> +0.60 ms, cross-model
// +0.85 -> +0.20, cross-layer +0.65 -> +0.25; disaggregation +0.75 -> +1.00 (first above the rest in 8 -> 5 of 10).
// The passes draw the opening's neighbours in turn, each number box's value one step up and one down
// (registry.neighbour_values), not one other value. What was left of a first change's extra was the engine meeting
// in BokehJS shapes of objects that the reader's value brought and the passes' one value had not shown it (a label
// column empty, a list where a packed column was, a one-row column through a view), and throwing away the code
// compiled for the others. V8's bailouts in a first change (tests/benchmarks/v8_changes.py, one load each), with
// the benchmark's first value (among the neighbours) and with its fourth (not among them): load-balancer 5 -> 3
// and 5 -> 2, prompt-caching 3 -> 1 and 3 -> 1, prefix-reuse 8 -> 1 and 12 -> 4; one left on each is the
// reader's click (a MouseEvent), before the change is sent, and three of prefix-reuse's four an axis's tick
// labels at a new precision; quantization (0) and mla (1) as they were. The reply's drawing, first less its twin,
// medians of 6 interleaved cold loads, before -> after: load-balancer +1.10 -> +0.20 ms, prompt-caching +0.15 ->
// -0.50, prefix-reuse +0.80 -> -0.35, quantization +0.45 -> +0.35, mla +0.30 -> +0.75.
const DRAW_PASSES = 20;            // passes after the first
const DRAW_PASS_GAP_MS = 20;
const DRAW_PASSES_MS = 250;        // the most time their applying takes (not their repaints); a simulation's is heavier
let readerActed = false;           // a press, key or focus (holdWarmUp): the reader is about to change something
let warmPassed = null;             // a pass's reply from the worker (onResult), while the passes last
function warmDrawingAgain(passParams, data) {
  let passes = 0, spent = 0, ended = false;
  let drawn = 0;                     // passes drawn (a reply the model refused is not)
  let lastOther = null;              // the last pass's neighbour, drawn again after the next major collection
  let collectedAfter = null;         // how many passes were drawn when that collection came
  const still = () => !readerActed && state.latest === 0 && animationAsOpened() && worker !== null;
  const end = () => {
    warmPassed = null;
    ended = true;
    html.dataset.kvxDrawingWarmed = `${passes + 1} passes, ended by ${still() ? "budget" : "reader"}`;  // tests, bench
    if (collectedAfter === drawn) passAfterCollection();       // it came after the last pass drawn
    else if (collectedAfter !== null) html.dataset.kvxPassAfterCollection = "not drawn: passes came after it";
  };
  const passAfterCollection = async () => {
    const not = lastOther === null ? "no pass drew a neighbour"
      : state.latest !== 0 || state.queued ? "a change was sent"         // queued: for a worker starting again
      : !animationAsOpened() ? "the animation was moved" : null;
    if (!not) await drawPass(lastOther, data);
    html.dataset.kvxPassAfterCollection = not ? `not drawn: ${not}` : "drawn";                   // tests
  };
  afterMajorCollection(() => {
    collectedAfter = drawn;
    if (ended) passAfterCollection();
  });
  const pass = () => {
    if (passes === DRAW_PASSES || spent >= DRAW_PASSES_MS || !still()) return end();
    const params = passParams[passes % passParams.length];
    worker.postMessage({ type: "run", id: `warm-${passes + 1}`, slug: cfg.slug, params });
  };
  warmPassed = async (reply) => {
    // A reply that comes after the reader acted is not drawn; nor is one the model refused (a neighbour valid
    // alone that the model turns down at these settings): the passes go on to the next.
    if (!still()) return end();
    if (reply.ok && reply.data.sources) {
      const t0 = performance.now();
      lastOther = warmOther(reply.data, data);
      await drawPass(lastOther, data);
      spent += performance.now() - t0;
      drawn += 1;
    }
    passes += 1;
    setTimeout(pass, DRAW_PASS_GAP_MS);
  };
  setTimeout(pass, DRAW_PASS_GAP_MS);
}

// One pass: the other value's data, then the opening's, so the picture painted stays the opening's.
async function drawPass(other, data) {
  apply(other, false, false);
  await bokehsContinuations();
  apply(data, false, false);
}

// A change drawn just after a major garbage collection took its data in 0.5-1.5 ms slower than the same change
// drawn later (mla, the twin of the first change made 1 s after a full collection, 6 cold loads: +1.55 ms over the
// rest, 6 of 6). And the page's first major collection after ready waits: in V8's trace (--trace-gc) its marking
// had not started with the heap at 67-96 MB against a 64 MB limit, and the page saw it done 0.14 s after the
// reader's first press, or about 3 s after ready with none (Chromium lets it wait while it counts the page as
// loading). The passes' garbage (mla's heap 34 -> 57-67 MB over 13 passes) leaves one waiting, so it came while
// the reader typed, and their first change was the first drawn after it. Once it has come, one pass more, from
// the last pass's neighbour (no worker run), puts that cost before the change: drawn the same way just after a
// forced collection, the twin was no slower than the rest (0.0 ms, 2 of 6). It is drawn while no change has been
// sent, even after the reader's press that ended the passes (the collection comes after it): 14-19 ms of the main
// thread, once, between two of their keys.
const majorCollections = typeof FinalizationRegistry === "function"
  ? new FinalizationRegistry((fn) => fn()) : null;
// Made as the script runs and let go only when the passes start, so the collection that frees it is the first
// major one after that (one during the page's boot does not count). In a traced load of mla none of the 19 young-
// generation collections after the passes began freed it; the major collection did, and the page saw it within
// 0.1 s.
let watchedObject = { madeAt: "the script's start" };
function afterMajorCollection(fn) {
  if (!majorCollections || watchedObject === null) return;
  majorCollections.register(watchedObject, fn);
  watchedObject = null;
}

// BokehJS takes new data in partly after awaits (a renderer's set_data, then its glyph's culling mask, whose
// change rebuilds the renderer's visuals): microtasks, which run before the task ends and so before any paint.
// Drawn back to back, the opening data was in the sources again before they ran, so they only ever saw the
// opening's: on mla the reader's first change was the first to change six renderers' masks, and ran their
// rebuilding for the first time (tests/benchmarks/first_run_code.py). Awaiting them here, still within the task,
// lets them see the neighbour's data while the picture painted stays the opening's. set_data's chain is a few
// awaits deep; 50 turns leave room (test_a_first_change_runs_no_bokehjs_code_the_warm_up_did_not: it checks).
async function bokehsContinuations() {
  for (let turn = 0; turn < 50; turn += 1) await null;
}

// The sources the other value leaves as they are (cross-layer's loss and stages, which its share changes and the
// warm-up's context does not), with their rows in reverse order: valid data (the same rows), yet a change, so
// their glyphs' update paths run too. Left out, they ran for the first time on a first change that touched them:
// cross-layer's sources took 0.47 ms more on its first change than on the rest, 0.05 ms with this (medians of 16
// cold loads each; the reply's drawing, +0.53 -> -0.10 ms). Nine passes of the whole warm-up instead of one were
// no better (cross-layer +1.15, cross-model -0.10, mla +0.95 ms, of 8 loads): not kept.
function stillSources(sources, otherSources) {
  const out = {};
  for (const [key, cols] of Object.entries(sources)) {
    if (otherSources[key] && !sameColumns(otherSources[key], cols)) continue;
    const reversed = Object.fromEntries(Object.entries(cols).map(([k, v]) => [k, column(v) ? v.slice().reverse() : v]));
    if (!sameColumns(reversed, cols)) out[key] = reversed;
  }
  return out;
}

// The reader's first change was also the first run of the controls' own paths: BokehJS's input view taking the
// committed text, its model's change, the CustomJS callback (compiled on its first call) and the page's
// onControl; run for the first time, they kept the main thread busy after the request was sent (4.5 ms against
// 0.4 on cross-model, a Chromium trace), and the reply waited for it. So each control is given another value and
// its own again, through its input element's events as a reader's typing would be, once the drawing is warmed.
// No request: the page counts these echoes as its own (setQuietly), and nothing shows (one task, no paint).
// Measured (the first change's median over 8-12 cold loads, with and without it alternating; four pages, six
// runs): 0.25-1.05 ms quicker in four, the same in one, 2.6 ms slower in one (disaggregation); the first change
// is still about 1 ms slower than the rest.
const KEYUPS = 12;                         // Enter keyups per box: past the engine's compiling of their handler
function warmControls() {
  for (const k of names) {
    const widget = model(`param:${k}`);
    const input = window.Bokeh.index.find_one(widget)?.input_el;
    if (!input || typeof input.value !== "string") continue;
    // A box the reader is in, or has typed in without committing (the page is drawn seconds before Python is
    // ready), is theirs: its text taken as the box's own was committed as an echo, and their Enter changed nothing;
    // a box they had selected lost its selection, so their typing went after its text ("2" and "0": 20). The box
    // is in Bokeh's shadow root, where the document's activeElement is only its host: ask the box's own root.
    const focused = input.getRootNode().activeElement === input;
    if (focused || input.value !== String(widget.value ?? "")) continue;
    const was = input.value;
    const other = input.tagName === "SELECT" ? [...input.options].map((o) => o.value).find((v) => v !== was) : `${was}0`;
    if (other === undefined) continue;
    for (const value of [other, was]) {
      input.value = value;
      dispatchQuietly(widget, input, [new Event("input"), new Event("change")]);
    }
    // The reader's Enter ends with a keyup, which BokehJS's box handles in the frame after it (a ValueSubmit event;
    // an autocomplete box commits its text again, here its own), and a reply that comes meanwhile waits for that
    // frame. Run for the first time it took 0.29-0.57 ms against about 0.12 later (Chromium traces of 7 cold loads,
    // mla and cross-model); one keyup here only moved that to the second change (0.56-0.89 ms: the engine compiling
    // it then), a dozen got past it (first changes' keyups 0.07-0.30 ms, median 0.09; the rest 0.09).
    if (input.tagName !== "SELECT") {
      dispatchQuietly(widget, input, Array.from({ length: KEYUPS }, () => new KeyboardEvent("keyup", { key: "Enter" })));
    }
  }
}

// Nothing asked yet: evaluate the opening parameters once so the reader's first change does not pay
// for the model's lazy imports and cold caches; the worker sends that reply back as "warmed" (warmDrawing),
// then warms up at other values, and a real change stops it.
function warmUp() {
  const params = {};
  for (const k of names) params[k] = cfg.defaults[k] === null ? "" : String(cfg.defaults[k]);
  worker.postMessage({ type: "warm", slug: cfg.slug, params });
  for (const type of READER_ACTS) document.addEventListener(type, holdWarmUp, { capture: true, passive: true });
}

// A reader's press, key or focus comes before any change they make (a box is clicked, then typed in and
// committed): it ends the warm-up, so that the change does not wait for a warm-up evaluation in flight (2-6 ms
// of a first change on the arithmetic pages, against none for the changes after it).
const READER_ACTS = ["pointerdown", "keydown", "focusin"];
function holdWarmUp() {
  readerActed = true;
  for (const type of READER_ACTS) document.removeEventListener(type, holdWarmUp, { capture: true });
  if (worker) worker.postMessage({ type: "hold" });
}

// A worker that dies (out of memory, a fatal Python error) is replaced on the reader's next change;
// until then the plots keep their last values and the page says what happened.
function workerDied(message) {
  if (worker) worker.terminate();
  worker = null;
  state.ready = false;
  state.handled = state.latest;                    // no reply is coming; the controls keep the newest values,
  state.handledFrame = state.latestFrame;          // which the next change sends to the new worker
  held.run = held.frame = null;
  html.removeAttribute("data-py-ready");
  html.dataset.kvxWorkerDied = String(Number(html.dataset.kvxWorkerDied || 0) + 1);
  drawn.then(drawTheRest);
  flushURL();                                      // no reply is coming to write it
  setStatus(`The Python worker stopped (${message}); the plots keep their last values, and Python restarts ` +
            "on your next change.", "failed");
}

function applyURL(search, initial = false) {
  const { params, step } = urlParams(search);
  setControls(params);
  const requested = !initial || Object.keys(params).length > 0;
  if (requested) request();
  if (!anim()) return;
  // An on-demand page redraws its opening frame when the new parameters' data arrives, so ask for the
  // URL's step after that reply (apply() below), not before it.
  // The same for a cumulative page: the link's parameters may have more frames than the baked ones.
  if (step !== null && requested) state.wantFrame = Math.max(0, Math.round(step));
  else if (step !== null) showFrame(step);
  writeURL(readParams());                 // the frame shown (a bad step clamped, or none given) is in the address
}

// ---- "copy link to this view" and "reset all" ----------------------------------------------------------
function toolSaid(text) {
  const el = document.getElementById("kvx-tool-said");
  if (el) el.textContent = text;
}

async function copyLink() {
  urlWanted = true;
  flushURL();
  const link = location.href;
  try {
    await navigator.clipboard.writeText(link);
    toolSaid("Link copied.");
  } catch (err) {                        // no clipboard (plain http, or refused): show it to copy by hand
    window.prompt("Copy this link:", link);
    toolSaid("");
  }
  html.dataset.kvxCopied = link;
}

function resetAll() {
  pause();
  for (const k of Object.keys(uploads)) delete uploads[k];
  setControls({});
  state.wantFrame = null;
  if (anim()) state.frame = anim().mode === "on_demand" ? cfg.baked.animation.frame : lastFrame();
  request();
  toolSaid("Every control is back to its default.");
}

// ---- classroom mode: ?present=1 or the P key ----------------------------------------------------------
const FONT_PROPS = ["text_font_size", "axis_label_text_font_size", "major_label_text_font_size",
                    "label_text_font_size", "title_text_font_size"];
const fontsAsBuilt = new Map();     // model -> {prop: size}, to put back when the mode is left

function scaleFont(size, k) {
  const m = /^([\d.]+)px$/.exec(size);
  return m ? `${Math.round(Number(m[1]) * k)}px` : size;
}

// Plot fonts scaled from the view's sizes: x1.4 in classroom mode, x0.8 on a phone (a long title or legend
// in a 320 px plot is cut less), x1 otherwise.
const narrow = window.matchMedia("(max-width: 560px)");
function plotFontScale() { return html.classList.contains("kvx-present") ? 1.4 : narrow.matches ? 0.8 : 1; }

function present(on) {
  html.classList.toggle("kvx-present", on);
  scalePlotFonts(plotFontScale());
  refit();
  const q = new URLSearchParams(location.search);
  if (on) q.set("present", "1"); else q.delete("present");
  const s = q.toString();
  history.replaceState(null, "", s ? `?${s}` : location.pathname);
}

function scalePlotFonts(k) {
  const on = k !== 1;
  for (const m of doc.all_models) {
    for (const prop of FONT_PROPS) {
      if (!(prop in m.properties)) continue;
      if (!fontsAsBuilt.has(m)) fontsAsBuilt.set(m, {});
      const built = fontsAsBuilt.get(m);
      if (!(prop in built)) built[prop] = m[prop];
      const size = built[prop];
      const value = on ? (typeof size === "string" ? scaleFont(size, k)
                          : size && typeof size.value === "string" ? { ...size, value: scaleFont(size.value, k) } : size)
                       : size;
      if (value !== m[prop]) m[prop] = value;
    }
  }
}

// A plot drawn two ways (tags "kvx:wide" and "kvx:narrow", such as MLA's step diagram): the page shows the one
// its width calls for.
function pickByWidth() {
  for (const m of doc.all_models) {
    const tags = m.tags || [];
    if (tags.includes("kvx:narrow")) m.visible = narrow.matches;
    else if (tags.includes("kvx:wide")) m.visible = !narrow.matches;
    else continue;
    const summary = m.name && m.name.startsWith("plot:") && document.getElementById(`kvx-summary-${m.name.slice(5)}`);
    if (summary) summary.hidden = !m.visible;          // its caption goes with it
  }
}

// A plot's title or x-axis label wider than the plot (a phone, classroom fonts) is wrapped into lines, from the
// text as built, whenever the width or the fonts change.
const textsAsBuilt = new Map();      // [model, property] key -> the text as built
function wrapPlotTexts() {
  const ctx = document.createElement("canvas").getContext("2d");
  const sizeOf = (size) => (size && typeof size === "object" ? size.value : size);
  const changed = new Set();
  for (const view of Bokeh.index.all_views()) {
    if (!view.frame || !view.model.properties.renderers || !view.model.visible) continue;
    const plot = view.model, f = view.frame.bbox, width = view.el.getBoundingClientRect().width;
    const items = [[plot.title, "text", "text", width - f.x0 - 4]];
    for (const axis of plot.below || []) items.push([axis, "axis_label", "axis_label_text", f.x1 - f.x0]);
    for (const [m, prop, font, room] of items) {
      if (!m || typeof m[prop] !== "string" || room <= 0) continue;
      if (!textsAsBuilt.has(m)) textsAsBuilt.set(m, m[prop]);
      const built = textsAsBuilt.get(m);
      ctx.font = `${m[`${font}_font_style`]} ${sizeOf(m[`${font}_font_size`])} ${m[`${font}_font`]}`;
      const text = built.includes("\n") ? built : wrapTo(built, room, measureWith(ctx));
      if (text !== m[prop]) {
        m[prop] = text;
        changed.add(view);
      }
    }
  }
  // A title's lines change the plot's layout, not only its paint: laid out again once Bokeh has the new text.
  setTimeout(() => {
    for (const view of changed) view.invalidate_layout();
    setTimeout(() => {
      for (const view of changed) {      // the paint between the text and the layout can leave ink Bokeh's clear misses
        const canvas = view.canvas_view.primary.canvas, ctx = canvas.getContext("2d");
        ctx.save();
        ctx.setTransform(1, 0, 0, 1, 0, 0);
        ctx.clearRect(0, 0, canvas.width, canvas.height);
        ctx.restore();
        view.request_repaint();
      }
    }, 50);
  }, 50);
}
let refitting = null;
function refit() {
  cancelAnimationFrame(refitting);
  refitting = requestAnimationFrame(() => requestAnimationFrame(wrapPlotTexts));
}

// ---- labels inside their plot ----------------------------------------------------------------------------
// A label at x = value (a bar's value, a point's note) runs past the plot's right edge when the value is near
// the end of the axis, the more so on a phone. Each is placed when it is drawn, from its measured width: a
// label that would cross the frame's right edge ends at its anchor instead (inside the bar, haloed in white),
// a note (a text glyph) moves left just enough, and one that fits neither way is wrapped into lines.
function measureWith(ctx) {
  return (text) => Math.max(...text.split("\n").map((line) => ctx.measureText(line).width));
}

function wrapTo(text, room, width) {
  const lines = [];
  for (const word of text.split(/\s+/)) {
    const last = lines.length - 1;
    if (last >= 0 && width(`${lines[last]} ${word}`) <= room) lines[last] += ` ${word}`;
    else lines.push(word);
  }
  return lines.join("\n");
}

function withHalo(ctx, draw) {
  ctx.fillText = function (...args) {
    const { strokeStyle, lineWidth, lineJoin } = this;
    Object.assign(this, { strokeStyle: "rgba(255,255,255,0.9)", lineWidth: 4, lineJoin: "round" });
    this.strokeText(...args);
    Object.assign(this, { strokeStyle, lineWidth, lineJoin });
    return CanvasRenderingContext2D.prototype.fillText.apply(this, args);
  };
  try { return draw(); } finally { delete ctx.fillText; }
}

// BokehJS 3.9 reads a CSS variable (--bk-<visual>-<property>) with getComputedStyle for every property of
// every scalar visual (axes, grids, titles, labels) on every paint, so that a stylesheet can restyle a plot.
// These pages set none: measured over every page, about a thousand lookups a change and every one "". Each
// lookup after a DOM change recalculates style, so the page answers them as "" (unset) itself. Returns
// Bokeh's own lookup (a test checks it still finds nothing), or null where this Bokeh has none.
function cssVisualsUnset() {
  try {
    const visual = Bokeh.require("core/visuals/visual").VisualProperties.prototype;
    const lookup = visual._get_css_value;
    if (typeof lookup !== "function") return null;
    visual._get_css_value = () => "";
    return lookup;
  } catch (err) {
    return null;                         // another BokehJS: its own lookups
  }
}

// A BokehJS 3.9 plot reads its font size with getComputedStyle for every axis label it measures (40-150
// times a change on these pages, 12 px every time), each read after a DOM change a style recalculation.
// It changes only with the page's style, which changes here only with the window's size: each plot keeps
// the value it read until the next resize. Returns Bokeh's own read (a test compares the two), or null.
function plotFontSizeKept() {
  try {
    let owner = Bokeh.Models.get("Plot").prototype.default_view.prototype, found;
    while (owner && !(found = Object.getOwnPropertyDescriptor(owner, "base_font_size"))) owner = Object.getPrototypeOf(owner);
    if (!found || !found.get) return null;
    let generation = 0;
    window.addEventListener("resize", () => { generation += 1; });
    const kept = new WeakMap();
    Object.defineProperty(owner, "base_font_size", { configurable: true, get() {
      const last = kept.get(this);
      if (last && last.generation === generation) return last.value;
      const value = found.get.call(this);
      kept.set(this, { generation, value });
      return value;
    } });
    return found.get;
  } catch (err) {
    return null;                         // another BokehJS: its own reads
  }
}

// A BokehJS 3.9 legend rebuilds its DOM (a canvas and three elements an entry, then a layout read) whenever
// anything reachable from its items changes, a data source included: measured, 10-140 rebuilds over ten
// changes a page, all but four with the same items, labels and visibility, 0.6-3.4 ms a change. Those are
// skipped (the next paint draws the entries' glyphs, as every paint does); any other change rebuilds.
// Returns Bokeh's own rebuild (a test compares), or null.
function legendsKept() {
  try {
    const legend = Bokeh.Models.get("Legend").prototype.default_view.prototype;
    const rebuild = legend._render_items;
    if (typeof rebuild !== "function" || !("_should_rerender_items" in legend)) return null;
    legend._render_items = function () {
      const entries = this.entries || [];
      if (entries.length && !this._should_rerender_items && entries.every((e) => e.kvxVisible === e.item.visible)) {
        for (const entry of entries) this._toggle_inactive(entry);      // a renderer hidden or muted meanwhile
        return;
      }
      rebuild.call(this);
      for (const entry of this.entries || []) entry.kvxVisible = entry.item.visible;
    };
    return rebuild;
  } catch (err) {
    return null;                         // another BokehJS: its own rebuilds
  }
}

function labelsStayInside() {
  const labels = Bokeh.Models.get("LabelSet").prototype.default_view.prototype;
  const paintText = labels._paint_text;
  labels._paint_text = function (ctx, i, text, sx, sy, angle) {
    try { return placeLabel.call(this, ctx, i, text, sx, sy, angle); } catch (err) {
      return paintText.call(this, ctx, i, text, sx, sy, angle);   // placing failed: drawn where Bokeh put it
    }
  };
  function placeLabel(ctx, i, text, sx, sy, angle) {
    const { x0, x1 } = this.plot_view.frame.bbox;
    ctx.save();
    this.visuals.text.set_vectorize(ctx, i);
    const width = measureWith(ctx), w = width(text), left = /^(left|start)$/.test(ctx.textAlign);
    ctx.restore();
    if (angle !== 0 || this.model.x_units !== "data" || !left || sx + w <= x1 - 1) {
      return paintText.call(this, ctx, i, text, sx, sy, angle);
    }
    const end = sx - 2 * this.x_offset.get(i);              // the anchor, less the offset on its other side
    if (end - w >= x0) return withHalo(ctx, () => paintText.call(this, ctx, i, text, end - w, sy, angle));
    ctx.save();
    this.visuals.text.set_vectorize(ctx, i);
    const lines = wrapTo(text, Math.max(x1 - sx, end - x0), width), lw = width(lines);
    const px = parseFloat(/([\d.]+)px/.exec(ctx.font)?.[1] || "13");
    ctx.restore();
    const at = x1 - sx >= end - x0 ? sx : end - lw;
    const down = (lines.split("\n").length - 1) * 1.2 * px / 2;      // the lines centred where the one line was
    return withHalo(ctx, () => paintText.call(this, ctx, i, lines, Math.max(x0, Math.min(at, x1 - lw)), sy + down, angle));
  }
  // One label at a data x (Label): moved left just enough, wrapped when wider than the plot.
  const label = Bokeh.Models.get("Label").prototype.default_view.prototype;
  const paintLabel = label._paint;
  label._paint = function (ctx) {
    const rect = this._rect, box = this._text_box;
    let moved = null;
    try { moved = placeOne.call(this, ctx); } catch (err) { moved = null; }
    if (!moved) return paintLabel.call(this, ctx);
    Object.assign(this, moved);
    try { return withHalo(ctx, () => paintLabel.call(this, ctx)); } finally { Object.assign(this, { _rect: rect, _text_box: box }); }
  };
  function placeOne(ctx) {
    const { x0, x1 } = this.plot_view.frame.bbox;
    const r = this._rect;
    const left = r.sx - r.anchor.x * r.width;
    if (this.model.x_units !== "data" || r.angle !== 0 || left + r.width <= x1 - 1 || left < x0 - 0.5) return null;
    if (r.width <= x1 - x0 - 2) return { _rect: { ...r, sx: r.sx + (x1 - 2 - r.width - left) } };
    ctx.save();
    this.visuals.text.set_value(ctx);
    const text = wrapTo(this._text_box.text, x1 - x0 - r.padding.left - r.padding.right - 2, measureWith(ctx));
    ctx.restore();
    const box = new this._text_box.constructor({ text });
    box.position = { sx: 0, sy: 0, x_anchor: "left", y_anchor: "top" };
    box.angle = 0;
    box.align = "auto";
    box.visuals = this.visuals.text.values();
    const size = box.size();
    const width = size.width + r.padding.left + r.padding.right, height = size.height + r.padding.top + r.padding.bottom;
    return { _text_box: box, _rect: { ...r, width, height, sx: x0 + r.anchor.x * width } };
  }
  const notes = Bokeh.Models.get("Text").prototype.default_view.prototype;
  const paintNotes = notes._paint;
  notes._paint = function (ctx, indices, data) {
    let placed;
    try { placed = placeNotes.call(this, ctx, indices, data); } catch (err) { placed = null; }
    if (!placed) return paintNotes.call(this, ctx, indices, data);
    const rest = Array.from(indices).filter((i) => !placed.wrapped.has(i));
    paintNotes.call(this, ctx, rest, { ...data, sx: placed.sx });
    // A note wider than the plot, in lines, drawn as Bokeh draws a note (its own box, at its left edge).
    const { sy, y_offset } = { ...this, ...data };
    for (const [i, { box, left, height }] of placed.wrapped) {
      if (!this.visuals.text.v_doit(i)) continue;
      ctx.save();
      ctx.translate(left + this.padding.left, sy[i] + y_offset.get(i) - this.anchor_.get(i).y * height + this.padding.top);
      box.paint(ctx);
      ctx.restore();
    }
  };
  // Where each note goes (null: all stay where they are), and those wider than the plot wrapped into lines.
  function placeNotes(ctx, indices, data) {
    const { x0, x1 } = this.renderer.plot_view.frame.bbox;
    const { sx, x_offset, angle } = { ...this, ...data };
    const wrapped = new Map();
    let moved = null;
    for (const i of indices) {
      const label = this.labels[i];
      if (!label || angle.get(i) !== 0) continue;
      const w = this.swidth[i];
      const left = sx[i] + x_offset.get(i) - this.anchor_.get(i).x * w;
      if (left + w <= x1 - 1 || left < x0 - 0.5) continue;
      moved = moved || Float64Array.from(sx);
      if (w <= x1 - x0 - 2) {                                 // moved left just enough
        moved[i] += x1 - 2 - w - left;
        continue;
      }
      ctx.save();
      this.visuals.text.set_vectorize(ctx, i);
      const text = wrapTo(label.text, x1 - x0 - this.padding.left - this.padding.right, measureWith(ctx));
      ctx.restore();
      const box = new label.constructor({ text });
      box.visuals = this.visuals.text.values(i);
      box.position = { sx: 0, sy: 0, x_anchor: "left", y_anchor: "top" };
      box.align = "auto";
      const height = box.size().height + this.padding.top + this.padding.bottom;
      wrapped.set(i, { box, left: x0, height });
    }
    return moved && { sx: moved, wrapped };
  }
}

function onKey(event) {
  const target = event.composedPath()[0];
  if (target && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(target.tagName)) return;
  if ((event.key === "p" || event.key === "P") && !event.ctrlKey && !event.metaKey && !event.altKey) {
    present(!html.classList.contains("kvx-present"));
    return;
  }
  // The focused frame slider moves itself on an arrow key: stepping here too moved it two frames.
  if (target && target.getAttribute && target.getAttribute("role") === "slider") return;
  if (!anim()) return;
  if (event.key === "ArrowRight") { animation.step(); event.preventDefault(); }
  else if (event.key === "ArrowLeft") { animation.back(); event.preventDefault(); }
  else if (event.key === " ") { animation.toggle(); event.preventDefault(); }
}

// "Try this" links are plain ?query links: apply them in place instead of reloading the page.
function onClick(event) {
  const a = event.target.closest && event.target.closest("a[href^='?']");
  if (!a) return;
  event.preventDefault();
  history.pushState(null, "", a.getAttribute("href"));
  applyURL(location.search);
  document.querySelector(".kvx-interactive").scrollIntoView({ behavior: "smooth", block: "start" });
}

// Bokeh draws its widgets in shadow DOM: the few things the page adds to them are found by a deep walk.
function deepAll(selector, root = document, out = []) {
  for (const e of root.querySelectorAll("*")) {
    if (e.matches(selector)) out.push(e);
    if (e.shadowRoot) deepAll(selector, e.shadowRoot, out);
  }
  return out;
}

// Help (ⓘ) as a disclosure a finger or the keyboard can open, not only a hover title: a button that
// shows the control's help text under it (the same text the spec gives the control).
function helpDisclosure(desc) {
  const text = desc.title;
  if (!text || desc.dataset.kvxHelp) return;
  desc.dataset.kvxHelp = "1";
  desc.removeAttribute("title");
  const label = (desc.closest("label") || desc.parentElement).textContent.trim();
  const box = document.createElement("div");
  box.className = "kvx-help";
  box.setAttribute("role", "note");
  box.textContent = text;
  box.hidden = true;
  Object.assign(box.style, { fontSize: "14px", lineHeight: "1.35", margin: "4px 0 0", padding: "4px 8px",
                             borderLeft: "3px solid #1d4ed8", background: "#eff6ff", color: "#111827" });
  (desc.closest(".bk-input-group") || desc.parentElement).append(box);
  desc.setAttribute("role", "button");
  desc.tabIndex = 0;
  desc.setAttribute("aria-label", `Help: ${label}`);
  desc.setAttribute("aria-expanded", "false");
  const toggle = (event) => {
    event.preventDefault();            // inside the control's <label>: do not also focus the input
    event.stopPropagation();
    box.hidden = !box.hidden;
    desc.setAttribute("aria-expanded", String(!box.hidden));
  };
  desc.addEventListener("click", toggle);
  desc.addEventListener("keydown", (event) => { if (event.key === "Enter" || event.key === " ") toggle(event); });
}

// A suggestion list (dtype) closes when the reader leaves the box with Tab, as a native one does.
function closeOnLeave(input) {
  if (input.dataset.kvxLeave) return;
  input.dataset.kvxLeave = "1";
  const close = () => input.dispatchEvent(new KeyboardEvent("keyup", { key: "Escape", bubbles: true }));
  input.addEventListener("keydown", (event) => { if (event.key === "Tab") close(); });
  input.addEventListener("focusout", (event) => { if (event.relatedTarget) close(); });
}

// noUiSlider's handle (role="slider") has no name of its own: say what it moves.
function improveWidgets(tries = 0) {
  const handles = deepAll(".noUi-handle");
  for (const h of handles) if (!h.getAttribute("aria-label")) h.setAttribute("aria-label", "animation frame");
  deepAll(".bk-description").forEach(helpDisclosure);
  for (const host of deepAll(".bk-AutocompleteInput")) {
    const input = host.shadowRoot && host.shadowRoot.querySelector("input");
    if (input) closeOnLeave(input);
  }
  if (!handles.length && anim() && tries < 50) setTimeout(() => improveWidgets(tries + 1), 100);
}

function whenBokehReady() {
  return new Promise((resolve) => {
    const poll = () => {
      const d = window.Bokeh && window.Bokeh.documents && window.Bokeh.documents[0];
      // The first screen drawn, or failed to be (said on the console): the page goes on with what it has.
      if (d && d.get_model_by_name(`param:${names[0]}`)) {
        (firstScreen || Promise.resolve()).catch((err) => console.error(err)).then(() => resolve(d));
      } else {
        setTimeout(poll, 20);
      }
    };
    poll();
  });
}

// Before the first paint: what the page does in BokehJS's place, with Bokeh's own ways kept for the tests.
labelsStayInside();
const bokehOwn = { cssLookup: cssVisualsUnset(), fontSizeRead: plotFontSizeKept(), legendRebuild: legendsKept() };

window.kvx = { onControl: (widget) => { if (!echoed(widget)) request(); }, anim: animation, timings, parts, painted, state, runHere,
               onUpload, clearUpload, text: (name) => shown[name], get worker() { return worker; }, bokehOwn };

// Python starts before BokehJS has drawn (it takes 1-2 s on a loaded machine): the two overlap.
// Nothing in the worker's replies touches Bokeh until the reader changes something, which needs the doc.
const drawn = whenBokehReady();
startWorker();
doc = await drawn;
improveWidgets();
pickByWidth();
if (new URLSearchParams(location.search).get("present") === "1") present(true);
else if (narrow.matches) scalePlotFonts(plotFontScale());
refit();
narrow.addEventListener("change", () => { pickByWidth(); scalePlotFonts(plotFontScale()); refit(); });
window.addEventListener("resize", refit);
state.params = cfg.defaults;
apply(cfg.baked, false);
html.setAttribute("data-kvx-drawn", String(Math.round(performance.now())));   // the first screen, ms since navigation
state.plotted = true;
worker?.postMessage({ type: "go" });           // Python starts now that it no longer competes with the drawing
applyURL(location.search, true);
document.addEventListener("keydown", onKey);
document.getElementById("kvx-copy-link")?.addEventListener("click", copyLink);
document.getElementById("kvx-reset-all")?.addEventListener("click", resetAll);
document.addEventListener("click", onClick);
window.addEventListener("popstate", () => applyURL(location.search));
window.addEventListener("pagehide", flushURL);                  // a change not yet in the address goes in now
document.addEventListener("visibilitychange", () => { if (document.hidden) flushURL(); });
findServer();
