"""A product's facts as the graph keeps them: category, brand, colour, gender, season, usage.

:class:`FactReader` reads them from a product's document: the explicit ``brand`` field wins over a
brand named in the title (:class:`~vitrine.index.vocabulary.BrandLexicon`), an attribute colour
over one named in the title (:class:`~vitrine.index.learned.TitleColours`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vitrine.index.learned import TitleColours, category_path
from vitrine.index.vocabulary import ATTR_KEYS, GraphData


@dataclass
class ProductFacts:
    iid: int
    pid: str
    category: str | None
    brand: str | None
    colour: str | None
    gender: str | None
    season: str | None
    usage: str | None


class FactReader:
    """Reads :class:`ProductFacts` (and the category path) from product documents."""

    def __init__(self, data: GraphData) -> None:
        self.data = data
        self._colour_in: TitleColours | None = None  # built on the first title that needs it

    def __call__(self, iid: int, pid: str, doc: Mapping[str, Any]) -> tuple[ProductFacts, list[str]]:
        attrs = {str(k).casefold(): v for k, v in (doc.get("attributes") or {}).items()}

        def attr(f: str) -> str | None:
            for k in ATTR_KEYS[f]:
                v = attrs.get(k)
                if v not in (None, "", "NA") and not isinstance(v, list):
                    return " ".join(str(v).split())
            return None

        path = category_path(doc)
        brand = doc.get("brand")
        if brand:
            brand = self.data.brands.canonical(str(brand))
        elif doc.get("title"):
            brand = self.data.brands.from_title(str(doc["title"]))
        colour = attr("colour")
        if colour is None and doc.get("title"):
            if self._colour_in is None:
                self._colour_in = TitleColours(self.data)
            colour = self._colour_in(str(doc["title"]))
        facts = ProductFacts(iid=iid, pid=pid, category=path[-1] if path else None, brand=brand,
                             colour=colour, gender=attr("gender"), season=attr("season"),
                             usage=attr("usage"))
        return facts, path
