"""Cost bounds of expensive queries, checked before any work from the request alone (the settings name each bound):
a query whose work would exceed one is refused (422) instead of running until its time budget runs out.

* a formula (:mod:`.formula`) evaluates each of its conditions on every point its prefetches return: the values
  of its conditions' filters (:func:`.filter_match.filter_size`, each condition at least one) times the sum of the
  prefetches' limits is at most ``collections_max_formula_work``.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.collections.errors import InvalidCollectionRequest
from service.collections.filter_match import filter_size
from service.collections.filters import Filter
from service.collections.vector_backend import CollectionSettings


def check_formula_work(settings: CollectionSettings, filters: Sequence[Filter | None], points: int) -> None:
    """Refuse a formula whose conditions (``filters``, None: every point matches), evaluated on each of the at most
    ``points`` prefetched points, would check more than ``collections_max_formula_work`` values.

    Raises:
        InvalidCollectionRequest: over the bound (``query.formula``).
    """
    values = sum(max(1, filter_size(f)) for f in filters)
    if (work := points * values) > (cap := settings.max_formula_work):
        raise InvalidCollectionRequest(
            f"the formula's conditions hold {values} values, checked on each of up to {points} prefetched points: "
            f"{work} checks, over {cap} (collections_max_formula_work); lower the prefetch limits or the "
            "conditions' values",
            "query.formula",
        )
