"""Stock: whether a product can be bought now.

A product carries its stock as attributes (the least invasive form: a catalogue record's unknown
top-level fields already become attributes, so ``{"in_stock": false, "quantity": 0}`` needs no new
field anywhere): ``in_stock`` (bool, or "true"/"false"/"yes"/"no"/"1"/"0") and optionally
``quantity`` (a number). A product is out of stock when ``in_stock`` says false, or, without
``in_stock``, when ``quantity`` is 0 or less. A product that says neither is in stock.

The filter index keeps the out-of-stock products under the hidden field :data:`FIELD` (value
:data:`OUT`), so a search finds them among its candidates with one cached set lookup
(vitrine/merchandising/rules.py ranks them last or hides them: ``VITRINE_OUT_OF_STOCK``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FIELD = "stock"
OUT = "out"
_FALSE = {"false", "no", "0", "n", "off", "out", "out of stock"}
_TRUE = {"true", "yes", "1", "y", "on", "in", "in stock"}


def in_stock_value(v: Any) -> bool | None:
    """``in_stock`` as a bool (None: absent or unreadable)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v > 0
    if isinstance(v, str):
        s = v.strip().casefold()
        if s in _FALSE:
            return False
        if s in _TRUE:
            return True
    return None


def is_out_of_stock(attributes: Mapping[str, Any] | None) -> bool:
    attrs = {str(k).casefold(): v for k, v in (attributes or {}).items()}
    flag = in_stock_value(attrs.get("in_stock"))
    if flag is not None:
        return not flag
    q = attrs.get("quantity")
    if isinstance(q, bool):
        return False
    if isinstance(q, (int, float)):
        return q <= 0
    if isinstance(q, str):
        try:
            return float(q) <= 0
        except ValueError:
            return False
    return False


def stock_values(doc: Mapping[str, Any]) -> list[str]:
    """The hidden filter field's values of a stored product document."""
    return [OUT] if is_out_of_stock(doc.get("attributes")) else []
