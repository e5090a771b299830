"""Creating and deleting a collection on the milvus backend, safe with several replicas and crashes.

* **One claim per name for both**: a create and a delete of one name take the same registry claim
  (:func:`name_claim`), so they run one at a time across replicas whatever their interleaving: a create that loses
  the claim answers 409 (ordered after the create or delete that holds it), a delete 404. The claim is renewed
  (:class:`~.catalog.Lease`) while a slow Milvus call runs, so it cannot lapse under a live create.
* **The Milvus alias is the collection's witness**: a create writes the record, then points the alias; a delete
  drops the alias first, then the record. So a name with an alias and no record is a registry read that came back
  short, not a deleted collection: answered 503 (:class:`RegistryIncomplete`), never 404, and never created over.
* **No orphan**: a physical collection is announced in the registry (``p:<physical>``, :meth:`.Registry.intend`)
  before it is created or dropped; a create that fails after making it drops it again, and what a crash leaves is
  dropped by :meth:`.PhysicalCollections.sweep` once the claim lapsed.
"""

from __future__ import annotations

import time
from typing import Any

from service.collections.aliases import Aliases
from service.collections.errors import BackendUnavailable, CollectionExists, CollectionNotFound, RegistryIncomplete
from service.collections.index import IndexSpec
from service.collections.milvus.catalog import Lease, Registry
from service.collections.milvus.physical import PhysicalCollections


def name_claim(name: str) -> str:
    """The registry claim that creates and deletes of collection ``name`` take (one for both)."""
    return f"+{name}"


class Lifecycle:
    """Creates and deletes the collections of one backend prefix (see the module docstring).

    Args:
        physical: the physical Milvus collections and their aliases.
        registry: the shared registry (records, claims, ``p:`` rows).
        aliases: the collection aliases (a deleted collection's are dropped).
        claim_ttl_s: the claims' TTL (``collections_milvus_claim_ttl_s``).
        claim_settle_s: how long a first claim waits for earlier claims to become visible
            (``collections_milvus_claim_settle_s``).
    """

    def __init__(
        self,
        physical: PhysicalCollections,
        registry: Registry,
        aliases: Aliases,
        claim_ttl_s: float,
        claim_settle_s: float,
    ) -> None:
        self.physical = physical
        self.registry = registry
        self.aliases = aliases
        self.claim_ttl_s = claim_ttl_s
        self.claim_settle_s = claim_settle_s

    def _claimed(self, name: str, what: str) -> tuple[str, str, Lease | None]:
        """Take ``name``'s claim for ``what`` (``create``/``delete``): ``(claim, owner, lease)``, lease None when
        another create or delete holds it (the claim written is released by :meth:`_release`)."""
        key, owner = name_claim(name), f"{what}:{time.time_ns()}"
        at = self.registry.claim(key, owner, self.claim_ttl_s, self.claim_settle_s)
        return key, owner, (None if at is None else Lease(self.registry, key, owner, at, self.claim_ttl_s))

    def _release(self, key: str, owner: str, lease: Lease | None) -> None:
        if lease is not None:
            lease.stop()
        self.registry.release(key, owner)

    def create(self, name: str, spec: IndexSpec, model: dict[str, Any], vector_name: str = "") -> dict[str, Any]:
        """Create collection ``name`` in Milvus and the registry (module docstring); returns its record.

        Raises:
            CollectionExists: the name is taken, or another create or delete of it is running.
            RegistryIncomplete: Milvus holds the name's alias but the registry read has no record.
            BackendUnavailable: the claim lapsed while the physical collection was made (nothing registered).
        """
        reg, phys = self.registry, self.physical
        key, owner, lease = self._claimed(name, "create")
        try:
            if lease is None:
                raise CollectionExists(f"collection {name!r}: another request is creating or deleting it")
            if reg.record(name) is not None or name in reg.aliases():
                raise CollectionExists(f"collection or alias {name!r} already exists")
            if phys.aliased(name):
                raise RegistryIncomplete(name)
            physical = phys.physical_name(name)
            rec = {
                "name": name,
                "kind": spec.kind,
                "metric": spec.metric,
                "params": spec.params,
                "dimension": spec.dimension,
                "model": dict(model),
                "physical": physical,
                "created_at": time.time(),
                "reembed": None,
                "vector_name": vector_name,
            }
            reg.intend(physical, key)
            try:
                phys.make(physical, spec)
                if lease.lost:
                    raise BackendUnavailable(f"creating {name!r} took longer than its claim lasts; retry")
                reg.put_record(name, rec)
            except BaseException:
                self._unmake(name, physical)
                raise
            reg.remove([f"p:{physical}"])
            phys.point_alias(name, physical)
            return rec
        finally:
            self._release(key, owner, lease)

    def _unmake(self, name: str, physical: str) -> None:
        """After a failed create: drop ``physical`` unless the record points at it after all (a write that timed out
        may have landed); if that cannot be told now, the ``p:`` row stays for the sweep."""
        try:
            rec = self.registry.record(name)
            if rec is not None and rec.get("physical") == physical:
                self.registry.remove([f"p:{physical}"])
            elif self.physical.drop_physical(physical):
                self.registry.remove([f"p:{physical}"])
        except Exception:
            pass

    def delete(self, name: str) -> list[str]:
        """Delete collection ``name`` (module docstring): alias, record, claims, aliases naming it, physical
        collections; returns the physical collections dropped.

        Raises:
            CollectionNotFound: no record (or another create or delete of it is running).
            RegistryIncomplete: Milvus holds the name's alias but the registry read has no record.
            pymilvus.MilvusException: dropping the alias failed (nothing deleted).
        """
        reg, phys = self.registry, self.physical
        key, owner, lease = self._claimed(name, "delete")
        try:
            if lease is None:
                raise CollectionNotFound(f"collection {name!r} not found (another request is creating or deleting it)")
            rec = reg.record(name)
            if rec is None:
                if phys.aliased(name):
                    raise RegistryIncomplete(name)
                raise CollectionNotFound(f"collection {name!r} not found")
            physicals = [rec["physical"]] + ([rec["reembed"]["physical"]] if rec.get("reembed") else [])
            for physical in physicals:  # a crash from here on: the sweep finishes the drops
                reg.intend(physical, key)
            phys.drop_alias(name)  # the witness first: from now on the name reads as absent
            reg.remove([f"c:{name}", f"s:{name}"])
            reg.release(name)
            self.aliases.drop_collection(name)
            dropped = [p for p in physicals if phys.drop_physical(p)]
            reg.remove([f"p:{p}" for p in dropped])
            return dropped
        finally:
            self._release(key, owner, lease)
