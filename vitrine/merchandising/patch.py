"""Partial product updates (``PATCH /v1/products/{id}``, the Kafka ``patch`` event): change a
product's price, stock or attributes without encoding anything again.

A product's vectors depend only on its embedded text (:func:`~vitrine.search.models.product_text`:
title, brand, category leaf) and its photo. A patch that leaves both as they were keeps the
stored vectors and writes the new document in one visible step (records, text index, filters,
graph: vitrine/search/state.py ``commit``); one that changes them goes through the write path's
upsert, which encodes (the stored photo reused unless the patch sends one).

Fields: any catalogue record field but ``id`` (``title``, ``description``, ``brand``,
``category``, ``price``, ``currency``, ``image_b64``, ``version``), ``attributes`` (merged; a null
value removes that attribute), and any other top-level name, such as ``in_stock`` or
``quantity``, is an attribute (as in a catalogue record). A null removes the field.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from vitrine.errors import InvalidInput, NotFound
from vitrine.index.records import RecordRow
from vitrine.search.models import Product, product_text
from vitrine.search.writes import ProductInput, WritePath

log = logging.getLogger(__name__)

_FIELDS = {"title", "description", "brand", "category", "price", "currency", "image_b64", "version"}


class PatchReport(BaseModel):
    id: str
    patched: bool
    reencoded: bool = False
    unchanged: bool = False
    stale: bool = False
    seq: int = 0


def merged(doc: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """A stored document with ``fields`` applied (see the module docstring)."""
    out = {k: v for k, v in doc.items() if k != "attributes"}
    attrs = dict(doc.get("attributes") or {})
    for k, v in fields.items():
        if k == "id":
            continue
        if k == "attributes":
            if not isinstance(v, Mapping):
                raise InvalidInput("attributes: must be an object")
            for ak, av in v.items():
                if av is None:
                    attrs.pop(ak, None)
                else:
                    attrs[ak] = av
        elif k in _FIELDS:
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
        elif k == "image":
            raise InvalidInput("image: send the photo as image_b64")
        elif v is None:
            attrs.pop(k, None)
        else:
            attrs[k] = v
    out["attributes"] = attrs
    return out


def patch_product(writes: WritePath, pid: str, fields: Mapping[str, Any]) -> PatchReport:
    """Apply ``fields`` to product ``pid``; NotFound when it does not exist, InvalidInput naming
    the field when the result is not a valid product."""
    if not fields:
        raise InvalidInput("the patch names no field")
    if "id" in fields and fields["id"] != pid:
        raise InvalidInput(f"id: {fields['id']!r} does not match the path id {pid!r}")
    st = writes.state
    with st.write_lock:
        old = st.records.get(pid, with_vectors=True)
        if old is None:
            raise NotFound("product", pid)
        try:
            product = Product.model_validate({**merged(old.doc, fields), "id": pid})
            before = Product.model_validate({**old.doc, "id": pid})
        except ValidationError as e:
            err = e.errors()[0]
            raise InvalidInput(f"{'.'.join(str(x) for x in err['loc']) or 'product'}: {err['msg']}") from e
        if product.version is not None and old.version is not None and product.version < old.version:
            return PatchReport(id=pid, patched=False, stale=True)
        sha = old.image_key.split(".", 1)[0] if old.image_key else None
        vectors = old.vectors
        keep = (product.image_b64 is None and product_text(product) == product_text(before)
                and old.model_key == st.model_key and vectors.get("fused") is not None)
        if keep:
            h = product.content_hash(sha)
            if h == old.content_hash and product.version == old.version:
                return PatchReport(id=pid, patched=False, unchanged=True)
            row = RecordRow(id=pid, doc=product.document(), content_hash=h, version=product.version,
                            image_key=old.image_key, model_key=old.model_key, vectors=dict(vectors))
            seq = st.commit([row])  # searches see all of this write or none of it
            return PatchReport(id=pid, patched=True, seq=seq)
    # the embedded text or the photo changed: encode again (the stored photo, unless a new one came)
    image = None if product.image_b64 else (st.images.get(old.image_key) if old.image_key else None)
    report = writes.upsert([ProductInput(product, image=image)])
    if report.failed:
        raise InvalidInput(report.failed[0].reason)
    return PatchReport(id=pid, patched=report.upserted > 0, reencoded=report.upserted > 0,
                       unchanged=report.unchanged > 0, stale=report.stale > 0, seq=report.seq)
