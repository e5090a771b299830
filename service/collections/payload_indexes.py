"""Payload indexes: a collection's index of the values one payload key holds, so that filters on that key find their
points without reading every payload (Qdrant API reference: "Create index for field in collection",
``PUT /collections/{collection_name}/index``; concepts, "Indexing", payload index).

An index is ``(key, data_type, params)``: ``key`` a key path (:func:`.conditions.parse_path`: ``a.b``, ``a[]``,
``a."b.c"``), ``data_type`` one of :data:`DATA_TYPES` (Qdrant's ``PayloadSchemaType`` but ``geo``), ``params`` the
type's ``*IndexParams`` object as given (``{type, ...}``; None when the schema was given as a bare type name). One
index per key: creating another on the same key replaces it. The values an index holds are those the key reaches
(:func:`.conditions.values_at`, an array's elements each) of the index's type; filters answer exactly as without the
index (the reference semantics of :func:`.filter_match.matches`), an index only makes them cheaper. ``params`` are
kept and reported, and change nothing (the full-text match keeps Qdrant's default word tokenizer).

The backends build and use them (the embedded backend: ``store/payload_index.py``; the milvus backend accepts them
with no effect: Milvus 2.3 indexes no key of a JSON field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.collections.conditions import parse_path
from service.collections.errors import InvalidCollectionRequest

#: Qdrant's payload schema types this service indexes
DATA_TYPES = ("keyword", "integer", "float", "bool", "datetime", "uuid", "text")
#: the keys each type's params object may hold besides ``type`` (Qdrant's ``*IndexParams``)
_PARAMS = {
    "keyword": {"is_tenant", "on_disk"},
    "integer": {"lookup", "range", "is_principal", "on_disk"},
    "float": {"is_principal", "on_disk"},
    "bool": {"on_disk"},
    "datetime": {"is_principal", "on_disk"},
    "uuid": {"is_tenant", "on_disk"},
    "text": {
        "tokenizer",
        "min_token_len",
        "max_token_len",
        "lowercase",
        "on_disk",
        "phrase_matching",
        "stopwords",
        "stemmer",
        "ascii_folding",
    },
}


@dataclass(frozen=True)
class PayloadIndex:
    """The index of payload ``key`` by ``data_type`` (:data:`DATA_TYPES`), ``params`` as given (or None)."""

    key: str
    data_type: str
    params: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """``{data_type, params?}``, Qdrant's ``PayloadIndexInfo`` without its ``points``."""
        return {"data_type": self.data_type, **({"params": self.params} if self.params is not None else {})}

    @classmethod
    def from_json(cls, key: str, d: dict[str, Any]) -> PayloadIndex:
        """The index of ``key`` recorded as :meth:`to_json`'s ``d``."""
        return cls(key, d["data_type"], d.get("params"))


def payload_index(key: Any, schema: Any) -> PayloadIndex:
    """The index of payload ``key`` with Qdrant's ``field_schema``: a type name (``"keyword"``) or a params object
    (``{"type": "text", "tokenizer": "word", ...}``).

    Raises:
        InvalidCollectionRequest: ``key`` is no key path (``field_name``); the schema is missing, not one of
            :data:`DATA_TYPES` (``geo`` is refused with ``unsupported``), or its params hold an unknown key
            (``field_schema``).
    """
    if not isinstance(key, str) or not key or parse_path(key) is None:
        raise InvalidCollectionRequest(f"field_name {key!r} is not a payload key path", param="field_name")
    params = None
    if isinstance(schema, dict):
        params, schema = dict(schema), schema.get("type")
    if schema == "geo":
        raise InvalidCollectionRequest(
            "geo payload indexes are not supported (geo filters work without one)",
            param="field_schema",
            code="unsupported",
        )
    if schema not in DATA_TYPES:
        raise InvalidCollectionRequest(
            f"field_schema must be one of {list(DATA_TYPES)} or an object with such a type, got {schema!r}",
            param="field_schema",
        )
    if params is not None:
        if unknown := set(params) - _PARAMS[schema] - {"type"}:
            raise InvalidCollectionRequest(
                f"field_schema: unknown {schema} index params {sorted(unknown)}", param="field_schema"
            )
    return PayloadIndex(key, schema, params)
