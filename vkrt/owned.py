"""Ownership of Vulkan handles: one owner each, an idempotent close(), live counts."""

from __future__ import annotations

import abc
import collections
import logging
import threading

log = logging.getLogger("vkrt")

_live: collections.Counter[str] = collections.Counter()
_live_lock = threading.Lock()


def live_objects() -> dict[str, int]:
    """Number of open objects per class; every count returns to zero after close()."""
    with _live_lock:
        return {name: n for name, n in _live.items() if n}


class Owned(abc.ABC):
    """Base of every object that owns a Vulkan handle (or another Owned).

    close() releases exactly once, in any order of calls; `with` closes on exit.
    __del__ is only a quiet safety net for objects nobody closed.
    """

    def __init__(self, label: str):
        self.label = label
        self._closed = False
        with _live_lock:
            _live[type(self).__name__] += 1

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._release()
        finally:
            with _live_lock:
                _live[type(self).__name__] -= 1

    @abc.abstractmethod
    def _release(self) -> None:
        """Destroy the handles this object owns. Called once."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_closed", True):
            return
        try:
            self.close()
        except Exception:  # interpreter shutdown or an already-destroyed parent
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self.label!r} {state}>"
