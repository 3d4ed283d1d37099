"""BoundedCache: the one LRU dict of the entry layer (every per-process cache is bounded)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Hashable


class BoundedCache:
    """A thread-safe LRU dict. Every per-process cache of the entry layer is one of these."""

    def __init__(self, maxsize: int, refresh: bool = True):
        """``refresh=False``: a hit does not move its key to the end, so the oldest insertion is
        evicted first (a lookup that costs one dict read, for the hottest caches)."""
        self.maxsize = maxsize
        self.refresh = refresh
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        if not refresh:
            self.get = self._data.get  # type: ignore[method-assign]  # a hit is one C-level dict read

    def get(self, key: Hashable) -> Any:
        value = self._data.get(key)
        if value is not None and self.refresh:
            try:
                self._data.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile: still a valid answer
                pass
        return value

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)
