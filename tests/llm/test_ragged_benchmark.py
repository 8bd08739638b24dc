"""benchmarks.ragged at tiny sizes: the three sides run the same requests, report what they did
and agree on greedy tokens; the models its --model names (no timing is checked)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import common, ragged
from morse_jax import llm
from morse_jax.llm import presets
from tests import tiny_models

PROMPT_LENGTHS = [9, 23, 5, 14, 30]
REPLIES = [3, 17, 6, 11, 4]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("llama"))
  tiny_models.save_hf_model("llama", path)
  return path


def prompts():
  return [tiny_models.random_tokens(i, (n,)).tolist() for i, n in enumerate(PROMPT_LENGTHS)]


@pytest.mark.slow  # compiles the engine's, the sampler's and transformers' programs
def test_the_sides_agree_and_report_their_padding(folder):
  model = dataclasses.replace(llm.load(folder), stop_ids=())
  sides = {"engine": ragged.run_engine(model, prompts(), REPLIES, slots=2, steps_per_call=4,
                                       prefill_chunk=16),
           "static": ragged.run_static(model, prompts(), REPLIES, slots=2),
           "transformers": ragged.run_transformers(folder, "float32", prompts(), REPLIES,
                                                   slots=2, pad_id=model.pad_id, threads=1)}
  tokens = {name: side.pop("tokens") for name, side in sides.items()}
  for side in sides.values():
    side.pop("logprobs", None)
  assert [len(t) for t in tokens["engine"]] == REPLIES
  # batches of 2 in arrival order, each run to its longest: 2 x 17 + 2 x 11 + 4
  assert sides["static"]["row_tokens_computed"] == 60
  assert sides["transformers"]["row_tokens_computed"] == 60
  assert sides["static"]["padding_share"] == pytest.approx(1 - sum(REPLIES) / 60)
  assert sides["engine"]["kv_bound_worst"] <= 1.0  # held <= 1.25 live + a page per row
  out = ragged.report({"requests": 5}, sides, tokens)
  assert out["greedy_equal"] and out["greedy_rows_equal"] == 5
  assert out["transformers_greedy_equal"], out["transformers_greedy_rows_equal"]
  assert out["ratio_vs_transformers"] == pytest.approx(
      sides["engine"]["tokens_per_s"] / sides["transformers"]["tokens_per_s"])
  partial = ragged.report({"requests": 5}, {"engine": sides["engine"]},
                          {"engine": tokens["engine"]})
  assert partial["ratio_vs_static"] is None and "greedy_equal" not in partial


@pytest.mark.slow  # ~7 s: builds each named model
def test_named_models(monkeypatch):
  tiny = common.bench_model("tiny")
  assert (tiny.config.num_layers, tiny.config.hidden_size) == (2, 64)
  assert tiny.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                            add_generation_prompt=True)
  shape = dataclasses.replace(tiny.config, num_layers=3)
  monkeypatch.setitem(presets.ARCHITECTURES, "Small-Preset", shape)
  random = common.bench_model("Small-Preset", "bfloat16")
  assert random.config == shape and str(random.params.embed.dtype) == "bfloat16"
  assert common.model_folder("Small-Preset") is None and common.model_folder("tiny") is None
  assert common.model_folder("/some/folder") == "/some/folder"


def test_divergences_name_where_sides_part_and_the_two_logits_there(folder):
  model = llm.load(folder)
  prompt = prompts()[1]
  logits = np.asarray(llm.forward(model.params, model.config, jnp.asarray([prompt]))[0][0, -1])
  first, second = np.argsort(logits)[::-1][:2].tolist()
  same = [5, 6, 7]
  parted = ragged.divergences(model, [prompt, prompt, prompt], [[first, 1], same, same],
                              [[second, 2], same, same + [8]])
  assert [d["request"] for d in parted] == [0, 2]  # request 1 agrees: not listed
  tie, longer = parted
  assert tie["at"] == 0 and tie["tokens"] == [first, second] and tie["f32_argmax"] == first
  np.testing.assert_allclose(tie["logits"], [logits[first], logits[second]], rtol=1e-5)
  gap = logits[first] - logits[second]
  spacing = 2.0 ** (np.floor(np.log2(abs(logits[first]))) - 7)
  assert tie["gap"] == pytest.approx(gap, rel=1e-4) and tie["spacing"] == spacing
  assert tie["near_tie"] == (gap <= spacing)
  assert longer == {"request": 2, "at": 3}  # the same tokens, one reply longer: no logits


def test_logprob_noise_is_the_largest_difference_before_the_tokens_part():
  ours, theirs = [[1, 2, 3], [4, 5], [6]], [[1, 2, 9], [4, 5], [6, 7]]
  ours_logp = [[-0.1, -0.2, -5.0], [-1.0, -2.0], [-0.5]]
  theirs_logp = [[-0.1, -0.23, -0.1], [-1.01, -2.0], [-0.5, -9.0]]
  # request 0 parts at 2 (its -5 vs -0.1 is not noise), request 2 only in length
  assert ragged.logprob_noise(ours, theirs, ours_logp, theirs_logp) == pytest.approx(0.03)
