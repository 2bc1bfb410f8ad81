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
                queued: false, suppress: false, applied: 0, latestFrame: 0, queuedFrame: null };
const timings = [];
let doc = null;
let worker = null;
const uploads = {};          // name -> text of a file the reader gave the model (data, never in the URL)

const model = (name) => doc.get_model_by_name(name);
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
  return { params: out, step: q.has("step") ? Number(q.get("step")) : null };
}

function writeURL(params) {
  const q = new URLSearchParams(location.search);
  for (const k of names) {
    const dflt = cfg.defaults[k] === null ? "" : String(cfg.defaults[k]);
    if (params[k] !== "" && String(params[k]) !== dflt && Number(params[k]) !== Number(dflt)) q.set(k, params[k]);
    else q.delete(k);
  }
  const opening = anim() && anim().mode === "on_demand" ? cfg.baked.animation.frame : lastFrame();
  if (anim() && state.frame !== opening) q.set("step", state.frame); else q.delete("step");
  const s = q.toString();
  history.replaceState(null, "", s ? `?${s}` : location.pathname);
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
  state.suppress = true;
  for (const k of names) {
    const v = values[k] ?? cfg.defaults[k];
    model(`param:${k}`).value = v === null ? "" : String(v);
  }
  state.suppress = false;
}

function showErrors(field, message) {
  for (const k of names) model(`error:${k}`).text = k === field ? message : "";
  for (const box of doc.all_models) {                 // an upload's message sits under its file input
    if (box.name && box.name.startsWith("error:") && !names.includes(box.name.slice(6))) {
      box.text = box.name === `error:${field}` ? message : "";
    }
  }
  const notes = document.getElementById("kvx-notes");
  if (field === null || !(names.includes(field) || model(`error:${field}`))) notes.textContent = message;
}

function request() {
  const params = readParams();
  writeURL(params);
  if (!state.ready) {
    state.queued = true;
    if (state.started) {
      if (!worker) startWorker();                        // the last one died: start a new one
      setStatus("Python is warming up; your change applies as soon as it is ready.", "wait");
    }
    return;
  }
  state.latest += 1;
  state.sentAt = performance.now();
  worker.postMessage({ type: "run", id: state.latest, slug: cfg.slug, params });
}

// Animations whose frames are not cumulative ask the model for each frame (the latest ask wins).
function requestFrame(k) {
  if (!state.ready) { state.queuedFrame = k; return; }
  state.latestFrame += 1;
  const params = { ...readParams(), _frame: k };
  worker.postMessage({ type: "run", id: `frame-${state.latestFrame}`, slug: cfg.slug, params });
}

function onFrame(id, reply) {
  if (id !== `frame-${state.latestFrame}` || !reply.ok) return;
  if (JSON.stringify(reply.params) !== JSON.stringify(state.params)) return;   // from before a change
  const data = reply.data;
  for (const [key, cols] of Object.entries(data.sources)) model(`source:${key}`).data = cols;
  state.data.animation = data.animation;
  applyTexts(data.texts || {});
  setText("caption", data.animation.caption || "");
  html.dataset.kvxFrame = String(data.animation.frame);
  html.dataset.kvxFrameApplied = String(Number(html.dataset.kvxFrameApplied || 0) + 1);
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

function onResult(id, reply) {
  if (typeof id === "string") return onFrame(id, reply);
  if (id !== state.latest) return;            // a newer request is on its way
  if (state.progressShown) { state.progressShown = false; setStatus(state.readyText, "ready"); }
  if (!reply.ok) {
    if (reply.field in uploads) delete uploads[reply.field];   // a bad file is not kept: the next change uses the model's own data
    showErrors(reply.field, reply.message);
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
  timings.push(performance.now() - state.sentAt);
  state.applied += 1;
  html.dataset.kvxApplied = String(state.applied);
}

// ---- drawing -------------------------------------------------------------------------------------
function apply(data, keepFrame) {
  const wasAtEnd = state.frame >= lastFrame();
  state.data = data;
  for (const [key, cols] of Object.entries(data.sources)) {
    if (!(anim() && key === anim().source)) model(`source:${key}`).data = cols;   // cumulative: showFrame
  }
  for (const [name, [start, end]] of Object.entries(data.ranges || {})) {
    const r = model(`range:${name}`);
    r.start = start;
    r.end = end;
  }
  if (anim()) {
    const slider = model("anim:frame");
    state.suppress = true;
    slider.end = Math.max(1, lastFrame());
    state.suppress = false;
    const k = keepFrame && !wasAtEnd ? Math.min(state.frame, lastFrame()) : lastFrame();
    if (anim().mode === "on_demand" && state.wantFrame !== null) {
      const k = state.wantFrame;                       // a link's step, asked for with these parameters
      state.wantFrame = null;
      showFrame(k);
    } else if (anim().mode === "on_demand") {
      showFrameLocal(anim().frame, anim().caption);   // the model chose the frame to open on
    } else {
      showFrame(k);
    }
  }
  applyTexts(data.texts || {});
  renderFormula(data.formula || []);
  renderReadouts(data.readouts || []);
  document.getElementById("kvx-notes").textContent = (data.notes || []).join(" ");
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
  state.suppress = true;
  model("anim:frame").value = k;
  state.suppress = false;
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
  model(`source:${a.source}`).data = cols;
  setText("caption", a.captions[k] || "");
  state.suppress = true;
  model("anim:frame").value = k;
  state.suppress = false;
  html.dataset.kvxFrame = String(k);
}

function pause() {
  if (state.timer) writeURL(readParams());
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
  step() { pause(); showFrame(state.frame + 1); writeURL(readParams()); },
  back() { pause(); showFrame(state.frame - 1); writeURL(readParams()); },
  reset() { pause(); showFrame(0); writeURL(readParams()); },
  speed(label) {
    state.speed = parseFloat(label) || 1;
    if (state.timer) { pause(); animation.toggle(); }
  },
  // The slider echoes every frame we show; only a reader's move (a different frame) pauses and seeks.
  seek(value) { if (!state.suppress && Math.round(value) !== state.frame) { pause(); showFrame(value); writeURL(readParams()); } },
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

async function runHere() {
  const run = state.data.run;
  if (!run || !server.device) return;
  const button = model("run:button");
  button.disabled = true;
  const started = performance.now();
  say("Sent to the server…");
  try {
    let reply = await fetch(`${cfg.api}/kernels/${run.kernel}`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(run.request) });
    let body = await reply.json();
    while (reply.status === 202) {            // a long job: poll it and show its progress
      say(`Running: ${Math.round(100 * body.progress)}% ${body.message || ""} (${((performance.now() - started) / 1000).toFixed(1)} s)`);
      await new Promise((r) => setTimeout(r, 400));
      reply = await fetch(`${cfg.api}/jobs/${body.job}`);
      body = await reply.json();
    }
    if (!reply.ok) {
      const detail = Array.isArray(body.detail) ? body.detail.map((d) => d.msg).join(" ") : body.detail;
      say(`The server could not run it: ${detail}${reply.headers.get("Retry-After") ? " Try again in a few seconds." : ""}`);
      return;
    }
    // The model words the measurement next to its own prediction, in the worker.
    state.latest += 1;
    worker.postMessage({ type: "run", id: state.latest, slug: cfg.slug, params: { ...readParams(), _run_reply: body } });
  } catch (err) {
    say(`The server stopped answering (${err.message}); the page keeps working without it.`);
  } finally {
    button.disabled = false;
  }
}

// ---- start ---------------------------------------------------------------------------------------
function startWorker() {
  state.started = true;
  worker = new Worker(new URL(cfg.worker, location.href), { type: "module" });
  const t0 = performance.now();
  worker.onmessage = (event) => {
    const msg = event.data;
    if (msg.type === "ready") {
      state.ready = true;
      html.dataset.pyReadyMs = String(Math.round(performance.now()));   // since navigation start
      html.dataset.kvxBoot = msg.from;                                    // "snapshot" or "boot" (tests, bench)
      // The attribute says "every control is live", which also needs the drawn page (Python may win the race).
      drawn.then(() => html.setAttribute("data-py-ready", ""));
      state.readyText = `Python is ready (${((performance.now() - t0) / 1000).toFixed(1)} s): every control is live.`;
      setStatus(state.readyText, "ready");
      if (state.queued) { state.queued = false; request(); }
      else if (state.queuedFrame === null) warmUp();
      if (state.queuedFrame !== null) { const k = state.queuedFrame; state.queuedFrame = null; requestFrame(k); }
    } else if (msg.type === "failed") {
      setStatus(`Python could not start (${msg.message}); the plots keep the precomputed values.`, "failed");
    } else if (msg.type === "result") {
      state.pythonMs = msg.ms;
      onResult(msg.id, msg.reply);
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
  worker.postMessage({ type: "init", wheel: new URL(cfg.wheel, location.href).href,
                       pyodide: new URL(cfg.pyodide, location.href).href,
                       snapshot: cfg.snapshot && new URL(cfg.snapshot, location.href).href });
}

// Nothing asked yet: evaluate the opening parameters once so the reader's first change does not pay
// for the model's lazy imports and cold caches. Its reply is not sent back; a real change queues behind it.
function warmUp() {
  const params = {};
  for (const k of names) params[k] = cfg.defaults[k] === null ? "" : String(cfg.defaults[k]);
  worker.postMessage({ type: "warm", slug: cfg.slug, params });
}

// A worker that dies (out of memory, a fatal Python error) is replaced on the reader's next change;
// until then the plots keep their last values and the page says what happened.
function workerDied(message) {
  if (worker) worker.terminate();
  worker = null;
  state.ready = false;
  html.removeAttribute("data-py-ready");
  html.dataset.kvxWorkerDied = String(Number(html.dataset.kvxWorkerDied || 0) + 1);
  setStatus(`The Python worker stopped (${message}); the plots keep their last values, and Python restarts ` +
            "on your next change.", "failed");
}

function applyURL(search, initial = false) {
  const { params, step } = urlParams(search);
  setControls(params);
  const requested = !initial || Object.keys(params).length > 0;
  if (requested) request();
  if (step === null || !anim()) return;
  // An on-demand page redraws its opening frame when the new parameters' data arrives, so ask for the
  // URL's step after that reply (apply() below), not before it.
  if (requested && anim().mode === "on_demand") state.wantFrame = step;
  else showFrame(step);
}

function onKey(event) {
  const target = event.composedPath()[0];
  if (target && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(target.tagName)) return;
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

function whenBokehReady() {
  return new Promise((resolve) => {
    const poll = () => {
      const d = window.Bokeh && window.Bokeh.documents && window.Bokeh.documents[0];
      if (d && d.get_model_by_name(`param:${names[0]}`)) resolve(d); else setTimeout(poll, 20);
    };
    poll();
  });
}

window.kvx = { onControl: () => { if (!state.suppress) request(); }, anim: animation, timings, state, runHere,
               onUpload, clearUpload, text: (name) => shown[name], get worker() { return worker; } };

// Python starts before BokehJS has drawn (it takes 1-2 s on a loaded machine): the two overlap.
// Nothing in the worker's replies touches Bokeh until the reader changes something, which needs the doc.
const drawn = whenBokehReady();
startWorker();
doc = await drawn;
state.params = cfg.defaults;
apply(cfg.baked, false);
html.setAttribute("data-kvx-drawn", String(Math.round(performance.now())));   // first plot, ms since navigation
applyURL(location.search, true);
document.addEventListener("keydown", onKey);
document.addEventListener("click", onClick);
window.addEventListener("popstate", () => applyURL(location.search));
findServer();
