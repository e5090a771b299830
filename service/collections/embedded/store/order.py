"""Orders of an embedded collection's rows, as SQLite expressions:

* scroll pages: Qdrant's point order (unsigned integer ids numerically, then string ids), over the stored key
  (:func:`~...ids.encode_id`, the id's JSON text), kept sorted by an expression index (``points_order``);
* an index's training sample: a deterministic pseudo-random choice by internal id (:func:`sample_query`)."""

from __future__ import annotations

ORDER_KEY = (
    "(CASE WHEN substr(key, 1, 1) = '\"' THEN '1' || key"
    " ELSE '0' || substr('00000000000000000000' || key, -20) END)"
)  # integer ids (at most 20 digits) zero-padded behind '0', string ids behind '1': one text compared byte by byte
ORDER_INDEX = f"CREATE INDEX IF NOT EXISTS points_order ON points{ORDER_KEY}"


def order_key(key: str) -> str:
    """:data:`ORDER_KEY` of a stored key, computed in Python (a scroll's start)."""
    return "1" + key if key.startswith('"') else "0" + key.rjust(20, "0")


#: a deterministic pseudo-random order of rows by internal id ``iid`` (Knuth's multiplicative hash, mod 2^32)
SAMPLE_KEY = "(iid * 2654435761) % 4294967296"


def sample_query(source: str) -> str:
    """SQL for the ``vector`` of up to ``?`` rows of ``source`` (what follows ``FROM``: a table, possibly with its
    own ``WHERE`` and ``?`` parameters, or a parenthesised query; with ``iid`` and ``vector`` columns), the first by
    :data:`SAMPLE_KEY`, returned in ``iid`` order: the same rows, in the same order, train the same index (FAISS's
    k-means and scalar-quantizer ranges depend on their sample's order; ``ORDER BY random()`` made a trained index,
    and its recall, differ from one training to the next). All rows, in ``iid`` order, when there are at most
    ``?``. The limit is the query's last parameter."""
    return f"SELECT vector FROM (SELECT iid, vector FROM {source} ORDER BY {SAMPLE_KEY} LIMIT ?) ORDER BY iid"
