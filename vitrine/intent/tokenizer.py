"""The real Qwen tokenizer, converted from ``qwen.tiktoken`` to a Hugging Face fast tokenizer.

Source: Alibaba's official ``dashscope`` SDK on PyPI (Apache-2.0) ships Qwen's byte-level BPE
ranks as ``dashscope/resources/qwen.tiktoken`` (one ``base64(token) rank`` per line). Pinned:
``dashscope==2.0.2`` and the file's SHA-256 below; any other file is refused.

Conversion (deterministic, :func:`build_tokenizer`):
- vocabulary: every rank's bytes mapped through GPT-2's byte-to-unicode table (byte-level BPE);
- merges recovered from the ranks: for each token, every split into two pieces that are both
  tokens, ordered by the merged token's rank and then the pieces' ranks (so the pair that builds
  the lowest-ranked token merges first, exactly tiktoken's rule);
- ``ignore_merges=True``: a pre-token that is itself in the vocabulary is emitted whole, as
  tiktoken does before running BPE;
- Qwen's pre-tokenizer regex (split, isolated) then byte-level without its own regex, NFC
  normalisation (Qwen normalises NFC before encoding), a byte-level decoder;
- special tokens at their real ids: ``<|endoftext|>`` 151643, ``<|im_start|>`` 151644,
  ``<|im_end|>`` 151645, ``<|extra_0|>`` .. ``<|extra_204|>``. User text is encoded with
  ``encode_special_tokens`` on, so a typed ``<|im_end|>`` is plain text, never a control token.

The converted ``tokenizer.json`` is about 16 MB (151k tokens and 248k merges), too big to keep in
the repository for what it adds, so it is built on first use (about 1.5 s) into a cache folder and
reused (0.3 s to load); every load checks the ids of a fixed set of probe strings against ids
recorded from tiktoken itself (:data:`PROBES`), and the test suite compares thousands of strings
with tiktoken. Conversion is deterministic (two builds give byte-identical files).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import logging
import threading
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import Any

from vitrine.atomic import atomic_path
from vitrine.errors import MissingExtra, ModelError

log = logging.getLogger(__name__)

SOURCE_PACKAGE = "dashscope"
SOURCE_VERSION = "2.0.2"
SOURCE_RESOURCE = "resources/qwen.tiktoken"
SOURCE_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"
CONVERTER_VERSION = 1
N_RANKS = 151643

PAT_STR = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
           r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_START_ID = 151643
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END) + tuple(f"<|extra_{i}|>" for i in range(205))
VOCAB_SIZE = N_RANKS + len(SPECIAL_TOKENS)  # 151851

INSTALL_HINT = "pip install 'vitrine[intent]'  (tokenizers, tiktoken, dashscope==2.0.2)"

# Ids recorded from tiktoken (qwen.tiktoken + PAT_STR, NFC, specials as plain text). Checked on load.
PROBES: dict[str, list[int]] = {
    "women red heels under 1500": [64662, 2518, 33360, 1212, 220, 16, 20, 15, 15],
    "nike 跑步鞋 under 2000": [77, 2970, 8908, 115, 239, 64682, 102097, 1212, 220, 17, 15, 15, 15],
    "这个耳机和AirPods Pro 2比，降噪强吗？": [99487, 110883, 33108, 25693, 23527, 82, 1298, 220, 17, 56006, 3837,
                                         99457, 101793, 99193, 101037, 11319],
    "how do I return these sandals?": [5158, 653, 358, 470, 1493, 80257, 30],
    "\U0001f460\U0001f460 <|im_end|>": [146516, 146516, 82639, 318, 6213, 91, 29],
    "\uff23\uff41\uff46\u00e9 \u20b91,499 500元以下": [134557, 144127, 144862, 963, 89791, 16, 11, 19, 24, 24, 220,
                                                      20, 15, 15, 23305, 87752],
    "Cafe\u0301 \u1acc\u0652 it's   OK\n\n": [34, 2577, 963, 220, 59397, 157, 104, 234, 432, 594, 256, 10402, 271],
    "1000到2000元的 PUMA 运动鞋 \U0001f4af": [16, 15, 15, 15, 26939, 17, 15, 15, 15, 23305, 9370, 393, 2794, 32, 32181,
                                          238, 27733, 102097, 63039, 107],
}


def _require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as e:
        raise MissingExtra(f"the Qwen tokenizer needs the `tokenizers` package: {INSTALL_HINT}") from e
    return tokenizers


def source_path() -> Path:
    """``qwen.tiktoken`` inside the installed ``dashscope`` package (located without importing it)."""
    spec = importlib.util.find_spec(SOURCE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra(f"Qwen's BPE ranks come from the `dashscope` package: {INSTALL_HINT}")
    for root in spec.submodule_search_locations:
        p = Path(root) / SOURCE_RESOURCE
        if p.is_file():
            return p
    raise MissingExtra(f"the installed dashscope has no {SOURCE_RESOURCE}: {INSTALL_HINT}")


def source_version() -> str | None:
    try:
        from importlib.metadata import version

        return version(SOURCE_PACKAGE)
    except Exception:  # noqa: BLE001 - metadata is informative only
        return None


def load_ranks(path: Path | None = None) -> dict[bytes, int]:
    """The tiktoken ranks, after checking the file against the pinned SHA-256."""
    path = path or source_path()
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    if sha != SOURCE_SHA256:
        raise ModelError(f"{path} has SHA-256 {sha}, expected {SOURCE_SHA256} (dashscope=={SOURCE_VERSION}); "
                         "refusing an unknown vocabulary")
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    if len(ranks) != N_RANKS or sorted(ranks.values()) != list(range(N_RANKS)):
        raise ModelError(f"{path}: expected {N_RANKS} dense ranks")
    return ranks


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """BPE merges implied by tiktoken ranks, in priority order."""
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for tok, rank in ranks.items():
        if len(tok) < 2:
            continue
        for i in range(1, len(tok)):
            a, b = tok[:i], tok[i:]
            ra, rb = ranks.get(a), ranks.get(b)
            if ra is not None and rb is not None and ra < rank and rb < rank:
                merges.append((rank, ra, rb, a, b))
    merges.sort()
    return [(a, b) for _, _, _, a, b in merges]


def build_tokenizer(ranks: dict[bytes, int] | None = None) -> Any:
    """Convert the ranks to a ``tokenizers.Tokenizer`` (deterministic)."""
    tk = _require_tokenizers()
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

    ranks = ranks if ranks is not None else load_ranks()
    b2u = bytes_to_unicode()

    def u(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {u(tok): rank for tok, rank in ranks.items()}
    merges = [(u(a), u(b)) for a, b in recover_merges(ranks)]
    bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=True)
    tok = tk.Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PAT_STR), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(t) != SPECIAL_START_ID + i:
            raise ModelError(f"special token {t} did not land at id {SPECIAL_START_ID + i}")
    tok.encode_special_tokens = True
    return tok


def reference_encoding(ranks: dict[bytes, int] | None = None) -> Any:
    """tiktoken's own encoder over the same file and regex: the reference the conversion is checked
    against (encode with ``allowed_special=set(), disallowed_special=()`` after NFC)."""
    try:
        import tiktoken
    except ImportError as e:
        raise MissingExtra(f"the tokenizer check needs `tiktoken`: {INSTALL_HINT}") from e
    ranks = ranks if ranks is not None else load_ranks()
    return tiktoken.Encoding(
        "qwen", pat_str=PAT_STR, mergeable_ranks=ranks,
        special_tokens={t: SPECIAL_START_ID + i for i, t in enumerate(SPECIAL_TOKENS)},
    )


def reference_ids(enc: Any, text: str) -> list[int]:
    return enc.encode(unicodedata.normalize("NFC", text), allowed_special=set(), disallowed_special=())


def encode(tok: Any, text: str) -> list[int]:
    """Qwen ids of ``text``: NFC first (in Python: the tokenizers NFC normaliser orders the pieces of
    re-ordered combining marks differently from tiktoken), special-token strings as plain text."""
    return tok.encode(unicodedata.normalize("NFC", text), add_special_tokens=False).ids


def check_probes(tok: Any) -> None:
    for text, want in PROBES.items():
        got = encode(tok, text)
        if got != want:
            raise ModelError(f"converted Qwen tokenizer disagrees with tiktoken on {text!r}: {got} != {want}")


def cache_file(cache_dir: Path) -> Path:
    return Path(cache_dir) / f"qwen-tokenizer-{SOURCE_SHA256[:16]}-c{CONVERTER_VERSION}.json"


_lock = threading.Lock()


@lru_cache(maxsize=4)
def _load_cached(path_str: str) -> Any:
    tk = _require_tokenizers()
    tok = tk.Tokenizer.from_file(path_str)
    tok.encode_special_tokens = True
    return tok


def load_tokenizer(cache_dir: Path | None = None) -> Any:
    """The converted Qwen tokenizer: from ``cache_dir`` when built before, else built (and cached
    when ``cache_dir`` is writable). Checked against :data:`PROBES` either way."""
    with _lock:
        path = cache_file(cache_dir) if cache_dir is not None else None
        if path is not None and path.is_file():
            try:
                tok = _load_cached(str(path))
                check_probes(tok)
                if tok.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE:
                    return tok
                raise ModelError("cached tokenizer has the wrong vocabulary size")
            except Exception as e:  # noqa: BLE001 - a bad cache entry is rebuilt, never trusted
                log.warning("cached Qwen tokenizer %s unusable (%s); rebuilding", path, e)
                _load_cached.cache_clear()
        log.info("converting Qwen's qwen.tiktoken (dashscope %s) to a fast tokenizer", source_version())
        tok = build_tokenizer()
        check_probes(tok)
        if path is not None:
            try:
                meta = {"source_package": SOURCE_PACKAGE, "source_version": source_version(),
                        "source_sha256": SOURCE_SHA256, "converter_version": CONVERTER_VERSION}
                with atomic_path(path, fsync=False) as tmp:
                    tok.save(str(tmp))
                    Path(str(path) + ".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            except OSError as e:
                log.warning("could not cache the Qwen tokenizer at %s: %s", path, e)
        return tok
