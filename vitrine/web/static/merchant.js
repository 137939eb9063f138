// Merchant page: GET /v1/rules, PUT/DELETE /v1/rules/{id} with the API key (kept in this tab's
// sessionStorage only). No library, nothing fetched from outside.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const key = $("mr-key");
  key.value = sessionStorage.getItem("vitrine-key") || "";
  key.addEventListener("change", () => sessionStorage.setItem("vitrine-key", key.value));

  function status(text, bad) {
    $("mr-status").textContent = text;
    $("mr-status").className = bad ? "err" : "";
  }

  async function call(method, path, body) {
    const headers = { "Content-Type": "application/json" };
    if (key.value) headers["X-API-Key"] = key.value;
    const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const data = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error((data.error && data.error.message) || r.statusText);
    return data;
  }

  function cell(row, text, cls) {
    const td = row.insertCell();
    if (cls) td.className = cls;
    td.textContent = text;
    return td;
  }

  async function load() {
    const table = $("mr-rules");
    table.replaceChildren();
    const head = table.createTHead().insertRow();
    for (const h of ["id", "state", "conditions", "consequences", "updated", ""]) {
      const th = document.createElement("th");
      th.textContent = h;
      head.append(th);
    }
    let rules;
    try {
      rules = await call("GET", "/v1/rules");
    } catch (e) {
      status("could not list the rules: " + e.message, true);
      return;
    }
    const body = table.createTBody();
    for (const r of rules) {
      const row = body.insertRow();
      cell(row, r.id);
      cell(row, r.active ? "live" : r.enabled ? "not live now" : "off", r.active ? "" : "off");
      const c = cell(row, "");
      c.append(Object.assign(document.createElement("code"), { textContent: JSON.stringify(r.conditions) }));
      const q = cell(row, "");
      q.append(Object.assign(document.createElement("code"), { textContent: JSON.stringify(r.consequences) }));
      cell(row, new Date(r.updated).toLocaleString());
      const act = row.insertCell();
      const edit = Object.assign(document.createElement("button"), { type: "button", textContent: "Edit" });
      edit.addEventListener("click", () => {
        $("mr-id").value = r.id;
        $("mr-body").value = JSON.stringify({ conditions: r.conditions, consequences: r.consequences,
                                              enabled: r.enabled }, null, 1);
      });
      const del = Object.assign(document.createElement("button"), { type: "button", textContent: "Delete" });
      del.addEventListener("click", async () => {
        try {
          await call("DELETE", "/v1/rules/" + encodeURIComponent(r.id));
          status("deleted " + r.id);
          load();
        } catch (e) {
          status(e.message, true);
        }
      });
      act.append(edit, " ", del);
    }
    if (!rules.length) cell(body.insertRow(), "no rules yet");
  }

  $("mr-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    let rule;
    try {
      rule = JSON.parse($("mr-body").value);
    } catch (e) {
      status("the rule is not JSON: " + e.message, true);
      return;
    }
    try {
      const out = await call("PUT", "/v1/rules/" + encodeURIComponent($("mr-id").value), rule);
      status("saved " + out.id + (out.active ? " (live)" : " (not live now)"));
      load();
    } catch (e) {
      status(e.message, true);
    }
  });
  load();
})();
