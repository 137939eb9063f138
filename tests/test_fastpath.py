"""The query fast path: micro-batching under concurrency, the query-embedding cache, precisions.

Real towers, real adapters, real catalogue photos and titles; no timing assertions (speed is in
`vitrine bench fastpath` / `vitrine bench api`)."""

from __future__ import annotations

import io

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image
import pytest
import torch

from vitrine import onnxrt
from vitrine.encoders.adapters import load_adapter
from vitrine.encoders.batching import LRUCache, MicroBatcher
from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.encoders.queries import QueryEncoder
from vitrine.errors import InvalidImage, InvalidInput, ModelError
from vitrine.onnxrt import OnnxModule
from vitrine.search.models import SearchRequest

from conftest import SOURCE


# -- building blocks ------------------------------------------------------------------------------
def test_lru_cache_evicts_least_recently_used():
    c: LRUCache[int] = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # a is now the most recent
    c.put("c", 3)
    assert c.get("b") is None and c.get("a") == 1 and c.get("c") == 3
    assert c.stats()["hits"] == 3 and c.stats()["misses"] == 1
    off: LRUCache[int] = LRUCache(0)
    off.put("a", 1)
    assert off.get("a") is None and len(off) == 0


def test_micro_batcher_batches_concurrent_calls_and_keeps_each_result():
    seen: list[int] = []

    def square(xs: list[int]) -> list[int]:
        seen.append(len(xs))
        time.sleep(0.01)  # a forward that takes a while: callers pile up behind it
        return [x * x for x in xs]

    b = MicroBatcher(square, max_batch=16, max_wait_s=0.005)
    with ThreadPoolExecutor(32) as ex:
        got = list(ex.map(b, range(200)))
    b.close()
    assert got == [x * x for x in range(200)]
    assert sum(seen) == 200 and max(seen) <= 16
    assert len(seen) < 100, f"concurrent calls were not batched: {seen}"


def test_micro_batcher_error_fails_only_its_batch_and_worker_survives():
    def fn(xs: list[int]) -> list[int]:
        if -1 in xs:
            raise ValueError("bad item")
        return xs

    b = MicroBatcher(fn, max_batch=8, max_wait_s=0.0)
    with pytest.raises(ValueError, match="bad item"):
        b(-1)
    assert b(5) == 5  # the worker is still alive
    b.close()
    with pytest.raises(RuntimeError, match="closed"):
        b.submit(1)


def test_micro_batcher_close_serves_what_is_queued():
    gate = threading.Event()

    def fn(xs: list[int]) -> list[int]:
        gate.wait(5)
        return [x + 1 for x in xs]

    b = MicroBatcher(fn, max_batch=2, max_wait_s=0.0)
    futs = [b.submit(i) for i in range(7)]
    closer = threading.Thread(target=b.close)
    closer.start()
    gate.set()
    closer.join(10)
    assert [f.result(5) for f in futs] == [i + 1 for i in range(7)]


def test_micro_batcher_works_in_a_forked_child():
    """A process forked after the batcher's worker thread started (a pre-forking server, our forked
    ingest workers) gets its own worker; the old one's queue would never be read in the child."""
    import os

    b = MicroBatcher(lambda xs: [x * 2 for x in xs], max_batch=4, max_wait_s=0.0)
    assert b(3, timeout=5) == 6  # the parent's worker thread is running
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when it answers in time
        code = 1
        try:
            code = 0 if b(21, timeout=5) == 42 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert b(5, timeout=5) == 10  # the parent's batcher is untouched


def test_progress_that_is_off_never_takes_tqdms_process_shared_lock(encoder, titles, monkeypatch):
    """tqdm's write lock is a semaphore shared with forked processes: a worker SIGKILLed while
    holding it blocked every later bar in the test session (and would in a pre-forking server).
    Library code with progress off must not touch it."""
    import tqdm.std

    from vitrine.progress import progress_bar

    def no_lock(cls):
        raise AssertionError("tqdm's lock taken with progress off")

    monkeypatch.setattr(tqdm.std.tqdm, "get_lock", classmethod(no_lock))
    bar = progress_bar(total=3, enabled=False, desc="x")
    bar.update(1)
    bar.set_postfix(loss=1.0)
    bar.close()
    assert list(progress_bar(iter([1, 2]), enabled=False)) == [1, 2]
    assert encoder.text_features([f"{titles[0]} never cached {time.time()}"]).shape[0] == 1
    with pytest.raises(AssertionError, match="lock taken"):
        progress_bar(total=1, enabled=True)


# -- query encoder over the real towers ------------------------------------------------------------
@pytest.fixture(scope="module")
def titles(subset_rows) -> list[str]:
    return [r["productDisplayName"] for r in subset_rows[:48]]


@pytest.fixture(scope="module")
def photos(subset_rows) -> list[bytes]:
    return [(SOURCE / "images" / f"{r['id']}.jpg").read_bytes() for r in subset_rows[:24]]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_concurrent_batched_text_queries_match_unbatched(encoder, titles):
    alone = QueryEncoder(encoder, cache_size=0, max_batch=1, max_wait_ms=0)
    ref = np.stack([alone.text([t])[0] for t in titles])
    alone.close()
    # the encoder's own path (towers + adapter) agrees too, in float32 (bf16 batch encodes:
    # tests/test_batch_precision.py)
    fp32 = MultimodalEncoder(encoder.towers, encoder.adapter, cache=None, batch_precision="fp32")
    direct = fp32.embed(None, fp32.text_features(titles)).text
    assert np.allclose(ref, direct, atol=2e-3)

    qe = QueryEncoder(encoder, cache_size=0, max_batch=16, max_wait_ms=5)
    with ThreadPoolExecutor(16) as ex:
        got = np.stack(list(ex.map(lambda t: qe.text([t])[0], titles)))
    st = qe.stats()["text_batches"]
    qe.close()
    assert st["items"] == len(titles) and st["largest"] > 1, st  # they really went in batches
    assert np.allclose(got, ref, atol=1e-4), np.abs(got - ref).max()
    assert (_cos(got, ref) > 0.9999).all()


def test_concurrent_batched_photo_queries_match_unbatched_and_bad_photo_fails_alone(encoder, photos):
    alone = QueryEncoder(encoder, cache_size=0, max_batch=1, max_wait_ms=0)
    ref = np.stack([alone.image([p])[0] for p in photos])
    alone.close()
    qe = QueryEncoder(encoder, cache_size=0, max_batch=8, max_wait_ms=5)
    bad = photos[0][: len(photos[0]) // 3]

    def one(p: bytes):
        try:
            return qe.image([p])[0]
        except InvalidImage as e:
            return e

    with ThreadPoolExecutor(8) as ex:
        got = list(ex.map(one, [*photos, bad]))
    qe.close()
    assert isinstance(got[-1], InvalidImage)
    assert np.allclose(np.stack(got[:-1]), ref, atol=1e-4)
    assert qe.stats()["image_batches"]["largest"] > 1


def test_cache_hits_and_invalidation_on_model_change(encoder, titles):
    cache: LRUCache[np.ndarray] = LRUCache(1000)
    qe = QueryEncoder(encoder, cache=cache, max_wait_ms=0)
    first = qe.text(titles[:5])
    batches = qe.stats()["text_batches"]["items"]
    again = qe.text([f"  {t.upper() if qe._lowercase else t} " for t in titles[:5]])  # normalised key
    assert np.array_equal(first, again)
    assert qe.stats()["text_batches"]["items"] == batches, "a cached query went through the model"
    assert cache.hits >= 5

    # another adapter = another model key: the shared cache must not answer for it
    other = MultimodalEncoder(encoder.towers, load_adapter("linear"))
    assert other.model_key != encoder.model_key
    qo = QueryEncoder(other, cache=cache, max_wait_ms=0)
    hits = cache.hits
    vo = qo.text(titles[:5])
    assert cache.hits == hits and qo.stats()["text_batches"]["items"] == 5
    assert vo.shape == first.shape and not np.allclose(vo, first, atol=1e-3)
    assert np.allclose(vo, other.embed(None, other.text_features(titles[:5])).text, atol=2e-3)
    # and the original model's entries are still there, still its own
    assert np.array_equal(qe.text(titles[:5]), first)
    qe.close()
    qo.close()


def test_reduced_precision_text_towers_are_close_and_cached_apart(mlp_encoder, titles):
    encoder = mlp_encoder  # tower precision: the MLP maps it smoothly; the MoE's top-k routing can flip
    cache: LRUCache[np.ndarray] = LRUCache(1000)
    fp = QueryEncoder(encoder, cache=cache, max_wait_ms=0)
    a = fp.text(titles[:16])
    # int8 dynamic quantisation is measurably lossy after the adapter (bench-results/fastpath.md);
    # bf16 is nearly exact
    for precision, min_cos, mean_cos in (("int8", 0.8, 0.9), ("bf16", 0.995, 0.999)):
        q = QueryEncoder(encoder, cache=cache, max_wait_ms=0, text_precision=precision)
        b = q.text(titles[:16])
        assert q.stats()["text_batches"]["items"] == 16, precision  # not served from the fp32 entries
        assert not np.array_equal(a, b)
        c = _cos(a, b)
        assert c.min() > min_cos and c.mean() > mean_cos, (precision, c)
        q.close()
    # the fp32 tower itself was not changed by quantising copies
    assert np.allclose(fp.text(titles[:16]), a)
    fresh = QueryEncoder(encoder, cache_size=0, max_wait_ms=0)
    assert np.allclose(fresh.text(titles[:4]), a[:4], atol=1e-5)
    fp.close()
    fresh.close()


# -- through the engine ----------------------------------------------------------------------------
def test_warm_up_builds_what_first_queries_would(settings_factory, encoder, engine, tmp_path):
    """The API warms an engine before traffic: afterwards the query fast path, the in-memory BM25
    postings and the slot vocabulary exist (a cold first search took 0.8 s on the full catalogue)."""
    from vitrine.search.engine import Engine

    eng = Engine(engine.settings.updated(snapshot_interval_s=0.0), encoder)
    try:
        assert not eng.reader.query_encoder_built  # (the BM25 postings may come with the snapshot)
        assert eng.warm_up() > 0
        assert eng.reader.query_encoder_built and eng.records.text_index(build=False).built
        assert eng.understanding is not None and eng.understanding._extractor is not None
    finally:
        eng.records.close()


def test_a_first_query_does_not_pay_the_fast_path_set_up_in_its_budget(settings_factory, encoder, catalog_dir,
                                                                      tmp_path, monkeypatch):
    """Building the query fast path (an ONNX export, or loading one and checking it) is set-up: a
    first photo query must not time out in the gate's budget and degrade for it."""
    from vitrine.encoders import queries
    from vitrine.search.engine import Engine
    from vitrine.search.writes import ProductInput
    from vitrine.search.models import Product

    eng = Engine(settings_factory(tmp_path / "d", gate_timeout_ms=400, intent=False), encoder)
    ids = sorted(p.stem for p in (catalog_dir / "images").glob("*.jpg"))[:3]
    eng.upsert([ProductInput(Product(id=i, title=f"product {i}"), image=(catalog_dir / "images" / f"{i}.jpg")
                             .read_bytes()) for i in ids])
    built = queries.QueryEncoder.__init__

    def slow_build(self, *a, **kw) -> None:
        time.sleep(1.0)  # longer than the gate's budget
        built(self, *a, **kw)

    monkeypatch.setattr(queries.QueryEncoder, "__init__", slow_build)
    eng.reader.reset_query_encoder()
    photo = (catalog_dir / "images" / f"{ids[1]}.jpg").read_bytes()
    res = eng.search(SearchRequest(k=1), image=photo)
    assert res.degraded == [] and res.results[0].id == ids[1]
    eng.close()


def test_engine_search_uses_the_fast_path_and_rebuilds_it_on_encoder_swap(engine, titles):
    qe = engine.query_encoder
    before = qe.cache.hits + qe.feature_cache.hits  # at the floor a text query needs only the text tower
    r1 = engine.search(SearchRequest(text=titles[3], k=5))
    r2 = engine.search(SearchRequest(text=titles[3], k=5))
    assert [h.id for h in r1.results] == [h.id for h in r2.results]
    assert qe.cache.hits + qe.feature_cache.hits > before
    with ThreadPoolExecutor(8) as ex:
        res = list(ex.map(lambda t: engine.search(SearchRequest(text=t, k=3)), titles[10:26]))
    assert all(r.results for r in res)
    # a swapped encoder gets its own query encoder (same shared cache, other model key)
    old = engine.encoder
    try:
        engine.encoder = MultimodalEncoder(old.towers, load_adapter("linear"))
        assert engine.query_encoder is not qe and engine.query_encoder.model_key != qe.model_key
    finally:
        engine.encoder = old
    assert engine.query_encoder.model_key == qe.model_key


def test_a_text_search_at_the_floor_runs_the_text_tower_once_and_not_the_adapter(engine, subset_rows):
    """An untuned catalogue ranks text by the text tower's own cosine: a new query text costs one
    tower forward and no adapter forward; a photo query still runs the adapter."""
    search = engine.settings.search
    before, search.calibration = search.calibration, "floor"  # the session's engine may have been tuned
    engine.reader.reload_calibration()
    qe = engine.query_encoder
    assert engine.reader.calibration.is_floor
    tower, embed = qe.text_features, engine.encoder.embed
    calls = {"tower": 0, "adapter": 0}

    def count(name, fn):
        def wrapped(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return wrapped

    texts = [f"{r['productDisplayName']} floor-check" for r in subset_rows[60:66]]  # never searched before
    qe.text_features, engine.encoder.embed = count("tower", tower), count("adapter", embed)
    try:
        got = [engine.search(SearchRequest(text=t, k=5)) for t in texts]
        assert calls == {"tower": len(texts), "adapter": 0}
        assert all(r.results and not r.degraded for r in got)
        # the ranking is the text tower's cosine: each title finds its own product first
        assert sum(r.results[0].title + " floor-check" == t for r, t in zip(got, texts)) >= len(texts) - 1
        photo = io.BytesIO()  # bytes no earlier test searched (the query cache keys photos by their bytes)
        Image.open(SOURCE / "images" / f"{subset_rows[60]['id']}.jpg").convert("RGB").save(photo, "JPEG", quality=83)
        engine.search(SearchRequest(k=3), image=photo.getvalue())
        assert calls["adapter"] == 1
    finally:
        del qe.text_features  # back to the class's method
        del engine.encoder.embed
        search.calibration = before
        engine.reader.reload_calibration()


# -- the onnxruntime query path (vitrine/onnxrt.py) -------------------------------------------------
onnx_needed = pytest.mark.skipif(not onnxrt.available(), reason="onnxruntime not installed (vitrine[fast])")


@onnx_needed
def test_onnx_query_path_matches_torch_for_texts_and_photos(mlp_encoder, titles, photos, cache_dir):
    encoder = mlp_encoder  # tower precision: the MLP maps it smoothly; the MoE's top-k routing can flip
    torch_qe = QueryEncoder(encoder, cache_size=0, max_wait_ms=0)
    ort_qe = QueryEncoder(encoder, cache_size=0, max_wait_ms=0, runtime="onnx", onnx_dir=cache_dir)
    try:
        assert (torch_qe.runtime, ort_qe.runtime) == ("torch", "onnx")
        texts = titles[:12] + ["", "x", "红色 高跟鞋 under 1500", "a " * 400]
        want = np.stack([torch_qe.text([t])[0] for t in texts])
        np.testing.assert_allclose(np.stack([ort_qe.text([t])[0] for t in texts]), want, atol=1e-5)
        np.testing.assert_allclose(ort_qe.text_features(texts), torch_qe.text_features(texts), atol=1e-4)  # padded
        good = photos[:6]
        np.testing.assert_allclose(ort_qe.image(good), torch_qe.image(good), atol=1e-5)
        assert list((cache_dir / "onnx").glob("*.onnx"))
        again = QueryEncoder(encoder, cache_size=0, max_wait_ms=0, runtime="onnx", onnx_dir=cache_dir)
        assert again.runtime == "onnx"  # the cached export is reused (and checked again)
        again.close()
    finally:
        torch_qe.close()
        ort_qe.close()


@onnx_needed
def test_int8_onnx_text_graph_is_close_cached_apart_and_the_auto_default(mlp_encoder, titles, cache_dir):
    """int8 through onnxruntime (first layer and attention products kept float32): what
    ``auto`` serves when onnxruntime runs the text tower; torch keeps fp32 under ``auto``."""
    encoder = mlp_encoder  # tower precision: the MLP maps it smoothly; the MoE's top-k routing can flip
    cache: LRUCache[np.ndarray] = LRUCache(1000)
    fp = QueryEncoder(encoder, cache=cache, max_wait_ms=0, runtime="onnx", onnx_dir=cache_dir)
    q8 = QueryEncoder(encoder, cache=cache, max_wait_ms=0, runtime="onnx", onnx_dir=cache_dir, text_precision="int8")
    auto = QueryEncoder(encoder, cache_size=0, max_wait_ms=0, runtime="onnx", onnx_dir=cache_dir, text_precision="auto")
    plain = QueryEncoder(encoder, cache_size=0, max_wait_ms=0, runtime="torch", text_precision="auto")
    try:
        assert (fp.text_precision, q8.text_precision, auto.text_precision, plain.text_precision) == \
            ("fp32", "int8", "int8", "fp32")
        assert q8._onnx_text is not None and q8._onnx_text.path.name.endswith(".int8.onnx")
        texts = titles[:24] + ["x", "红色 高跟鞋 under 1500"]
        a, b = fp.text(texts), q8.text(texts)
        assert q8.stats()["text_batches"]["items"] == len(texts)  # not served from the fp32 entries
        c = _cos(a, b)
        assert not np.array_equal(a, b) and c.min() > 0.97 and c.mean() > 0.99, c
        np.testing.assert_allclose(auto.text(texts), b, atol=1e-5)  # the same cached int8 graph
        # a query's vector does not depend on what it was batched with (dynamic int8 would, per batch)
        alone = np.stack([q8.text_features([t])[0] for t in texts[:6]])
        np.testing.assert_allclose(q8.text_features(texts[:6]), alone, atol=1e-6)
    finally:
        for q in (fp, q8, auto, plain):
            q.close()


@onnx_needed
def test_onnx_runtime_that_cannot_be_had_raises_or_falls_back(encoder, cache_dir):
    with pytest.raises(ModelError, match="not possible"):
        QueryEncoder(encoder, cache_size=0, text_precision="bf16", runtime="onnx", onnx_dir=cache_dir)
    qe = QueryEncoder(encoder, cache_size=0, text_precision="bf16", runtime="auto", onnx_dir=cache_dir)
    assert qe.runtime == "torch"
    qe.close()
    with pytest.raises(InvalidInput):
        QueryEncoder(encoder, cache_size=0, runtime="tensorrt")


class _ShapeBranch(torch.nn.Module):
    """Traced on a batch of one, its Python branch is frozen into the graph: wrong for larger ones."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[0] > 1 else x + 0


@onnx_needed
def test_an_export_that_disagrees_with_torch_is_refused_and_not_kept(tmp_path):
    x1, x3 = torch.ones(1, 4), torch.ones(3, 4)
    with pytest.raises(ModelError, match="disagrees"):
        OnnxModule.export(_ShapeBranch(), (x1,), key="branch", cache_dir=tmp_path, input_names=["x"],
                          dynamic_axes={"x": {0: "b"}, "out": {0: "b"}}, probes=[(x1,), (x3,)])
    assert not list((tmp_path / "onnx").glob("*.onnx"))
    ok = OnnxModule.export(_ShapeBranch(), (x1,), key="branch", cache_dir=tmp_path, input_names=["x"],
                           dynamic_axes={"x": {0: "b"}, "out": {0: "b"}}, probes=[(x1,)])
    np.testing.assert_allclose(ok(np.full((1, 4), 3.0, dtype=np.float32)), np.full((1, 4), 3.0))


@onnx_needed
def test_intent_classifier_onnx_runtime_gives_torch_probabilities(cache_dir):
    from vitrine.intent.classifier import IntentClassifier

    a = IntentClassifier.load(cache_dir=cache_dir / "intent", runtime="torch")
    b = IntentClassifier.load(cache_dir=cache_dir / "intent", runtime="onnx")
    assert b.runtime == "onnx"
    queries = ["nike vs puma running shoes", "what goes with a navy blazer", "how do I return these sandals",
               "这个耳机和AirPods Pro 2比，降噪强吗？", "", "😀😀😀", "women red heels under 1500 " * 40]
    for x, y in zip(a.predict_batch(queries), b.predict_batch(queries)):
        assert x.label == y.label
        assert max(abs(x.scores[k] - y.scores[k]) for k in x.scores) < 1e-4
    for q in queries:
        assert b.predict(q).scores == pytest.approx(a.predict(q).scores, abs=1e-4)
