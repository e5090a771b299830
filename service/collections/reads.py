"""The value types of a read on any backend: :class:`Hit` (a search result), :class:`ReadConsistency` (what a read
must see) and :class:`ResponseBudget` (the bytes a response may still hold, with the byte counts of its parts)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, get_args

from service.collections.errors import ResponseTooLarge
from service.settings import ReadConsistencyLevel


@dataclass
class Hit:
    """One search result: point ``id``, ``score`` (similarity, or distance for l2), optional text and payload."""

    id: int | str
    score: float
    text: str | None = None
    payload: dict[str, Any] | None = None


HIT_OVERHEAD_BYTES = 64  # a hit's id, score and JSON punctuation, counted against a response budget
#: one value of a dense vector in a response: a float32 written as JSON text (as Python's float: about 17 significant
#: digits) and its comma, 19 to 21 bytes on average (unit vectors: 21), 25 at most
FLOAT_JSON_BYTES = 21
SPARSE_ENTRY_BYTES = 11 + FLOAT_JSON_BYTES  # one entry of a sparse vector: its index (a uint32) and its value

CONSISTENCY_LEVELS: tuple[str, ...] = get_args(ReadConsistencyLevel)  # "strong", "bounded", "eventual"


@dataclass(frozen=True)
class ReadConsistency:
    """What a read must see, following Milvus's consistency levels (Milvus docs, "Consistency Level") and Qdrant's
    per-request read ``consistency`` parameter (Qdrant API reference, "Read consistency").

    Attributes:
        level: ``strong`` (every write acknowledged before the read started, on any replica), ``bounded`` (may
            miss writes of the last ``common.gracefulTime`` of the Milvus server, 5 s by default), ``eventual``
            (no wait at all: may miss recent writes for longer).
        after: a write's ``sequence``: the read sees that write and every earlier one, whatever ``level`` (a
            read-your-writes token, valid on every replica).

    The embedded backend is always strong: one process holds the data and a write is answered once searchable.
    """

    level: str = "strong"
    after: int | None = None

    @property
    def applied(self) -> str:
        """The name answered in the ``X-Read-Consistency`` header: the level, or ``session`` for a token with a
        level below strong (a strong read with a token is still strong)."""
        return "session" if self.after is not None and self.level != "strong" else self.level


STRONG = ReadConsistency()


class ResponseBudget:
    """The bytes a response may still hold (``collections_max_response_bytes``), spent by the backends as they gather
    hits or points: texts (UTF-8) and payloads (JSON) as stored, vectors as JSON text (:data:`FLOAT_JSON_BYTES` per
    dense value, :data:`SPARSE_ENTRY_BYTES` per sparse entry), plus :data:`HIT_OVERHEAD_BYTES` per hit or point.
    One budget serves one request: every search of a batch and every read of the vectors of its hits spend from it.

    Raises (from :meth:`spend`, :meth:`spend_point`, :meth:`spend_hits`):
        ResponseTooLarge: more than ``limit`` bytes in all.
    """

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def spend_point(
        self, key: str, text: str | None = None, payload: Any = None, floats: int = 0, entries: int = 0
    ) -> None:
        """Count one hit or point: its id's JSON text ``key``, its ``text`` (UTF-8), ``payload`` (as JSON), ``floats``
        dense and ``entries`` sparse vector values, and :data:`HIT_OVERHEAD_BYTES`.

        Raises:
            ResponseTooLarge: as :meth:`spend`.
        """
        self.spend(
            len(key.encode())
            + HIT_OVERHEAD_BYTES
            + (len(text.encode()) if text else 0)
            + (len(json.dumps(payload)) if payload is not None else 0)
            + floats * FLOAT_JSON_BYTES
            + entries * SPARSE_ENTRY_BYTES
        )

    def spend_hits(self, hits: Sequence[Hit]) -> None:
        """Count hits already gathered (e.g. the fused hits of a query with prefetches, whose searches each had a
        budget of their own): their ids, texts and payloads as :meth:`spend_point` counts them.

        Raises:
            ResponseTooLarge: as :meth:`spend`.
        """
        for h in hits:
            self.spend_point(json.dumps(h.id), h.text, h.payload)

    def spend(self, n: int) -> None:
        """Count ``n`` more bytes; raises :class:`~.errors.ResponseTooLarge` once the total exceeds ``limit``."""
        self.used += n
        if self.used > self.limit:
            raise ResponseTooLarge(
                f"the search results hold more than {self.limit} bytes (collections_max_response_bytes): ask for "
                "fewer hits (top_k, limit), without payloads, texts or vectors (with_payload, with_text, "
                "with_vector), or split the batch"
            )
