"""A process-wide cache of what was read from Delta tables, kept at each table's identity.

One entry per path: the table's identity ``(Delta table id, Delta version)`` the values are
known to be of, and one value per family (whatever the caller caches: the versions table's
rows, a statement's release summaries). Values of several families accumulate while the
identity is the same; a value cached at another identity replaces the path's entry (every
commit is a new version, a recreated table a new id), and a value is served only at exactly
its own identity. At most ``limit()`` paths: beyond that, the least recently used path is
dropped. The limit is read on every insertion, so a caller can pass a callable reading a
module attribute (and a test can change that attribute).

Callers take the identity themselves (``versions._identity``, from the table's log) and decide
when a value is of a known identity; this module only keeps them. Values are copied in and out
(``copy``), so a caller can change what it gets. Pure Python: imports no pyspark.
"""

from __future__ import annotations

import copy as _copy
import threading
from collections import OrderedDict
from typing import Callable, Generic, Iterable, Iterator, Mapping, Optional, TypeVar

__all__ = ["Identity", "IdentityCache"]

Identity = tuple[str, int]  # (Delta table id, Delta version)

V = TypeVar("V")


class IdentityCache(Generic[V]):
    """Per path: (identity, {family: value}), least recently used paths dropped beyond
    ``limit()``. Thread-safe. ``in``, ``iter`` and ``len`` look at the cached paths."""

    def __init__(self, limit: Callable[[], int], copy: Callable[[V], V] = _copy.deepcopy) -> None:
        self._limit = limit
        self._copy = copy
        self._entries: "OrderedDict[str, tuple[Identity, dict[str, V]]]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str, identity: Optional[Identity], families: Iterable[str]) -> Optional[dict[str, V]]:
        """Copies of the values of ``families`` (family -> value) when every one of them is
        cached for exactly ``identity`` (the path is then the most recently used), else None."""
        if identity is None:
            return None
        families = tuple(families)
        with self._lock:
            entry = self._entries.get(path)
            if entry is None or entry[0] != identity or any(f not in entry[1] for f in families):
                return None
            self._entries.move_to_end(path)
            return {f: self._copy(entry[1][f]) for f in families}

    def put(self, path: str, identity: Identity, values: Mapping[str, V]) -> None:
        """Cache ``values`` (family -> value) at ``identity``: the families already cached for
        the path at the same identity are kept (those in ``values`` replaced), an entry at
        another identity is replaced."""
        fresh = {f: self._copy(v) for f, v in values.items()}
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None and entry[0] == identity:
                fresh = {**entry[1], **fresh}
            self._entries[path] = (identity, fresh)
            self._entries.move_to_end(path)
            while len(self._entries) > self._limit():
                self._entries.popitem(last=False)

    def pop(self, path: str) -> Optional[tuple[Identity, dict[str, V]]]:
        """Remove the path's entry and return it, (identity, {family: value}), or None."""
        with self._lock:
            return self._entries.pop(path, None)

    def clear(self, path: Optional[str] = None) -> None:
        """Forget the entry of ``path`` (every entry by default)."""
        with self._lock:
            if path is None:
                self._entries.clear()
            else:
                self._entries.pop(path, None)

    def __contains__(self, path: object) -> bool:
        with self._lock:
            return path in self._entries

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._entries))  # least recently used first

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
