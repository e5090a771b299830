"""Training objectives: a registry of :class:`~training.objectives.base.Objective` classes.

One file per method (``training/objectives/<type>.py``); see ``base.py`` for the interface.
:func:`build_objective` imports ``training.objectives.<type>`` on demand, so a new method is
one new file with ``@register("<type>")`` on its class.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from training.objectives.base import LossOutput, Objective, ObjectiveBatch, ObjectiveContext

_REGISTRY: dict[str, type[Objective]] = {}


def register(type_name: str) -> Callable[[type[Objective]], type[Objective]]:
    """Class decorator: make an :class:`Objective` available as ``type: <type_name>`` in configs."""

    def deco(cls: type[Objective]) -> type[Objective]:
        cls.type_name = type_name
        _REGISTRY[type_name] = cls
        return cls

    return deco


def get_objective_class(type_name: str) -> type[Objective]:
    """The class registered as ``type_name``, importing ``training.objectives.<type_name>`` if needed.

    Raises:
        KeyError: no module/class provides ``type_name``.
    """
    if type_name not in _REGISTRY:
        try:
            importlib.import_module(f"training.objectives.{type_name}")
        except ModuleNotFoundError as e:
            if e.name != f"training.objectives.{type_name}":
                raise
    if type_name not in _REGISTRY:
        raise KeyError(f"unknown objective type {type_name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[type_name]


def build_objective(type_name: str, ctx: ObjectiveContext, params: dict[str, Any] | None = None) -> Objective:
    """Instantiate objective ``type_name`` with ``params`` as keyword arguments.

    Raises:
        KeyError: unknown type. ValueError: it needs hard negatives but ``ctx.supervised`` is false.
    """
    cls = get_objective_class(type_name)
    obj = cls(ctx, **(params or {}))
    if obj.requires_hard_negative and not ctx.supervised:
        raise ValueError(f"objective {type_name!r} needs supervised triplets (data.mode: sup)")
    return obj


__all__ = [
    "LossOutput",
    "Objective",
    "ObjectiveBatch",
    "ObjectiveContext",
    "build_objective",
    "get_objective_class",
    "register",
]
