"""Ingest at the towers' speed without changing what it writes: length-sorted text batches give
the same vectors, the reader pipeline and ``--jobs`` give the same index, and an aligner change
re-runs only the aligner over cached tower outputs (speed itself: ``vitrine bench ingest-profile``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.ingest.catalog import ingest_file, ingest_records, read_catalog


def _text_catalogue(catalog_dir: Path, out: Path, n: int = 30, *, longer: int = 0) -> Path:
    """The subset's first ``n`` records without photos (every ``longer``-th title lengthened)."""
    lines = (catalog_dir / "catalog.jsonl").read_text().splitlines()[:n]
    with open(out, "w") as f:
        for k, line in enumerate(lines):
            rec = json.loads(line)
            rec.pop("image", None)
            if longer and k % longer == 0:
                rec["title"] = rec["title"] + " with a much longer description of fabric, fit and care" * 2
            f.write(json.dumps(rec) + "\n")
    return out


class CountingTowers:
    """Counts the texts and photos that reach the towers (wraps the shared towers' methods)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, towers) -> None:
        self.texts = 0
        self.photos = 0
        text_features, image_features = towers.text_features, towers.image_features
        of_tokens = towers.text_features_of_tokens

        def counted_text(texts):
            self.texts += len(texts)
            return text_features(texts)

        def counted_tokens(ids):
            self.texts += len(ids)
            return of_tokens(ids)

        def counted_image(pixels, **kw):
            self.photos += len(pixels)
            return image_features(pixels, **kw)

        monkeypatch.setattr(towers, "text_features", counted_text)
        monkeypatch.setattr(towers, "text_features_of_tokens", counted_tokens)
        monkeypatch.setattr(towers, "image_features", counted_image)


def test_length_sorted_batches_give_the_same_vectors(encoder, catalog_dir):
    """Sorted by token length, in forwards of batch_size, scattered back: each text's vector equals
    its own batch-of-one forward (no padding at all) and the catalogue-order batch's."""
    texts = [json.loads(x)["title"] for x in (catalog_dir / "catalog.jsonl").read_text().splitlines()[:24]]
    texts = [t + " in a long, long description" * (k % 5) for k, t in enumerate(texts)]  # mixed lengths
    enc = MultimodalEncoder(encoder.towers, None, batch_size=8, cache=None, batch_precision="fp32")
    lengths = encoder.towers.token_lengths(texts)
    assert len(set(lengths)) > 5
    batches = list(enc.length_batches(texts, list(range(len(texts)))))
    assert sorted(i for b in batches for i in b) == list(range(len(texts)))
    assert all(len(b) <= 8 for b in batches)
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat)  # each forward pads to a near neighbour's length
    got = enc.text_features(texts)
    np.testing.assert_array_equal(  # tokenized once, padded by the towers: what the tokenizer pads
        encoder.towers.text_features_of_tokens(encoder.towers.tokenize(texts)).numpy(),
        encoder.towers.text_features(texts).numpy())
    one_by_one = np.concatenate([encoder.towers.text_features([t]).numpy() for t in texts])
    in_order = encoder.towers.text_features(texts).numpy()  # one forward, padded to the longest
    np.testing.assert_allclose(got, one_by_one, atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(got, in_order, atol=2e-4, rtol=1e-4)


def test_pipelined_ingest_and_jobs_build_the_same_index(settings_factory, encoder, catalog_dir, tmp_path):
    """The reader thread ahead of the encoders, with torch threads = --jobs, writes the same
    records and vectors as reading in turn on one thread; a bad record is still reported by its line."""
    import torch

    from vitrine.cli.base import make_settings
    from vitrine.encoders.feature_cache import FeatureCache
    from vitrine.search.engine import Engine

    assert make_settings(data_dir=tmp_path, torch_threads=2).encoders.torch_threads == 2  # what --jobs sets
    cat = _text_catalogue(catalog_dir, tmp_path / "c.jsonl", longer=7)
    with open(cat, "a") as f:
        f.write("{not json\n")
    before = torch.get_num_threads()
    out = {}
    try:
        for name, jobs, prefetch in (("serial-1", 1, 0), ("pipelined-2", 2, 2)):
            torch.set_num_threads(jobs)
            # a cold feature cache of its own: the towers really run under each thread count
            enc = MultimodalEncoder(encoder.towers, encoder.adapter, cache=FeatureCache(tmp_path / name / "f.sqlite"))
            eng = Engine(settings_factory(tmp_path / name / "data"), enc)
            rep = ingest_records(eng, read_catalog(cat), cat.parent, batch_size=10, progress=False,
                                 prefetch=prefetch)
            assert rep.upserted == 30 and [e.line for e in rep.failed] == [31]
            out[name] = {r.id: r for r in eng.records.iter_rows(with_vectors=True)}
            eng.close()
    finally:
        torch.set_num_threads(before)
    a, b = out["serial-1"], out["pipelined-2"]
    assert sorted(a) == sorted(b)
    for pid, ra in a.items():
        rb = b[pid]
        assert ra.doc == rb.doc and ra.content_hash == rb.content_hash and ra.model_key == rb.model_key
        for f in ("fused", "text", "native"):
            # the thread count changes the order of the towers' sums: float noise whose size depends on
            # the CPU's kernels (up to 3.4e-4 on the 12-07 machine), never a different vector
            np.testing.assert_allclose(ra.vectors[f], rb.vectors[f], atol=1e-3)
            assert float(np.dot(ra.vectors[f], rb.vectors[f])) > 0.9999 * float(
                np.linalg.norm(ra.vectors[f]) * np.linalg.norm(rb.vectors[f]))


def test_reader_error_is_raised_and_stops_the_pipeline(fresh_engine, tmp_path):
    def records():
        yield from read_catalog(_write(tmp_path / "a.jsonl", [{"id": "a1", "title": "Red shirt"}]))
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        ingest_records(fresh_engine, records(), tmp_path, batch_size=1, progress=False)


def _write(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_aligner_change_reuses_cached_tower_outputs(settings_factory, encoder, mlp_encoder, catalog_dir,
                                                    tmp_path, monkeypatch):
    """Re-ingesting under another aligner (same towers) re-embeds every product without one tower
    forward: photos and texts come from the feature cache; only the aligner runs."""
    from vitrine.search.engine import Engine

    settings = settings_factory(tmp_path / "d")
    lines = (catalog_dir / "catalog.jsonl").read_text().splitlines()[:30]
    sub = catalog_dir / "catalog-aligner-test.jsonl"  # photos are read relative to the file
    sub.write_text("\n".join(lines) + "\n")
    try:
        eng = Engine(settings, encoder)
        assert ingest_file(eng, sub, progress=False).upserted == 30
        eng.close()
        counts = CountingTowers(monkeypatch, encoder.towers)  # mlp_encoder shares these towers
        eng = Engine(settings, mlp_encoder)  # opening under another aligner re-embeds every product
        assert {r.model_key for r in eng.records.iter_rows(with_vectors=False)} == {mlp_encoder.model_key}
        assert counts.texts == 0 and counts.photos == 0
        rep = ingest_file(eng, sub, progress=False)
        assert rep.unchanged == 30 and not rep.failed
        # a changed title is the one text the tower sees again
        recs = [json.loads(x) for x in lines]
        recs[3]["title"] += " limited edition"
        sub.write_text("".join(json.dumps(r) + "\n" for r in recs))
        rep = ingest_file(eng, sub, progress=False)
        assert rep.upserted == 1 and rep.unchanged == 29
        assert counts.texts == 1 and counts.photos == 0
        eng.close()
    finally:
        sub.unlink(missing_ok=True)
