"""Load and serving: throughput, latency under load, model swaps, batch shapes, backends and replicas."""
