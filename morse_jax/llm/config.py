"""Typed, validated model configuration, read from and written to Hugging Face config.json.

Both config.json layouts are accepted: transformers 5 nests `rope_theta` and the scaling under
`rope_parameters`; older files carry top-level `rope_theta` and `rope_scaling`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

FAMILIES = ("llama", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")


class ConfigError(ValueError):
  """A config.json field is missing, mistyped or unsupported; the message names it."""


@dataclasses.dataclass(frozen=True)
class RopeConfig:
  theta: float = 10000.0
  type: str = "default"
  factor: float = 1.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192

  def __post_init__(self):
    if self.type not in ROPE_TYPES:
      raise ConfigError(f"rope type {self.type!r} is not supported (supported: {ROPE_TYPES})")
    if self.theta <= 0:
      raise ConfigError(f"rope_theta must be > 0, got {self.theta!r}")
    if self.type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
      raise ConfigError(
          f"llama3 rope needs high_freq_factor > low_freq_factor, got "
          f"{self.high_freq_factor!r} <= {self.low_freq_factor!r}")


@dataclasses.dataclass(frozen=True)
class LlmConfig:
  """Architecture of a decoder-only model. Hashable, so it can be a static jit argument."""

  model_type: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope: RopeConfig = RopeConfig()
  tie_word_embeddings: bool = False
  qkv_bias: bool = False  # Qwen2 always; Llama / Qwen3 when attention_bias
  o_bias: bool = False  # Llama / Qwen3 when attention_bias
  qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
  max_position_embeddings: int = 8192
  # Qwen2.5-VL's multimodal rotary (mrope): how many of the head_dim / 2 frequencies each of the
  # three position streams (temporal, height, width) drives, in order, repeating t, h, w; None:
  # one position stream. With all three streams equal it is the plain rotary.
  mrope_section: tuple[int, ...] | None = None

  def __post_init__(self):
    if self.model_type not in FAMILIES:
      raise ConfigError(f"model_type {self.model_type!r} is not supported (supported: {FAMILIES})")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(
          f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
          f"({self.num_kv_heads})")
    if self.head_dim % 2:
      raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
    if not self.rms_norm_eps > 0:
      raise ConfigError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
    if self.mrope_section is not None and sum(self.mrope_section) != self.head_dim // 2:
      raise ConfigError(f"mrope_section {list(self.mrope_section)} must sum to head_dim / 2 "
                        f"({self.head_dim // 2})")

  @property
  def q_size(self) -> int:
    return self.num_heads * self.head_dim

  @property
  def kv_size(self) -> int:
    return self.num_kv_heads * self.head_dim

  def num_params(self) -> int:
    d, f, layers = self.hidden_size, self.intermediate_size, self.num_layers
    per_layer = d * (self.q_size + 2 * self.kv_size) + self.q_size * d + 3 * d * f + 2 * d
    per_layer += (self.q_size + 2 * self.kv_size) * self.qkv_bias + d * self.o_bias
    per_layer += 2 * self.head_dim * self.qk_norm
    head = 0 if self.tie_word_embeddings else d * self.vocab_size
    return self.vocab_size * d + layers * per_layer + d + head

  # ---- Hugging Face config.json ----

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json") -> "LlmConfig":
    """Reads a transformers config dict (old or new layout); `source` names the file in errors."""

    def need(key):
      if key not in hf or hf[key] is None:
        raise ConfigError(f"{source}: required field {key!r} is missing")
      return hf[key]

    model_type = need("model_type")
    if model_type not in FAMILIES:
      raise ConfigError(f"{source}: model_type {model_type!r} is not supported "
                        f"(supported: {FAMILIES})")
    if hf.get("hidden_act", "silu") != "silu":
      raise ConfigError(f"{source}: hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    if hf.get("mlp_bias"):
      raise ConfigError(f"{source}: mlp_bias=True is not supported")
    if hf.get("use_sliding_window"):
      raise ConfigError(f"{source}: use_sliding_window=True is not supported")
    num_heads = need("num_attention_heads")
    hidden = need("hidden_size")
    head_dim = hf.get("head_dim") or hidden // num_heads  # Qwen2 writes head_dim: null
    attention_bias = bool(hf.get("attention_bias", False))
    try:
      return cls(
          model_type=model_type,
          vocab_size=need("vocab_size"),
          hidden_size=hidden,
          intermediate_size=need("intermediate_size"),
          num_layers=need("num_hidden_layers"),
          num_heads=num_heads,
          num_kv_heads=hf.get("num_key_value_heads") or num_heads,
          head_dim=head_dim,
          rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
          rope=_rope_from_hf(hf, source),
          tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
          qkv_bias=model_type == "qwen2" or attention_bias,
          o_bias=model_type != "qwen2" and attention_bias,
          qk_norm=model_type == "qwen3",
          max_position_embeddings=int(hf.get("max_position_embeddings", 8192)),
          mrope_section=_mrope_from_hf(hf),
      )
    except ConfigError as e:
      raise ConfigError(f"{source}: {e}") from None

  def to_hf_dict(self) -> dict[str, Any]:
    """The fields transformers needs to rebuild this architecture (transformers 5 layout)."""
    rope: dict[str, Any] = {"rope_theta": self.rope.theta, "rope_type": self.rope.type}
    if self.rope.type == "linear":
      rope["factor"] = self.rope.factor
    elif self.rope.type == "llama3":
      rope.update(factor=self.rope.factor, low_freq_factor=self.rope.low_freq_factor,
                  high_freq_factor=self.rope.high_freq_factor,
                  original_max_position_embeddings=self.rope.original_max_position_embeddings)
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM"}[self.model_type]
    out = {
        "architectures": [arch],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": self.rms_norm_eps,
        "rope_parameters": rope,
        "tie_word_embeddings": self.tie_word_embeddings,
        "max_position_embeddings": self.max_position_embeddings,
    }
    if self.model_type != "qwen2":
      out["attention_bias"] = self.qkv_bias
    if self.mrope_section is not None:
      rope["mrope_section"] = list(self.mrope_section)
    return out


def _mrope_from_hf(hf: dict[str, Any]) -> tuple[int, ...] | None:
  for key in ("rope_parameters", "rope_scaling"):
    section = (hf.get(key) or {}).get("mrope_section")
    if section is not None:
      return tuple(int(s) for s in section)
  return None


def _rope_from_hf(hf: dict[str, Any], source: str) -> RopeConfig:
  params = dict(hf.get("rope_parameters") or {})
  # transformers 5 may key rope_parameters by layer type; all our families use one.
  if "full_attention" in params and isinstance(params["full_attention"], dict):
    params = dict(params["full_attention"])
  legacy = hf.get("rope_scaling") or {}
  theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
  kind = params.get("rope_type") or legacy.get("rope_type") or legacy.get("type") or "default"
  if kind == "mrope":  # Qwen2-VL's older files: the default rotary, over three position streams
    kind = "default"
  merged = {**legacy, **params}
  if kind not in ROPE_TYPES:
    raise ConfigError(f"{source}: rope type {kind!r} is not supported (supported: {ROPE_TYPES})")
  fields: dict[str, Any] = {"theta": float(theta), "type": kind}
  if kind in ("linear", "llama3"):
    if "factor" not in merged:
      raise ConfigError(f"{source}: rope type {kind!r} needs field 'factor'")
    fields["factor"] = float(merged["factor"])
  if kind == "llama3":
    for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
      if key not in merged:
        raise ConfigError(f"{source}: rope type 'llama3' needs field {key!r}")
    fields.update(low_freq_factor=float(merged["low_freq_factor"]),
                  high_freq_factor=float(merged["high_freq_factor"]),
                  original_max_position_embeddings=int(merged["original_max_position_embeddings"]))
  return RopeConfig(**fields)
