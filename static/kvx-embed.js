// kvx embedding kit: one classic script with two roles.
//
// In another site's page (the parent): defines <kvx-explainer slug="paging" params="context=8192">, an
// iframe of the explainer that takes the height of its content, and sizes any plain
// <iframe data-kvx-autosize src="…/paging.html?embed=1"> the same way.
// In an explainer page opened with ?embed=1 inside an iframe (the child): tells the parent its content
// height (on load and whenever it changes), and keeps "Open in kvx ↗" pointing at the reader's settings.
//
// Messages, both namespaced so other scripts' messages are ignored:
//   child -> parent  {type: "kvx:height", height}   (height in CSS px, of the whole document)
//   parent -> child  {type: "kvx:measure"}           (asks for a height now; the child then also stops
//                                                      showing its own scrollbar, since the parent sizes it)
// The parent accepts a height only from an iframe it sizes, and only from that iframe's own origin.
(() => {
  "use strict";
  const HEIGHT = "kvx:height";
  const MEASURE = "kvx:measure";
  const script = document.currentScript;

  // ---- child: an explainer page inside an iframe ---------------------------------------------------
  function child() {
    const root = document.documentElement;
    let last = -1;
    // The document's own height (html is a block formatting root, so no margin escapes it); not the
    // viewport's, which is whatever height the parent gave us and would never let the frame shrink.
    const measure = () => Math.ceil(root.getBoundingClientRect().height);
    const post = (force) => {
      const height = measure();
      if (!force && height === last) return;
      last = height;
      window.parent.postMessage({ type: HEIGHT, height }, "*");    // a height is no secret: any parent may read it
    };
    const observer = new ResizeObserver(() => post(false));
    const watch = () => { observer.observe(root); if (document.body) observer.observe(document.body); post(true); };
    if (document.body) watch(); else document.addEventListener("DOMContentLoaded", watch);
    window.addEventListener("load", () => post(true));
    window.addEventListener("message", (event) => {
      if (event.source !== window.parent || !event.data || event.data.type !== MEASURE) return;
      root.style.overflowY = "hidden";       // the parent sizes us: a scrollbar here would only flicker
      post(true);
    });
  }

  // "Open in kvx ↗" opens the full page with the reader's current settings: the page keeps them in
  // its URL (kvx-page.js), so the link is rewritten from the URL just before it is followed or copied.
  function keepSettingsInLink() {
    const fresh = (a) => {
      const q = new URLSearchParams(location.search);
      q.delete("embed");
      const s = q.toString();
      a.href = `${location.pathname}${s ? `?${s}` : ""}`;
    };
    for (const kind of ["pointerdown", "focusin", "mouseover", "click", "contextmenu"]) {
      document.addEventListener(kind, (event) => {
        const a = event.target.closest && event.target.closest("a.kvx-open");
        if (a) fresh(a);
      }, true);
    }
  }

  // ---- parent: a page that embeds explainers ---------------------------------------------------------
  const sized = new Set();          // iframes this script sizes (the component's live in shadow roots)

  function originOf(iframe) {
    try { return new URL(iframe.src, location.href).origin; } catch (err) { return null; }
  }

  function onHeight(event) {
    if (!event.data || event.data.type !== HEIGHT) return;
    const height = Number(event.data.height);
    if (!Number.isFinite(height) || height <= 0 || height > 100000) return;
    const frames = [...sized, ...document.querySelectorAll("iframe[data-kvx-autosize]")];
    for (const iframe of frames) {
      if (iframe.contentWindow !== event.source || originOf(iframe) !== event.origin) continue;
      if (iframe.style.height !== `${height}px`) iframe.style.height = `${height}px`;
      if (!iframe.dataset.kvxSized) {
        iframe.dataset.kvxSized = "1";
        iframe.contentWindow.postMessage({ type: MEASURE }, event.origin);
      }
      iframe.dispatchEvent(new CustomEvent("kvx-resize", { bubbles: true, composed: true, detail: { height } }));
    }
  }

  function askForHeight(iframe) {
    // A frame that loaded before this script ran has already posted: ask it again.
    const ask = () => {
      delete iframe.dataset.kvxSized;
      const origin = originOf(iframe);
      if (iframe.contentWindow && origin && origin !== "null") iframe.contentWindow.postMessage({ type: MEASURE }, origin);
    };
    iframe.addEventListener("load", ask);
    ask();
  }

  // Where the kvx site is: the `src-base` attribute, else the folder above this script (…/static/).
  const defaultBase = script && script.src ? new URL("../", script.src).href : new URL("./", location.href).href;

  class KvxExplainer extends HTMLElement {
    static get observedAttributes() { return ["slug", "params", "src-base", "step", "title", "loading", "height"]; }

    constructor() {
      super();
      const shadow = this.attachShadow({ mode: "open" });
      const style = document.createElement("style");
      style.textContent = ":host { display: block; } iframe { display: block; width: 100%; border: 0; }";
      this.iframe = document.createElement("iframe");
      shadow.append(style, this.iframe);
    }

    // The explainer page's URL: the site base, the slug, the reader's starting parameters and embed=1.
    get src() {
      const slug = (this.getAttribute("slug") || "").trim();
      if (!/^[a-z0-9-]+$/.test(slug)) return null;
      const url = new URL(`${slug}.html`, new URL(this.getAttribute("src-base") || defaultBase, location.href));
      const q = new URLSearchParams((this.getAttribute("params") || "").replace(/^\?/, ""));
      if (this.hasAttribute("step")) q.set("step", this.getAttribute("step"));
      q.set("embed", "1");
      url.search = q.toString();
      return url.href;
    }

    connectedCallback() {
      sized.add(this.iframe);
      this.update();
    }

    disconnectedCallback() { sized.delete(this.iframe); }

    attributeChangedCallback() { if (this.isConnected) this.update(); }

    update() {
      const src = this.src;
      const frame = this.iframe;
      frame.title = this.getAttribute("title") || `kvx explainer: ${this.getAttribute("slug") || "?"}`;
      frame.loading = this.getAttribute("loading") || "lazy";
      if (!frame.style.height) frame.style.height = `${Number(this.getAttribute("height")) || 600}px`;   // until it reports
      if (src === null) {
        frame.removeAttribute("src");
        return;
      }
      if (frame.getAttribute("src") !== src) {
        delete frame.dataset.kvxSized;
        frame.src = src;
      }
    }
  }

  function parent() {
    window.addEventListener("message", onHeight);
    if (!customElements.get("kvx-explainer")) customElements.define("kvx-explainer", KvxExplainer);
    const plain = () => document.querySelectorAll("iframe[data-kvx-autosize]").forEach(askForHeight);
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", plain); else plain();
  }

  if (window.__kvxEmbed) return;              // loaded twice (one script tag per directive): once is enough
  window.__kvxEmbed = true;
  const explainer = document.getElementById("kvx-config") !== null;      // an explainer page, not another site's
  if (explainer) keepSettingsInLink();
  if (explainer && new URLSearchParams(location.search).get("embed") === "1" && window.parent !== window) child();
  else parent();
})();
