"""Data: STS evaluation sets (:mod:`.sts`), SentEval transfer tasks (:mod:`.transfer`), training examples and
their batches (:mod:`.train_data`: sentences, NLI triplets, positive pairs), and the 3R redundant pool
(:mod:`.redundant_pool`)."""
