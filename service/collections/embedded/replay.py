"""The replay that completes an index loaded from a snapshot: the rows written after it, added in order, and the
count checked against the table (the snapshots of named dense vectors, :mod:`.dense_snapshots`, and of sparse ones,
:mod:`.sparse_snapshots`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np

log = logging.getLogger("service.collections")


def replay(index: Any, rows: Iterable[tuple[np.ndarray, Any]], stored: int, what: str, seq: int, removed: int) -> None:
    """Add ``rows`` (``(internal ids, values)`` chunks written after the snapshot ``seq``) to ``index`` (loaded from
    it, ``removed`` removals already replayed), then check it holds the ``stored`` points of the table.

    Raises:
        ValueError: the index holds another count than the table (the snapshot is then not used).
    """
    added = 0
    for ids, values in rows:
        index.add(ids, values)
        added += len(ids)
    if index.live != stored:
        raise ValueError(f"after replay the index holds {index.live} points, the table {stored}")
    log.info("%s: snapshot seq %d + %d removals, %d rows replayed", what, seq, removed, added)
