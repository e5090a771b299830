"""The physical Milvus collections of one backend prefix: their names, the Milvus aliases that point at them, and
dropping those no collection uses any more: retired ones (after a re-embedding's switch, once no replica's view can
still use them) and those a crash left behind.

Each API collection ``name`` has a Milvus alias ``<prefix><name>`` pointing at a physical collection
``<prefix><name>__g<version>`` (Milvus names allow letters, digits and ``_`` only, so ``_`` and ``-`` of an API
name are written ``_u`` and ``_d``).

**What counts as left by a crash, and why nothing in flight is removed**: the sweep only ever considers a physical
collection that the registry itself announced (a ``p:<physical>`` row, written by a create, a re-embedding or a
delete before it creates or drops that collection, under a claim: :mod:`.lifecycle`, :mod:`.target`). Such a
collection is dropped only when all of these hold, in the registry's own ordering rather than by clocks:

* the claim named in its ``p:`` row is held by no one (no unexpired claim: its maker finished, failed or died, and
  a live maker renews its claim, :class:`~.catalog.Lease`), and the row is older than the claim TTL (a claim
  written just now may not be visible yet);
* no record points at it (as its points or as a re-embedding's target) and no ``r:`` row retires it;
* no Milvus alias points at it (a collection whose alias exists is in use, even if a registry read came back short).

A physical collection the registry never announced (made by another deployment that shares the Milvus, or before
this rule) is never touched.
"""

from __future__ import annotations

import logging
import time

from pymilvus import MilvusException

from service.collections.index import IndexSpec
from service.collections.milvus.catalog import Registry
from service.collections.milvus.client import BoundedClient
from service.collections.milvus.schema import create_physical

log = logging.getLogger("service.collections.milvus")


def _missing(e: MilvusException) -> bool:
    """Whether Milvus answered "no such alias or collection"."""
    return "not found" in str(e) or "not exist" in str(e)


class PhysicalCollections:
    """The physical Milvus collections behind a backend's collections (see the module docstring).

    Args:
        client: the backend's bounded client (it keeps its identity when the breaker reconnects).
        registry: the shared registry (its ``p:`` and ``r:`` rows, and the records the sweep keeps).
        prefix: the backend's name prefix (``collections_milvus_prefix``).
        settle_s: seconds after which no replica's view can still use a retired collection (the refresh interval
            plus the write timeout, plus 1 s).
        claim_ttl_s: the claims' TTL (``collections_milvus_claim_ttl_s``): an announced collection whose claim
            lapsed and whose ``p:`` row is older than this was left by a crash.
    """

    def __init__(
        self, client: BoundedClient, registry: Registry, prefix: str, settle_s: float, claim_ttl_s: float
    ) -> None:
        self.client = client
        self.registry = registry
        self.prefix = prefix
        self.settle_s = settle_s
        self.claim_ttl_s = claim_ttl_s

    # --- names and aliases ------------------------------------------------------------------------------------
    def alias(self, name: str) -> str:
        """The Milvus alias of collection ``name``."""
        return self.prefix + name.replace("_", "_u").replace("-", "_d")

    def physical_name(self, name: str) -> str:
        """A new physical Milvus collection name for ``name``."""
        return f"{self.alias(name)}__g{time.time_ns():x}"

    def aliased(self, name: str) -> bool:
        """Whether Milvus holds the alias of collection ``name`` (the witness that it exists, :mod:`.lifecycle`).

        Raises:
            pymilvus.MilvusException: Milvus did not answer the question.
        """
        try:
            return bool(self.client.describe_alias(self.alias(name)).get("collection_name"))
        except MilvusException as e:
            if _missing(e):
                return False
            raise

    def point_alias(self, name: str, physical: str) -> None:
        """Make ``name``'s alias point to ``physical`` (creating it if missing)."""
        alias = self.alias(name)
        try:
            current = self.client.describe_alias(alias).get("collection_name")
        except Exception:
            current = None
        if current == physical:
            return
        (self.client.alter_alias if current else self.client.create_alias)(physical, alias)

    def drop_alias(self, name: str) -> None:
        """Drop the alias of collection ``name`` (a missing one is fine). Raises pymilvus.MilvusException."""
        try:
            self.client.drop_alias(self.alias(name))
        except MilvusException as e:
            if not _missing(e):
                raise

    # --- physical collections ---------------------------------------------------------------------------------
    def exists(self, physical: str) -> bool:
        """Whether a Milvus collection exists."""
        return self.client.has_collection(physical)

    def count(self, physical: str) -> int:
        """Points in a physical collection (strongly consistent)."""
        return int(self.client.query(physical, filter="", output_fields=["count(*)"])[0]["count(*)"])

    def make(self, physical: str, spec: IndexSpec) -> None:
        """Create the physical collection ``physical`` for ``spec`` (:func:`~.schema.create_physical`, strongly
        consistent); announce it first (:meth:`~.catalog.Registry.intend`)."""
        create_physical(self.client, physical, spec, "Strong")

    def drop_physical(self, physical: str) -> bool:
        """Drop a physical collection (best effort; a missing one is fine); whether it is gone."""
        try:
            if self.client.has_collection(physical):
                self.client.drop_collection(physical)
            return True
        except Exception:
            log.exception("milvus: dropping %s failed", physical)
            return False

    # --- retirement and the sweep -----------------------------------------------------------------------------
    def retire(self, physical: str) -> None:
        """Drop ``physical`` once no replica's view can still use it (after :attr:`settle_s`; any replica does it)."""
        self.registry.put(f"r:{physical}", {"drop_after": time.time() + self.settle_s})

    def drop_retired(self) -> None:
        """Drop the retired physical collections whose ``drop_after`` has passed (and their ``r:`` rows)."""
        for physical, doc in self.registry.retired().items():
            if doc["drop_after"] <= time.time():
                self.drop_physical(physical)
                self.registry.remove([f"r:{physical}"])

    def sweep(self) -> list[str]:
        """Drop the physical collections a crash left (module docstring); returns those dropped. Any replica may run
        it at any time; two at once drop the same ones (dropping is idempotent)."""
        reg, ttl = self.registry, self.claim_ttl_s
        stale = {
            p: d for p, d in reg.intents().items() if time.time() - d.get("at", 0) > ttl and not reg.holder(d["claim"])
        }
        if not stale:
            return []
        recs, _ = reg.records()
        used = set(reg.retired())
        for r in recs.values():
            used.add(r["physical"])
            if r.get("reembed"):
                used.add(r["reembed"]["physical"])
        dropped = []
        for physical in stale:
            if physical not in used:
                if self.client.has_collection(physical) and self.client.list_aliases(physical).get("aliases"):
                    log.warning("milvus: %s has no registry row but an alias points at it: kept", physical)
                    continue
                if not self.drop_physical(physical):
                    continue
                log.warning(
                    "milvus: dropped %s, left by a create, re-embedding or delete that did not finish", physical
                )
                dropped.append(physical)
            reg.remove([f"p:{physical}"])
        return dropped
