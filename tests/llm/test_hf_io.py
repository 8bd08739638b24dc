"""Loading and saving Hugging Face folders: layouts, shards, tokenizer, and clear errors."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from morse_jax import llm
from tests import tiny_models


def copy_folder(src, tmp_path):
  dst = str(tmp_path / "model")
  shutil.copytree(src, dst)
  return dst


def edit_json(path, **changes):
  with open(path) as f:
    data = json.load(f)
  for key, value in changes.items():
    if value is None:
      data.pop(key, None)
    else:
      data[key] = value
  with open(path, "w") as f:
    json.dump(data, f)


def test_both_config_layouts_give_the_same_config():
  new = {"model_type": "llama", "vocab_size": 10, "hidden_size": 16, "intermediate_size": 32,
         "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
         "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}}
  old = {k: v for k, v in new.items() if k != "rope_parameters"}
  old.update(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 8192})
  a, b = llm.LlmConfig.from_hf_dict(new), llm.LlmConfig.from_hf_dict(old)
  assert a == b and a.rope.type == "llama3" and a.rope.theta == 500000.0
  assert llm.LlmConfig.from_hf_dict(a.to_hf_dict()) == a


def test_qwen2_null_head_dim_and_implied_biases():
  cfg = llm.LlmConfig.from_hf_dict({
      "model_type": "qwen2", "vocab_size": 10, "hidden_size": 64, "intermediate_size": 32,
      "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": None, "rope_theta": 1e6})
  assert cfg.head_dim == 16 and cfg.qkv_bias and not cfg.o_bias and not cfg.qk_norm


def test_qwen3_head_dim_is_independent_of_hidden_size(hf_folders):
  model = llm.load(hf_folders["qwen3"][0])
  assert model.config.head_dim == 16 and model.config.hidden_size == 32
  assert model.params.layers.wq.shape == (2, 64, 32) and model.config.qk_norm


@pytest.mark.parametrize("field,value,match", [
    ("model_type", "gpt2", "model_type 'gpt2' is not supported"),
    ("hidden_size", None, "'hidden_size' is missing"),
    ("num_key_value_heads", 3, "multiple of num_key_value_heads"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1.0}, "rope type 'yarn'"),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 1.0, "factor": 8.0},
     "needs field 'low_freq_factor'"),
])
def test_bad_config_names_file_and_field(field, value, match, hf_folders, tmp_path):
  folder = copy_folder(hf_folders["llama"][0], tmp_path)
  edit_json(os.path.join(folder, "config.json"), **{field: value})
  with pytest.raises(llm.ConfigError, match=match) as info:
    llm.load(folder)
  assert "config.json" in str(info.value)


def test_missing_files_are_named(hf_folders, tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    llm.load(str(tmp_path))
  folder = copy_folder(hf_folders["qwen2"][0], tmp_path)
  os.remove(os.path.join(folder, "model.safetensors"))
  with pytest.raises(FileNotFoundError, match="no model.safetensors"):
    llm.load(folder)


def test_missing_and_misshaped_tensors_are_named(hf_folders, tmp_path):
  folder = copy_folder(hf_folders["qwen2"][0], tmp_path)
  weights_path = os.path.join(folder, "model.safetensors")
  tensors = load_file(weights_path)
  name = "model.layers.1.self_attn.k_proj.bias"
  missing = {k: v for k, v in tensors.items() if k != name}
  save_file(missing, weights_path)
  with pytest.raises(llm.CheckpointError, match=name.replace(".", r"\.") + ".*missing"):
    llm.load(folder)
  bad = dict(tensors)
  bad["model.layers.0.mlp.up_proj.weight"] = np.zeros((64, 31), np.float32)
  save_file(bad, weights_path)
  with pytest.raises(llm.CheckpointError,
                     match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.up_proj\.weight' "
                           r"has shape \(64, 31\), expected \(64, 32\)"):
    llm.load(folder)


def test_sharded_checkpoint_round_trip(hf_folders, tmp_path):
  model = llm.load(hf_folders["llama"][0])
  out = str(tmp_path / "sharded")
  llm.save(model, out, max_shard_bytes=20_000)
  index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
  shards = sorted(set(index["weight_map"].values()))
  assert len(shards) > 2 and not os.path.exists(os.path.join(out, "model.safetensors"))
  again = llm.load(out)
  tokens = jnp.asarray(tiny_models.random_tokens(0, (1, 8)))
  a, _ = llm.forward(model.params, model.config, tokens)
  b, _ = llm.forward(again.params, again.config, tokens)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  os.remove(os.path.join(out, shards[1]))
  with pytest.raises(FileNotFoundError, match=shards[1]):
    llm.load(out)


def test_transformers_sharded_layout_loads(hf_folders, tmp_path):
  torch_model = hf_folders["qwen3"][1]
  torch_model.save_pretrained(str(tmp_path), max_shard_size="20KB")
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  model = llm.load(str(tmp_path))
  assert model.tokenizer is None and model.stop_ids == ()
  np.testing.assert_array_equal(
      np.asarray(model.params.layers.q_norm[1]),
      torch_model.model.layers[1].self_attn.q_norm.weight.detach().numpy())


def test_tokenizer_chat_template_and_stop_ids(hf_folders):
  model = llm.load(hf_folders["llama"][0])
  tok = model.tokenizer
  ids = tok.apply_chat_template([{"role": "user", "content": "w1 w2"}])
  assert tok.decode(ids, skip_special_tokens=False).split() == [
      "<|user|>", "w1", "w2", "<|end|>", "<|assistant|>"]
  assert model.stop_ids == (1, 7)  # generation_config.json list; tokenizer EOS (1) already in it
  assert tok.encode("w3 w4") == [tok.hf.convert_tokens_to_ids("w3"),
                                  tok.hf.convert_tokens_to_ids("w4")]


def test_tokenizer_without_chat_template_is_a_clear_error(tmp_path):
  tiny_models.make_tokenizer(chat_template=None).save_pretrained(str(tmp_path))
  tok = llm.tokenizer.load_tokenizer(str(tmp_path))
  with pytest.raises(llm.TokenizerError, match="tokenizer_config.json.*chat_template"):
    tok.apply_chat_template([{"role": "user", "content": "w1"}])


def test_bad_generation_config_is_named(hf_folders, tmp_path):
  folder = copy_folder(hf_folders["llama"][0], tmp_path)
  edit_json(os.path.join(folder, "generation_config.json"), eos_token_id="two")
  with pytest.raises(llm.TokenizerError, match="generation_config.json: eos_token_id"):
    llm.load(folder)
