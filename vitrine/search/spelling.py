"""Reading a misspelt or run-together query word as the catalogue's word, before every signal.

BM25 already scores a query word no product holds as its closest catalogue term (typo tolerance,
vitrine/index/bm25.py). The text tower, the graph and the slots read the text as typed, and the
tower reads an unknown word as word pieces that mean little ("foutains" -> f ##out ##ains). So the
read path reads such a word as the catalogue's word first, and every signal searches that:

- a word stays as typed when the catalogue holds it (its BM25 term), when it is shorter than the
  edits allow (vitrine/index/fuzzy.py: 4 letters), or when the text tower knows it: its tokenizer
  holds it as one token, or as a word and an inflection ("tees": tee ##s). "sneakers" on a
  catalogue that says "sports shoes" is a synonym to the tower, not a typo;
- else it is read as a catalogue term within the edits its length allows (as BM25 corrects it)
  that keeps the typed word's first letter (shoppers rarely mistype it: "hoodies" is not
  "goodies"; the first two swapped, "ewdges", count as kept), written as a word the catalogue's
  tokenizer reads as that term: the term plus the typed ending ("fountain" + "s"), the term, or
  the term as the stemmer cut it ("convers" + "e"). The closest as written first; among equally
  close ones, the one the most products hold together with the query's other words ("pums
  benecio": puma, not pumps), then the closest term, then the one the most products hold;
- else as two words it runs together ("roomtables" -> "room tables"), each of 3 letters or more,
  known to the tower and held by the catalogue: the split whose two words the most products hold
  together ("barstool": bar stool, not bars tool), as Typesense splits tokens.

The response's ``query.corrected`` is the text searched, ``query.corrections`` each word and what
it was read as. ``search.query_spelling`` turns it off.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from vitrine.index import fuzzy
from vitrine.index.bm25 import MemoryBM25, word_terms
from vitrine.search.read_context import ReadContext
from vitrine.search.reading import Correction, Reading

LATIN_WORD = re.compile(r"(?<![^\W_])[A-Za-z]+(?![^\W_])")  # a word of letters alone: never part of "xr500"
MIN_PART = 3  # letters in each word of a split


def correct(text: str, index: MemoryBM25, knows_word: Callable[[str], bool]) -> Correction | None:
    """``text`` with its misspelt and run-together words read as the catalogue's (None: none)."""
    found = list(LATIN_WORD.finditer(text))
    terms = [word_terms(m.group(0).lower()) for m in found]
    # the query's words the catalogue holds: the context that tells equally close readings apart
    context = [t[0] for t in terms if len(t) == 1 and index.frequency(t[0])]
    words: list[tuple[str, str]] = []
    out, at = [], 0
    for m, wt in zip(found, terms):
        typed = m.group(0)
        read = _word(typed.lower(), wt, index, knows_word, context)
        if read is not None:
            read = _cased_as(typed, read)
            words.append((typed, read))
            out += [text[at:m.start()], read]
            at = m.end()
    return Correction(text, "".join(out) + text[at:], tuple(words)) if words else None


def _word(w: str, terms: tuple[str, ...], index: MemoryBM25, knows_word: Callable[[str], bool],
          context: list[str]) -> str | None:
    if len(w) < fuzzy.MIN_ONE_EDIT or len(terms) != 1 or index.frequency(terms[0]) or knows_word(w):
        return None
    term = terms[0]
    ending = w[len(term):] if w.startswith(term) else ""
    options = []  # (edits as typed, edits of the terms, term, written)
    near = dict(index.near(w, w))  # the typed word's neighbours ("garce": grace), and its term's
    for fixed, edits in index.near(term, w):
        near[fixed] = min(edits, near.get(fixed, edits))
    for fixed, edits in near.items():
        written = _written(fixed, ending, w, knows_word) if _same_start(fixed, w) else None
        if written is not None:
            options.append((written[0], edits, fixed, written[1]))
    if not options:
        return _split(w, index, knows_word)
    closest = min(o[0] for o in options)
    tied = [o for o in options if o[0] == closest]

    def key(o: tuple[int, int, str, str]) -> tuple[int, int, int, bool, str]:
        together = sum(index.frequency(o[2], c) for c in context) if len(tied) > 1 else 0
        return (-together, o[1], -index.frequency(o[2]), not knows_word(o[3]), o[3])

    return min(tied, key=key)[3]


def _cased_as(typed: str, read: str) -> str:
    """``read`` in the typed word's case ("Lndon" -> "London", "ADIDAp" -> "ADIDAS"): a brand
    or a name the slots know by its capitals stays one."""
    if len(typed) > 1 and sum(c.isupper() for c in typed) > len(typed) // 2:
        return read.upper()
    return read[:1].upper() + read[1:] if typed[:1].isupper() else read


def _same_start(term: str, typed: str) -> bool:
    """Whether a reading keeps the typed word's first letter, or swaps its first two ("ewdges")."""
    return term[:1] == typed[:1] or (len(typed) > 1 and term[:2] == typed[1::-1])


def _written(term: str, ending: str, typed: str, knows_word: Callable[[str], bool]) -> tuple[int, str] | None:
    """A word the catalogue's tokenizer reads as ``term`` (the term with the typed word's ending,
    "fountain" + "s"; the term itself; the term as the stemmer cut it, "convers" + "e", "adida" +
    "s", "poli" -> "poly"), the closest to ``typed`` first, then the one of its length ("vasn" ->
    "vans", not "van"), then one the tower knows, then in that order; with its edits from
    ``typed``. None: none."""
    guesses = (term + ending, term, term + "e", term + "s", term[:-1] + "y" if term.endswith("i") else term)
    forms = [(fuzzy.distance(typed, w), abs(len(w) - len(typed)), not knows_word(w), i, w)
             for i, w in enumerate(dict.fromkeys(guesses)) if word_terms(w) == (term,)]
    return (min(forms)[0], min(forms)[4]) if forms else None


def _split(w: str, index: MemoryBM25, knows_word: Callable[[str], bool]) -> str | None:
    """Two words the tower knows and the catalogue holds that ``w`` runs together: the split whose
    two terms the most products hold together ("barstool": bar + stool, not bars + tool)."""
    best: tuple[int, str] | None = None
    for i in range(MIN_PART, len(w) - MIN_PART + 1):
        left, right = w[:i], w[i:]
        lt, rt = word_terms(left), word_terms(right)
        if len(lt) != 1 or len(rt) != 1 or not knows_word(left) or not knows_word(right):
            continue
        together = index.frequency(lt[0], rt[0])
        if together and (best is None or together > best[0]):
            best = (together, f"{left} {right}")
    return best[1] if best else None


def read(reader: ReadContext, reading: Reading) -> Reading:
    """``reading`` with its words read as the catalogue's where they are misspelt or run together:
    an English query, or a Chinese one read into an English catalogue's words (its Latin words are
    kept as typed: "nkie 跑步鞋" -> "nkie sports shoes"), on a catalogue whose in-memory postings are
    built, unless turned off. Not an English query read into a Chinese catalogue's words."""
    english = reading.translation is None if reading.language == "en" else reading.translation is not None
    if not reader.settings.search.query_spelling or not reading.text or not english:
        return reading
    index = reader.state.records.text_index(build=False)
    if not isinstance(index, MemoryBM25) or not index.built:
        return reading
    got = correct(reading.text, index, reader.encoder.reads_as_word)
    return reading if got is None else dataclasses.replace(reading, text=got.text, spelling=got)
