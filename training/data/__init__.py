"""Data loaders: STS evaluation sets, the unsupervised corpus and NLI triplets."""
