// Search-as-you-type (GET /v1/suggest), the home page's examples and the text-only page, kept
// apart from app.js: this module only adds to the search box and the welcome panel.
//
// - typing shows up to 8 completions under the box (debounced, the latest request only); the
//   arrow keys move through them, Enter takes the highlighted one and searches, Escape closes;
//   a click takes one. Without a highlighted one, Enter searches what was typed (app.js).
// - the welcome panel's examples come from the catalogue and its logged queries (the server's
//   ui/config), not from a fixed list.
// - the page's text follows the catalogue's language (ui/config `language`, static/i18n.js); a
//   Chinese shopper's input method shows pinyin in the box while composing ("shou'biao"): the
//   server completes it to Chinese.
// - a catalogue without photos gets a text-only page (body.no-photos): no photo prompt or drop
//   zone, no photo boxes on the cards.

import { uiConfig } from "./config.js";
import { applyLanguage, t } from "./i18n.js";

const DEBOUNCE_MS = 120;
const K = 8;
const $ = (sel, root = document) => root.querySelector(sel);

function suggestBox() {
  const input = $("#q");
  const form = $("#search-form");
  if (!input || !form) return;
  const list = document.createElement("ul");
  list.id = "suggestions";
  list.className = "suggestions";
  list.setAttribute("role", "listbox");
  list.setAttribute("aria-label", "Suggestions");
  list.hidden = true;
  (input.closest(".search-box") || form).append(list);
  input.setAttribute("role", "combobox");
  input.setAttribute("aria-autocomplete", "list");
  input.setAttribute("aria-controls", list.id);
  input.setAttribute("aria-expanded", "false");

  let timer = 0;
  let seq = 0;
  let ctl = null;
  let items = [];
  let active = -1;

  const close = () => {
    seq += 1;
    clearTimeout(timer);
    if (ctl) ctl.abort();
    ctl = null;
    list.hidden = true;
    list.replaceChildren();
    items = [];
    active = -1;
    input.setAttribute("aria-expanded", "false");
    input.removeAttribute("aria-activedescendant");
  };

  const highlight = (i) => {
    active = i;
    [...list.children].forEach((li, j) => li.setAttribute("aria-selected", String(j === i)));
    if (i >= 0) input.setAttribute("aria-activedescendant", list.children[i].id);
    else input.removeAttribute("aria-activedescendant");
  };

  const choose = (text) => {
    input.value = text;
    close();
    form.requestSubmit();
  };

  const render = (q, got) => {
    items = got;
    active = -1;
    list.replaceChildren(...got.map((s, i) => {
      const li = document.createElement("li");
      li.id = `sugg-${i}`;
      li.setAttribute("role", "option");
      li.setAttribute("aria-selected", "false");
      li.dataset.kind = s.kind;
      li.className = "suggestion";
      const t = document.createElement("span");
      t.className = "sugg-text";
      t.textContent = s.text;
      const kind = document.createElement("span");
      kind.className = "sugg-kind";
      kind.textContent = s.kind === "query" ? "popular" : s.kind;
      li.append(t, kind);
      // mousedown, not click: the input keeps its focus (no blur closing the list first)
      li.addEventListener("mousedown", (e) => { e.preventDefault(); choose(s.text); });
      return li;
    }));
    list.hidden = !got.length;
    input.setAttribute("aria-expanded", String(got.length > 0));
    window.vitrine = window.vitrine || {};
    window.vitrine.suggestions = { q, items: got };
  };

  const fetchNow = async () => {
    const q = input.value;
    if (!q.trim()) { close(); return; }
    const mine = ++seq;
    if (ctl) ctl.abort();
    ctl = new AbortController();
    try {
      const r = await fetch(`v1/suggest?q=${encodeURIComponent(q)}&k=${K}`, { signal: ctl.signal, headers: { Accept: "application/json" } });
      if (!r.ok) return;
      const body = await r.json();
      if (mine !== seq || document.activeElement !== input) return; // typed on, submitted, or left
      render(q, body.suggestions || []);
    } catch (e) {
      if (e.name !== "AbortError") list.hidden = true;
    }
  };

  input.addEventListener("input", () => {
    clearTimeout(timer);
    if (!input.value.trim()) { close(); return; }
    timer = setTimeout(fetchNow, DEBOUNCE_MS);
  });
  input.addEventListener("keydown", (e) => {
    if (list.hidden || !items.length) {
      if (e.key === "ArrowDown" && input.value.trim()) { e.preventDefault(); fetchNow(); }
      return;
    }
    if (e.key === "ArrowDown") { e.preventDefault(); highlight((active + 1) % items.length); }
    else if (e.key === "ArrowUp") { e.preventDefault(); highlight(active <= 0 ? items.length - 1 : active - 1); }
    else if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); close(); }
    else if (e.key === "Enter" && active >= 0) { e.preventDefault(); choose(items[active].text); }
  });
  input.addEventListener("blur", () => setTimeout(close, 0));
  form.addEventListener("submit", close, true); // a search closes the list and drops late answers
  window.addEventListener("hashchange", close);
}

function examples(cfg) {
  const box = $("#welcome .try");
  if (!box || !cfg.examples || !cfg.examples.length) return;
  const label = document.createTextNode(t("try"));
  const buttons = cfg.examples.map((q) => {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "example";
    b.dataset.q = q;
    b.textContent = q;
    b.addEventListener("click", () => { $("#q").value = q; $("#search-form").requestSubmit(); });
    return b;
  });
  box.replaceChildren(label, ...buttons);
  box.hidden = false;
  box.dataset.source = "catalogue";
}

function textOnly(cfg) {
  if (cfg.photos !== false) return;
  document.body.classList.add("no-photos");
  const input = $("#q");
  if (input) input.placeholder = t("placeholderText");
  const hint = $("#search-hint");
  if (hint) hint.textContent = t("hintText");
  const h2 = $("#welcome h2");
  if (h2) h2.textContent = t("welcomeText");
  const intro = $("#welcome h2 + p");
  if (intro) {
    intro.textContent = t("introText");
  }
  // no photo search here: a dropped or pasted image is not taken (the listeners after this one never see it)
  const hasImage = (dt) => dt && [...(dt.items || [])].some((i) => i.kind === "file" && i.type.startsWith("image/"));
  for (const type of ["dragenter", "dragover", "drop", "paste"]) {
    window.addEventListener(type, (e) => {
      if (hasImage(e.dataTransfer || e.clipboardData)) { e.stopImmediatePropagation(); if (type !== "paste") e.preventDefault(); }
    }, true);
  }
}

suggestBox();
uiConfig().then((cfg) => {
  applyLanguage(cfg.language || "en"); // the page's text in the catalogue's language (static/i18n.js)
  textOnly(cfg);
  examples(cfg);
  document.body.dataset.uiConfig = "1";
});
