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
* ``p:<physical>``: a physical collection being made or dropped, ``{claim, at}``: written before it is created (by
  a create or a re-embedding) or dropped (by a delete) and removed once a record points at it or it is gone, so that
  one left by a crash is known and dropped by :meth:`.PhysicalCollections.sweep` once ``claim`` (the claim its
  maker held) lapsed.
* ``aliases``: the collection aliases, ``{map: {alias: collection}}`` (one row: a change of several is atomic).

Reads are strongly consistent (``consistency_level="Strong"`` on every query): a row written before the read
started, by any replica, is in its answer.

Claims: Milvus has no compare-and-set, so a re-embedding is claimed by order: a replica writes its claim, waits
``settle_s`` (so that every claim written before its own is visible), then holds the re-embedding if its claim is
the earliest unexpired one (ties by owner name). The holder renews its claim; one that lapses (a killed or stalled
replica) lets the next claimer take over and resume, and cannot be renewed: its holder learns it lost at its next
renewal and goes back to waiting.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from pymilvus import DataType, MilvusClient

from service.collections.milvus.client import LOAD_TIMEOUT_S
from service.collections.vector_backend import NAME_RE

_MAX_ROWS = 16384  # Milvus's query window

log = logging.getLogger("service.collections.milvus")


def like_prefix(prefix: str) -> str:
    """``key like "<prefix>%"``: the keys starting with ``prefix``. Milvus 2.3 reads ``%`` as a wildcard wherever it
    is, accepts it only at the end ("unsupported pattern" otherwise, a 500 for ``DELETE /collections/%25`` before
    names were checked) and has no escape (``\\%`` is a literal backslash); ``_`` is literal. So a prefix holding
    ``%`` cannot be asked for: refused here (collection names, checked before, hold none).

    Raises:
        ValueError: ``prefix`` holds ``%``.
    """
    if "%" in prefix:
        raise ValueError(f"a Milvus like prefix cannot hold '%': {prefix!r}")
    return f"key like {json.dumps(prefix + '%', ensure_ascii=False)}"


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
            self.client.load_collection(self.name, timeout=LOAD_TIMEOUT_S)
            return
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=512)
        schema.add_field("doc", DataType.JSON)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=2)  # Milvus requires a vector field; unused
        ip = self.client.prepare_index_params()
        ip.add_index(field_name="vec", index_type="FLAT", metric_type="L2")
        try:
            self.client.create_collection(
                self.name, schema=schema, index_params=ip, consistency_level="Strong", timeout=LOAD_TIMEOUT_S
            )
        except Exception:
            if not self.client.has_collection(self.name):
                raise

    def _query(self, expr: str) -> dict[str, dict[str, Any]]:
        # Strong: never the collection's default guessed by the client (pymilvus sends its own last write's time)
        rows = self.client.query(
            self.name, filter=expr, output_fields=["key", "doc"], limit=_MAX_ROWS, consistency_level="Strong"
        )
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
        rows = self._query(f"{like_prefix('c:')} or {like_prefix('s:')}")
        recs = {k[2:]: v for k, v in rows.items() if k.startswith("c:")}
        stats = {k[2:]: v for k, v in rows.items() if k.startswith("s:")}
        return recs, stats

    def record(self, name: str) -> dict[str, Any] | None:
        """The record of ``name`` read now, or None (at once for a name that is no collection name: no such
        record can exist, and Milvus need not see it)."""
        if not NAME_RE.match(name):
            return None
        return self._query(f"key == {json.dumps('c:' + name, ensure_ascii=False)}").get(f"c:{name}")

    def aliases(self) -> dict[str, str]:
        """The collection aliases ``{alias: collection}`` read now."""
        return self._query('key == "aliases"').get("aliases", {}).get("map", {})

    def put_aliases(self, aliases: dict[str, str]) -> None:
        """Replace the collection aliases (one row write)."""
        self.put("aliases", {"map": aliases})

    def has(self, name: str) -> bool:
        """Whether collection ``name`` has a record now."""
        return self.record(name) is not None

    def retired(self) -> dict[str, dict[str, Any]]:
        """``{physical: {drop_after}}``: physical collections to drop once no replica can still use them."""
        return {k[2:]: v for k, v in self._query(like_prefix("r:")).items()}

    def intend(self, physical: str, claim: str, at: float | None = None) -> None:
        """Record that ``physical`` is about to be created or dropped under the claim ``claim`` (a ``p:`` row, see
        the module docstring; ``at``: when, default now)."""
        self.put(f"p:{physical}", {"claim": claim, "at": time.time() if at is None else at})

    def intents(self) -> dict[str, dict[str, Any]]:
        """``{physical: {claim, at}}``: physical collections being made or dropped (or left so by a crash)."""
        return {k[2:]: v for k, v in self._query(like_prefix("p:")).items()}

    # --- claims -------------------------------------------------------------------------------------------------
    def _claims(self, name: str) -> list[dict[str, Any]]:
        return list(self._query(like_prefix(f"l:{name}:")).values())

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

    def renew(self, name: str, owner: str, ttl_s: float, at: float) -> bool:
        """Extend ``owner``'s claim on ``name`` (taken at ``at``) for ``ttl_s`` from now; False when it lapsed
        meanwhile or another claim is ahead of it. A lapsed claim cannot be renewed: renewing it with its old place
        in line would take the re-embedding back from the replica that took over."""
        now = time.time()
        mine = [
            c
            for c in self._claims(name)
            if c["owner"] == owner and abs(c["at"] - at) < 1e-3 and c.get("until", 0) > now
        ]
        if not mine:
            return False
        self.put(f"l:{name}:{owner}", {"owner": owner, "at": at, "until": now + ttl_s})
        return self.holder(name) == owner

    def release(self, name: str, owner: str | None = None) -> None:
        """Drop ``owner``'s claim on ``name`` (every claim when None)."""
        keys = [f"l:{name}:{c['owner']}" for c in self._claims(name) if owner is None or c["owner"] == owner]
        self.remove(keys)


class Lease:
    """Keeps a held claim alive from a thread, renewing it every third of its TTL, so that a holder busy in one long
    Milvus call (creating a collection, reading every write version) does not lapse; the usual lease keeper.

    :attr:`lost` turns True, and renewal stops, when a renewal fails (the claim lapsed or another is ahead: see
    :meth:`Registry.renew`) or raises (Milvus unreachable: giving the claim up is the safe side, the announced target
    stays for the next claimer).

    Args:
        registry: the registry. name: the collection. owner: the claim's owner. at: its place in line.
        ttl_s: the claim's TTL (``collections_milvus_claim_ttl_s``).
    """

    def __init__(self, registry: Registry, name: str, owner: str, at: float, ttl_s: float) -> None:
        self.registry, self.name, self.owner, self.at, self.ttl_s = registry, name, owner, at, ttl_s
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"milvus-lease-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                ok = self.registry.renew(self.name, self.owner, self.ttl_s, self.at)
            except Exception:
                log.warning("milvus: renewing the claim on %s failed; giving it up", self.name, exc_info=True)
                ok = False
            if not ok:
                self.lost = True
                return

    def stop(self) -> None:
        """Stop renewing (before releasing the claim)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def older_status(new: dict[str, Any], have: dict[str, Any] | None) -> bool:
    """Whether the re-embedding status ``new`` is an earlier view of the one ``have`` shows (same run, less
    progress): a replica's view never goes back to it."""
    if have is None or new.get("started_at") != have.get("started_at"):
        return False
    return (new.get("state") == "running" and have.get("state") != "running") or new.get("done", 0) < have.get(
        "done", 0
    )


def revision(record: dict[str, Any]) -> tuple[float, int]:
    """A record's place in time, ``(created_at, rev)``: a collection deleted and created again starts a new
    ``created_at``; every write of its record increments ``rev``."""
    return float(record.get("created_at", 0.0)), int(record.get("rev", 0))
