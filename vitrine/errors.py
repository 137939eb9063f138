"""Domain errors shared by every layer.

Library code raises these; only :mod:`vitrine.web` maps them to HTTP status codes and
only :mod:`vitrine.cli` maps them to exit codes.
"""

from __future__ import annotations

from typing import Any


class VitrineError(Exception):
    """Base class of every error Vitrine raises on purpose."""


class InvalidInput(VitrineError):
    """The caller sent something malformed (bad query, bad record, bad parameter)."""


class InvalidBody(InvalidInput):
    """A request that does not fit its schema: ``detail`` lists each error's ``loc`` (from
    ``"body"``, ``"query"`` ...) and ``msg``. The web layer's own validation answers with it, and so
    does the intake of events, which validates its raw body in a process of its own."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        self.detail = detail
        super().__init__("; ".join(f"{'.'.join(str(x) for x in d['loc'])}: {d['msg']}" for d in detail[:5])
                         or "invalid request")

    def __reduce__(self) -> tuple[type, tuple[list[dict[str, Any]]]]:  # crosses processes by pickle
        return (InvalidBody, (self.detail,))


class InvalidImage(InvalidInput):
    """Bytes that are not a decodable image, or an image over the configured limits."""


class TooLarge(InvalidInput):
    """Input over a configured size limit (bytes, pixels, characters)."""


class ImageTooLarge(InvalidImage, TooLarge):
    """An image over the configured byte or pixel limit (decompression bombs included)."""


class Unauthorized(VitrineError):
    """A write or admin action without a valid API key."""


class NotFound(VitrineError):
    """A product (or other named object) does not exist."""

    def __init__(self, what: str, key: str) -> None:
        super().__init__(f"{what} {key!r} not found")
        self.what = what
        self.key = key


class ModelError(VitrineError):
    """A model or adapter could not be built or loaded (missing weights, bad config, checksum)."""


class StorageError(VitrineError):
    """Persistent state is unreadable, inconsistent or failed its checksum."""


class MissingExtra(VitrineError):
    """An optional dependency is not installed; the message says what to install."""


class SwapRefused(VitrineError):
    """A hot swap whose candidate could not be built or failed a canary check; the live version
    keeps serving. ``report`` says which check failed and by how much."""

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report
