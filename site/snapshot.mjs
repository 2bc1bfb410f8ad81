// Makes the Pyodide memory snapshot the pages restore instead of booting Python (site/snapshot.py runs
// this with Node at build time):  node snapshot.mjs <pyodide folder> <model wheel> <out file>
//
// The snapshot is Python's heap after start-up with every model module imported and every page evaluated
// once at its defaults, so a page skips the interpreter's initialisation, the imports and the cold first
// run (cache-renting's first evaluation 215 -> 9 ms, eviction's 546 -> 11 ms, in Node). Pyodide keeps the
// file system outside that heap, so the worker still unpacks the wheel after restoring, once it has said it
// is ready (the pages need no file then: every model is imported and every baked.json read). No
// JavaScript object may be held by Python when the heap is taken (Pyodide cannot carry it over), so the
// worker's hooks into JavaScript (traces.progress) are set after restoring, not here.
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";

const [dir, wheel, out] = process.argv.slice(2);
const indexURL = path.resolve(dir) + path.sep;
const { loadPyodide } = await import(pathToFileURL(path.join(indexURL, "pyodide.mjs")).href);
const pyodide = await loadPyodide({ indexURL, _makeSnapshot: true, stdout: () => {}, stderr: (s) => console.error(s) });
pyodide.FS.writeFile("/tmp/kvx_models.whl", readFileSync(wheel));
pyodide.runPython(`
import importlib, pkgutil, site, zipfile
zipfile.ZipFile("/tmp/kvx_models.whl").extractall(site.getsitepackages()[0])
importlib.invalidate_caches()
import kvx.explainers
from kvx.explainers.registry import page_json
for m in pkgutil.walk_packages(kvx.explainers.__path__, "kvx.explainers."):
    importlib.import_module(m.name)
# One evaluation per page at its defaults: the first evaluation pays for lazy imports and cold caches
# (7-181 ms measured), so the snapshot holds them paid. The answers are what CPython gives (tests).
from kvx.explainers.registry import REGISTRY
for slug in REGISTRY:
    page_json(slug, "{}")
del m, slug, page_json, REGISTRY
`);
writeFileSync(out, pyodide.makeMemorySnapshot());
