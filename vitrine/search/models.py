"""Domain models: catalogue records, queries, hits, reports (pydantic)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vitrine.errors import InvalidInput
from vitrine.lang.render import RENDERING, for_tower
from vitrine.lang.segment import has_cjk

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_KNOWN = {"id", "title", "description", "brand", "category", "attributes", "price", "currency", "image",
          "image_b64", "version"}
AttrValue = str | int | float | bool | list[str]
# A ranking: (product iid, score, per-signal explanation) best first. The explanation is a mapping,
# not always a dict: the hybrid ranking makes it only when it is read (a page of the pool).
Ranked = list[tuple[int, float, Mapping[str, float]]]

# Attribute names that mean the same thing in different feeds.
GENDER_KEYS = ("gender",)
COLOUR_KEYS = ("colour", "color", "basecolour", "basecolor")


# Examples in the OpenAPI schema
EXAMPLE_PRODUCT: dict[str, Any] = {'id': '15970',
     'title': 'Adidas Men Running Shoes',
     'brand': 'Adidas',
     'category': 'Footwear > Shoes > Sports Shoes',
     'attributes': {'gender': 'Men', 'colour': 'Black'},
     'price': 2499.0,
     'currency': 'INR',
     'version': 3,
     'image_b64': '/9j/4AAQSkZJRg...'}
EXAMPLE_FILTERS: dict[str, Any] = {'gender': 'Women', 'colour': ['Red', 'Pink'], 'category': 'Heels', 'price_max': 2000}
EXAMPLE_FACETS: dict[str, Any] = {
    'facets': {'gender': [{'value': 'Men', 'count': 10590}, {'value': 'Women', 'count': 8740}]},
     'products': 20873}
EXAMPLE_PRODUCT_OUT: dict[str, Any] = {'id': '15970',
     'title': 'Adidas Men Running Shoes',
     'brand': 'Adidas',
     'category': ['Footwear', 'Shoes', 'Sports Shoes'],
     'attributes': {'gender': 'Men', 'colour': 'Black'},
     'price': 2499.0,
     'currency': 'INR',
     'image_url': '/images/3f2a.jpg',
     'version': 3}
EXAMPLE_RECOMMEND: dict[str, Any] = {'anchor': EXAMPLE_PRODUCT_OUT,
     'kind': 'complementary',
     'results': [{'id': '2133',
                  'score': 0.71,
                  'title': 'Puma Men Black Track Pants',
                  'relation': 'complements: Sports Shoes -> Track Pants; colour-compatible'}],
     'took_ms': 12.5}
EXAMPLE_COMPARE: dict[str, Any] = {'products': [EXAMPLE_PRODUCT_OUT,
                  {'id': '2133', 'title': 'Nike Men Running Shoes'}],
     'attributes': [{'name': 'colour', 'values': {'15970': 'Black', '2133': 'White'}, 'same': False}],
     'shared': {'gender': 'Men'},
     'differing': ['colour'],
     'pairwise': [{'a': '15970',
                   'b': '2133',
                   'photo': 0.82,
                   'text': 0.77,
                   'fused': 0.8,
                   'relation': 'substitutes'}],
     'price_difference': None,
     'summary': "Both are men's running shoes; they differ in colour.",
     'took_ms': 8.2}


def _clean(s: str) -> str:
    return " ".join(_CONTROL.sub(" ", s).split())


class Product(BaseModel):
    """One catalogue record (docs/design.md). Unknown top-level fields become attributes."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True,
                              json_schema_extra={"examples": [EXAMPLE_PRODUCT]})

    id: str = Field(min_length=1, max_length=256)
    title: str = Field(min_length=1, max_length=1000)
    description: str | None = Field(None, max_length=20_000)
    brand: str | None = Field(None, max_length=200)
    category: list[str] = Field(default_factory=list, max_length=12)
    attributes: dict[str, AttrValue] = Field(default_factory=dict)
    price: float | None = Field(None, ge=0)
    currency: str | None = Field(None, max_length=8)
    image: str | None = Field(None, max_length=4096, description="Path relative to the file, file URI or http(s) URL")
    image_b64: str | None = Field(None, description="The photo itself, base64-encoded")
    version: int | None = Field(None, ge=0, description="Source version; a lower one never overwrites a higher one")

    @model_validator(mode="before")
    @classmethod
    def _fold_extras(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("a product must be a JSON object")
        extras = {k: v for k, v in data.items() if k not in _KNOWN}
        if not extras:
            return data
        data = {k: v for k, v in data.items() if k in _KNOWN}
        if data.get("attributes") is not None and not isinstance(data["attributes"], dict):
            return data  # the attributes validator says what is wrong with them
        attrs = dict(data.get("attributes") or {})
        for k, v in extras.items():
            if v is None or v == "":
                continue
            if isinstance(v, (str, int, float, bool)) or (isinstance(v, list) and all(isinstance(x, str) for x in v)):
                attrs.setdefault(str(k), v)
        data["attributes"] = attrs
        return data

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if _CONTROL.search(v) or "/" in v or v in {".", ".."}:
            raise ValueError("id must not contain control characters or '/'")
        return v

    @field_validator("title", "description", "brand")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = _clean(v)
        return v or None

    @field_validator("title")
    @classmethod
    def _title(cls, v: str | None) -> str:
        if not v:
            raise ValueError("title must not be empty")
        return v

    @field_validator("category", mode="before")
    @classmethod
    def _category(cls, v: Any) -> list[str]:
        if v is None or v == "":
            return []
        if isinstance(v, str):
            parts = re.split(r"\s*(?:>|/|\|)\s*", v)
        elif isinstance(v, list):
            parts = [str(x) for x in v]
        else:
            raise ValueError("category must be a path list or a string like 'A > B > C'")
        return [_clean(p) for p in parts if _clean(p)]

    @field_validator("attributes", mode="before")
    @classmethod
    def _attrs(cls, v: Any) -> dict[str, Any]:
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise ValueError("attributes must be an object")
        if len(v) > 200:
            raise ValueError("at most 200 attributes")
        out = {}
        for k, val in v.items():
            if val is None or val == "":
                continue
            if isinstance(val, float) and not math.isfinite(val):
                raise ValueError(f"attribute {k!r} is not a finite number")
            if isinstance(val, str):
                val = _clean(val)[:1000]
            out[_clean(str(k))[:100]] = val
        return out

    @field_validator("price")
    @classmethod
    def _price(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("price must be a finite number")
        return v

    @field_validator("image_b64")
    @classmethod
    def _b64(cls, v: str | None) -> str | None:
        if v:
            try:
                decode_b64(v)  # validates
            except InvalidInput as e:  # as a ValueError, pydantic reports it as a validation error
                raise ValueError(str(e)) from e
        return v or None

    # -- derived views ----------------------------------------------------------------------
    def attr(self, *keys: str) -> str | None:
        low = {k.casefold(): v for k, v in self.attributes.items()}
        for k in keys:
            v = low.get(k)
            if v is not None and not isinstance(v, list):
                return str(v)
        return None

    @property
    def gender(self) -> str | None:
        return self.attr(*GENDER_KEYS)

    @property
    def colour(self) -> str | None:
        return self.attr(*COLOUR_KEYS)

    def document(self) -> dict[str, Any]:
        """The stored form: everything but the photo payload."""
        return self.model_dump(exclude={"image_b64"}, exclude_none=True)

    def content_hash(self, image_sha256: str | None) -> str:
        doc = self.model_dump(exclude={"image", "image_b64", "version"}, exclude_none=True)
        text = json.dumps(doc, sort_keys=True, ensure_ascii=False)
        h = hashlib.sha256(text.encode())
        h.update((image_sha256 or "").encode())
        if has_cjk(text):  # its embedded text is rendered (vitrine/lang/render.py): a re-ingest re-embeds
            h.update(f"tower-rendering:{RENDERING}".encode())  # what was embedded before the rendering
        return h.hexdigest()


def product_text(p: Product) -> str:
    """The words a product is embedded by: its title, plus brand and category leaf when the
    title does not already say them; Chinese written as English words for the English text tower
    (:func:`vitrine.lang.render.for_tower`: text without Chinese is returned as it is)."""
    parts = [p.title]
    low = p.title.casefold()
    if p.brand and p.brand.casefold() not in low:
        parts.append(p.brand)
    if p.category and p.category[-1].casefold() not in low:
        parts.append(p.category[-1])
    return for_tower(" ".join(parts))


def decode_b64(s: str) -> bytes:
    """Strict base64 (standard or URL-safe, data: URIs accepted) -> bytes."""
    s = s.strip()
    if s.startswith("data:"):
        _, _, s = s.partition(",")
    s = "".join(s.split())
    if not s:
        raise InvalidInput("image_b64 is empty")
    try:
        std = s.replace("-", "+").replace("_", "/")  # URL-safe alphabet -> standard
        return base64.b64decode(std + "=" * (-len(std) % 4), validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidInput(f"image_b64 is not valid base64: {e}") from e


class Filters(BaseModel):
    """Search filters. A list means any of its values; fields combine with AND."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, json_schema_extra={"examples": [EXAMPLE_FILTERS]})

    category: str | list[str] | None = Field(None, description="Any level of the category path")
    gender: str | list[str] | None = None
    colour: str | list[str] | None = Field(None, alias="color")
    brand: str | list[str] | None = None
    price_min: float | None = Field(None, ge=0)
    price_max: float | None = Field(None, ge=0)
    exclude: dict[Literal["category", "gender", "colour", "brand"], list[str]] | None = Field(
        None, description='Values to leave out, per field: {"brand": ["Nike"]} (a shopping session\'s "not nike")')

    @model_validator(mode="after")
    def _range(self) -> "Filters":
        if self.price_min is not None and self.price_max is not None and self.price_min > self.price_max:
            raise ValueError("price_min is greater than price_max")
        return self

    def terms(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for f in ("category", "gender", "colour", "brand"):
            v = getattr(self, f)
            if v:
                out[f] = [v] if isinstance(v, str) else list(v)
        return out

    def is_empty(self) -> bool:
        return not self.terms() and self.price_min is None and self.price_max is None and not self.excluded()

    def excluded(self) -> dict[str, list[str]]:
        """The values to leave out, per field (empty lists dropped)."""
        return {f: list(v) for f, v in (self.exclude or {}).items() if v}


SortOrder = Literal["relevance", "price_asc", "price_desc", "newest"]
FacetField = Literal["gender", "colour", "brand", "category", "price"]
FACET_FIELDS: tuple[str, ...] = ("gender", "colour", "brand", "category", "price")


class SearchRequest(BaseModel):
    """A search: words, a photo or both, within filters; one page of results in an order."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"text": "women red running shoes", "k": 10},
        {"text": "adidas running shoes", "k": 20, "offset": 20, "sort": "price_asc",
         "filters": {"gender": "Men", "price_max": 3000}, "facets": ["brand", "colour", "price"],
         "highlight": True},
    ]})

    text: str | None = Field(None, description="Words: what the shopper typed")
    image_b64: str | None = Field(None, description="A photo, base64-encoded (JPEG, PNG, WEBP...)")
    k: int = Field(10, ge=1, description="Results per page (offset + k is at most the server's max_k)")
    offset: int = Field(0, ge=0, description="Results to skip: page n (from 0) of size k is offset = n * k")
    sort: SortOrder = Field("relevance", description="relevance (default); price_asc, price_desc and newest "
                                                     "order the products above the relevance floor")
    filters: Filters | None = None
    facets: list[FacetField] = Field(default_factory=list, max_length=5, description=(
        "Count each value of these fields among the matching products (price as ranges)"))
    highlight: bool = Field(False, description="Attach each hit's query-word spans in its title and description")
    explain: bool = Field(False, description="Attach a per-hit explanation")
    user: str | None = Field(None, min_length=1, max_length=256, description=(
        "A pseudonymous shopper token the storefront chooses: experiment assignment and event attribution "
        "(stored hashed)"))
    session: str | None = Field(None, min_length=1, max_length=128, description=(
        "A shopping session id the storefront chooses: follow-up queries refine the session's last search"))
    new_search: bool | None = Field(None, description=(
        "With a session: true starts a new search in it, false reads the query as a refinement; "
        "absent: the session's classifier decides"))
    session_drop: list[str] = Field(default_factory=list, max_length=20, description=(
        "With a session: chips to remove from its standing query (a chip's `key` from the response's "
        "session.chips); without text or photo the standing query runs again without them"))
    use_intent: bool = Field(True, description="Classify the query's intent and turn its slots into filters")

    @field_validator("session")
    @classmethod
    def _session_id(cls, v: str | None) -> str | None:
        if v is not None and (_CONTROL.search(v) or any(c in v for c in "\t\n\r")):
            raise ValueError("session must not contain control characters")
        return v


class Explanation(BaseModel):
    vector_score: float
    signals: dict[str, float] = Field(default_factory=dict)
    modalities: list[str] = Field(default_factory=list)
    filters: dict[str, Any] = Field(default_factory=dict)
    intent: dict[str, Any] | None = Field(None, description="The query's intent: label and probabilities")
    slots: dict[str, Any] = Field(default_factory=dict, description="Slots of the query used as filters")
    backfill: bool = Field(False, description="Added from the search without the slot filters, after the hits "
                                              "that met them, so that a slot filter never leaves fewer than k")
    rules: list[dict[str, Any]] = Field(default_factory=list, description=(
        "Merchandising rules that moved this hit: rule id, action (pin, boost, bury, stock) and its detail"))
    translated: list[dict[str, Any]] = Field(default_factory=list, description=(
        "A query in another language than the catalogue's: each word, the catalogue words it was read as "
        "and how (table, dictionary, parts, kept, unread)"))


class Span(BaseModel):
    """Where a query word was found: ``text[start:end]`` (Python string offsets, end exclusive)."""

    start: int
    end: int


class Hit(BaseModel):
    id: str
    score: float
    title: str
    brand: str | None = None
    category: list[str] = Field(default_factory=list)
    attributes: dict[str, Any] = Field(default_factory=dict)
    price: float | None = None
    currency: str | None = None
    description: str | None = None
    image_url: str | None = None
    highlights: dict[str, list[Span]] | None = Field(None, description=(
        "highlight=true: spans of the query's words (typos forgiven) in title and description"))
    explanation: Explanation | None = None
    rules: list[str] | None = Field(None, description="The merchandising rules that moved this hit (absent: none)")


class SearchResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "results": [{"id": "15970", "score": 0.8123, "title": "Adidas Men Running Shoes", "brand": "Adidas",
                     "category": ["Footwear", "Shoes", "Sports Shoes"], "attributes": {"gender": "Men"},
                     "price": 2499.0, "image_url": "/images/3f2a.jpg",
                     "highlights": {"title": [{"start": 0, "end": 6}, {"start": 11, "end": 18}]}}],
        "took_ms": 21.4, "k": 10, "offset": 0, "total": 143, "total_exact": False, "pool": 212,
        "sort": "relevance",
        "facets": {"brand": [{"value": "Adidas", "count": 61}, {"value": "Nike", "count": 22}],
                   "price": [{"value": "0-1000", "count": 12, "min": 0, "max": 1000}]},
        "query": {"text": "adidas running shoes", "image": False, "filters": {}},
        "model": "effnet-minilm+mlp", "degraded": []}]})

    results: list[Hit]
    took_ms: float
    k: int
    offset: int = Field(0, description="The request's offset")
    total: int | None = Field(None, description="Products matching the query: exact when total_exact, "
                                                "else an estimate from the candidate pool (a lower bound)")
    total_exact: bool | None = Field(None, description="Whether total is exact (every product within the "
                                                       "filters was ranked) or an estimate")
    pool: int | None = Field(None, description="Candidates ranked for this query; facet counts and the "
                                               "sorted orders are exact over them")
    sort: str | None = Field(None, description="The order of the results")
    facets: dict[str, list[FacetValue]] | None = Field(None, description=(
        "Requested facets: each value's count among the matching products"))
    query: dict[str, Any] = Field(default_factory=dict, description=(
        "How the query was read: text (as typed), image, filters applied; translated and translation (a "
        "Chinese query read as the catalogue's words); corrected and corrections (misspelt or run-together "
        "words read as the catalogue's: [{word, read_as}]); the intent and slots read from it"))
    model: str | None = None
    degraded: list[str] = Field(default_factory=list, description=(
        "Parts that could not serve this search and were left out: gate, intent, bm25, graph, or store (the "
        "shared PostgreSQL store is down: results come from this replica's own copy, see stale_s)"))
    stale_s: float | None = Field(None, description="With degraded store: seconds since the store last answered "
                                                    "(this replica's copy may lack changes made since)")
    intent: IntentOut | None = Field(None, description="What the shopper wants (null: not classified)")
    slots: dict[str, Any] = Field(default_factory=dict, description="brand, category, colour, gender, "
                                                                    "price_min, price_max named by the query")
    compare: CompareResponse | None = Field(None, description="Compare intent: the compared products")
    recommendations: RecommendResponse | None = Field(None, description="Recommend intent: recommendations")
    answer: AfterSalesAnswer | None = Field(None, description="After-sales intent: an answer instead of products")
    query_id: str | None = Field(None, description="This search's id: events (POST /v1/events) name it")
    session: dict[str, Any] | None = Field(None, description=(
        "With a session: the effective query (text, filters, chips), what this turn changed, whether it was read "
        "as a new search, and the classifier's p_refine / p_new_search (docs/sessions.md)"))
    variant: str | None = Field(None, description="The experiment variant that ranked this search, when one runs")
    exploration: dict[str, Any] | None = Field(None, description=(
        "An explored page (docs/learning.md): the product moved up from below the page (product_id, from_rank, "
        "position, propensity: the probability of that draw)"))
    rules: list[str] = Field(default_factory=list, description="The merchandising rules that fired on this search")
    banner: dict[str, Any] | None = Field(None, description="A fired rule's banner for the storefront to show")
    redirect: str | None = Field(None, description="A fired rule's redirect: the storefront goes there instead")


class IntentOut(BaseModel):
    label: str = Field(description="search, compare, recommend, purchase_intent, after_sales or abandon")
    scores: dict[str, float] = Field(description="Probability of every label (empty when the classifier did "
                                                 "not run: see by)")
    predicted: str | None = Field(None, description="The classifier's top label (label falls back to "
                                                    "search when it is not confident; null when it did not run)")
    confident: bool = True
    by: Literal["classifier", "lexical_prior"] = Field(
        "classifier", description="What decided the label: the classifier, or the lexical prior (the query holds "
                                  "no cue word of a non-search intent, so it is a search whatever the classifier "
                                  "says, and the classifier is not run; VITRINE_INTENT_CLASSIFY_EVERY_QUERY runs it)")


class AfterSalesAnswer(BaseModel):
    topic: str
    text: str
    steps: list[str] = Field(default_factory=list)


class FacetValue(BaseModel):
    value: str
    count: int
    min: float | None = Field(None, description="price facet: the range's lower bound (inclusive)")
    max: float | None = Field(None, description="price facet: the range's upper bound (exclusive; null: open)")


class FacetsResponse(BaseModel):
    """Filter values and how many products hold each (for filter chips)."""

    model_config = ConfigDict(json_schema_extra={"examples": [EXAMPLE_FACETS]})

    facets: dict[str, list[FacetValue]]
    products: int


class ProductOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [EXAMPLE_PRODUCT_OUT]})

    id: str
    title: str
    brand: str | None = None
    category: list[str] = Field(default_factory=list)
    attributes: dict[str, Any] = Field(default_factory=dict)
    price: float | None = None
    currency: str | None = None
    description: str | None = None
    image_url: str | None = None
    version: int | None = None
    degraded: list[str] | None = Field(None, description=(
        '["store"]: read from this replica\'s copy because the shared store did not answer (may be stale)'))


class ItemError(BaseModel):
    id: str | None = None
    line: int | None = None
    reason: str


class UpsertReport(BaseModel):
    upserted: int = 0
    unchanged: int = 0
    stale: int = 0
    failed: list[ItemError] = Field(default_factory=list)
    seq: int = 0
    seconds: float = 0.0

    def merge(self, other: "UpsertReport") -> None:
        self.upserted += other.upserted
        self.unchanged += other.unchanged
        self.stale += other.stale
        self.failed.extend(other.failed)
        self.seq = max(self.seq, other.seq)
        self.seconds += other.seconds


Modality = Literal["text", "image"]


# -- recommendations and comparisons (the knowledge-graph endpoints) -------------------------------
class RecommendHit(Hit):
    """A recommended product: every field of a search hit, plus the relation that put it there."""

    relation: str = Field(description='e.g. "same category: Shirts" or '
                                      '"complements: Shirts -> Trousers; colour-compatible"')


class RecommendResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [EXAMPLE_RECOMMEND]})

    anchor: ProductOut
    kind: str
    results: list[RecommendHit]
    took_ms: float


class CompareAttribute(BaseModel):
    name: str
    values: dict[str, Any] = Field(description="product id -> value (null when the product lacks it)")
    same: bool


class PairwiseSimilarity(BaseModel):
    a: str
    b: str
    photo: float | None = Field(None, description="Cosine of the two photos in the shared space")
    text: float | None = Field(None, description="Cosine of the two product texts in the shared space")
    fused: float | None = Field(None, description="Cosine of the two fused product vectors")
    relation: Literal["substitutes", "complements", "unrelated"]


class CompareResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [EXAMPLE_COMPARE]})

    products: list[ProductOut]
    attributes: list[CompareAttribute]
    shared: dict[str, Any]
    differing: list[str]
    pairwise: list[PairwiseSimilarity]
    price_difference: float | None = None
    summary: str
    took_ms: float


class CompareRequest(BaseModel):
    """``{"ids": [2..5 product ids]}`` or ``{"text": "nike vs puma running shoes"}``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"ids": ["15970", "2133"]}, {"text": "nike vs puma running shoes"}]})

    ids: list[str] | None = Field(None, description="2 to 5 distinct product ids")
    text: str | None = Field(None, max_length=1000, description='Two or more sides joined by "vs"')

    @model_validator(mode="after")
    def _one(self) -> "CompareRequest":
        if (self.ids is None) == (self.text is None):
            raise ValueError('give exactly one of "ids" or "text"')
        return self


SearchResponse.model_rebuild()  # its compare/recommendations types are defined below it
