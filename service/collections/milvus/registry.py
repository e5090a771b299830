"""The shared registry of the milvus backend: one small Milvus collection, ``<prefix>registry``, that every replica
reads, holding one JSON document per row:

* ``c:<name>``: a collection's record: ``{name, kind, metric, params, dimension, model, physical, created_at,
  reembed, retired}``. ``physical`` is the Milvus collection holding its points now; ``reembed`` (or null) the
  running re-embedding ``{model, dimension, physical, announced_at}``; ``retired`` ``[[physical, drop_after]]``
  the old physical collections kept until no replica can still use them; ``rev`` a revision that every write
  increments (a replica's view never goes back to an older revision, whichever thread read it first). A record
  changes in one row write, so a switch of model, dimension and physical collection is atomic for every reader.
* ``s:<name>``: the progress of its last re-embedding (what ``GET /collections/{name}`` shows under ``reembedding``).
* ``l:<name>:<owner>``: a claim on re-embedding ``name`` (``l:+<name>:<owner>``: on creating it):
  ``{owner, at, until}``.
* ``r:<physical>``: a retired physical collection, ``{drop_after}``.

Claims: Milvus has no compare-and-set, so a re-embedding is claimed by order: a replica writes its claim, waits
``settle_s`` (so that every claim written before its own is visible), then holds the re-embedding if its claim is
the earliest unexpired one (ties by owner name). The holder renews its claim; one that lapses (a killed replica)
lets the next claimer take over and resume.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pymilvus import DataType, MilvusClient

_MAX_ROWS = 16384  # Milvus's query window


class Registry:
    """The registry collection of one backend prefix.

    Args:
        client: a connected :class:`MilvusClient`.
        prefix: the backend's name prefix (``collections_milvus_prefix``).
    """

    def __init__(self, client: MilvusClient, prefix: str) -> None:
        self.client = client
        self.name = f"{prefix}registry"

    def ensure(self) -> None:
        """Create the registry collection if it does not exist (another replica may create it at the same time)."""
        if self.client.has_collection(self.name):
            self.client.load_collection(self.name)
            return
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=512)
        schema.add_field("doc", DataType.JSON)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=2)  # Milvus requires a vector field; unused
        ip = self.client.prepare_index_params()
        ip.add_index(field_name="vec", index_type="FLAT", metric_type="L2")
        try:
            self.client.create_collection(self.name, schema=schema, index_params=ip, consistency_level="Strong")
        except Exception:
            if not self.client.has_collection(self.name):
                raise

    def _query(self, expr: str) -> dict[str, dict[str, Any]]:
        rows = self.client.query(self.name, filter=expr, output_fields=["key", "doc"], limit=_MAX_ROWS)
        return {r["key"]: r["doc"] for r in rows}

    def put(self, key: str, doc: dict[str, Any]) -> None:
        """Write one document (replacing the row)."""
        self.client.upsert(self.name, [{"key": key, "doc": doc, "vec": [0.0, 0.0]}])

    def put_record(self, name: str, rec: dict[str, Any]) -> None:
        """Write a collection's record (read from the registry just before) with its revision incremented."""
        rec["rev"] = int(rec.get("rev", 0)) + 1
        self.put(f"c:{name}", rec)

    def remove(self, keys: list[str]) -> None:
        """Delete rows by key."""
        if keys:
            self.client.delete(self.name, filter=f"key in {json.dumps(keys, ensure_ascii=False)}")

    def records(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """``(records, statuses)``, each by collection name."""
        rows = self._query('key like "c:%" or key like "s:%"')
        recs = {k[2:]: v for k, v in rows.items() if k.startswith("c:")}
        stats = {k[2:]: v for k, v in rows.items() if k.startswith("s:")}
        return recs, stats

    def record(self, name: str) -> dict[str, Any] | None:
        """The record of ``name`` read now, or None."""
        return self._query(f"key == {json.dumps('c:' + name, ensure_ascii=False)}").get(f"c:{name}")

    def retired(self) -> dict[str, dict[str, Any]]:
        """``{physical: {drop_after}}``: physical collections to drop once no replica can still use them."""
        return {k[2:]: v for k, v in self._query('key like "r:%"').items()}

    # --- claims -------------------------------------------------------------------------------------------------
    def _claims(self, name: str) -> list[dict[str, Any]]:
        prefix = json.dumps(f"l:{name}:%", ensure_ascii=False)
        return list(self._query(f"key like {prefix}").values())

    def holder(self, name: str) -> str | None:
        """The owner of the earliest unexpired claim on ``name``, or None."""
        now = time.time()
        live = [c for c in self._claims(name) if c.get("until", 0) > now]
        return min(live, key=lambda c: (c["at"], c["owner"]))["owner"] if live else None

    def claim(
        self, name: str, owner: str, ttl_s: float, settle_s: float = 0.0, at: float | None = None
    ) -> float | None:
        """Write (or renew) ``owner``'s claim on ``name``, valid for ``ttl_s`` from now, and say whether it holds.

        Args:
            at: the claim's place in line (seconds since the epoch); None keeps the place of ``owner``'s live claim,
                or takes now for a new one (a waiting replica keeps its place).
            settle_s: wait this long after writing (a first claim: earlier claims become visible).

        Returns:
            the claim's ``at`` when ``owner`` holds the claim (module docstring), else None.
        """
        now = time.time()
        if at is None:
            mine = [c for c in self._claims(name) if c["owner"] == owner and c.get("until", 0) > now]
            at = mine[0]["at"] if mine else now
        self.put(f"l:{name}:{owner}", {"owner": owner, "at": at, "until": now + ttl_s})
        if settle_s > 0:
            time.sleep(settle_s)
        return at if self.holder(name) == owner else None

    def release(self, name: str, owner: str | None = None) -> None:
        """Drop ``owner``'s claim on ``name`` (every claim when None)."""
        keys = [f"l:{name}:{c['owner']}" for c in self._claims(name) if owner is None or c["owner"] == owner]
        self.remove(keys)
