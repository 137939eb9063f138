// What the UI needs to know about this server's catalogue, fetched once (GET /v1/ui/config):
// the events-only key, whether the catalogue has photos, example searches from the catalogue
// and its logged queries. A server without the endpoint: photos on, no events, the page's own
// examples.

let pending = null;

export function uiConfig() {
  if (!pending) {
    pending = fetch("v1/ui/config", { headers: { Accept: "application/json" } })
      .then((r) => (r.ok ? r.json() : null))
      .catch(() => null)
      .then((c) => c || { events_key: null, photos: true, examples: null, products: null });
  }
  return pending;
}
