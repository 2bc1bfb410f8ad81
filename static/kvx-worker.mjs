// Runs the explainer's Python model in Pyodide, off the main thread, so the page never freezes.
// Messages in:  {type: "init", wheel}  then  {type: "run", id, slug, params}
// Messages out: {type: "ready", ms} | {type: "failed", message} | {type: "result", id, reply}
//               | {type: "progress", id, share, text} (during a long run)
import { loadPyodide } from "../vendor/pyodide/pyodide.mjs";

let pageJson = null;
let starting = null;
let current = null;          // the id of the request Python is working on
// A long replay (a big uploaded trace) reports how far it is; the page shows it while Python works.
self.kvxProgress = (share, text) => self.postMessage({ type: "progress", id: current, share, text });

// The model wheel is fetched while Pyodide core loads (not after it), then unzipped into
// site-packages with the standard library: it is pure Python, so that is all installing it takes.
const INSTALL = `
import importlib, site, zipfile
zipfile.ZipFile("/tmp/kvx_models.whl").extractall(site.getsitepackages()[0])
importlib.invalidate_caches()
from kvx.explainers.registry import page_json
import js
from kvx.explainers.core import traces
traces.progress = lambda share, text: js.kvxProgress(share, text)
page_json`;

async function start(wheelURL) {
  const t0 = performance.now();
  const wheel = fetch(new URL(wheelURL, self.location.href)).then((r) => {
    if (!r.ok) throw new Error(`the model wheel answered HTTP ${r.status}`);
    return r.arrayBuffer();
  });
  const pyodide = await loadPyodide({
    indexURL: new URL("../vendor/pyodide/", import.meta.url).href,
    stdout: () => {}, stderr: (s) => console.warn(s),
  });
  pyodide.FS.writeFile("/tmp/kvx_models.whl", new Uint8Array(await wheel));
  pageJson = pyodide.runPython(INSTALL);
  return performance.now() - t0;
}

self.onmessage = async (event) => {
  const msg = event.data;
  if (msg.type === "init") {
    starting = start(msg.wheel);
    try {
      const ms = await starting;
      self.postMessage({ type: "ready", ms });
    } catch (err) {
      self.postMessage({ type: "failed", message: String(err && err.message || err) });
    }
  } else if (msg.type === "run") {
    await starting;
    // page_json never raises: a bad value comes back as {ok: false, field, message}. What can still
    // fail is Pyodide itself (out of memory, a fatal error): the page then replaces this worker.
    const t0 = performance.now();
    current = msg.id;
    let reply;
    try {
      reply = JSON.parse(pageJson(msg.slug, JSON.stringify(msg.params)));
    } catch (err) {
      self.postMessage({ type: "crashed", message: String(err && err.message || err).split("\n")[0] });
      return;
    }
    self.postMessage({ type: "result", id: msg.id, reply, ms: performance.now() - t0 });   // Python's share
  }
};
