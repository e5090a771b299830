"""Collection-layer costs: filters, ordering, vector indexes, scale, snapshots, Qdrant reads."""
