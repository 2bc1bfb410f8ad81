// Runs the explainer's Python model in Pyodide, off the main thread, so the page never freezes.
// Messages in:  {type: "init", wheel, pyodide, snapshot}, {type: "go"} (the page is drawn: start Python)
//               then  {type: "run", id, slug, params}
//               | {type: "warm", slug, params} (the opening parameters, evaluated before any change: see below)
//               | {type: "hold"} (the reader has pressed, typed or focused something: end the warm-up)
// Messages out: {type: "ready", ms, from: "snapshot" | "boot", frozen} | {type: "failed", message} | {type: "result", id, reply, ms, at}
//               | {type: "warmed", reply, other, passParams} (the opening parameters' reply, one other value's,
//                 and the parameters the page's passes draw, after a "warm")
//               | {type: "progress", id, share, text} (during a long run)
//               | {type: "warm-ended", runs, ms, by, reopened} (the warm-up's evaluations, what ended them, and whether
//                 the opening was evaluated once more after them)
// Pyodide's folder is named by its content hash (site/assets.py), so the page passes its URL and the
// worker imports it from there rather than from a fixed relative path.

let pageJson = null;
let warmUpValues = () => [];
let neighbourValues = () => [];
let starting = null;
let unpacked = null;         // the model wheel's files in site-packages (after "ready" when restored from the snapshot)
let current = null;          // the id of the request Python is working on
let stopped = null;          // what stopped the warm-up: a "hold" (the reader touched the page) or a "run"
// The warm-up's budget after ready (registry.WARM_UP_RUNS: why). A real change stops it, waiting for one
// evaluation at most. The values are gone through again until the budget is spent: on the arithmetic pages 200
// runs take about half a second, and a first change a second after ready, with the warm-up over, still found
// the engine optimising (cross-layer: 13-19 ms of Python against 2-3 ms for the rest; warmed up to the budget,
// 1-2 ms).
const WARM_UP_MS = 4000;
// Between warm-up runs the worker yields to its event loop, so a real change that came meanwhile is taken
// next. Through a MessageChannel, not setTimeout(0): nested timers are clamped to 4 ms each (the HTML spec),
// which added about 0.8 s to 200 arithmetic runs and kept the warm-up going when the reader's first change came.
const turn = new MessageChannel();
const yieldToEvents = () => new Promise((resolve) => {
  turn.port1.onmessage = () => resolve();
  turn.port2.postMessage(null);
});
// A long replay (a big uploaded trace) reports how far it is; the page shows it while Python works.
// On the page's clock too (performance.timeOrigin), for its breakdown of a round trip.
const clock = () => performance.timeOrigin + performance.now();
self.kvxProgress = (share, text) => self.postMessage({ type: "progress", id: current, share, text });

// Pyodide's loader fetches its WebAssembly itself, and when that fails (an HTTP error, the network), Emscripten
// aborts from a callback and loadPyodide never settles: the page said "warming up" for good. So this worker
// watches that fetch, and a failed one fails the start (wasmLost rejects the promise start is raced against).
let wasmLost = () => {};
const plainFetch = self.fetch.bind(self);
self.fetch = (input, init) => {
  const answer = plainFetch(input, init);
  if (String(input && input.url || input).endsWith(".wasm")) {
    answer.then((r) => { if (!r.ok) wasmLost(new Error(`Python's WebAssembly answered HTTP ${r.status}`)); },
                (err) => wasmLost(new Error(`Python's WebAssembly could not be fetched (${err && err.message || err})`)));
  }
  return answer;
};

// The model wheel is fetched while Pyodide core loads (not after it), then unzipped into
// site-packages with the standard library: it is pure Python, so that is all installing it takes.
const UNPACK = `
import importlib, site, zipfile
zipfile.ZipFile("/tmp/kvx_models.whl").extractall(site.getsitepackages()[0])
importlib.invalidate_caches()`;
const HOOK = `
from kvx.explainers.registry import neighbour_values, page_json, warm_up_values
import js
from kvx.explainers.core import traces
traces.progress = lambda share, text: js.kvxProgress(share, text)
def page_reply(slug, params):
    return page_json(slug, params, packed=True)
# What Python holds now (the interpreter, every model, the snapshot's caches) lives as long as the page: out of
# the cycle collector's reach, a full collection need not walk it again. (A cached reply from then that is evicted
# later is still freed by its reference count; only a reference cycle among such objects would stay.) In Pyodide under Node, with the
# snapshot's heap (31,000 objects): a full collection 26 ms -> 0.7 ms; 40 load-balancer changes after the
# warm-up, the collector's time 5.6-6.8 -> 2.3-2.4 ms and its longest pause 5.4-6.5 -> 1.6-1.9 ms.
import gc
gc.freeze()
page_reply, gc.get_freeze_count()`;

// The reply's packed columns (registry.pack_columns: long columns of floats as base64 doubles) become
// Float64Arrays, which BokehJS takes as they are and postMessage copies in one piece.
function decodeColumns(reply) {
  const sources = reply.ok && reply.data && reply.data.sources;
  if (sources) {
    for (const cols of Object.values(sources)) {
      for (const [name, col] of Object.entries(cols)) if (col && col.f64 !== undefined) cols[name] = float64(col.f64);
    }
  }
  return reply;
}
// A page's reply for these parameters, as the page takes it: a run's whole path in the worker but the posting.
const pageReply = (slug, params) => decodeColumns(JSON.parse(pageJson(slug, JSON.stringify(params))));
function float64(text) {
  const bytes = atob(text);
  const out = new Uint8Array(bytes.length);
  for (let i = 0; i < bytes.length; i++) out[i] = bytes.charCodeAt(i);
  return new Float64Array(out.buffer);
}

function download(url, what) {
  return fetch(new URL(url, self.location.href)).then((r) => {
    if (!r.ok) throw new Error(`${what} answered HTTP ${r.status}`);
    return r.arrayBuffer();
  });
}

// Restoring the build's memory snapshot (site/snapshot.py: Python started, every model imported) skips
// the interpreter's start-up and the imports. Anything wrong with it (missing, another Pyodide build,
// a browser that refuses it) and Python boots the normal way: slower, same answers, nothing to report.
async function boot(loadPyodide, pyodideURL, snapshot) {
  const options = { indexURL: pyodideURL, stdout: () => {}, stderr: (s) => console.warn(s) };
  if (snapshot) {
    try {
      return { pyodide: await loadPyodide({ ...options, _loadSnapshot: snapshot }), from: "snapshot" };
    } catch (err) {
      console.info(`kvx: booting Python without the snapshot (${String(err && err.message || err).split("\n")[0]})`);
    }
  }
  return { pyodide: await loadPyodide(options), from: "boot" };
}

// The page starts this worker before BokehJS has drawn it (explainer.html), and says "go" once it has: until
// then the worker only downloads (the model wheel, the snapshot, Pyodide's loader), since starting Python
// beside BokehJS's first drawing, on two cores, put the first plot 0.5-0.7 s later.
let go = null;
const drawn = new Promise((resolve) => { go = resolve; });

async function start(wheelURL, pyodideURL, snapshotURL) {
  const wheel = download(wheelURL, "the model wheel");      // fetched while Pyodide loads, not after
  wheel.catch(() => {});                                    // reported below, where it is awaited
  const snapshot = snapshotURL && download(snapshotURL, "the snapshot");
  if (snapshot) snapshot.catch(() => {});                   // boot() falls back to a plain start
  const { loadPyodide } = await import(new URL("pyodide.mjs", pyodideURL).href);
  await drawn;
  const t0 = performance.now();
  const { pyodide, from } = await boot(loadPyodide, pyodideURL, snapshot);
  const unpack = async () => {
    pyodide.FS.writeFile("/tmp/kvx_models.whl", new Uint8Array(await wheel));
    pyodide.runPython(UNPACK);
  };
  // Restored from the snapshot, every model is imported and every page has run once (site/snapshot.mjs), so
  // Python can answer at once: the files (for anything imported or read later) are unpacked after "ready",
  // which came 60-90 ms sooner. Booted, the models are imported from them, so they come first.
  if (from === "snapshot") {
    unpacked = yieldToEvents().then(unpack).catch((err) => console.warn(`kvx: the model files (${err.message})`));
  } else {
    await unpack();
  }
  const hooked = pyodide.runPython(HOOK);
  pageJson = hooked.get(0);
  const frozen = hooked.get(1);
  hooked.destroy();
  const fromPython = (name) => {
    const f = pyodide.globals.get(name);
    return (slug) => {
      const list = f(slug);
      try { return list.toJs({ dict_converter: Object.fromEntries }); } finally { list.destroy(); }
    };
  };
  warmUpValues = fromPython("warm_up_values");
  neighbourValues = fromPython("neighbour_values");
  return { ms: performance.now() - t0, from, frozen };
}

self.onmessage = async (event) => {
  const msg = event.data;
  if (msg.type === "go") {
    go();
  } else if (msg.type === "init") {
    const lost = new Promise((_, reject) => { wasmLost = reject; });     // self.fetch, above
    starting = start(msg.wheel, msg.pyodide, msg.snapshot);
    try {
      const { ms, from, frozen } = await Promise.race([starting, lost]);
      self.postMessage({ type: "ready", ms, from, frozen });
    } catch (err) {
      self.postMessage({ type: "failed", message: String(err && err.message || err) });
    }
  } else if (msg.type === "warm") {
    // Right after ready, with nothing asked yet: the first evaluation pays for lazy imports and cold
    // caches (7-181 ms measured), so pay it now rather than on the reader's first change. Then
    // evaluations at other values (registry.warm_up_values: why), one task each, so a real change that
    // comes meanwhile waits for one evaluation at most, and none after it.
    await starting;
    await unpacked;
    const changes = warmUpValues(msg.slug);
    let runs = 0;                              // evaluations at other values
    try {
      const reply = pageReply(msg.slug, msg.params);
      // and one other value's, for the page to run its drawing's update paths on changed data (warmDrawing)
      const otherParams = changes.length ? { ...msg.params, ...changes[0] } : null;
      const other = otherParams ? pageReply(msg.slug, otherParams) : null;
      runs = other ? 1 : 0;
      // and the opening's neighbours, which the page's passes draw (kvx-page.js, warmDrawingAgain)
      const passParams = neighbourValues(msg.slug).map((c) => ({ ...msg.params, ...c }));
      self.postMessage({ type: "warmed", reply, other, passParams });   // the page warms its drawing with them (same picture)
    } catch (err) { /* a real run will report it */ }
    const t0 = performance.now();
    for (let i = 1; changes.length && !stopped && performance.now() - t0 < WARM_UP_MS; i += 1) {
      await yieldToEvents();
      if (stopped) break;
      // The reply decoded too, as a run's is: else the columns' decoding (float64's loop) had run only twice
      // before the reader's first change, which then paid for the engine compiling it (kvx-page.js,
      // warmDrawingAgain: measured with it).
      try { pageReply(msg.slug, { ...msg.params, ...changes[i % changes.length] }); } catch (err) { break; }
      runs += 1;
    }
    // The opening parameters once more, so the model's caches end on the opening's entries, not the warm-up's.
    // A reader's first change shares work with the opening that the warm-up's values evicted: agent-sessions'
    // cliff, thirteen runs at the opening's seed, which 200 other seeds pushed out of simulate's cache, so the
    // first change reran all thirteen (Python 16-18 ms in the browser against 7 for the rest; in CPython after
    // the warm-up 10.9 ms against 2.4 with this). Not after a reader's change has come: it is waiting.
    const reopened = runs > 0 && stopped !== "run";
    if (reopened) {                            // the caches are what count: its reply is neither decoded nor kept
      try { pageJson(msg.slug, JSON.stringify(msg.params)); } catch (err) { /* a real run will report it */ }
    }
    self.postMessage({ type: "warm-ended", runs, ms: performance.now() - t0, by: stopped || "budget", reopened });
  } else if (msg.type === "hold") {
    stopped = stopped || "hold";               // the reader is about to change something: the warm-up ends
  } else if (msg.type === "run") {
    const received = clock();                  // the page's breakdown of a round trip
    if (!String(msg.id).startsWith("warm-")) stopped = stopped || "run";   // a warmed drawing's pass is not a change
    await starting;
    await unpacked;
    // page_json never raises: a bad value comes back as {ok: false, field, message}. What can still
    // fail is Pyodide itself (out of memory, a fatal error): the page then replaces this worker.
    const t0 = performance.now();
    current = msg.id;
    let reply;
    try {
      reply = pageReply(msg.slug, msg.params);
    } catch (err) {
      self.postMessage({ type: "crashed", message: String(err && err.message || err).split("\n")[0] });
      return;
    }
    self.postMessage({ type: "result", id: msg.id, reply, ms: performance.now() - t0,      // Python's share
                       at: { received, sent: clock() } });
  }
};
