"""Hazard tracking at record time: a barrier goes in only when a command touches memory that an
earlier command since the last barrier wrote (read-after-write, write-after-write) or read
(write-after-read)."""

from __future__ import annotations


def _overlaps(spans: list[tuple[int, int, int]], key: int, start: int, end: int) -> bool:
    return any(k == key and s < end and start < e for k, s, e in spans)


class HazardTracker:
    def __init__(self):
        self.reads: list[tuple[int, int, int]] = []
        self.writes: list[tuple[int, int, int]] = []

    def reset(self) -> None:
        self.reads.clear()
        self.writes.clear()

    @staticmethod
    def span(rng) -> tuple[int, int, int]:
        return id(rng.buffer), rng.offset, rng.offset + rng.size

    def needs_barrier(self, reads, writes) -> bool:
        for r in reads:
            if _overlaps(self.writes, *self.span(r)):
                return True
        for w in writes:
            key, s, e = self.span(w)
            if _overlaps(self.writes, key, s, e) or _overlaps(self.reads, key, s, e):
                return True
        return False

    def record(self, reads, writes) -> None:
        self.reads.extend(self.span(r) for r in reads)
        self.writes.extend(self.span(w) for w in writes)
