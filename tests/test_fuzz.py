"""Fuzzing: schemathesis against the OpenAPI schema (zero 5xx, every error in the one JSON shape),
and hypothesis properties of the catalogue-record, Kafka-event and query parsers."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil

import pytest
import schemathesis
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis import strategies as st
from conftest import copy_sqlite
from pydantic import SecretStr, ValidationError

from vitrine.errors import InvalidInput
from vitrine.ingest.catalog import parse_record, read_csv, read_jsonl
from vitrine.ingest.events import BadEvent, DeleteEvent, UpsertEvent, encode_event, parse_event
from vitrine.search.models import Filters, Product, SearchRequest

KEY = "fuzz-key"
CASES = {"read": 0, "write": 0}
SERVER_ERRORS: list[str] = []


def _check_response(case, response) -> None:
    """No 5xx; every 4xx is the one JSON error shape with its status."""
    if response.status_code >= 500:
        SERVER_ERRORS.append(f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}")
    assert response.status_code < 500, (case.method, case.path, case.body, response.status_code, response.text[:500])
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, body
        assert body["error"]["status"] == response.status_code and body["error"]["code"] and body["error"]["message"]


@pytest.fixture(scope="module")
def read_schema(engine):
    """The API over the session engine, writes without a key (401), everything else for real."""
    from vitrine.web.app import create_app

    app = create_app(engine=engine)
    app.state.engine = engine
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def write_schema(engine, settings_factory, encoder, tmp_path_factory):
    """Writes and admin actions with the key, over a copy of the subset (the session engine stays as is)."""
    from vitrine.search.engine import Engine
    from vitrine.web.app import create_app

    src = engine.data_dir
    engine.save()
    d = tmp_path_factory.mktemp("fuzz") / "data"
    d.mkdir()
    copy_sqlite(src / "records.sqlite", d / "records.sqlite")
    shutil.copytree(src / "images", d / "images")
    shutil.copytree(src / "index", d / "index", ignore=shutil.ignore_patterns(".lock"))
    eng = Engine(settings_factory(d, intent=False, api_key=SecretStr(KEY), snapshot_interval_s=3600), encoder)
    app = create_app(engine=eng)
    app.state.engine = eng
    yield schemathesis.openapi.from_asgi("/openapi.json", app).include(
        method=["PUT", "DELETE", "POST"], path_regex=r"^/v1/(products/\{pid\}|admin/snapshot)$")
    eng.records.close()


def fuzz(schema, headers: dict[str, str] | None, examples: int, bucket: str) -> dict[str, int]:
    """Every operation, positive (valid per schema) and negative (schema-violating) cases."""
    from schemathesis import GenerationMode

    per_op: dict[str, int] = {}
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=op.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def run(case) -> None:
                response = case.call(headers=headers)
                CASES[bucket] += 1
                per_op[op.label] = per_op.get(op.label, 0) + 1
                _check_response(case, response)

            try:
                run()
            except Unsatisfiable:  # nothing to violate (an operation without parameters or body)
                assert mode == GenerationMode.NEGATIVE, op.label
    return per_op


@pytest.mark.slow
def test_fuzz_the_api_over_the_session_engine(read_schema):
    """Generated requests against every operation (writes and admin actions without the key)."""
    per_op = fuzz(read_schema, None, 70, "read")
    print("schemathesis cases per operation (read):", per_op)
    assert len(per_op) >= 14


@pytest.mark.slow
def test_fuzz_writes_and_admin_with_the_key(write_schema):
    per_op = fuzz(write_schema, {"X-API-Key": KEY}, 70, "write")
    print("schemathesis cases per operation (with the key):", per_op)
    assert set(per_op) == {"PUT /v1/products/{pid}", "DELETE /v1/products/{pid}", "POST /v1/admin/snapshot"}


@pytest.mark.slow
def test_fuzz_ran_over_a_thousand_cases_without_a_server_error():
    """(Runs after the two fuzz tests above.) The bar: >= 1,000 generated cases, zero 5xx."""
    total = CASES["read"] + CASES["write"]
    if not CASES["read"] or not CASES["write"]:
        pytest.skip("counts the cases of the two fuzz tests above: run this file whole")
    print(f"schemathesis: {CASES['read']} cases over the API, {CASES['write']} over writes with the key, "
          f"{len(SERVER_ERRORS)} server errors")
    assert total >= 1000, CASES
    assert not SERVER_ERRORS


# -- catalogue records --------------------------------------------------------------------------------------
json_scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | \
    st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30)
json_values = st.recursive(json_scalars, lambda ch: st.lists(ch, max_size=4) | st.dictionaries(st.text(max_size=8), ch,
                                                                                               max_size=4), max_leaves=10)
field_values = {
    "id": st.text(max_size=20) | st.integers() | st.none(),
    "title": st.text(max_size=40) | st.none() | st.integers(),
    "description": st.text(max_size=40) | st.none(),
    "brand": st.text(max_size=20) | st.none(),
    "category": st.text(max_size=30) | st.lists(st.text(max_size=10), max_size=14) | st.integers(),
    "attributes": st.dictionaries(st.text(max_size=10), json_values, max_size=5) | json_values,
    "price": st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 10**6) | st.text(max_size=5),
    "currency": st.text(max_size=10) | st.none(),
    "image": st.text(max_size=30) | st.none(),
    "image_b64": st.text(max_size=30) | st.none() | st.just("aGVsbG8="),
    "version": st.integers(-3, 10**9) | st.none() | st.text(max_size=3),
}
records = st.fixed_dictionaries({}, optional=field_values).flatmap(
    lambda d: st.dictionaries(st.text(max_size=10), json_values, max_size=3).map(lambda extra: {**extra, **d}))
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@given(records | json_values)
@settings(max_examples=400, deadline=None)
def test_any_record_is_either_a_clean_product_or_a_clear_error(obj):
    try:
        p = Product.model_validate(obj)
    except (ValidationError, InvalidInput) as e:
        assert str(e)
        parsed = parse_record(obj, 7)  # the file reader's view: never raises, says why with the line
        assert parsed.product is None and parsed.error and parsed.line == 7
        return
    assert p.id and "/" not in p.id and not _CONTROL.search(p.id) and len(p.id) <= 256
    assert p.title and p.title == " ".join(p.title.split()) and not _CONTROL.search(p.title)
    assert all(c and c == " ".join(c.split()) for c in p.category) and len(p.category) <= 12
    assert p.price is None or (math.isfinite(p.price) and p.price >= 0)
    assert p.version is None or p.version >= 0
    for v in p.attributes.values():
        assert not (isinstance(v, float) and not math.isfinite(v))
    doc = p.document()
    json.dumps(doc, allow_nan=False)  # storable as strict JSON
    again = Product.model_validate(doc)  # what is stored reads back as the same product
    assert again.model_dump(exclude={"image_b64"}) == p.model_dump(exclude={"image_b64"})
    assert again.content_hash(None) == p.content_hash(None)


@given(st.lists(st.one_of(records.map(lambda r: json.dumps(r, default=str)), st.text(max_size=60)), max_size=12))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_jsonl_reader_never_crashes_and_reports_each_line(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("jsonl") / "c.jsonl"
    clean = [ln.replace("\n", " ").replace("\r", " ") for ln in lines]
    path.write_bytes(("\n".join(clean) + "\n").encode("utf-8", "replace"))  # (lone surrogates: "?")
    out = list(read_jsonl(path))
    nonblank = [i + 1 for i, ln in enumerate(clean) if ln.strip()]
    assert [p.line for p in out] == nonblank
    for p in out:
        assert (p.product is None) != (p.error is None)


@given(st.lists(st.dictionaries(st.sampled_from(["id", "title", "price", "brand", "version", "attributes", "x y"]),
                                st.text(max_size=15), max_size=6), max_size=8),
       st.lists(st.sampled_from(["id", "title", "price", "brand", "version", "attributes", "x y"]), max_size=7))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(rows=[{"id": "a", "version": "²"}], header=["id", "version"])  # a digit int() refuses (found in CI)
def test_csv_reader_never_crashes(tmp_path_factory, rows, header):
    path = tmp_path_factory.mktemp("csv") / "c.csv"
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for r in rows:
        w.writerow([r.get(h, "") for h in header] + (["extra"] if len(r) == 6 else []))
    path.write_text(buf.getvalue(), encoding="utf-8", errors="replace")
    out = list(read_csv(path))
    if "id" not in header:
        assert len(out) == 1 and "id" in out[0].error
    for p in out:
        assert (p.product is None) != (p.error is None) and p.line >= 1


# -- Kafka events --------------------------------------------------------------------------------------------
event_objs = st.one_of(
    st.fixed_dictionaries({"op": st.just("upsert"), "product": records},
                          optional={"version": st.integers(-2, 10**6) | st.text(max_size=3) | st.none()}),
    st.fixed_dictionaries({"op": st.just("delete"), "id": st.text(max_size=12) | st.integers() | st.none()},
                          optional={"version": st.integers(-2, 10**6) | st.none()}),
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    json_values,
)


@given(st.one_of(st.none(), st.binary(max_size=20), st.text(max_size=12).map(str.encode)),
       st.one_of(st.none(), st.binary(max_size=60), event_objs.map(lambda o: json.dumps(o, default=str).encode())))
@settings(max_examples=500, deadline=None)
def test_any_message_is_an_event_or_a_bad_event_with_a_kind(key, value):
    try:
        ev = parse_event(key, value)
    except BadEvent as e:
        assert e.kind in {"json", "schema", "key"} and e.reason
        return
    assert isinstance(ev, (UpsertEvent, DeleteEvent)) and ev.id
    if key is not None:
        assert key.decode() == ev.id  # keyed by the product id, or refused
    if isinstance(ev, UpsertEvent) and ev.version is not None:
        assert ev.product.version == ev.version
    k2, v2 = encode_event(ev)  # what goes on the topic parses back to the same event
    assert parse_event(k2, v2) == ev


# -- queries -------------------------------------------------------------------------------------------------
filter_objs = st.fixed_dictionaries({}, optional={
    "category": st.text(max_size=10) | st.lists(st.text(max_size=8), max_size=3) | st.integers(),
    "gender": st.sampled_from(["Men", "Women", "Unisex", "Boys"]) | st.lists(st.sampled_from(["Men", "Women"])),
    "colour": st.text(max_size=8), "color": st.sampled_from(["Black", "Red", "Navy Blue"]),
    "brand": st.text(max_size=8), "price_min": st.floats(-5, 500) | st.none(), "price_max": st.floats(-5, 500),
    "flavour": st.text(max_size=3),
})
query_objs = st.fixed_dictionaries({}, optional={
    "text": st.text(max_size=60) | st.none() | st.integers(),
    "k": st.integers(-3, 300) | st.text(max_size=3),
    "filters": filter_objs | json_values,
    "explain": st.booleans(), "use_intent": st.booleans(),
    "image_b64": st.text(alphabet="ABCDEFGHabcd0123+/=%", max_size=16),
    "other": st.integers(),
})


@given(query_objs | json_values)
@settings(max_examples=400, deadline=None)
def test_query_parser_accepts_or_refuses_clearly(obj):
    try:
        req = SearchRequest.model_validate(obj)
    except ValidationError as e:
        assert e.errors()
        return
    assert req.k >= 1
    f = req.filters
    if f is not None:
        if f.price_min is not None and f.price_max is not None:
            assert f.price_min <= f.price_max
        assert all(v and all(isinstance(x, str) for x in v) for v in f.terms().values())
        assert f.is_empty() == (not f.terms() and f.price_min is None and f.price_max is None)
        assert Filters.model_validate(f.model_dump(exclude_none=True, by_alias=False)) == f


@given(st.fixed_dictionaries({"text": st.text(max_size=40)}, optional={
    "k": st.integers(1, 150), "filters": st.fixed_dictionaries({}, optional={
        "gender": st.sampled_from(["Men", "Women", "Unisex"]), "colour": st.sampled_from(["Black", "Blue", "Mauve"]),
        "category": st.sampled_from(["Shoes", "Watches", "Nothing"]), "price_max": st.floats(0, 100)}),
    "explain": st.booleans(), "use_intent": st.booleans()}))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_valid_query_is_answered_or_refused_as_invalid(engine, obj):
    req = SearchRequest.model_validate(obj)
    try:
        res = engine.search(req)
    except InvalidInput as e:  # empty words, k over max_k: the caller's error, said plainly
        assert str(e)
        assume(False)
        return
    assert len(res.results) <= req.k
    assert all(h.id and h.title for h in res.results)
    scores = [h.score for h in res.results]
    assert all(math.isfinite(s) for s in scores)
