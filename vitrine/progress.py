"""Progress bars (tqdm) that cost nothing when they are off.

``tqdm(..., disable=True)`` still takes tqdm's global write lock on construction, and that lock
is a process-shared semaphore: a process SIGKILLed while holding it (an ingest worker killed
mid-encode) leaves every process forked from the same parent blocked on it forever. Library
code runs with progress off in services and workers, so when a bar is off we build no tqdm
at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


class NoBar(Generic[T]):
    """A bar that is off: iterates what it was given; every bar method does nothing."""

    def __init__(self, iterable: Iterable[T] | None = None) -> None:
        self._iterable = iterable

    def __iter__(self) -> Iterator[T]:
        return iter(self._iterable if self._iterable is not None else ())

    def __enter__(self) -> NoBar[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getattr__(self, name: str) -> Any:  # update, close, set_postfix, ...
        return lambda *args, **kwargs: None


def progress_bar(iterable: Iterable[T] | None = None, *, enabled: bool, **kwargs: Any) -> tqdm | NoBar[T]:
    """``tqdm(iterable, **kwargs)`` when ``enabled``, else a :class:`NoBar`."""
    if not enabled:
        return NoBar(iterable)
    return tqdm(iterable, **kwargs) if iterable is not None else tqdm(**kwargs)
