"""The lexical prior of the intent decision: a query with no intent cue word is a search.

The classifier reads a short phrase of rare product words ("arrow nocks", "golf cart
enclosures") by whatever its unfamiliar tokens resemble, sometimes with high confidence. Every
non-search intent is carried by words around the product ("compare", "return", "my cart",
"forget it", "gift for"); a product phrase alone has none of them. So the deployed rule keeps a
non-search label only when the query holds a **cue word**: a word of some non-search intent's
training templates (English; a Chinese query is left to the classifier) that is not also a
product word (a word of the taxonomy's training names or of the generator's product parts: "for",
"with", "cordless" are product words). A word one edit from a cue word (two from 8 letters) counts
as that cue (a swap of two neighbours is one edit): shoppers type "retrun" and "recomend". A
word the catalogue holds is never such a typo (``known``: the serving catalogue's words, passed
down by the read path): "lever" in a hardware shop is not "leave", "surge" not "suggest".

The cue words come from the templates the classifier trains on (the ``train`` lists of
templates.json, with their validation share, and the compositional frames); the test templates
and the held-out taxonomy leaves are never read, so both still measure the rule.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable
from dataclasses import dataclass
from functools import lru_cache

from rapidfuzz import process
from rapidfuzz.distance import OSA

_PLACEHOLDER = re.compile(r"\{[A-Z]+\}")
_WORD = re.compile(r"[a-z][a-z']*")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
MIN_TYPO_LEN = 5  # shorter words must match a cue exactly
LONG_TYPO_LEN = 8  # from this length, two edits


def words(text: str) -> set[str]:
    """Lower-cased Latin words of ``text`` (template placeholders removed)."""
    return set(_WORD.findall(_PLACEHOLDER.sub(" ", text.lower())))


@dataclass(frozen=True)
class CueWords:
    """The cue words of the non-search intents and the product words they exclude."""

    cues: frozenset[str]
    product: frozenset[str]
    typo_edits: int = 1

    @classmethod
    def build(cls, templates: Iterable[str], product_phrases: Iterable[str], *, typo_edits: int = 1) -> "CueWords":
        cue: set[str] = set()
        for t in templates:
            cue |= words(t)
        prod: set[str] = set()
        for p in product_phrases:
            prod |= words(p)
        return cls(frozenset(cue - prod), frozenset(prod), typo_edits)

    def _near_cue(self, w: str, known: Container[str]) -> bool:
        if self.typo_edits <= 0 or len(w) < MIN_TYPO_LEN or w in self.product or is_known(w, known):
            return False
        edits = self.typo_edits + (len(w) >= LONG_TYPO_LEN)
        return process.extractOne(w, self.cues, scorer=OSA.distance, score_cutoff=edits) is not None

    def has_cue(self, text: str, known: Container[str] = frozenset()) -> bool:
        """True when ``text`` holds a cue word (or is not Latin-script text: no prior there).

        ``known``: the catalogue's words (lower case): a query word the catalogue holds is a
        product word, never read as a typo of a cue word ("broadway lever" is not "leave", "surge
        protector" not "suggest"); a cue word itself still counts."""
        if _CJK.search(text):
            return True
        ws = words(text)
        return bool(ws & self.cues) or any(self._near_cue(w, known) for w in ws - self.cues)


def is_known(word: str, known: Container[str]) -> bool:
    """Whether ``word`` (lower case) or its singular (-s, -es, -ies) is one of the ``known`` words."""
    if word in known:
        return True
    w = word.replace("'", "")
    forms = [w]
    if w.endswith("ies") and len(w) > 4:
        forms.append(w[:-3] + "y")
    if w.endswith("es") and len(w) > 4:
        forms.append(w[:-2])
    if w.endswith("s") and len(w) > 3:
        forms.append(w[:-1])
    return any(f in known for f in forms)


def cue_templates(splits: tuple[str, ...] = ("train", "val")) -> list[str]:
    """English templates of every non-search intent in ``splits`` (never "test"), with the
    compositional frames when "train" is among them."""
    from vitrine.intent.templates import LABELS, compositional_templates, template_sets

    if "test" in splits:
        raise ValueError("the test templates measure the rule; they never build it")
    out: list[str] = []
    for split in splits:
        sets = template_sets(split)
        out += [t for lab in LABELS if lab != "search" for t in sets[lab].get("en", [])]
    if "train" in splits:
        comp = compositional_templates()
        out += [t for lab in LABELS if lab != "search" for t in comp.get(lab, [])]
    return out


def product_phrases() -> list[str]:
    """Product words: the taxonomy's training names (never its held-out leaves) and the
    generator's sizes, attributes, connectors, determiners and other domains' brands."""
    from vitrine.intent import taxonomy as tx
    from vitrine.intent.templates import DETERMINERS

    return [*tx.taxonomy_names().train, *tx.SIZES, *tx.ATTRIBUTES, *tx.CONNECT, *DETERMINERS, *tx.OTHER_BRANDS]


@lru_cache(maxsize=4)
def default_cues(splits: tuple[str, ...] = ("train", "val"), typo_edits: int = 1) -> CueWords:
    """The shipped rule's cue words (built once per process, ~0.1 s)."""
    return CueWords.build(cue_templates(splits), product_phrases(), typo_edits=typo_edits)
