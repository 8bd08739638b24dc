"""The shared frozen backbone: config, weights, forward pass, HF I/O, tokenizer, sampler, sharding."""

from morse_jax.llm.config import ConfigError, LlmConfig, RopeConfig
from morse_jax.llm.bundle import Model
from morse_jax.llm.hf import CheckpointError, save
from morse_jax.llm.loader import load
from morse_jax.llm.model import KVCache, forward, init_cache
from morse_jax.llm.params import LayerParams, Params, init_random, param_shapes
from morse_jax.llm import fused_decode, tokenizer
from morse_jax.llm.tokenizer import Tokenizer, TokenizerError
from morse_jax.llm.sampling import (GREEDY, GenerationSettings, SampleOutput, SamplingConfig,
                                    bucket, generate_padded, length_bucket, sample)
