"""Python client of Vitrine's HTTP API, sync (:class:`Client`) and async (:class:`AsyncClient`),
typed by the API's own pydantic models (vitrine.search.models).

Both retry with exponential backoff and jitter (honouring ``Retry-After``) when the server answers
503 or cannot be reached, and give every request a timeout. A request that changes state only
once (a hot swap) is retried only when it never reached the server. Errors come as
:class:`ApiError` with the API's error code, message and detail::

    from vitrine.client import Client

    with Client("http://127.0.0.1:8000") as vc:
        page = vc.search("adidas running shoes", k=20, sort="price_asc", facets=["brand", "price"])
        for hit in page.results:
            print(hit.id, hit.title, hit.price)

    # shopper events on that page (the write key or the events key): POST /v1/events
    with Client("http://127.0.0.1:8000", api_key=EVENTS_KEY) as vc:
        vc.click(page.query_id, page.results[2].id, position=2, user="u-81f2")
        vc.events([{"type": "view", "query_id": page.query_id, "product_id": h.id, "position": i}
                   for i, h in enumerate(page.results)])
"""

from vitrine.client.base import ApiError, RetryPolicy, Unreachable
from vitrine.client.sync import Client
from vitrine.client.aio import AsyncClient

__all__ = ["ApiError", "AsyncClient", "Client", "RetryPolicy", "Unreachable"]
