"""The native collections API (``/collections/...``): collections, points, search, aliases, snapshots and vector
names, translated into :class:`service.collections.service.CollectionService` calls."""
