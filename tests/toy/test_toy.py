"""The toy backbone's tooling: gold corpus, BPE tokenizer, SFT from scratch, Hugging Face output."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from morse_jax import llm
from morse_jax.mas import prompts
from morse_jax.mas.graph import SubtaskGraph
from morse_jax.tasks import synthetic
from morse_jax.toy import corpus, sft, tokenizer

TINY = sft.ToyConfig(vocab_size=1024, hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16,
                     intermediate=64, max_len=256, buckets=(256,), batch=4, lr=1e-2, warmup=3,
                     steps=20, seed=0)


@pytest.fixture(scope="module")
def problems():
  return synthetic.generate(12, 0, synthetic.train_categories())


@pytest.fixture(scope="module")
def turns(problems):
  return corpus.turns(problems)


@pytest.fixture(scope="module")
def hf_tok(turns):
  return tokenizer.train_bpe(corpus.texts(turns), TINY.vocab_size)


def test_corpus_roles_contexts_and_targets(problems, turns):
  diamond = next(p for p in problems if p.data["shape"] == "diamond")
  mine = [t for t in turns if t["problem_id"] == diamond.id]
  plan = mine[0]
  assert plan["role"] == "plan"
  assert plan["messages"] == prompts.planner(diamond.statement, 12)
  graph = SubtaskGraph.from_json(plan["target"])
  assert [n.to_dict() for n in graph.nodes] == [dict(n) for n in diamond.gold_graph]
  executes = {t["node_id"]: t for t in mine if t["role"] == "execute"}
  assert set(executes) == {n["id"] for n in diamond.gold_graph}
  for node_id, turn in executes.items():
    assert turn["target"] == synthetic.reference_artifact(diamond, node_id)
  merges = [t for t in mine if t["role"] == "merge"]
  joins = [n for n in diamond.gold_graph if len(n["depends_on"]) > 1]
  assert [t["node_id"] for t in merges] == [n["id"] for n in joins] and merges
  for merge, node in zip(merges, joins):
    # The merge target holds every parent's code in one block, and is the executor's context.
    assert merge["target"].startswith("```python\n") and merge["target"].count("```") == 2
    for parent in node["depends_on"]:
      ref = diamond.data["nodes"][parent]["reference"]
      assert ref.strip() in merge["target"]
      assert ref.strip() in merge["messages"][1]["content"]
    assert merge["target"] in executes[node["id"]]["messages"][1]["content"]
  by_id = {n["id"]: n for n in diamond.gold_graph}
  for node_id, turn in executes.items():
    parents = by_id[node_id]["depends_on"]
    user = turn["messages"][1]["content"]
    if not parents:
      assert "Results of earlier subtasks" not in user
    elif len(parents) == 1:
      assert synthetic.reference_artifact(diamond, parents[0]) in user


def test_executor_turns_of_categories():
  mixed = synthetic.generate(40, 3)
  picked = corpus.executor_turns(mixed, ("string_analysis",))
  by_id = {p.id: p for p in mixed}
  assert picked and all(t["role"] == "execute" for t in picked)
  cats = [by_id[t["problem_id"]].data["nodes"][t["node_id"]]["category"] for t in picked]
  assert set(cats) == {"string_analysis"}
  expected = sum(n["category"] == "string_analysis" for p in mixed
                 for n in p.data["nodes"].values())
  assert len(picked) == expected


def test_tokenizer_round_trips_and_chat_template(hf_tok, tmp_path, turns):
  from transformers import AutoTokenizer

  hf_tok.save_pretrained(str(tmp_path))
  ours = llm.tokenizer.load_tokenizer(str(tmp_path))
  theirs = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
  text = "def f(xs):\n    return [x  * 2 for x in xs]  # é ✓ 🙂\n"
  assert ours.decode(ours.encode(text)) == text
  messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi there"}]
  rendered = ours.decode(ours.apply_chat_template(messages), skip_special_tokens=False)
  assert rendered == ("<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n"
                      "<|im_start|>assistant\n")
  assert ours.apply_chat_template(turns[0]["messages"]) == list(
      theirs.apply_chat_template(turns[0]["messages"], add_generation_prompt=True,
                                 tokenize=True)["input_ids"])
  im_end = ours.hf.convert_tokens_to_ids(tokenizer.IM_END)
  assert ours.eos_id == im_end and ours.pad_id == 0
  im_start = ours.hf.convert_tokens_to_ids(tokenizer.IM_START)
  assert ours.encode("<|im_start|>", parse_special_tokens=True) == [im_start]
  assert im_start not in ours.encode("<|im_start|>")  # text, unless a templated prompt asks


def test_encode_masks_only_the_target_and_its_end(hf_tok, turns):
  turn = turns[1]
  tokens, mask = sft.encode(turn, hf_tok, 4096)
  im_end = hf_tok.convert_tokens_to_ids(tokenizer.IM_END)
  assert tokens[-1] == im_end and mask[-1] == 1
  answer = tokens[mask == 1]
  assert hf_tok.decode(answer[:-1].tolist()) == turn["target"]
  assert mask.sum() == len(hf_tok.encode(turn["target"], add_special_tokens=False)) + 1
  assert np.all(np.diff(mask) >= 0)  # prompt first, then target
  short, dropped = sft.examples(turns, hf_tok, 64)
  assert dropped == len(turns) and not short


@pytest.fixture(scope="module")
def trained(hf_tok, turns):
  """SFT of the tiny config on a handful of turns, their prompts cut short so that one 256-token
  bucket holds them: (config, params, (loss before, step losses, loss after), data)."""
  short = [{**t, "messages": [{"role": "user", "content": t["messages"][-1]["content"][:60]}]}
           for t in turns if t["role"] == "execute"]
  data, _ = sft.examples(short, hf_tok, TINY.max_len)
  data = data[:8]
  assert len(data) == 8
  config = sft.llm_config(TINY, len(hf_tok))
  params = sft.init_params(config, TINY.seed)
  opt = sft.optimizer(TINY)
  opt_state = opt.init(params)
  step = sft.make_train_step(config, opt)
  stream = sft.batches(data, TINY.buckets, TINY.batch, hf_tok.pad_token_id, 0)
  before = sft.evaluate_loss(params, config, data, TINY.buckets, TINY.batch, hf_tok.pad_token_id)
  losses = []
  for _ in range(TINY.steps):
    params, opt_state, metrics = step(params, opt_state, next(stream))
    losses.append(float(metrics["loss"]))
  after = sft.evaluate_loss(params, config, data, TINY.buckets, TINY.batch, hf_tok.pad_token_id)
  return config, params, (before, losses, after), data


def test_sft_loss_drops(trained, hf_tok):
  config, _, (before, losses, after), _ = trained
  assert config.vocab_size >= len(hf_tok) and config.vocab_size % 64 == 0
  assert np.all(np.isfinite(losses))
  assert before > np.log(len(hf_tok)) - 1.0  # starts near uniform
  assert after < 0.6 * before, (before, losses, after)
  assert np.mean(losses[-4:]) < 0.7 * np.mean(losses[:4])


def test_saved_model_loads_matches_transformers_and_samples(trained, hf_tok, tmp_path, turns):
  from transformers import AutoModelForCausalLM

  config, params, _, _ = trained
  path = str(tmp_path / "toy")
  sft.save(path, config, params, hf_tok)
  with open(os.path.join(path, "generation_config.json")) as f:
    gen = json.load(f)
  im_end = hf_tok.convert_tokens_to_ids(tokenizer.IM_END)
  assert im_end in gen["eos_token_id"]
  model = llm.load(path)
  assert model.config == config and im_end in model.stop_ids
  assert model.tokenizer.pad_id == hf_tok.pad_token_id
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               model.params, params)

  prompt = model.tokenizer.apply_chat_template(turns[1]["messages"])[:40]
  ours, _ = llm.forward(model.params, model.config, jnp.asarray([prompt]))
  torch_model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
  with torch.no_grad():
    ref = torch_model(torch.tensor([prompt], dtype=torch.long)).logits.float().numpy()
  np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=0)

  out = llm.sample(model, [prompt], llm.GenerationSettings.for_model(model, 8, llm.GREEDY),
                   rng=jax.random.key(0))
  assert np.asarray(out.tokens).shape[0] == 1
  model.tokenizer.decode(np.asarray(out.tokens)[0].tolist())
