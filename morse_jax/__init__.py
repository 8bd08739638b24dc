"""MoRSE in JAX: a frozen decoder, role and subtask LoRA experts, and HGRPO training."""
