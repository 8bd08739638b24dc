"""The paper's backbones as `LlmConfig`s, from their Hugging Face config.json, by the name
config.model.name gives (`configs/morse/common.BACKBONES`): the shapes `launchers.fit` measures
through `rl.aot` when no checkpoint is at hand."""

from __future__ import annotations

from morse_jax.llm import vl
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
    # the paper's single-agent comparison backbone; `benchmarks.ragged` decodes at its shapes
    "Qwen2.5-Coder-1.5B-Instruct": LlmConfig(
        "qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
        num_heads=12, num_kv_heads=2, head_dim=128, rope=RopeConfig(theta=1e6),
        tie_word_embeddings=True, qkv_bias=True, max_position_embeddings=32768),
    "Llama-3.1-8B-Instruct": LlmConfig(
        "llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
        rope=RopeConfig(theta=5e5, type="llama3", factor=8.0, low_freq_factor=1.0,
                        high_freq_factor=4.0, original_max_position_embeddings=8192),
        max_position_embeddings=131072),
}

# Qwen2.5-VL-7B-Instruct's config.json (the APEx executor), the fields the model reads; `vl_preset`
# turns it into a VlConfig (the vision tower's depth 32 x 1280, windows of 112 px, full
# attention in blocks 7, 15, 23, 31; the text decoder 28 x 3584 with mrope [16, 24, 24]).
VL_HF_CONFIGS = {
    "qwen25_vl_7b": {
        "model_type": "qwen2_5_vl", "vocab_size": 152064, "hidden_size": 3584,
        "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 128000, "tie_word_embeddings": False, "hidden_act": "silu",
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
        "vision_end_token_id": 151653, "image_token_id": 151655, "video_token_id": 151656,
        "vision_config": {
            "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
            "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
            "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
            "temporal_patch_size": 2, "hidden_act": "silu"},
    },
}


def vl_preset(name: str):
  """The VlConfig of a VL_HF_CONFIGS name (refused naming the known ones)."""
  if name not in VL_HF_CONFIGS:
    raise ValueError(f"VL preset {name!r} not in {sorted(VL_HF_CONFIGS)}")
  return vl.VlConfig.from_hf_dict(VL_HF_CONFIGS[name], f"presets.VL_HF_CONFIGS[{name!r}]")
