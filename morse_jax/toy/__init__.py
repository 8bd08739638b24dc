"""A toy backbone for CPU demos: a gold-data corpus of agent turns, a BPE tokenizer trained on it,
and supervised training of a small Qwen3-architecture model from scratch (launchers/pretrain_toy).
"""
