"""Masked-language-model pretraining: make a *raw* encoder here (``python -m training pretrain``).

BERT's objective (Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding", arXiv:1810.04805, §3.1 "Task #1: Masked LM"): 15 % of the tokens are chosen; of those 80 %
become ``[MASK]``, 10 % a random token, 10 % stay; the loss is cross-entropy on the chosen tokens only.
The model, the masking and the WordPiece vocabulary come from ``transformers`` (``BertConfig``,
``BertForMaskedLM``, ``DataCollatorForLanguageModeling``) and ``tokenizers``; this package only wires them
into a resumable CPU/GPU loop with the same conventions as ``python -m training train``.

Modules: :mod:`.config` (settings), :mod:`.data` (corpus split, vocabulary, batches),
:mod:`.loop` (model, optimisation, checkpoints, metrics); the command is :mod:`training.cli.pretrain`.
"""
