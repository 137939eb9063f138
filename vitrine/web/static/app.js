// Vitrine's browser UI: search (words, photo or both), filters, product page with
// recommendations, and a compare tray. Plain ES module, no dependencies, no network access
// beyond the Vitrine API that serves it.
//
// Routes (hash based, so the page works behind any prefix and needs no server routing):
//   #/                         welcome
//   #/search?q=..&photo=p1&gender=..&category=..&colour=..&sort=..   results (pages: "More results")
//   #/product/ID               product page
//   #/compare?ids=A,B[,C..]    side-by-side comparison

const K = 24;                          // results per page
const SORTS = ["relevance", "price_asc", "price_desc", "newest"];
const FACET_FIELDS = ["gender", "category", "colour"];
const FACET_LABELS = { gender: "Gender", category: "Category", colour: "Colour" };
const CHIPS_SHOWN = 8;                 // chips per field before "More"
const TRAY_MAX = 5;
const MAX_PHOTO_BYTES = 4_000_000;     // bigger photos are scaled down in the browser first
const GONE = new Set([404, 405, 501]); // an endpoint this server does not have: hide its part

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

// ---------------------------------------------------------------------------------------------
// state

function sessionGet(key) {
  try { return sessionStorage.getItem(key); } catch { return null; }
}

function sessionSet(key, value) {
  try { sessionStorage.setItem(key, value); } catch { /* storage off: fine */ }
}

const state = {
  photo: null,            // {id, name, dataUrl, blobUrl}
  photoSeq: 0,
  filters: { gender: [], category: [], colour: [] },
  sort: "relevance",      // the results' order (the API's sort)
  maxK: 100,              // the deepest result the server pages to (GET /health's max_k)
  expanded: new Set(),    // facet fields showing all values
  facets: null,           // {field: [{value, count}]} from GET /facets, or null
  cache: new Map(),       // request key -> search response (back/forward without refetching)
  compareCache: null,     // {key, data}: a compare response we already have (compare intent)
  tray: loadTray(),       // [{id, title, image_url}]
  lastSearchHash: sessionGet("vitrine.lastSearch") || "#/", // where "Back to results" goes, across reloads
  last: null,             // {req, resp} of the rendered search
  searchAbort: null,
  renders: 0,
};

// exposed for the end-to-end tests and for curious users in the console
window.vitrine = { state, renders: 0, lastRenderMs: null, lastRequest: null, lastResponse: null };

// ---------------------------------------------------------------------------------------------
// small helpers

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
  describe() {
    return this.status ? `${this.message} (${this.status} ${this.code})` : this.message;
  }
}

async function api(path, { method = "GET", body, signal } = {}) {
  let res;
  try {
    res = await fetch(path, {
      method,
      signal,
      headers: body ? { "Content-Type": "application/json", Accept: "application/json" } : { Accept: "application/json" },
      body: body ? JSON.stringify(body) : undefined,
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "network", "Could not reach the Vitrine server. Is it still running?");
  }
  let data = null;
  try {
    data = await res.json();
  } catch {
    data = null;
  }
  if (!res.ok) {
    const err = data && data.error;
    throw new ApiError(res.status, (err && err.code) || "http_error",
      (err && err.message) || `the server answered ${res.status} ${res.statusText}`);
  }
  return data;
}

function formatPrice(price, currency) {
  if (price === null || price === undefined) return "";
  if (currency) {
    try {
      return new Intl.NumberFormat(undefined, { style: "currency", currency }).format(price);
    } catch { /* an unknown currency code: fall through */ }
  }
  const num = new Intl.NumberFormat(undefined, { maximumFractionDigits: 2 }).format(price);
  return currency ? `${num} ${currency}` : num;
}

const attrOf = (item, ...keys) => {
  const attrs = item.attributes || {};
  for (const k of Object.keys(attrs)) {
    if (keys.includes(k.toLowerCase())) return attrs[k];
  }
  return null;
};
const genderOf = (item) => attrOf(item, "gender");
const colourOf = (item) => attrOf(item, "colour", "color", "basecolour", "basecolor");
const fmt = (x, d = 3) => (typeof x === "number" ? x.toFixed(d) : String(x));
const same = (a, b) => String(a).toLowerCase() === String(b).toLowerCase();
// "articleType" / "article_type" -> "article type"
const attrName = (k) => String(k).replace(/([a-z])([A-Z])/g, "$1 $2").replace(/_/g, " ").toLowerCase();

function swatch(colour) {
  const name = String(colour).toLowerCase().replace(/[^a-z]/g, "");
  const extra = { offwhite: "#f4f1e8", navyblue: "navy", multi: "conic-gradient(red, yellow, lime, aqua, blue, magenta, red)",
    mustard: "#d4a017", burgundy: "#800020", charcoal: "#36454f", skin: "#e8c4a0", nude: "#e3bc9a",
    rust: "#b7410e", mauve: "#e0b0ff", copper: "#b87333", metallic: "#aaa9ad", taupe: "#483c32",
    coffeebrown: "#6f4e37", mushroombrown: "#a48d74", fluorescentgreen: "#39ff14", teal: "teal",
    creme: "#fffdd0", peach: "#ffcba4", rose: "#ff007f", lime: "lime", steel: "#71797e", grey: "grey",
    greymelange: "#b6b6b4", tanbrown: "#a0785a", lavender: "lavender" };
  const css = extra[name] || (CSS.supports("color", name) ? name : null);
  return css ? h("span", { class: "swatch", style: `background:${css}`, "aria-hidden": "true" }) : null;
}

// ---------------------------------------------------------------------------------------------
// compare tray (kept in localStorage so it survives reloads)

function loadTray() {
  try {
    const t = JSON.parse(localStorage.getItem("vitrine.tray") || "[]");
    return Array.isArray(t) ? t.filter((x) => x && x.id).slice(0, TRAY_MAX) : [];
  } catch {
    return [];
  }
}

function saveTray() {
  try { localStorage.setItem("vitrine.tray", JSON.stringify(state.tray)); } catch { /* private mode */ }
}

const inTray = (id) => state.tray.some((t) => t.id === id);

function toggleTray(item, want) {
  const has = inTray(item.id);
  if (want === undefined) want = !has;
  if (want && !has) {
    if (state.tray.length >= TRAY_MAX) {
      announce(`The compare tray holds at most ${TRAY_MAX} products; remove one first.`);
      renderTray();
      return false;
    }
    state.tray.push({ id: item.id, title: item.title, image_url: item.image_url || null });
  } else if (!want && has) {
    state.tray = state.tray.filter((t) => t.id !== item.id);
  }
  saveTray();
  renderTray();
  return true;
}

function renderTray() {
  const tray = $("#tray");
  const list = $("#tray-items");
  const n = state.tray.length;
  tray.hidden = n === 0;
  document.body.classList.toggle("has-tray", n > 0);
  list.replaceChildren(...state.tray.map((t) => h("li", { class: "tray-item", dataset: { id: t.id } },
    t.image_url ? h("img", { src: t.image_url, alt: "", width: 36, height: 48, loading: "lazy" }) : null,
    h("a", { href: `#/product/${encodeURIComponent(t.id)}`, class: "tray-title", title: t.title }, t.title),
    h("button", { type: "button", class: "icon-btn", "aria-label": `Remove ${t.title} from compare`,
      onclick: () => toggleTray(t, false) }, "×"))));
  $("#tray-count").textContent = n < 2 ? `${n} of ${TRAY_MAX} — pick at least 2 to compare` : `${n} of ${TRAY_MAX}`;
  const open = $("#tray-open");
  open.disabled = n < 2;
  open.textContent = `Compare (${n})`;
  // keep every compare checkbox / button on the page in step
  for (const cb of $$("input.cmp-box")) cb.checked = inTray(cb.dataset.id);
  const pc = $("#product-compare");
  if (pc.dataset.id) {
    const on = inTray(pc.dataset.id);
    pc.setAttribute("aria-pressed", String(on));
    pc.textContent = on ? "Remove from compare" : "Add to compare";
  }
}

function announce(msg) {
  const view = currentView();
  const el = view === "product" ? $("#product-status") : view === "compare" ? $("#compare-status") : $("#status");
  el.textContent = msg;
}

// ---------------------------------------------------------------------------------------------
// routing

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const i = raw.indexOf("?");
  const path = i < 0 ? raw : raw.slice(0, i);
  const params = new URLSearchParams(i < 0 ? "" : raw.slice(i + 1));
  return { path, params };
}

let view = "search";
const currentView = () => view;

function show(name) {
  view = name;
  for (const v of ["search", "product", "compare"]) $(`#view-${v}`).hidden = v !== name;
  document.body.dataset.view = name;
}

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

async function route() {
  const { path, params } = parseHash();
  if (path.startsWith("/product/")) {
    show("product");
    await showProduct(decodeURIComponent(path.slice("/product/".length)));
  } else if (path === "/compare") {
    show("compare");
    const ids = (params.get("ids") || "").split(",").map((s) => s.trim()).filter(Boolean);
    await showCompare(ids);
  } else if (path === "/search") {
    show("search");
    state.lastSearchHash = location.hash;
    sessionSet("vitrine.lastSearch", location.hash);
    await showSearch(params);
  } else {
    show("search");
    showWelcome();
  }
}

// ---------------------------------------------------------------------------------------------
// search

function searchHash(text, photo, filters, sort = state.sort) {
  const p = new URLSearchParams();
  if (text) p.set("q", text);
  if (photo) p.set("photo", photo.id);
  for (const f of FACET_FIELDS) for (const v of filters[f] || []) p.append(f, v);
  if (sort && sort !== "relevance") p.set("sort", sort);
  return `#/search?${p.toString()}`;
}

function submitSearch({ keepFilters = false } = {}) {
  const text = $("#q").value.trim();
  if (!text && !state.photo) {
    setSearchState("error");
    $("#status").replaceChildren(h("p", { class: "error" }, "Type some words or add a photo to search."));
    $("#q").focus();
    return;
  }
  const cur = parseHash();
  const sameQuery = cur.path === "/search" && (cur.params.get("q") || "") === text &&
    (cur.params.get("photo") || "") === (state.photo ? state.photo.id : "");
  const filters = keepFilters || sameQuery ? state.filters : { gender: [], category: [], colour: [] };
  go(searchHash(text, state.photo, filters));
}

function setSearchState(s) {
  $("#view-search").dataset.state = s;
}

function showWelcome() {
  state.filters = { gender: [], category: [], colour: [] };
  state.last = null;
  $("#q").value = "";
  clearPhoto(false);
  setSearchState("idle");
  $("#welcome").hidden = false;
  for (const id of ["#understood", "#filters", "#answer", "#intent-recs", "#toolbar", "#more-box"]) $(id).hidden = true;
  $("#results").replaceChildren();
  $("#status").replaceChildren();
}

async function showSearch(params) {
  const text = (params.get("q") || "").trim();
  const photoId = params.get("photo");
  state.filters = { gender: params.getAll("gender"), category: params.getAll("category"), colour: params.getAll("colour") };
  state.sort = SORTS.includes(params.get("sort")) ? params.get("sort") : "relevance";
  $("#sort").value = state.sort;
  $("#q").value = text;
  $("#welcome").hidden = true;
  if (photoId && (!state.photo || state.photo.id !== photoId)) {
    // the photo lives in this page's memory only (it is not in the address)
    if (!text) {
      setSearchState("error");
      $("#results").replaceChildren();
      $("#status").replaceChildren(h("p", { class: "error" },
        "The photo of this search is no longer here (photos are not kept in the address). Add it again."));
      return;
    }
  }
  const photo = photoId && state.photo && state.photo.id === photoId ? state.photo : null;
  if (!photo) clearPhoto(false);
  if (!text && !photo) { showWelcome(); return; }

  const filters = {};
  for (const f of FACET_FIELDS) if (state.filters[f].length) filters[f] = state.filters[f].length === 1 ? state.filters[f][0] : state.filters[f];
  const req = { k: K, explain: true, facets: FACET_FIELDS, highlight: true };
  if (state.sort !== "relevance") req.sort = state.sort;
  if (text) req.text = text;
  if (photo) req.image_b64 = photo.dataUrl;
  if (Object.keys(filters).length) req.filters = filters;
  const key = JSON.stringify({ text, photo: photo ? photo.id : null, filters, sort: state.sort });

  if (state.searchAbort) state.searchAbort.abort();
  const cached = state.cache.get(key);
  if (cached) {
    renderSearch(req, cached, { fresh: false, t0: performance.now() });
    return;
  }
  const ctl = new AbortController();
  state.searchAbort = ctl;
  setSearchState("loading");
  $("#status").replaceChildren(h("p", { class: "muted" }, photo && text ? "Searching with your words and photo…"
    : photo ? "Searching with your photo…" : `Searching for “${text}”…`));
  $("#search-btn").disabled = true;
  try {
    const resp = await api("v1/search", { method: "POST", body: req, signal: ctl.signal });
    const t0 = answeredAt("/search");
    state.cache.set(key, resp);
    if (state.cache.size > 30) state.cache.delete(state.cache.keys().next().value);
    renderSearch(req, resp, { fresh: true, t0 });
  } catch (e) {
    if (e.name === "AbortError") return;
    setSearchState("error");
    $("#results").replaceChildren();
    $("#understood").hidden = true;
    $("#answer").hidden = true;
    $("#intent-recs").hidden = true;
    $("#status").replaceChildren(h("p", { class: "error", role: "alert" },
      h("strong", {}, "The search failed: "), e instanceof ApiError ? e.describe() : String(e)));
    $("#filters").hidden = true;
    $("#more-box").hidden = true;
  } finally {
    if (state.searchAbort === ctl) state.searchAbort = null;
    $("#search-btn").disabled = false;
  }
}

function renderSearch(req, resp, { fresh, t0 }) {
  const tStart = performance.now();
  state.last = { req, resp };
  const hits = resp.results || [];
  renderUnderstood(req, resp);
  renderFilters(hits);
  renderAnswer(resp.answer);
  renderIntentRecs(resp.recommendations);

  const status = $("#status");
  const filtered = FACET_FIELDS.some((f) => state.filters[f].length);
  if (!hits.length) {
    setSearchState("empty");
    const what = req.text ? ` for “${req.text}”${req.image_b64 ? " and your photo" : ""}` : req.image_b64 ? " for your photo" : "";
    const flt = FACET_FIELDS.filter((f) => state.filters[f].length)
      .map((f) => `${FACET_LABELS[f].toLowerCase()} ${state.filters[f].join(" or ")}`).join(" and ");
    status.replaceChildren(h("div", { class: "empty" },
      h("p", {}, h("strong", {}, "No products found"), what,
        filtered ? ` with ${flt}. ` : resp.answer ? " — this looks like a question about an order; see the answer above. "
          : ". Try other words or another photo. "),
      filtered ? h("button", { type: "button", class: "secondary", onclick: clearFilters }, "Clear the filters") : null));
  } else {
    setSearchState("results");
    const what = req.text && req.image_b64 ? `${searchedText(req, resp)} and your photo` : req.text ? searchedText(req, resp) : "your photo";
    status.replaceChildren(h("p", { class: "muted" }, `${countText(hits.length, resp)} for ${what} in ${Math.round(resp.took_ms)} ms`));
  }
  $("#toolbar").hidden = !hits.length;
  updateMore(resp);
  if (resp.compare && resp.compare.products && resp.compare.products.length >= 2) {
    const ids = resp.compare.products.map((p) => p.id);
    status.append(h("p", { class: "notice" }, "This looks like a comparison. ",
      h("a", { href: `#/compare?ids=${ids.map(encodeURIComponent).join(",")}` }, "Open the comparison")));
  }

  // the results grid: one DOM build per response, photos lazy-loaded
  const frag = document.createDocumentFragment();
  hits.forEach((hit, i) => frag.append(resultCard(hit, i)));
  $("#results").replaceChildren(frag);
  const tBuilt = performance.now();
  void $("#results").offsetHeight; // style + layout now (the frame would do it anyway), so it is measured

  const ms = performance.now() - t0;
  window.vitrine.lastBreakdown = { parse_ms: tStart - t0, build_ms: tBuilt - tStart, layout_ms: performance.now() - tBuilt };
  state.renders += 1;
  Object.assign(window.vitrine, { renders: state.renders, lastRenderMs: ms, lastFrameMs: null, lastRequest: req, lastResponse: resp });
  document.body.dataset.renders = String(state.renders);
  const seq = state.renders;
  // when the frame showing these results was produced (the callback runs before that frame paints)
  requestAnimationFrame(() => { if (window.vitrine.renders === seq) window.vitrine.lastFrameMs = performance.now() - t0; });

  if (fresh && resp.compare && resp.compare.products && resp.compare.products.length >= 2) {
    openComparison(resp.compare);
  } else if (fresh && !resp.intent && !req.image_b64 && VS.test(req.text || "")) {
    // no intent model on this server: "A vs B" still asks for a comparison, by its words
    compareByText(req.text);
  }
}

const VS = /\S\s+(vs\.?|versus)\s+\S/i;

function searchedText(req, resp) {
  // the words searched: a misspelt or run-together word is searched as the catalogue's (query.corrected)
  const fixed = resp.query && resp.query.corrected;
  return fixed ? `“${fixed}” (you typed “${req.text}”)` : `“${req.text}”`;
}

function countText(shown, resp) {
  // "24 of 143 results" (total: the products matching above the relevance floor; "about" when estimated)
  const total = typeof resp.total === "number" ? Math.max(resp.total, state.sort === "relevance" ? 0 : shown) : null;
  if (total === null || total <= shown) return `${shown} result${shown === 1 ? "" : "s"}`;
  return `${shown} of ${resp.total_exact ? "" : "about "}${total.toLocaleString()} results`;
}

function nextPage(resp) {
  // the next page's offset and size, or null when there is none (or the server pages no deeper)
  const have = (resp.results || []).length;
  const total = typeof resp.total === "number" ? resp.total : 0;
  const k = Math.min(K, state.maxK - have, total - have);
  return k > 0 ? { offset: have, k } : null;
}

function updateMore(resp) {
  $("#more-box").hidden = !nextPage(resp);
}

async function loadMore() {
  const last = state.last;
  if (!last) return;
  const page = nextPage(last.resp);
  if (!page) return;
  const btn = $("#more");
  btn.disabled = true;
  btn.textContent = "Loading…";
  try {
    const resp = await api("v1/search", { method: "POST", body: { ...last.req, ...page } });
    if (state.last !== last) return; // another search was rendered meanwhile
    const start = last.resp.results.length;
    const seen = new Set(last.resp.results.map((hh) => hh.id));
    const fresh = (resp.results || []).filter((hh) => !seen.has(hh.id));
    last.resp.results = last.resp.results.concat(fresh);
    const frag = document.createDocumentFragment();
    fresh.forEach((hit, i) => frag.append(resultCard(hit, start + i)));
    $("#results").append(frag);
    const what = last.req.text ? searchedText(last.req, last.resp) : "your photo";
    $("#status").replaceChildren(h("p", { class: "muted" }, `${countText(last.resp.results.length, last.resp)} for ${what}`));
    updateMore(last.resp);
    window.vitrine.pages = (window.vitrine.pages || 1) + 1;
    const first = $("#results").children[start];
    if (first) { const a = first.querySelector("a"); if (a) a.focus({ preventScroll: true }); }
  } catch (e) {
    $("#status").append(h("p", { class: "error", role: "alert" }, `Could not load more results: ${e.describe ? e.describe() : e}`));
  } finally {
    btn.disabled = false;
    btn.textContent = "More results";
  }
}

function openComparison(data) {
  const ids = data.products.map((p) => p.id);
  state.compareCache = { key: ids.join(","), data };
  go(`#/compare?ids=${ids.map(encodeURIComponent).join(",")}`);
}

async function compareByText(text) {
  const at = location.hash;
  try {
    const data = await api("compare", { method: "POST", body: { text } });
    if (location.hash === at && data.products && data.products.length >= 2) openComparison(data);
  } catch (e) {
    if (location.hash === at && !GONE.has(e.status)) {
      $("#status").append(h("p", { class: "muted" }, `Could not compare the sides of “${text}”: ${e.describe ? e.describe() : e}`));
    }
  }
}

function answeredAt(path) {
  // when the last byte of the API's answer arrived (Resource Timing), else now
  const entries = performance.getEntriesByType("resource").filter((e) => new URL(e.name).pathname.endsWith(path));
  const t = entries.length ? entries[entries.length - 1].responseEnd : 0;
  performance.clearResourceTimings(); // photos would otherwise fill the buffer
  return t > 0 ? t : performance.now();
}

function marked(text, spans) {
  // the API's highlight spans as <mark> elements built from text nodes (no markup from the server)
  if (!spans || !spans.length) return [text];
  const out = [];
  let at = 0;
  for (const { start, end } of [...spans].sort((a, b) => a.start - b.start)) {
    if (start < at || end > text.length) continue;
    if (start > at) out.push(text.slice(at, start));
    out.push(h("mark", {}, text.slice(start, end)));
    at = end;
  }
  if (at < text.length) out.push(text.slice(at));
  return out;
}

function resultCard(hit, i) {
  const gender = genderOf(hit);
  const colour = colourOf(hit);
  const cat = hit.category || [];
  const titleId = `t-${i}`;
  const whyId = `why-${i}`;
  const li = h("li", {
    class: "card", dataset: { id: hit.id, gender: gender || "", colour: colour || "", category: cat.join(" > ") },
    "aria-labelledby": titleId,
  },
  h("a", { class: "card-link", href: `#/product/${encodeURIComponent(hit.id)}` },
    h("div", { class: "ph" }, hit.image_url
      ? h("img", { src: hit.image_url, alt: "", loading: i < 8 ? "eager" : "lazy", decoding: "async", width: 180, height: 240 })
      : h("span", { class: "noimg" }, "no photo")),
    h("h3", { class: "card-title", id: titleId }, ...marked(hit.title, hit.highlights && hit.highlights.title))),
  h("p", { class: "card-meta" },
    hit.brand ? h("span", { class: "card-brand" }, hit.brand) : null,
    cat.length ? h("span", { class: "card-category" }, cat[cat.length - 1]) : null),
  h("p", { class: "card-tags" },
    gender ? h("span", { class: "tag" }, gender) : null,
    colour ? h("span", { class: "tag" }, swatch(colour), colour) : null),
  hit.price !== null && hit.price !== undefined ? h("p", { class: "card-price" }, formatPrice(hit.price, hit.currency)) : null,
  h("div", { class: "card-actions" },
    hit.explanation ? h("button", { type: "button", class: "why-btn", "aria-expanded": "false", "aria-controls": whyId,
      "aria-describedby": titleId,
      onclick: (e) => toggleWhy(e.currentTarget, hit) }, "Why this result?") : null,
    h("label", { class: "cmp" },
      h("input", { type: "checkbox", class: "cmp-box", dataset: { id: hit.id }, checked: inTray(hit.id),
        "aria-label": `Compare ${hit.title}`,
        onchange: (e) => { if (!toggleTray(hit, e.currentTarget.checked)) e.currentTarget.checked = false; } }),
      "Compare")),
  hit.explanation ? h("div", { class: "why", id: whyId, hidden: true }) : null);
  return li;
}

function toggleWhy(btn, hit) {
  const panel = document.getElementById(btn.getAttribute("aria-controls"));
  const open = btn.getAttribute("aria-expanded") !== "true";
  btn.setAttribute("aria-expanded", String(open));
  if (open && !panel.firstChild) panel.append(explanationView(hit.explanation, hit.score));
  panel.hidden = !open;
}

function explanationView(ex, score) {
  const box = h("div", {});
  box.append(h("p", {}, h("strong", {}, "Score "), fmt(score, 4),
    ex.modalities && ex.modalities.length ? ` · matched on ${ex.modalities.map((m) => (m === "text" ? "words" : m === "image" ? "photo" : m)).join(" + ")}` : ""));
  const sig = Object.entries(ex.signals || {});
  if (sig.length) {
    const max = Math.max(...sig.map(([, v]) => Math.abs(v)), 1e-9);
    box.append(h("table", { class: "signals" },
      h("caption", { class: "visually-hidden" }, "Signals and their contribution to the score"),
      h("tbody", {}, sig.map(([name, v]) => h("tr", {},
        h("th", { scope: "row" }, name),
        h("td", { class: "bar-cell" }, h("span", { class: `bar${v < 0 ? " neg" : ""}`, style: `width:${Math.round((Math.abs(v) / max) * 100)}%` })),
        h("td", { class: "num" }, fmt(v)))))));
  }
  const flt = Object.entries(ex.filters || {});
  if (flt.length) box.append(h("p", {}, h("strong", {}, "Filters: "), flt.map(([k, v]) => `${k} = ${Array.isArray(v) ? v.join(" or ") : v}`).join("; ")));
  if (ex.intent) box.append(h("p", {}, h("strong", {}, "Intent: "), typeof ex.intent === "string" ? ex.intent : ex.intent.label || JSON.stringify(ex.intent)));
  if (ex.slots && Object.keys(ex.slots).length) box.append(h("p", {}, h("strong", {}, "Slots used: "), Object.entries(ex.slots).map(([k, v]) => `${k} = ${v}`).join("; ")));
  // anything else the engine explains (graph relations, ...), shown as is
  const known = new Set(["vector_score", "signals", "modalities", "filters", "intent", "slots"]);
  for (const [k, v] of Object.entries(ex)) {
    if (known.has(k) || v === null || v === undefined || (typeof v === "object" && !Object.keys(v).length)) continue;
    box.append(h("p", {}, h("strong", {}, `${k.replace(/_/g, " ")}: `), typeof v === "object" ? JSON.stringify(v) : String(v)));
  }
  return box;
}

function renderUnderstood(req, resp) {
  const box = $("#understood");
  const chips = [];
  const intent = resp.intent;
  if (intent && intent.label) {
    const p = intent.scores && typeof intent.scores[intent.label] === "number" ? ` ${Math.round(intent.scores[intent.label] * 100)}%` : "";
    const all = intent.scores ? Object.entries(intent.scores).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${Math.round(v * 100)}%`).join(", ") : "";
    const why = intent.by === "lexical_prior" ? "no intent cue word in the query: a search" : "";
    chips.push(h("li", { class: "chip intent", dataset: { intent: intent.label }, title: all || why }, "Intent: ", h("strong", {}, intent.label.replace(/_/g, " ")), p));
  }
  const slots = resp.slots || {};
  for (const [k, v] of Object.entries(slots)) {
    if (v === null || v === undefined || v === "") continue;
    const label = k === "price_min" ? "price ≥" : k === "price_max" ? "price ≤" : `${k}:`;
    chips.push(h("li", { class: "chip slot", dataset: { slot: k } }, `${label} `, h("strong", {}, Array.isArray(v) ? v.join(" or ") : String(v))));
  }
  if (req.image_b64) chips.push(h("li", { class: "chip mod" }, req.text ? "words + photo" : "photo"));
  for (const d of resp.degraded || []) {
    chips.push(h("li", { class: "chip warn", title: `The ${d} step failed and was skipped; results come from plain vector search.` }, `skipped: ${d}`));
  }
  box.replaceChildren(...(chips.length ? [h("ul", { class: "chips", "aria-label": "How the query was understood" }, chips)] : []));
  box.hidden = !chips.length;
}

function renderAnswer(ans) {
  const box = $("#answer");
  if (!ans) { box.hidden = true; box.replaceChildren(); return; }
  box.replaceChildren(
    h("h2", {}, ans.topic ? ans.topic.replace(/_/g, " ") : "Answer"),
    ans.text ? h("p", {}, ans.text) : null,
    ans.steps && ans.steps.length ? h("ol", {}, ans.steps.map((s) => h("li", {}, s))) : null);
  box.hidden = false;
}

function renderIntentRecs(rec) {
  const sec = $("#intent-recs");
  if (!rec || !rec.results || !rec.results.length) { sec.hidden = true; return; }
  $("h2", sec).textContent = rec.anchor ? `Recommended with “${rec.anchor.title}”` : "Recommended for you";
  $(".row-cards", sec).replaceChildren(...rec.results.map(rowCard));
  sec.hidden = false;
}

// ---------------------------------------------------------------------------------------------
// filter chips

function renderFilters(hits) {
  const box = $("#filters");
  const focused = document.activeElement && document.activeElement.classList.contains("chip-btn")
    ? { f: document.activeElement.dataset.field, v: document.activeElement.dataset.value, more: document.activeElement.dataset.more }
    : null;
  const groups = [];
  for (const f of FACET_FIELDS) {
    const sel = state.filters[f];
    const inResults = new Map();
    const counted = state.last && state.last.resp && state.last.resp.facets && state.last.resp.facets[f];
    let n = (hits || []).length;
    if (counted) {
      // the API's counts among every matching product, not only the cards on screen
      for (const fv of counted) inResults.set(fv.value, fv.count);
      n = Math.max(n, state.last.resp.total || 0);
    } else {
      for (const hit of hits || []) {
        const vals = f === "category" ? (hit.category || []) : [f === "gender" ? genderOf(hit) : colourOf(hit)];
        for (const v of new Set(vals.filter(Boolean).map(String))) inResults.set(v, (inResults.get(v) || 0) + 1);
      }
    }
    const values = [];
    const seen = new Set();
    const add = (v, count) => {
      const key = v.toLowerCase();
      if (seen.has(key)) return;
      seen.add(key);
      values.push({ value: v, count });
    };
    sel.forEach((v) => add(v, null));
    // values that would narrow these results, most common first
    [...inResults.entries()].filter(([, c]) => c < n || sel.length).sort((a, b) => b[1] - a[1]).forEach(([v, c]) => add(v, c));
    const global = (state.facets && state.facets[f]) || [];
    const expanded = state.expanded.has(f);
    let shown = values;
    let more = 0;
    if (!expanded) {
      if (shown.length < CHIPS_SHOWN) for (const g of global) { if (values.length >= CHIPS_SHOWN + sel.length) break; add(g.value, null); }
      shown = values.slice(0, Math.max(CHIPS_SHOWN, sel.length));
      more = Math.max(0, global.filter((g) => !seen.has(g.value.toLowerCase())).length + values.length - shown.length);
    } else {
      global.forEach((g) => add(g.value, null));
      shown = values;
    }
    if (!shown.length) continue;
    const gcount = new Map(global.map((g) => [g.value.toLowerCase(), g.count]));
    groups.push(h("div", { class: "filter-group", role: "group", "aria-labelledby": `fl-${f}` },
      h("span", { class: "filter-label", id: `fl-${f}` }, FACET_LABELS[f]),
      shown.map(({ value, count }) => {
        const on = sel.some((s) => same(s, value));
        const tip = [count ? `${count} matching product${count === 1 ? "" : "s"}` : null,
          gcount.has(value.toLowerCase()) ? `${gcount.get(value.toLowerCase())} in the catalogue` : null].filter(Boolean).join("; ");
        return h("button", {
          type: "button", class: "chip chip-btn", "aria-pressed": String(on), title: tip || null,
          dataset: { field: f, value }, onclick: () => toggleFilter(f, value),
        }, f === "colour" ? swatch(value) : null, value);
      }),
      !expanded && more > 0 ? h("button", { type: "button", class: "chip more", dataset: { field: f, more: "1" },
        "aria-label": `More ${FACET_LABELS[f].toLowerCase()} values`, onclick: () => { state.expanded.add(f); renderFilters(hits); } }, `More (${more})`) : null,
      expanded && global.length > CHIPS_SHOWN ? h("button", { type: "button", class: "chip more", dataset: { field: f, more: "1" },
        "aria-label": `Fewer ${FACET_LABELS[f].toLowerCase()} values`, onclick: () => { state.expanded.delete(f); renderFilters(hits); } }, "Fewer") : null));
  }
  const any = FACET_FIELDS.some((f) => state.filters[f].length);
  if (any) groups.push(h("button", { type: "button", class: "link-btn", id: "clear-filters", onclick: clearFilters }, "Clear filters"));
  box.replaceChildren(...groups);
  box.hidden = !groups.length;
  if (focused) {
    const sel = focused.more ? `.chip.more[data-field="${CSS.escape(focused.f)}"]`
      : `.chip-btn[data-field="${CSS.escape(focused.f)}"][data-value="${CSS.escape(focused.v)}"]`;
    const el = $(sel, box);
    if (el) el.focus();
  }
}

function toggleFilter(field, value) {
  const cur = state.filters[field];
  state.filters[field] = cur.some((v) => same(v, value)) ? cur.filter((v) => !same(v, value)) : [...cur, value];
  const { params } = parseHash();
  go(searchHash(params.get("q") || "", state.photo, state.filters));
}

function clearFilters() {
  state.filters = { gender: [], category: [], colour: [] };
  const { params } = parseHash();
  go(searchHash(params.get("q") || "", state.photo, state.filters));
}

async function loadFacets() {
  try {
    const data = await api(`facets?${FACET_FIELDS.map((f) => `field=${f}`).join("&")}&limit=60`);
    state.facets = {};
    for (const f of FACET_FIELDS) state.facets[f] = (data.facets && data.facets[f]) || [];
    if (state.last) renderFilters(state.last.resp.results || []);
  } catch {
    state.facets = null; // filter chips then come from the results alone
  }
}

// ---------------------------------------------------------------------------------------------
// photos: upload, drag and drop, paste

function readDataUrl(blob) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(r.result);
    r.onerror = () => reject(r.error);
    r.readAsDataURL(blob);
  });
}

async function shrink(file) {
  // a phone photo can be many megabytes; the encoder needs a few hundred pixels
  const bmp = await createImageBitmap(file);
  const scale = Math.min(1, 1600 / Math.max(bmp.width, bmp.height));
  const canvas = document.createElement("canvas");
  canvas.width = Math.round(bmp.width * scale);
  canvas.height = Math.round(bmp.height * scale);
  canvas.getContext("2d").drawImage(bmp, 0, 0, canvas.width, canvas.height);
  return new Promise((resolve) => canvas.toBlob(resolve, "image/jpeg", 0.9));
}

async function usePhoto(file, name) {
  if (!file) return;
  if (file.type && !file.type.startsWith("image/")) {
    setSearchState("error");
    $("#status").replaceChildren(h("p", { class: "error", role: "alert" },
      `“${name || file.name || "That file"}” is not an image (${file.type}). Use a JPEG, PNG, WEBP or GIF photo.`));
    return;
  }
  let blob = file;
  if (file.size > MAX_PHOTO_BYTES) {
    try { blob = (await shrink(file)) || file; } catch { blob = file; }
  }
  const dataUrl = await readDataUrl(blob);
  clearPhoto(false);
  state.photoSeq += 1;
  state.photo = { id: `p${state.photoSeq}`, name: name || file.name || "photo", dataUrl, blobUrl: URL.createObjectURL(blob) };
  $("#photo-thumb").src = state.photo.blobUrl;
  $("#photo-name").textContent = state.photo.name;
  $("#photo-chip").hidden = false;
  submitSearch();
}

function clearPhoto(research = true) {
  if (state.photo && state.photo.blobUrl) URL.revokeObjectURL(state.photo.blobUrl);
  const had = !!state.photo;
  state.photo = null;
  $("#photo-chip").hidden = true;
  $("#photo-thumb").removeAttribute("src");
  $("#photo-input").value = "";
  if (research && had) {
    if ($("#q").value.trim()) submitSearch({ keepFilters: true });
    else go("#/");
  }
}

async function photoFromUrl(url, name) {
  const res = await fetch(url);
  if (!res.ok) throw new ApiError(res.status, "not_found", "could not load that photo");
  const blob = await res.blob();
  await usePhoto(new File([blob], name, { type: blob.type || "image/jpeg" }), name);
}

function setupPhotoInput() {
  const input = $("#photo-input");
  $("#photo-btn").addEventListener("click", () => input.click());
  input.addEventListener("change", () => { if (input.files && input.files[0]) usePhoto(input.files[0]); });
  $("#photo-clear").addEventListener("click", () => clearPhoto(true));
  const thumb = $("#photo-thumb"); // a photo the browser cannot show (the server will say why)
  thumb.addEventListener("error", () => { thumb.style.visibility = "hidden"; });
  thumb.addEventListener("load", () => { thumb.style.visibility = ""; });

  // drop anywhere on the page; the search box shows where it goes
  const zone = $("#dropzone");
  let depth = 0;
  const hasImage = (e) => e.dataTransfer && Array.from(e.dataTransfer.types || []).some((t) => t === "Files" || t === "text/uri-list");
  document.addEventListener("dragenter", (e) => { if (hasImage(e)) { depth += 1; zone.classList.add("dragging"); } });
  document.addEventListener("dragleave", () => { depth = Math.max(0, depth - 1); if (!depth) zone.classList.remove("dragging"); });
  document.addEventListener("dragover", (e) => { if (hasImage(e)) { e.preventDefault(); e.dataTransfer.dropEffect = "copy"; } });
  document.addEventListener("drop", async (e) => {
    if (!e.dataTransfer) return;
    depth = 0;
    zone.classList.remove("dragging");
    const file = Array.from(e.dataTransfer.files || []).find((f) => f.type.startsWith("image/")) || (e.dataTransfer.files || [])[0];
    if (file) { e.preventDefault(); await usePhoto(file); return; }
    // a photo dragged from this page (a result's picture): search by it
    const url = (e.dataTransfer.getData("text/uri-list") || "").split("\n").find((l) => l && !l.startsWith("#"));
    if (url && new URL(url, location.href).origin === location.origin) {
      e.preventDefault();
      try { await photoFromUrl(url, "dragged photo"); } catch (err) { announce(err.message); }
    }
  });

  // paste a photo (from the clipboard) anywhere
  document.addEventListener("paste", (e) => {
    const file = Array.from((e.clipboardData && e.clipboardData.files) || []).find((f) => f.type.startsWith("image/"));
    if (file) { e.preventDefault(); usePhoto(file, "pasted photo"); }
  });
}

// ---------------------------------------------------------------------------------------------
// product page

let productSeq = 0;

async function showProduct(id) {
  const seq = ++productSeq;
  $("#product-back").href = state.lastSearchHash;
  const art = $("#product");
  const st = $("#product-status");
  art.hidden = true;
  for (const s of ["#rec-similar", "#rec-complementary"]) $(s).hidden = true;
  st.replaceChildren(h("p", { class: "muted" }, "Loading the product…"));
  let p;
  try {
    p = await api(`products/${encodeURIComponent(id)}`);
  } catch (e) {
    if (seq !== productSeq) return;
    st.replaceChildren(h("p", { class: "error", role: "alert" },
      e.status === 404 ? `There is no product with id “${id}” (it may have been removed).` : `Could not load the product: ${e.describe ? e.describe() : e}`));
    return;
  }
  if (seq !== productSeq) return;
  st.replaceChildren();
  const img = $("#product-img");
  if (p.image_url) { img.src = p.image_url; img.alt = p.title; img.hidden = false; } else { img.removeAttribute("src"); img.hidden = true; }
  $("#product-title").textContent = p.title;
  $("#product-brand").textContent = p.brand || "";
  $("#product-price").textContent = formatPrice(p.price, p.currency);
  const cat = p.category || [];
  $("#product-category").replaceChildren(...cat.map((c, i) => [i ? h("span", { "aria-hidden": "true" }, " › ") : null,
    h("a", { href: `#/search?q=${encodeURIComponent(c)}&category=${encodeURIComponent(c)}` }, c)]).flat().filter(Boolean));
  const attrs = Object.entries(p.attributes || {});
  $("#product-attrs").replaceChildren(...attrs.map(([k, v]) => [h("dt", {}, attrName(k)),
    h("dd", {}, /colou?r/i.test(k) ? swatch(v) : null, Array.isArray(v) ? v.join(", ") : String(v))]).flat());
  $("#product-desc").textContent = p.description || "";
  const pc = $("#product-compare");
  pc.dataset.id = p.id;
  pc.onclick = () => toggleTray(p);
  $("#product-visual").hidden = !p.image_url;
  $("#product-visual").onclick = () => photoFromUrl(p.image_url, p.title).catch((e) => announce(e.message));
  renderTray();
  art.hidden = false;
  art.dataset.id = p.id;
  $("#product-title").focus();
  await Promise.all([loadRecs(p.id, "similar", "#rec-similar", seq), loadRecs(p.id, "complementary", "#rec-complementary", seq)]);
}

async function loadRecs(id, kind, sel, seq) {
  const sec = $(sel);
  const list = $(".row-cards", sec);
  const st = $(".row-status", sec);
  list.replaceChildren();
  st.textContent = "Loading…";
  sec.hidden = false;
  sec.dataset.state = "loading";
  try {
    const rec = await api(`recommend/${encodeURIComponent(id)}?kind=${kind}&k=12`);
    if (seq !== productSeq) return;
    const items = rec.results || [];
    list.replaceChildren(...items.map(rowCard));
    st.textContent = items.length ? "" : "Nothing to suggest for this product yet.";
    sec.dataset.state = items.length ? "results" : "empty";
  } catch (e) {
    if (seq !== productSeq) return;
    if (GONE.has(e.status)) { sec.hidden = true; sec.dataset.state = "unavailable"; return; } // this server has no recommendations
    st.textContent = `Could not load suggestions: ${e.describe ? e.describe() : e}`;
    sec.dataset.state = "error";
  }
}

function rowCard(hit) {
  return h("li", { class: "mini", dataset: { id: hit.id } },
    h("a", { href: `#/product/${encodeURIComponent(hit.id)}` },
      h("div", { class: "ph" }, hit.image_url ? h("img", { src: hit.image_url, alt: "", loading: "lazy", decoding: "async", width: 120, height: 160 }) : h("span", { class: "noimg" }, "no photo")),
      h("span", { class: "mini-title" }, hit.title)),
    hit.relation ? h("span", { class: "relation" }, hit.relation) : null,
    hit.price !== null && hit.price !== undefined ? h("span", { class: "card-price" }, formatPrice(hit.price, hit.currency)) : null);
}

// ---------------------------------------------------------------------------------------------
// compare

let compareSeq = 0;

async function showCompare(ids) {
  const seq = ++compareSeq;
  $("#compare-back").href = state.lastSearchHash;
  const st = $("#compare-status");
  const box = $("#compare");
  box.hidden = true;
  if (ids.length < 2) {
    st.replaceChildren(h("p", { class: "error", role: "alert" }, "Pick at least 2 products to compare (tick “Compare” on the results)."));
    $("#compare-heading").focus();
    return;
  }
  let data;
  const key = ids.join(",");
  if (state.compareCache && state.compareCache.key === key) {
    data = state.compareCache.data;
  } else {
    st.replaceChildren(h("p", { class: "muted" }, `Comparing ${ids.length} products…`));
    try {
      data = await api("compare", { method: "POST", body: { ids } });
    } catch (e) {
      if (seq !== compareSeq) return;
      st.replaceChildren(h("p", { class: "error", role: "alert" },
        GONE.has(e.status) && e.code !== "not_found" ? "This server does not offer comparisons." :
          `Could not compare these products: ${e.describe ? e.describe() : e}`));
      $("#compare-heading").focus();
      return;
    }
    if (seq !== compareSeq) return;
    state.compareCache = { key, data };
  }
  st.replaceChildren();
  renderCompare(data);
  box.hidden = false;
  $("#compare-heading").focus();
}

function renderCompare(data) {
  const products = data.products || [];
  const byId = new Map(products.map((p) => [p.id, p]));
  $("#compare-heading").textContent = `Compare ${products.length} products`;
  const bits = [];
  if (data.summary) bits.push(data.summary);
  if (data.price_difference !== null && data.price_difference !== undefined) bits.push(`Price difference: ${formatPrice(data.price_difference, products[0] && products[0].currency)}.`);
  $("#compare-summary").textContent = bits.join(" ");

  const head = h("tr", {}, h("td", { class: "corner" }),
    products.map((p) => h("th", { scope: "col", dataset: { id: p.id } },
      h("a", { href: `#/product/${encodeURIComponent(p.id)}` },
        p.image_url ? h("img", { src: p.image_url, alt: "", width: 120, height: 160, loading: "lazy" }) : null,
        h("span", { class: "cmp-title" }, p.title)),
      products.length > 2 ? h("button", { type: "button", class: "link-btn", "aria-label": `Remove ${p.title} from the comparison`,
        onclick: () => go(`#/compare?ids=${products.filter((q) => q.id !== p.id).map((q) => encodeURIComponent(q.id)).join(",")}`) }, "Remove") : null)));

  const rows = [];
  const row = (name, values, isSame) => rows.push(h("tr", { class: isSame ? "same" : "differs", dataset: { attr: name } },
    h("th", { scope: "row" }, attrName(name), isSame ? null : h("span", { class: "visually-hidden" }, " (differs)")),
    products.map((p) => { const v = values[p.id]; return h("td", {}, v === null || v === undefined || v === "" ? h("span", { class: "muted" }, "—") : Array.isArray(v) ? v.join(", ") : typeof v === "object" ? JSON.stringify(v) : String(v)); })));
  const vals = (fn) => Object.fromEntries(products.map((p) => [p.id, fn(p)]));
  const allSame = (o) => { const v = Object.values(o).map((x) => JSON.stringify(x ?? null)); return v.every((x) => x === v[0]); };
  let attrs = data.attributes;
  if (!Array.isArray(attrs)) { // an older server: build the rows from the products themselves
    const names = [...new Set(products.flatMap((p) => Object.keys(p.attributes || {})))];
    attrs = names.map((n) => { const v = vals((p) => (p.attributes || {})[n] ?? null); return { name: n, values: v, same: allSame(v) }; });
  }
  const have = new Set(attrs.map((a) => String(a.name).toLowerCase()));
  // brand, category and price from the products themselves when the server's table lacks them
  const fixed = [["brand", vals((p) => p.brand)], ["category", vals((p) => (p.category || []).join(" › "))],
    ["price", vals((p) => p.price ?? null)]];
  for (const [name, v] of fixed) if (!have.has(name) && Object.values(v).some((x) => x !== null && x !== undefined && x !== "")) row(name, v, allSame(v));
  const currency = Object.fromEntries(products.map((p) => [p.id, p.currency]));
  for (const a of attrs) {
    const name = String(a.name).toLowerCase();
    if (name === "currency" && have.has("price")) continue; // shown with the price
    const values = name === "price"
      ? Object.fromEntries(Object.entries(a.values || {}).map(([id, v]) => [id, typeof v === "number" ? formatPrice(v, currency[id]) : v]))
      : a.values || {};
    row(a.name, values, !!a.same);
  }

  $("#compare-table").replaceChildren(
    h("caption", { class: "visually-hidden" }, `Side-by-side comparison of ${products.map((p) => p.title).join(", ")}`),
    h("thead", {}, head), h("tbody", {}, rows));
  $("#compare-table").classList.toggle("only-diff", $("#compare-diff").checked);

  const pairs = data.pairwise || [];
  $("#compare-pairs").replaceChildren(...pairs.map((pr) => {
    const a = byId.get(pr.a); const b = byId.get(pr.b);
    const scores = [["photo", pr.photo], ["words", pr.text], ["overall", pr.fused]].filter(([, v]) => typeof v === "number")
      .map(([k, v]) => `${k} ${fmt(v, 2)}`).join(" · ");
    return h("li", { dataset: { relation: pr.relation || "" } },
      h("strong", {}, a ? a.title : pr.a), " and ", h("strong", {}, b ? b.title : pr.b), ": ",
      h("span", { class: `rel rel-${pr.relation}` }, pr.relation === "substitutes" ? "alternatives to each other"
        : pr.relation === "complements" ? "go well together" : pr.relation || "unrelated"),
      scores ? h("span", { class: "muted" }, ` (similarity: ${scores})`) : null);
  }));
  $("#pairs-h").parentElement.hidden = !pairs.length;
}

// ---------------------------------------------------------------------------------------------
// start

async function loadStats() {
  try {
    const s = await api("health");
    if (Number.isFinite(s.max_k)) state.maxK = s.max_k;
    $("#catalog-stats").textContent = `${Number(s.products).toLocaleString()} products in the catalogue` +
      (s.with_photo ? `, ${Number(s.with_photo).toLocaleString()} with photos` : "") + "."; // none: a text-only page
  } catch (e) {
    $("#catalog-stats").textContent = e.describe ? `The server did not answer: ${e.describe()}` : "";
  }
}

function init() {
  $("#search-form").addEventListener("submit", (e) => { e.preventDefault(); submitSearch(); });
  for (const b of $$(".example")) b.addEventListener("click", () => { $("#q").value = b.dataset.q; submitSearch(); });
  $("#tray-open").addEventListener("click", () => {
    if (state.tray.length >= 2) go(`#/compare?ids=${state.tray.map((t) => encodeURIComponent(t.id)).join(",")}`);
  });
  $("#tray-clear").addEventListener("click", () => { state.tray = []; saveTray(); renderTray(); });
  $("#compare-diff").addEventListener("change", (e) => $("#compare-table").classList.toggle("only-diff", e.currentTarget.checked));
  document.addEventListener("keydown", (e) => {
    const t = e.target;
    const typing = t instanceof HTMLInputElement || t instanceof HTMLTextAreaElement || (t && t.isContentEditable);
    if (e.key === "/" && !typing && !e.ctrlKey && !e.metaKey && !e.altKey) { e.preventDefault(); $("#q").focus(); $("#q").select(); }
    if (e.key === "Escape" && t && t.classList && t.classList.contains("why-btn") && t.getAttribute("aria-expanded") === "true") t.click();
  });
  setupPhotoInput();
  $("#more").addEventListener("click", loadMore);
  $("#sort").addEventListener("change", (e) => {
    const { params } = parseHash();
    state.sort = e.currentTarget.value;
    go(searchHash(params.get("q") || "", state.photo, state.filters));
  });
  window.addEventListener("hashchange", route);
  renderTray();
  loadStats();
  loadFacets();
  document.body.dataset.ready = "1";
  route();
}

init();

// shopping sessions (static/session.js) render a chip removal's response through the page's own renderer
window.vitrine = window.vitrine || {};
window.vitrine.renderSearch = (req, resp) => renderSearch(req, resp, { fresh: true, t0: performance.now() });
