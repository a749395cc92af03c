"""Finished OpenAI Responses API responses, kept in memory for `previous_response_id` and GET /
DELETE /v1/responses/{id} (and its input_items): each one's response object, its conversation (as
chat messages, with the images their media markers stand for) and its request's input items, the
oldest dropped past `max_count` responses or `max_age` seconds (serve's --responses-store-max and
--responses-store-ttl)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

MAX_COUNT = 1000
MAX_AGE = 3600.0   # seconds


@dataclass
class Stored:
    response: dict         # the response object, as it was answered
    messages: list[dict]   # the conversation through its output, as chat messages (without its instructions)
    at: float              # when it was stored (the store's clock)
    images: list = field(default_factory=list)   # the conversation's images, (field, bytes) each
    inputs: list[dict] = field(default_factory=list)   # the request's input items, with ids


class ResponseStore:
    """Thread-safe: requests are parsed in request threads, finished on the event loop."""

    def __init__(self, max_count: int = MAX_COUNT, max_age: float = MAX_AGE, clock=time.monotonic):
        self.max_count, self.max_age, self.clock = max_count, max_age, clock
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response: dict, messages: list[dict], images: list | None = None,
            inputs: list[dict] | None = None) -> None:
        with self._lock:
            self._items[response["id"]] = Stored(response, messages, self.clock(), list(images or ()),
                                                 list(inputs or ()))
            self._expire()

    def get(self, response_id: str) -> Stored | None:
        with self._lock:
            self._expire()
            return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            self._expire()
            return self._items.pop(response_id, None) is not None

    def _expire(self) -> None:
        old = self.clock() - self.max_age
        while self._items and (len(self._items) > self.max_count or next(iter(self._items.values())).at < old):
            self._items.popitem(last=False)
