"""The paper's backbones as `LlmConfig`s, from their Hugging Face config.json, by the name
config.model.name gives (`configs/morse/common.BACKBONES`): the shapes `launchers.fit` measures
through `rl.aot` when no checkpoint is at hand."""

from __future__ import annotations

from morse_jax.llm.config import LlmConfig, RopeConfig

ARCHITECTURES = {
    "Qwen3-4B-Instruct-2507": LlmConfig(
        "qwen3", vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_layers=36,
        num_heads=32, num_kv_heads=8, head_dim=128, rope=RopeConfig(theta=5e6),
        tie_word_embeddings=True, qk_norm=True, max_position_embeddings=262144),
    "Qwen3-8B": LlmConfig(
        "qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
        num_heads=32, num_kv_heads=8, head_dim=128, rope=RopeConfig(theta=1e6),
        qk_norm=True, max_position_embeddings=40960),
    "Llama-3.1-8B-Instruct": LlmConfig(
        "llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
        rope=RopeConfig(theta=5e5, type="llama3", factor=8.0, low_freq_factor=1.0,
                        high_freq_factor=4.0, original_max_position_embeddings=8192),
        max_position_embeddings=131072),
}
