"""The GPU kit: what a lent GPU machine needs (packages, models, data) and the scripts a device session runs."""
