// Merchant analytics page: GET /v1/analytics and /v1/experiments with the API key (kept in this
// tab's sessionStorage only), drawn as plain SVG. No library, nothing fetched from outside.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const COLOURS = ["#2b6cb0", "#c05621", "#2f855a", "#9b2c2c", "#6b46c1"];
  const pct = (v) => (v === null || v === undefined ? "–" : (100 * v).toFixed(1) + "%");
  const num = (v) => (v === null || v === undefined ? "–" : Number(v).toLocaleString());

  function el(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // A line chart of several series over the buckets; values scaled to the largest (or to 1 for rates).
  function lineChart(svg, labels, series, { rate = false } = {}) {
    svg.replaceChildren();
    const W = 600, H = 220, L = 48, R = 10, T = 10, B = 40;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const all = series.flatMap((s) => s.values.filter((v) => v !== null));
    let max = all.length ? Math.max(...all) : 1;
    if (rate) max = Math.min(1, Math.max(0.05, max * 1.1));
    max = max || 1;
    const x = (i) => L + (labels.length > 1 ? (i * (W - L - R)) / (labels.length - 1) : (W - L - R) / 2);
    const y = (v) => T + (H - T - B) * (1 - v / max);
    for (let g = 0; g <= 4; g++) {
      const v = (max * g) / 4;
      svg.append(el("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#eee" }));
      svg.append(el("text", { x: L - 4, y: y(v) + 4, "text-anchor": "end", "font-size": 10 },
        rate ? (100 * v).toFixed(0) + "%" : Math.round(v).toLocaleString()));
    }
    const step = Math.max(1, Math.ceil(labels.length / 8));
    labels.forEach((lab, i) => {
      if (i % step === 0) svg.append(el("text", { x: x(i), y: H - B + 14, "text-anchor": "middle", "font-size": 10 }, lab));
    });
    series.forEach((s, k) => {
      const pts = s.values.map((v, i) => (v === null ? null : `${x(i)},${y(v)}`)).filter(Boolean);
      if (pts.length) svg.append(el("polyline", { points: pts.join(" "), fill: "none", stroke: COLOURS[k], "stroke-width": 2 }));
      s.values.forEach((v, i) => {
        if (v === null) return;
        const c = el("circle", { cx: x(i), cy: y(v), r: 3, fill: COLOURS[k] });
        c.append(el("title", {}, `${s.name} ${labels[i]}: ${rate ? pct(v) : num(v)}`));
        svg.append(c);
      });
      svg.append(el("rect", { x: L + k * 120, y: H - 16, width: 10, height: 10, fill: COLOURS[k] }));
      svg.append(el("text", { x: L + k * 120 + 14, y: H - 7, "font-size": 11 }, s.name));
    });
  }

  function table(t, head, rows) {
    t.replaceChildren();
    const tr = document.createElement("tr");
    head.forEach(([h, n]) => { const th = document.createElement("th"); th.textContent = h; if (n) th.className = "n"; tr.append(th); });
    t.append(tr);
    if (!rows.length) {
      const r = document.createElement("tr"), td = document.createElement("td");
      td.colSpan = head.length; td.textContent = "None."; r.append(td); t.append(r);
    }
    rows.forEach((cells) => {
      const r = document.createElement("tr");
      cells.forEach((c, i) => { const td = document.createElement("td"); td.textContent = c; if (head[i][1]) td.className = "n"; r.append(td); });
      t.append(r);
    });
  }

  async function get(path, key) {
    const r = await fetch(path, { headers: { "X-API-Key": key } });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error((body.error && body.error.message) || r.statusText);
    return body;
  }

  async function show(ev) {
    if (ev) ev.preventDefault();
    const key = $("an-key").value.trim();
    if (!key) return;
    sessionStorage.setItem("vitrine-admin-key", key);
    const q = new URLSearchParams({ granularity: $("an-gran").value, top: $("an-top").value || "20" });
    if ($("an-since").value.trim()) q.set("since", $("an-since").value.trim());
    if ($("an-until").value.trim()) q.set("until", $("an-until").value.trim());
    $("an-status").textContent = "Loading…";
    $("an-status").className = "";
    try {
      const rep = await get("/v1/analytics?" + q, key);
      const t = rep.totals;
      $("an-cards").replaceChildren(...[
        ["Searches", num(t.searches)], ["Users", num(t.users)], ["Click-through", pct(t.ctr)],
        ["Add to cart", pct(t.add_to_cart_rate)], ["Conversion", pct(t.conversion)],
        ["No results", pct(t.no_result_rate)],
        ["Mean click position", t.mean_click_position === null ? "–" : t.mean_click_position.toFixed(2)],
      ].map(([k, v]) => { const d = document.createElement("div"); d.className = "card"; d.innerHTML = "<span></span><b></b>";
        d.firstChild.textContent = k; d.lastChild.textContent = v; return d; }));
      const labels = rep.series.map((b) => (rep.granularity === "day" ? b.date.slice(5, 10) : b.date.slice(5, 13) + "h"));
      lineChart($("chart-volume"), labels, [
        { name: "searches", values: rep.series.map((b) => b.searches) },
        { name: "users", values: rep.series.map((b) => b.users) }]);
      lineChart($("chart-rates"), labels, [
        { name: "CTR", values: rep.series.map((b) => b.ctr) },
        { name: "add to cart", values: rep.series.map((b) => b.add_to_cart_rate) },
        { name: "conversion", values: rep.series.map((b) => b.conversion) },
        { name: "no results", values: rep.series.map((b) => b.no_result_rate) }], { rate: true });
      table($("t-top"), [["query"], ["searches", 1], ["users", 1], ["CTR", 1], ["conversion", 1], ["no results", 1], ["mean click pos.", 1]],
        rep.top_queries.map((r) => [r.query || "(photo)", num(r.searches), num(r.users), pct(r.ctr), pct(r.conversion),
          pct(r.no_result_rate), r.mean_click_position === null ? "–" : r.mean_click_position.toFixed(2)]));
      table($("t-nores"), [["query"], ["searches", 1], ["users", 1]], rep.no_result_queries.map((r) => [r.query || "(photo)", num(r.searches), num(r.users)]));
      table($("t-noclick"), [["query"], ["searches", 1], ["users", 1]], rep.no_click_queries.map((r) => [r.query || "(photo)", num(r.searches), num(r.users)]));
      const exps = await get("/v1/experiments", key);
      const rows = [];
      for (const e of exps) {
        let verdict = "";
        try { verdict = (await get("/v1/experiments/" + encodeURIComponent(e.name), key)).verdict; } catch (err) { verdict = String(err.message); }
        rows.push([e.name, e.status, e.interleave ? "interleaved" : Object.keys(e.variants).map((v, i) => `${v} ${e.split[i]}%`).join(", "), verdict]);
      }
      table($("t-exp"), [["experiment"], ["status"], ["split"], ["verdict"]], rows);
      $("an-status").textContent = `${num(t.searches)} searches from ${new Date(rep.since * 1000).toISOString().slice(0, 16)} to ${new Date(rep.until * 1000).toISOString().slice(0, 16)} UTC.`;
    } catch (err) {
      $("an-status").textContent = "Could not load: " + err.message;
      $("an-status").className = "err";
    }
  }

  $("an-form").addEventListener("submit", show);
  const saved = sessionStorage.getItem("vitrine-admin-key");
  if (saved) { $("an-key").value = saved; show(); }
})();
