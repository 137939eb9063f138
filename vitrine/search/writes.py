"""The write path: upserts, deletes, re-embedding and snapshots of one index state.

upsert: validated products (+ photo bytes) -> the state's serving encoder (towers -> adapter) ->
        encoded rows -> one visible step of the state (one SQLite transaction of records +
        vectors, then every in-memory index; vitrine/search/state.py). Photos are stored first:
        a record never points at a missing file.

Writers are serialised by ``state.write_lock``; the visible step of each write is exclusive
(``state.lock.write()``), so a search sees all of a write or none of it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from vitrine.errors import InvalidInput
from vitrine.index.records import RecordRow
from vitrine.search import native
from vitrine.search.models import ItemError, Product, UpsertReport, decode_b64, product_text
from vitrine.search.state import IndexState
from vitrine.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class ProductInput:
    """A validated product and its photo bytes (resolved by the caller), or why there are none."""

    product: Product
    image: bytes | None = None
    image_error: str | None = None
    line: int | None = None


class WritePath:
    """Encodes products with ``state``'s serving encoder and commits them to ``state``."""

    def __init__(self, state: IndexState, settings: Settings) -> None:
        self.state = state
        self.settings = settings

    def upsert(self, items: Sequence[ProductInput], *, progress: bool = False) -> UpsertReport:
        """Encode and store products; unchanged and stale ones are skipped, bad ones reported."""
        t0 = time.time()
        st = self.state
        report = UpsertReport()
        # One product per id per call: the last occurrence wins, as it would in a stream.
        by_id: dict[str, ProductInput] = {}
        for it in items:
            by_id.pop(it.product.id, None)
            by_id[it.product.id] = it
        todo: list[tuple[ProductInput, bytes | None, str | None]] = []
        with st.write_lock:
            existing = st.records.get_many(list(by_id), include_deleted=True)
            for pid, it in by_id.items():
                img = it.image
                if img is None and it.product.image_b64:
                    try:
                        img = decode_b64(it.product.image_b64)
                    except InvalidInput as e:
                        report.failed.append(ItemError(id=pid, line=it.line, reason=str(e)))
                        continue
                if it.image_error:
                    report.failed.append(ItemError(id=pid, line=it.line, reason=it.image_error))
                    continue
                img_sha = hashlib.sha256(img).hexdigest() if img is not None else None
                h = it.product.content_hash(img_sha)
                old = existing.get(pid)
                if old is not None:
                    if it.product.version is not None and old.version is not None and it.product.version < old.version:
                        report.stale += 1
                        continue
                    if not old.deleted and old.content_hash == h and old.model_key == st.model_key \
                            and old.version == it.product.version:
                        report.unchanged += 1
                        continue
                todo.append((it, img, img_sha))
            if todo:
                rows = self.encode_rows(todo, report, progress=progress)
                if rows:
                    photos = {it.product.id: img for it, img, _ in todo if img is not None}
                    # photos first: a record never points at a missing file
                    st.images.put_many({r.image_key: photos[r.id] for r in rows if r.image_key})
                    seq = st.commit(rows)  # searches see all of this write or none of it
                    report.upserted += len(rows)
                    report.seq = seq
        report.seconds = time.time() - t0
        return report

    def encode_rows(self, todo: list[tuple[ProductInput, bytes | None, str | None]], report: UpsertReport, *,
                    progress: bool) -> list[RecordRow]:
        """Records with vectors of the products in ``todo`` (product, photo bytes, photo SHA-256);
        a photo that fails to decode fails its product (reported), the others go on."""
        encoder = self.state.encoder
        texts = [product_text(it.product) for it, _, _ in todo]
        with_img = [i for i, (_, img, _) in enumerate(todo) if img is not None]
        img_errors: dict[int, str] = {}
        img_feats = np.full((len(todo), encoder.towers.image_dim), np.nan, dtype=np.float32)
        if with_img:
            feats = encoder.shared_image_features([img for _, img, _ in todo if img is not None],  # with_img's
                                                  progress=progress, errors=img_errors)
            img_feats[with_img] = feats
        txt_feats = encoder.text_features(texts, progress=progress)
        bad = {with_img[j] for j in img_errors}
        keep = [i for i in range(len(todo)) if i not in bad]
        for j, reason in img_errors.items():
            it = todo[with_img[j]][0]
            report.failed.append(ItemError(id=it.product.id, line=it.line, reason=f"photo: {reason}"))
        if not keep:
            return []
        shared_txt = encoder.shared_text_features([texts[i] for i in keep], native=txt_feats[keep])
        emb = encoder.embed(img_feats[keep], shared_txt)
        native_vecs = native.unit_rows(txt_feats[keep])
        rows: list[RecordRow] = []
        for n, i in enumerate(keep):
            it, img, sha = todo[i]
            has_img = img is not None
            rows.append(RecordRow(
                id=it.product.id,
                doc=it.product.document(),
                content_hash=it.product.content_hash(sha),
                version=it.product.version,
                image_key=image_key(sha, img) if has_img else None,  # type: ignore[arg-type]  # sha is set with the photo
                model_key=self.state.model_key,
                vectors={
                    "fused": emb.fused[n],
                    "image": emb.image[n] if has_img and emb.image is not None else None,
                    "text": emb.text[n] if emb.text is not None else None,
                    "native": native_vecs[n],
                },
            ))
        return rows

    def delete(self, ids: Sequence[str], versions: Sequence[int | None] | None = None) -> int:
        """Delete products by id; unknown ids are ignored. Returns how many were deleted.

        With ``versions``, a delete older than the stored version is ignored (stale)."""
        return self.state.delete(ids, versions)

    def reembed(self, *, progress: bool = False, photo_loader: Callable[[str], bytes | None] | None = None) -> int:
        """Re-embed every product whose vectors came from another model (photos from the store)."""
        st = self.state
        stale = [r for r in st.records.iter_rows(with_vectors=False) if r.model_key != st.model_key]
        if not stale:
            return 0
        items = []
        for r in stale:
            doc = dict(r.doc)
            img = st.images.get(r.image_key) if r.image_key else None
            items.append(ProductInput(Product.model_validate(doc), image=img))
        with st.write_lock:
            todo = [(it, it.image, hashlib.sha256(it.image).hexdigest() if it.image else None) for it in items]
            report = UpsertReport()
            rows = self.encode_rows(todo, report, progress=progress)
            versions = {s.id: s.version for s in stale}
            for row in rows:  # (rows skip products whose photo failed: match by id, not position)
                row.version = versions.get(row.id)
            if not rows:
                return 0
            st.commit(rows)
        return len(rows)

    def save(self) -> bool:
        """Publish a snapshot version of the indexes (vitrine/search/state.py), naming the serving
        model's artifacts. Returns False if nothing changed since the last one."""
        intent = self.settings.intent
        return self.state.save(intent.intent_model if intent.intent else None)


def image_key(sha: str, data: bytes) -> str:
    """A stored photo's file name: its SHA-256 and the extension its bytes say."""
    ext = "png" if data[:8] == b"\x89PNG\r\n\x1a\n" else "webp" if data[8:12] == b"WEBP" else \
        "gif" if data[:4] == b"GIF8" else "jpg"
    return f"{sha}.{ext}"
