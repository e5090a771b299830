"""Creating and deleting a collection on the milvus backend, safe with several replicas and crashes.

* **One claim per name for both**: a create and a delete of one name take the same registry claim
  (:func:`name_claim`), so they run one at a time across replicas whatever their interleaving: a create that loses
  the claim answers 409 (ordered after the create or delete that holds it), a delete 404. The claim is renewed
  (:class:`~.registry.Lease`) while a slow Milvus call runs, so it cannot lapse under a live create.
* **The Milvus alias is the collection's witness**: a create writes the record, then points the alias; a delete
  drops the alias first, then the record. So a name with an alias and no record is a registry read that came back
  short, not a deleted collection: answered 503 (:class:`RegistryIncomplete`), never 404, and never created over.
* **No orphan**: a physical collection is announced in the registry (``p:<physical>``, :meth:`.Registry.intend`)
  before it is created or dropped; a create that fails after making it drops it again, and what a crash leaves is
  dropped by :func:`.sweep.sweep` once the claim lapsed.
"""

from __future__ import annotations

import time
from typing import Any

from pymilvus import MilvusException

from service.collections.errors import BackendUnavailable, CollectionExists, CollectionNotFound, RegistryIncomplete
from service.collections.index import IndexSpec
from service.collections.milvus.catalog import Lease
from service.collections.milvus.schema import create_physical


def _missing(e: MilvusException) -> bool:
    """Whether Milvus answered "no such alias or collection"."""
    return "not found" in str(e) or "not exist" in str(e)


def aliased(b: Any, name: str) -> bool:
    """Whether Milvus holds the alias of collection ``name`` on backend ``b`` (the witness that it exists).

    Raises:
        pymilvus.MilvusException: Milvus did not answer the question.
    """
    try:
        return bool(b.client.describe_alias(b.alias(name)).get("collection_name"))
    except MilvusException as e:
        if _missing(e):
            return False
        raise


def drop_alias(b: Any, name: str) -> None:
    """Drop the alias of collection ``name`` (a missing one is fine). Raises pymilvus.MilvusException."""
    try:
        b.client.drop_alias(b.alias(name))
    except MilvusException as e:
        if not _missing(e):
            raise


def name_claim(name: str) -> str:
    """The registry claim that creates and deletes of collection ``name`` take (one for both)."""
    return f"+{name}"


def _claimed(b: Any, name: str, what: str) -> tuple[str, str, Lease | None]:
    """Take ``name``'s claim for ``what`` (``create``/``delete``): ``(claim, owner, lease)``, lease None when another
    create or delete holds it (the claim written is released by :func:`_release`)."""
    s, key, owner = b.settings, name_claim(name), f"{what}:{time.time_ns()}"
    at = b.registry.claim(key, owner, s.milvus_claim_ttl_s, b.claim_settle_s)
    return key, owner, (None if at is None else Lease(b.registry, key, owner, at, s.milvus_claim_ttl_s))


def _release(b: Any, key: str, owner: str, lease: Lease | None) -> None:
    if lease is not None:
        lease.stop()
    b.registry.release(key, owner)


def create(b: Any, name: str, spec: IndexSpec, model: dict[str, Any], vector_name: str = "") -> dict[str, Any]:
    """Create collection ``name`` in Milvus and the registry (module docstring); returns its record.

    Raises:
        CollectionExists: the name is taken, or another create or delete of it is running.
        RegistryIncomplete: Milvus holds the name's alias but the registry read has no record.
        BackendUnavailable: the claim lapsed while the physical collection was made (nothing registered).
    """
    key, owner, lease = _claimed(b, name, "create")
    try:
        if lease is None:
            raise CollectionExists(f"collection {name!r}: another request is creating or deleting it")
        if b.registry.record(name) is not None or name in b.registry.aliases():
            raise CollectionExists(f"collection or alias {name!r} already exists")
        if aliased(b, name):
            raise RegistryIncomplete(name)
        physical = b.physical_name(name)
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
        b.registry.intend(physical, key)
        try:
            create_physical(b.client, physical, spec, "Strong")
            if lease.lost:
                raise BackendUnavailable(f"creating {name!r} took longer than its claim lasts; retry")
            b.registry.put_record(name, rec)
        except BaseException:
            unmake(b, name, physical)
            raise
        b.registry.remove([f"p:{physical}"])
        b.point_alias(name, physical)
        return rec
    finally:
        _release(b, key, owner, lease)


def unmake(b: Any, name: str, physical: str) -> None:
    """After a failed create: drop ``physical`` unless the record points at it after all (a write that timed out
    may have landed); if that cannot be told now, the ``p:`` row stays for :func:`.sweep.sweep`."""
    try:
        rec = b.registry.record(name)
        if rec is not None and rec.get("physical") == physical:
            b.registry.remove([f"p:{physical}"])
        elif b.drop_physical(physical):
            b.registry.remove([f"p:{physical}"])
    except Exception:
        pass


def delete(b: Any, name: str) -> list[str]:
    """Delete collection ``name`` (module docstring): alias, record, claims, aliases naming it, physical collections;
    returns the physical collections dropped.

    Raises:
        CollectionNotFound: no record (or another create or delete of it is running).
        RegistryIncomplete: Milvus holds the name's alias but the registry read has no record.
        pymilvus.MilvusException: dropping the alias failed (nothing deleted).
    """
    key, owner, lease = _claimed(b, name, "delete")
    try:
        if lease is None:
            raise CollectionNotFound(f"collection {name!r} not found (another request is creating or deleting it)")
        rec = b.registry.record(name)
        if rec is None:
            if aliased(b, name):
                raise RegistryIncomplete(name)
            raise CollectionNotFound(f"collection {name!r} not found")
        physicals = [rec["physical"]] + ([rec["reembed"]["physical"]] if rec.get("reembed") else [])
        for physical in physicals:  # a crash from here on: the sweep finishes the drops
            b.registry.intend(physical, key)
        drop_alias(b, name)  # the witness first: from now on the name reads as absent
        b.registry.remove([f"c:{name}", f"s:{name}"])
        b.registry.release(name)
        b.aliases.drop_collection(name)
        dropped = [p for p in physicals if b.drop_physical(p)]
        b.registry.remove([f"p:{p}" for p in dropped])
        return dropped
    finally:
        _release(b, key, owner, lease)
