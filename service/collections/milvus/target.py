"""Re-embedding on the milvus backend (:class:`~..backend.ReembedTarget`), safe with several replicas.

1. **Claim** (:meth:`Registry.claim`): one replica at a time re-embeds a collection; a killed one's claim lapses
   after ``collections_milvus_claim_ttl_s`` and another resumes its work.
2. **Announce**: a new physical Milvus collection for the target model (new dimension allowed) is created and
   recorded as the record's ``reembed``; from then on every replica's upserts and deletes go to both physical
   collections (their views are at most ``refresh_s`` old, see :mod:`.collection`), with the same write version.
3. **Sweep**: live points whose copy in the new collection is missing or has another write version (written
   before the announcement reached every replica) are re-embedded and written with their version.
4. **Switch**: once ``refresh_s`` + the write timeout have passed since the announcement (no write can still go to
   the old collection alone), a full comparison of keys and versions finds nothing missing (points deleted from the
   old collection meanwhile are deleted from the new one), then one registry write records the new model, dimension,
   params and physical collection — atomic for every replica — and the alias is moved. The old physical collection
   is retired: dropped once no replica's view can still use it.

A replica killed at any step leaves either the old record (the switch did not happen; the next claimer resumes)
or the new one (the switch happened): never half of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Protocol

from service.collections.errors import CollectionClosed, InvalidCollectionRequest
from service.collections.index import IndexConfigError, IndexSpec, get_type, normalize_params
from service.collections.milvus.catalog import Lease, Registry
from service.collections.milvus.client import BoundedClient, long_call
from service.collections.milvus.physical import PhysicalCollections
from service.collections.milvus.schema import to_rows
from service.collections.vector_backend import same_model

_PAGE = 16384


def _keyed(
    client: BoundedClient, physical: str, cursor: str | None, limit: int, fields: list[str]
) -> list[dict[str, Any]]:
    expr = f"key > {json.dumps(cursor, ensure_ascii=False)}" if cursor is not None else 'key != ""'
    rows = client.query(physical, filter=expr, output_fields=["key", *fields], limit=limit)
    return sorted(rows, key=lambda r: r["key"])


def _versions(client: BoundedClient, physical: str) -> dict[str, int]:
    out: dict[str, int] = {}
    cursor = None
    while rows := _keyed(client, physical, cursor, _PAGE, ["updated"]):
        out.update((r["key"], r["updated"]) for r in rows)
        cursor = rows[-1]["key"]
    return out


class ReembeddedCollection(Protocol):
    """What a re-embedding uses of its collection (:class:`~.collection.MilvusCollection`)."""

    name: str
    shared_status: dict[str, Any] | None

    @property
    def spec(self) -> IndexSpec:
        """The index spec of the collection's record view."""

    def update(self, record: dict[str, Any], status: dict[str, Any] | None) -> None:
        """Replace the record view (unless it holds a newer one)."""


class Reembeddings:
    """Starts the re-embeddings of one backend prefix's collections (steps 1 and 2 of the module docstring).

    Args:
        physical: the physical Milvus collections (the target is one of them).
        registry: the shared registry (records, claims, ``p:`` rows).
        claim_ttl_s: the claims' TTL (``collections_milvus_claim_ttl_s``).
        claim_settle_s: how long a first claim waits for earlier claims to become visible
            (``collections_milvus_claim_settle_s``).
    """

    def __init__(
        self, physical: PhysicalCollections, registry: Registry, claim_ttl_s: float, claim_settle_s: float
    ) -> None:
        self.physical = physical
        self.registry = registry
        self.claim_ttl_s = claim_ttl_s
        self.claim_settle_s = claim_settle_s

    def begin(self, c: ReembeddedCollection, model: dict[str, Any], dimension: int, owner: str) -> MilvusTarget | None:
        """Claim ``c``'s re-embedding towards ``model`` and announce it (or resume the announced one for the same
        model); None when another replica holds the claim, or the collection already has ``model`` (this replica's
        view was older than another replica's switch).

        Raises:
            InvalidCollectionRequest: the index params cannot be carried to ``dimension``.
            CollectionClosed: the collection was deleted.
        """
        spec = c.spec
        try:
            params = normalize_params(spec.kind, get_type(spec.kind).user_params(spec.params), dimension)
        except IndexConfigError as e:
            raise InvalidCollectionRequest(f"cannot re-embed {c.name!r} at dimension {dimension}: {e}") from e
        claimed_at = self.registry.claim(c.name, owner, self.claim_ttl_s, settle_s=self.claim_settle_s)
        if claimed_at is None:
            return None
        lease = Lease(self.registry, c.name, owner, claimed_at, self.claim_ttl_s)
        try:
            return self._announce(c, model, dimension, owner, params, lease)
        except BaseException:
            lease.stop()
            self.registry.release(c.name, owner)
            raise

    def _announce(
        self,
        c: ReembeddedCollection,
        model: dict[str, Any],
        dimension: int,
        owner: str,
        params: dict[str, Any],
        lease: Lease,
    ) -> MilvusTarget | None:
        """:meth:`begin` once the claim is held (kept alive by ``lease``)."""
        reg, phys = self.registry, self.physical
        spec = c.spec
        rec = reg.record(c.name)
        if rec is None:
            raise CollectionClosed(f"collection {c.name!r} not found (deleted)")
        if same_model(rec["model"], model) and int(rec["dimension"]) == dimension:
            # this replica's view was older than the switch another replica made: nothing left to do
            lease.stop()
            reg.release(c.name, owner)
            c.update(rec, c.shared_status)
            return None
        rb = rec.get("reembed")
        if not (rb and same_model(rb["model"], model) and rb["dimension"] == dimension and phys.exists(rb["physical"])):
            if rb:
                phys.drop_physical(rb["physical"])
            physical = phys.physical_name(c.name)
            reg.intend(physical, c.name)  # under this claim: a crash before the record names it, the sweep drops it
            phys.make(physical, IndexSpec(spec.kind, spec.metric, params, dimension))
            rb = {
                "model": dict(model),
                "dimension": dimension,
                "params": params,
                "physical": physical,
                "announced_at": time.time(),
            }
            rec["reembed"] = rb
            reg.put_record(c.name, rec)
            reg.remove([f"p:{physical}"])
        c.update(rec, c.shared_status)
        if lease.lost:  # another replica took over meanwhile: it resumes the announced target
            lease.stop()
            reg.release(c.name, owner)
            return None
        return MilvusTarget(c, rec, owner, lease, phys, reg, self.claim_ttl_s)


class MilvusTarget:
    """An announced re-embedding of one collection held by ``owner`` (see the module docstring).

    Args:
        c: the collection. rec: its record, announcing the re-embedding. owner: the claim's owner.
        lease: keeps the claim alive. physical: the physical Milvus collections. registry: the shared registry.
        claim_ttl_s: the claims' TTL.
    """

    def __init__(
        self,
        c: ReembeddedCollection,
        rec: dict[str, Any],
        owner: str,
        lease: Lease,
        physical: PhysicalCollections,
        registry: Registry,
        claim_ttl_s: float,
    ) -> None:
        self.c, self.owner, self.lease, self.claimed_at = c, owner, lease, lease.at
        self.physical, self.registry, self.claim_ttl_s = physical, registry, claim_ttl_s
        rb = rec["reembed"]
        self.model, self.dimension, self.params = dict(rb["model"]), int(rb["dimension"]), rb["params"]
        self.old, self.new, self.announced_at = rec["physical"], rb["physical"], float(rb["announced_at"])
        self.status: dict[str, Any] = {
            "state": "running",
            "target_model": dict(self.model),
            "dimension": self.dimension,
            "done": 0,
            "total": None,
            "rate_per_s": None,
            "started_at": time.time(),
            "finished_at": None,
            "error": None,
            "owner": owner,
        }
        self.status["done"] = physical.count(self.new)
        self.status["total"] = physical.count(self.old)

    @long_call
    def pending(self, cursor: str | None, limit: int) -> tuple[list[tuple[dict[str, Any], str]], str | None]:
        """Live points after key ``cursor`` whose copy is missing or outdated: ``([(row, text)], next cursor)``."""
        client = self.physical.client
        while rows := _keyed(client, self.old, cursor, limit, ["text", "payload", "nulls", "updated"]):
            cursor = rows[-1]["key"]
            have = client.query(
                self.new, filter=f"key in {json.dumps([r['key'] for r in rows])}", output_fields=["updated"]
            )
            done = {h["key"]: h["updated"] for h in have}
            todo = [(r, r["text"]) for r in rows if done.get(r["key"]) != r["updated"]]
            if todo:
                return todo, cursor
        return [], cursor

    @long_call
    def write(self, refs: Sequence[dict[str, Any]], vectors: Any) -> None:
        """Write the re-embedded points (their texts, payloads and write versions) to the new collection."""
        rows = to_rows(
            [r["key"] for r in refs],
            [r["text"] for r in refs],
            [r["payload"] for r in refs],
            vectors,
            0,
            self.c.spec.metric,
            self.dimension,
        )
        for row, r in zip(rows, refs):
            row["updated"] = r["updated"]
        self.physical.client.upsert(self.new, rows)

    @long_call
    def complete(self) -> bool:
        """Switch when nothing is missing (see the module docstring, step 4); False otherwise."""
        wait = self.announced_at + self.physical.settle_s - time.time()
        if wait > 0:
            time.sleep(wait)
        old, new = _versions(self.physical.client, self.old), _versions(self.physical.client, self.new)
        if any(new.get(k) != v for k, v in old.items()):
            return False
        extra = [k for k in new if k not in old]
        for i in range(0, len(extra), 1000):
            self.physical.client.delete(self.new, filter=f"key in {json.dumps(extra[i : i + 1000])}")
        rec = self.registry.record(self.c.name)
        if rec is None:
            raise CollectionClosed(f"collection {self.c.name!r} not found (deleted)")
        if (rec.get("reembed") or {}).get("physical") != self.new or not self.renew():
            return False
        rec.update(model=self.model, dimension=self.dimension, params=self.params, physical=self.new, reembed=None)
        self.registry.intend(self.old, self.c.name)  # a crash before it is retired: the sweep drops it
        self.registry.put_record(self.c.name, rec)  # the switch, for every replica
        self.physical.point_alias(self.c.name, self.new)
        self.physical.retire(self.old)
        self.registry.remove([f"p:{self.old}"])
        self.c.update(rec, self.c.shared_status)
        return True

    @long_call
    def publish_status(self) -> None:
        """Write the progress to the registry (every replica's ``GET /collections/{name}`` shows it)."""
        self.registry.put(f"s:{self.c.name}", self.status)
        self.c.shared_status = dict(self.status)

    @long_call
    def renew(self) -> bool:
        """Extend the claim; False when another replica holds it now, or announced its own target (two claims can
        overlap when a claim's write is slower than ``claim_settle_s``)."""
        if self.lease.lost or not self.registry.renew(self.c.name, self.owner, self.claim_ttl_s, self.claimed_at):
            return False
        rec = self.registry.record(self.c.name)
        return rec is not None and (rec.get("reembed") or {}).get("physical") == self.new

    @long_call
    def abandon(self, drop: bool) -> None:
        """Release the claim; ``drop`` also ends the re-embedding (record and new collection) for every replica,
        else it stays announced so the next claimer resumes it. A new collection no record announces (another
        replica's announcement replaced it) is retired either way."""
        self.lease.stop()
        rec = self.registry.record(self.c.name)
        announced = rec is not None and (rec.get("reembed") or {}).get("physical") == self.new
        if drop and announced:
            rec["reembed"] = None
            self.registry.put_record(self.c.name, rec)
            self.c.update(rec, self.c.shared_status)
        if (drop or not announced) and rec is not None and rec.get("physical") != self.new:
            self.physical.retire(self.new)
        self.registry.release(self.c.name, self.owner)
