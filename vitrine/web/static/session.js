// Shopping sessions in the UI (docs/sessions.md). Every search of this tab carries one session id
// (sessionStorage: it survives pages and reloads of the tab), so a follow-up ("in brown", "cheaper",
// "not nike", "more like the second one") refines the last search. The session's standing query shows
// above the results as chips, each removable (session_drop), with a "New search" control that makes
// the next search start over (new_search: true). Kept apart from app.js: it adds the session fields to
// the page's search requests and reads the responses; app.js renders results
// (window.vitrine.renderSearch, when it exposes it).

const KEY = "vitrine.session";
let startOver = false;
let last = null; // the latest session search: {req, resp}

export function sessionId() {
  try {
    let s = sessionStorage.getItem(KEY);
    if (!s) {
      s = crypto.randomUUID ? crypto.randomUUID() : `s${Date.now()}${String(Math.random()).slice(2, 10)}`;
      sessionStorage.setItem(KEY, s);
    }
    return s;
  } catch {
    return null;
  }
}

function isSearch(input, init) {
  try {
    const url = new URL(typeof input === "string" ? input : input.url, location.href);
    const method = (init.method || "GET").toUpperCase();
    return method === "POST" && /\/search$/.test(url.pathname) && typeof init.body === "string";
  } catch {
    return false;
  }
}

const innerFetch = window.fetch.bind(window);
window.fetch = async (input, init = {}) => {
  if (!isSearch(input, init)) return innerFetch(input, init);
  let req;
  try {
    req = JSON.parse(init.body);
  } catch {
    return innerFetch(input, init);
  }
  const sid = sessionId();
  if (sid && !req.session) {
    req.session = sid;
    if (startOver && !req.offset) {
      req.new_search = true;
      startOver = false;
    }
    init = { ...init, body: JSON.stringify(req) };
  }
  const res = await innerFetch(input, init);
  if (res.ok) {
    res.clone().json().then((body) => {
      if (body && body.session) {
        last = { req, resp: body };
        renderChips(body.session);
      }
    }).catch(() => {});
  }
  return res;
};

function bar() {
  let el = document.getElementById("session-bar");
  if (!el) {
    const anchor = document.getElementById("understood");
    if (!anchor) return null;
    el = document.createElement("div");
    el.id = "session-bar";
    el.className = "session-bar";
    el.setAttribute("aria-label", "Your search so far");
    el.hidden = true;
    anchor.parentNode.insertBefore(el, anchor);
  }
  return el;
}

function chip(c) {
  const li = document.createElement("li");
  li.className = `session-chip session-chip-${c.kind}`;
  li.dataset.key = c.key;
  const label = document.createElement("span");
  label.textContent = c.label;
  const x = document.createElement("button");
  x.type = "button";
  x.className = "session-chip-x";
  x.setAttribute("aria-label", `Remove ${c.label}`);
  x.textContent = "×";
  x.addEventListener("click", () => dropChip(c.key));
  li.append(label, x);
  return li;
}

export function renderChips(session) {
  expose();
  const el = bar();
  if (!el) return;
  const chips = session.chips || [];
  const title = document.createElement("span");
  title.className = "session-title";
  title.textContent = session.new_search ? "Searching:" : "Refined:";
  if (!session.new_search && typeof session.p_refine === "number") {
    title.title = `read as a refinement (p = ${session.p_refine.toFixed(2)})`;
  }
  const list = document.createElement("ul");
  list.className = "session-chips";
  list.append(...chips.map(chip));
  const fresh = document.createElement("button");
  fresh.type = "button";
  fresh.id = "session-new";
  fresh.className = "secondary session-new";
  fresh.textContent = "New search";
  fresh.title = "Start over: the next search does not refine this one";
  fresh.addEventListener("click", newSearch);
  el.replaceChildren(title, list, fresh);
  el.dataset.turn = String(session.turn || "");
  el.hidden = !chips.length && session.new_search;
}

export function newSearch() {
  startOver = true;
  const el = bar();
  if (el) {
    el.replaceChildren();
    el.hidden = true;
  }
  const q = document.getElementById("q");
  if (q) {
    q.value = "";
    q.focus();
  }
}

async function dropChip(key) {
  if (!last) return;
  const { text, image_b64, offset, new_search, session_drop, ...rest } = last.req; // eslint-disable-line no-unused-vars
  const req = { ...rest, session: sessionId(), session_drop: [key] };
  const res = await window.fetch("v1/search", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(req),
  });
  if (!res.ok) return;
  const resp = await res.json();
  const render = window.vitrine && window.vitrine.renderSearch;
  if (render) render(req, resp);
  const q = document.getElementById("q");
  if (q && resp.session) q.value = resp.session.text || "";
}

function expose() { // app.js sets window.vitrine afresh when it loads: (re)attach this module's handle
  window.vitrine = window.vitrine || {};
  window.vitrine.session = { id: sessionId, newSearch, renderChips };
}

expose();
