"""Quality: retrieval and reranking on BEIR SciFact, STS training benchmarks and reproductions."""
