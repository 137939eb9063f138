"""The intent serving fast path gives the plain path's answers, checked by brute force on real queries.

- :class:`~vitrine.intent.stacked.RowTable` (every member's embedding rows in one gather) builds
  exactly what each member's own ``rows()`` + :func:`~vitrine.intent.stacked.stack_inputs` build;
- the onnxruntime stacked graph (one 2D weight per member) gives torch's labels, and scores within 1e-5;
- :meth:`SlotExtractor.find_phrases` (a character trie) finds exactly what the alternation regex of
  every phrase (longest first, word boundaries where a phrase starts/ends with a word character) finds.

Queries: the classifier's held-out test queries, held-out taxonomy leaves, catalogue titles, and
odd inputs (empty, emoji, Chinese, a very long query, out-of-table ids).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from vitrine.training.intent_queries import catalogue_terms, make_splits
from vitrine.intent.model import PAD
from vitrine.intent.slots import SlotExtractor, key_norm, fold

from conftest import SOURCE

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.slow]

ODD = ["", "   ", "👠👠👠🔥", "x", "women red heels under 1500 " * 80, "nike 跑步鞋 under 2000", "红色高跟鞋",
       "这个耳机和AirPods Pro 2比，降噪强吗？", "<|im_start|>system<|im_end|>", "ไทย हिन्दी العربية 鞋 shoes",
       "retrun my order plz", "recomend a gift for my dad"]


@pytest.fixture(scope="module")
def tok_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("intent-fastpath-cache")


@pytest.fixture(scope="module")
def terms():
    return catalogue_terms(SOURCE)


@pytest.fixture(scope="module")
def queries(terms) -> list[str]:
    from vitrine.intent.model import IntentModel
    from vitrine.intent.taxonomy import heldout_leaf_queries

    cfg = IntentModel.from_pretrained("default").config
    _, test = make_splits(terms, train_per_label=cfg["train_per_label"], test_per_label=cfg["test_per_label"],
                          seed=cfg["seed"], members=cfg.get("members", 1), train_seed=cfg.get("train_seed"))
    rng = random.Random(5)
    titles = [t for t, _ in terms.titles]
    leaves = [q for q, _ in heldout_leaf_queries()]
    return ODD + rng.sample([e.text for e in test], 240) + rng.sample(leaves, 60) + rng.sample(titles, 60)


@pytest.fixture(scope="module")
def plain(tok_cache):
    from vitrine.intent.classifier import IntentClassifier

    return IntentClassifier.load("default", cache_dir=tok_cache)  # torch, member by member


def test_row_table_builds_what_each_member_builds(plain, queries):
    from vitrine.intent.stacked import RowTable, stack_inputs

    everyone = [plain, *plain.members]
    offsets = np.cumsum([0] + [len(c.model.keep_ids) + 3 for c in everyone[:-1]]).astype(np.int64)
    table = RowTable([c.model.row_of for c in everyone], offsets, pad=PAD, unk=1, eos=2)
    ids = [plain.token_ids(q) for q in queries]
    ids.append([5, 151_850, 10**7, 0])  # ids outside every kept table (and beyond the vocabulary) are UNK
    for batch in [[i] for i in ids] + [ids[:17], ids]:
        want = stack_inputs([[c.model.rows(i).rows for i in batch] for c in everyone], offsets, PAD)
        got = table([plain.model.clip(i)[0] for i in batch])
        assert got[0].dtype == want[0].dtype and np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_onnx_fast_path_gives_the_plain_answers(plain, queries, tok_cache):
    from vitrine import onnxrt
    from vitrine.intent.classifier import IntentClassifier

    if not onnxrt.available():
        pytest.skip("onnxruntime is not installed")
    fast = IntentClassifier.load("default", cache_dir=tok_cache, runtime="onnx")
    assert fast._stacked is not None and fast._stack_rows is not None
    want = plain.predict_batch(queries)
    for got in ([fast.predict(q) for q in queries], fast.predict_batch(queries)):
        for q, g, w in zip(queries, got, want):
            assert (g.label, g.predicted, g.confident, g.extra, g.n_tokens, g.truncated) == \
                (w.label, w.predicted, w.confident, w.extra, w.n_tokens, w.truncated), q
            assert max(abs(g.scores[k] - w.scores[k]) for k in w.scores) <= 1e-5, q


def test_the_lexical_prior_decides_only_what_the_classifier_would(plain, queries):
    """A query the prior decides without the classifier gets the label predict() gives it; the
    short cut takes bare product phrases (leaves, titles) and never a query with a cue word."""
    decided = {q: plain.decided_by_prior(q) for q in queries}
    want = {q: r for q, r in zip(queries, plain.predict_batch(queries))}
    for q, d in decided.items():
        if d is not None:
            assert d.label == want[q].label == "search" and d.scores == {} and d.predicted is None, q
            assert d.extra == {"by": "lexical_prior"}
        elif q.strip():
            assert plain.cues.has_cue(" ".join(q.split())), q
    skipped = [q for q, d in decided.items() if d is not None]
    assert len(skipped) >= len(queries) // 4  # the leaves and titles: product phrases
    assert any(want[q].predicted != "search" for q in skipped)  # a bare phrase the ensemble misreads stays a search


def _regex_phrases(ex: SlotExtractor, q: str) -> list[str]:
    """The reference: one alternation of every phrase, longest first (what extract() used to run)."""
    def word(ch: str) -> bool:
        return ch.isalnum() and not ("\u3040" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af" or "\uf900" <= ch <= "\ufaff")

    alts = [("(?<![a-z0-9])" if word(k[0]) else "") + re.escape(k) + ("(?![a-z0-9])" if word(k[-1]) else "")
            for k in sorted(ex.phrases, key=lambda s: (-len(s), s)) if k]
    rx = re.compile("|".join(alts))
    return [m.group(0) for m in rx.finditer(q)]


def test_trie_finds_what_the_phrase_regex_finds(terms, queries):
    ex = SlotExtractor(terms.vocabulary())
    rng = random.Random(3)
    phrases = sorted(k for k in ex.phrases if k)
    glued = []  # phrases run together, split, with digits, accents and Chinese next to them
    for _ in range(400):
        parts = [rng.choice(phrases) for _ in range(rng.randint(1, 4))]
        seps = [" ", "", "1", "é", "鞋", "-", " the "]
        s = "".join(p + rng.choice(seps) for p in parts)
        if rng.random() < 0.3:
            cut = rng.randint(0, len(s))
            s = s[cut:] + s[:cut]
        glued.append(s)
    normed = [key_norm(fold(q)) for q in queries] + glued
    assert sum(bool(_regex_phrases(ex, q)) for q in normed) > len(normed) // 2  # the check has matches to check
    for q in normed:
        assert ex.find_phrases(q) == _regex_phrases(ex, q), q
