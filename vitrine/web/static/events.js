// Shopper events (POST /v1/events with the events-only key from ui/config): a click on a search
// result, and add-to-cart on a product page opened from one. Kept apart from app.js: it watches
// the search responses the page receives (their query_id and the offset each page started at)
// and the clicks on result cards; it never changes what app.js renders, except the product
// page's "Add to cart" button it drives.

import { uiConfig } from "./config.js";

const seen = new Map(); // product id -> {query_id, position} of the latest search page it was on
let lastOpened = null;   // the result the shopper opened last: {product_id, query_id, position}

function session() {
  try {
    let s = sessionStorage.getItem("vitrine.session");
    if (!s) {
      s = (crypto.randomUUID ? crypto.randomUUID() : String(Math.random()).slice(2));
      sessionStorage.setItem("vitrine.session", s);
    }
    return s;
  } catch {
    return null;
  }
}

// watch search responses: which query_id and rank each product had
const realFetch = window.fetch.bind(window);
window.fetch = async (input, init = {}) => {
  const res = await realFetch(input, init);
  try {
    const url = new URL(typeof input === "string" ? input : input.url, location.href);
    const method = (init.method || (typeof input === "string" ? "GET" : input.method) || "GET").toUpperCase();
    if (method === "POST" && /\/search$/.test(url.pathname) && res.ok) {
      const req = typeof init.body === "string" ? JSON.parse(init.body) : {};
      res.clone().json().then((body) => {
        if (!body || !body.query_id) return;
        const offset = Number(req.offset) || 0;
        (body.results || []).forEach((hit, i) => seen.set(hit.id, { query_id: body.query_id, position: offset + i }));
      }).catch(() => {});
    }
  } catch {
    // never break the page's own request
  }
  return res;
};

export async function sendEvents(events) {
  const cfg = await uiConfig();
  if (!cfg.events_key || !events.length) return false;
  const s = session();
  const body = { events: events.map((e) => (s ? { ...e, session: s } : e)) };
  window.vitrine = window.vitrine || {};
  (window.vitrine.sentEvents = window.vitrine.sentEvents || []).push(...body.events);
  try {
    const r = await realFetch("v1/events", {
      method: "POST", keepalive: true,
      headers: { "Content-Type": "application/json", "X-API-Key": cfg.events_key },
      body: JSON.stringify(body),
    });
    return r.ok;
  } catch {
    return false;
  }
}

// a click on a result card (its link: the photo or the title) opens the product: a click event
document.addEventListener("click", (e) => {
  const link = e.target instanceof Element ? e.target.closest("#results .card a.card-link") : null;
  if (!link) return;
  const card = link.closest(".card");
  const id = card && card.dataset.id;
  const at = id && seen.get(id);
  if (!at) return;
  lastOpened = { product_id: id, ...at };
  sendEvents([{ type: "click", product_id: id, query_id: at.query_id, position: at.position }]);
}, true);

// the product page's "Add to cart"
function cartButton() {
  const btn = document.getElementById("product-cart");
  if (!btn) return;
  const art = document.getElementById("product");
  const reset = () => {
    btn.textContent = "Add to cart";
    btn.disabled = false;
    btn.setAttribute("aria-pressed", "false");
  };
  new MutationObserver(reset).observe(art, { attributes: true, attributeFilter: ["data-id"] });
  btn.addEventListener("click", () => {
    const id = art.dataset.id;
    if (!id) return;
    const from = lastOpened && lastOpened.product_id === id ? lastOpened : null;
    if (from) sendEvents([{ type: "add_to_cart", product_id: id, query_id: from.query_id, position: from.position }]);
    btn.textContent = "Added to cart ✓";
    btn.setAttribute("aria-pressed", "true");
    btn.disabled = true;
  });
}

cartButton();
