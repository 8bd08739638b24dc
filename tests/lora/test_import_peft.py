"""A PEFT LoRA adapter read as one expert: what peft itself saves (random A and B, two targets,
chosen layers), what export_peft writes, and adapters we cannot represent, named."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import llm
from morse_jax.lora import export
from morse_jax.lora.experts import make_adapter
from tests import tiny_models
from tests.lora.test_mixture import LORA, llama, peft_logits  # noqa: F401 -- shared fixture


def ours(model, experts, lora, tokens):
  adapter = make_adapter(experts, lora, model.config, [[0]] * tokens.shape[0], "dense")
  return llm.forward(model.params, model.config, tokens, adapter=adapter)[0]


@pytest.fixture(scope="module")
def peft_saved(llama, tmp_path_factory):  # noqa: F811
  """An adapter written by peft's save_pretrained, B randomised (peft starts it at 0)."""
  import copy

  import torch
  from peft import LoraConfig, get_peft_model

  _, torch_model, _ = llama
  torch.manual_seed(0)
  num_layers = torch_model.config.num_hidden_layers
  peft_model = get_peft_model(copy.deepcopy(torch_model), LoraConfig(
      r=3, lora_alpha=5, target_modules=["q_proj", "down_proj"], lora_dropout=0.0,
      layers_to_transform=[0, num_layers - 1]))
  with torch.no_grad():
    for name, p in peft_model.named_parameters():
      if "lora_B" in name:
        p.normal_(0, 0.3)
  path = tmp_path_factory.mktemp("peft_adapter")
  peft_model.save_pretrained(str(path))
  return str(path)


def test_adapter_saved_by_peft_gives_peft_logits(llama, peft_saved):  # noqa: F811
  model, torch_model, _ = llama
  experts, lora = export.import_peft(peft_saved, model.config)
  assert lora.targets == ("q", "down") and lora.rank == 3 and lora.scale == 5 / 3
  assert lora.adapted_layers(model.config) == (0, model.config.num_layers - 1)
  tokens = jnp.asarray(tiny_models.random_tokens(5, (2, 9)))
  plain, _ = llm.forward(model.params, model.config, tokens)
  theirs = peft_logits(torch_model, peft_saved, tokens)
  assert np.abs(theirs - np.asarray(plain)).max() > 1e-2  # the adapter changes the logits
  np.testing.assert_allclose(ours(model, experts, lora, tokens), theirs, atol=1e-4)


def test_exported_route_reads_back_as_the_same_mixture(llama, tmp_path):  # noqa: F811
  model, _, experts = llama
  route = [1, 3]
  export.export_peft(experts, LORA, model.config, route, str(tmp_path))
  imported, lora = export.import_peft(str(tmp_path), model.config)
  tokens = jnp.asarray(tiny_models.random_tokens(6, (2, 7)))
  mixed, _ = llm.forward(model.params, model.config, tokens, adapter=make_adapter(
      experts, LORA, model.config, [route] * 2, "dense"))
  np.testing.assert_allclose(ours(model, imported, lora, tokens), mixed, atol=1e-5)


def _rewrite(src, dst, **changes):
  import shutil

  shutil.copytree(src, dst)
  with open(f"{dst}/adapter_config.json") as f:
    cfg = json.load(f)
  cfg.update(changes)
  with open(f"{dst}/adapter_config.json", "w") as f:
    json.dump(cfg, f)
  return str(dst)


@pytest.mark.parametrize("changes,match", [
    ({"use_rslora": True}, "use_rslora=True is not supported"),
    ({"use_dora": True}, "use_dora=True is not supported"),
    ({"r": 0}, "r must be a positive integer, got 0"),
    ({"lora_alpha": "big"}, "lora_alpha must be a positive number, got 'big'"),
    ({"peft_type": "IA3"}, "peft_type must be 'LORA', got 'IA3'"),
    ({"rank_pattern": {"q_proj": 8}}, "rank_pattern .* is not supported"),
    ({"r": 5}, r"do not fit the model .* rank 5"),
])
def test_adapters_we_cannot_represent_are_named(llama, peft_saved, tmp_path, changes,  # noqa: F811
                                                match):
  model = llama[0]
  with pytest.raises(export.PeftAdapterError, match=match):
    export.import_peft(_rewrite(peft_saved, tmp_path / "a", **changes), model.config)


def test_broken_files_are_named(llama, peft_saved, tmp_path):  # noqa: F811
  from safetensors.numpy import load_file, save_file

  model = llama[0]
  with pytest.raises(export.PeftAdapterError, match="adapter_config.json: cannot read"):
    export.import_peft(str(tmp_path / "missing"), model.config)
  path = _rewrite(peft_saved, tmp_path / "b")
  tensors = load_file(f"{path}/adapter_model.safetensors")
  dropped = next(k for k in tensors if "lora_B" in k)
  save_file({k: v for k, v in tensors.items() if k != dropped},
            f"{path}/adapter_model.safetensors")
  with pytest.raises(export.PeftAdapterError, match="needs lora_A and lora_B .* missing"):
    export.import_peft(path, model.config)
  save_file({"model.embed_tokens.weight": np.zeros((2, 2), np.float32)},
            f"{path}/adapter_model.safetensors")
  with pytest.raises(export.PeftAdapterError, match="'model.embed_tokens.weight' is not a LoRA"):
    export.import_peft(path, model.config)
