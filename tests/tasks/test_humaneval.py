"""HumanEval from the installed package: loading, the canonical solutions pass, bad ones fail."""

from __future__ import annotations

import concurrent.futures
import textwrap
import time

import pytest

from morse_jax.tasks import humaneval

# 10, 32: prompts with a helper function; 81, 134: canonical bodies that start unindented lines.
SAMPLE = ("HumanEval/0", "HumanEval/10", "HumanEval/32", "HumanEval/81", "HumanEval/134")


@pytest.fixture(scope="module")
def problems():
  return {p.id: p for p in humaneval.load()}


def _score(family, problem, artifact):
  return family.score_node(problem, problem.gold_graph[0], artifact, {})


def test_load_all_problems(problems):
  assert len(problems) == 164
  p = problems["HumanEval/0"]
  assert (p.family, p.category) == ("humaneval", "humaneval")
  assert p.statement == p.data["prompt"] and "def has_close_elements" in p.statement
  assert set(p.data) == {"prompt", "test", "entry_point", "canonical_solution"}
  assert p.gold_graph == [{"id": "1", "title": "has_close_elements", "depends_on": [],
                           "description": p.gold_graph[0]["description"]}]
  assert humaneval.data_path().endswith("HumanEval.jsonl.gz")


def test_load_errors_name_the_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"task_id": "a", "prompt": "p", "entry_point": "f", '
                  '"canonical_solution": "", "test": ""}\n{"task_id": "b"}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:2: field 'prompt'"):
    humaneval.load(str(path))


def test_canonical_solutions_pass(problems):
  family = humaneval.HumanEval()
  for pid in SAMPLE:
    score = _score(family, problems[pid], humaneval.canonical_artifact(problems[pid]))
    assert (score.reward, score.passed) == (1.0, True), (pid, score.details)


def test_reply_forms(problems):
  family = humaneval.HumanEval()
  p = problems["HumanEval/32"]  # find_zero calls the prompt's helper poly
  full = "```python\nimport math\n\ndef find_zero(xs):\n" + p.data["canonical_solution"] + "```"
  assert _score(family, p, full).passed
  p = problems["HumanEval/0"]
  body = p.data["canonical_solution"]
  assert _score(family, p, body).passed  # a raw completion, no fence
  assert _score(family, p, f"```python\n{textwrap.dedent(body)}```").passed  # indent dropped
  assert not humaneval.HumanEval(allow_unfenced=False).score_node(p, {"id": "1"}, body, {}).passed


def test_wrong_and_stub_bodies_fail(problems):
  family = humaneval.HumanEval()
  p = problems["HumanEval/0"]
  wrong = _score(family, p, "```python\n    return False\n```")
  assert (wrong.reward, wrong.passed) == (0.0, False)
  assert "AssertionError" in wrong.details["reason"]
  empty = _score(family, p, "```python\n\n```")
  assert not empty.passed and "has_close_elements" in empty.details["reason"]
  stub = _score(family, p, "```python\ndef has_close_elements(numbers, threshold):\n    pass\n```")
  assert stub.reward == 0.0 and "placeholder" in stub.details["reason"]
  assert "has_close_elements" in stub.details["reason"]


def test_score_problem(problems):
  family = humaneval.HumanEval()
  p = problems["HumanEval/2"]
  assert family.score_problem(p, {"1": humaneval.canonical_artifact(p)}).metrics == {"pass@1": 1}
  missing = family.score_problem(p, {"1": None})
  assert (missing.passed, missing.metrics) == (False, {"pass@1": 0.0})
  assert "truncate_number" in family.executor_instructions(p, p.gold_graph[0])


@pytest.mark.slow
def test_all_canonical_solutions_pass(problems):
  """All 164 (about 13 s on 2 CPUs with 8 threads, 28 s one at a time): left in the default run."""
  family = humaneval.HumanEval()
  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    scores = dict(zip(problems, pool.map(
        lambda p: _score(family, p, humaneval.canonical_artifact(p)), problems.values())))
  failed = {pid: s.details for pid, s in scores.items() if not s.passed}
  print(f"164 canonical HumanEval solutions in {time.perf_counter() - start:.1f} s")
  assert not failed and len(scores) == 164


def _small_model_replies(p):
  """Reply shapes seen from SmolLM2-135M-Instruct, built around a correct body."""
  prompt, body = p.data["prompt"], p.data["canonical_solution"]
  real, stub = f"```python\n{prompt}{body}```", f"```python\n{prompt}```"
  return {
      "attempt, then the prompt repeated": f"Sure.\n{real}\nThe function is:\n{stub}\n",
      "attempt, then a repeat cut at the token limit": f"{real}\nAgain:\n{stub[:-40]}",
      "signature repeated, body below the fence": f"{stub}\n{body}\nThis checks every pair.",
      "no fence, code in prose": f"Here is the code:\n{prompt}{body}\nHope this helps!",
  }


@pytest.mark.parametrize("shape", list(_small_model_replies(humaneval.load()[0])))
def test_small_model_reply_shapes_pass(problems, shape):
  family = humaneval.HumanEval()
  p = problems["HumanEval/0"]
  reply = _small_model_replies(p)[shape]
  score = _score(family, p, reply)
  assert score.passed, score.details
  assert "def has_close_elements" in score.details["code"] and "return False" in \
      score.details["code"]
  # The same shapes with a wrong body still run the tests, and fail on them.
  wrong = reply.replace("return True", "return False")
  assert wrong != reply
  score = _score(family, p, wrong)
  assert not score.passed and "AssertionError" in score.details["reason"]


def test_body_less_replies_still_fail(problems):
  family = humaneval.HumanEval()
  p = problems["HumanEval/0"]
  stub = f"```python\n{p.data['prompt']}```"
  for reply in (stub, f"{stub}\n{stub}", f"{stub}\n{stub[:-30]}", p.data["prompt"]):
    score = _score(family, p, reply)
    assert not score.passed and "placeholder" in score.details["reason"], reply
  # A body below the fence that does not compile is not joined: the stub is rejected.
  score = _score(family, p, f"{stub}\n    return (\n")
  assert not score.passed and "placeholder" in score.details["reason"]
  strict = humaneval.HumanEval(allow_unfenced=False)
  plain = f"{p.data['prompt']}{p.data['canonical_solution']}"
  assert strict.score_node(p, {"id": "1"}, plain, {}).details["reason"] == (
      "no fenced code block in the reply")


def test_prefilled_reply_is_the_prompt_then_the_body(problems):
  assert not humaneval.HumanEval().prefill  # the default (README: measured worse on SmolLM2)
  family = humaneval.HumanEval(prefill=True)
  for pid in SAMPLE:
    p = problems[pid]
    prefix = family.reply_prefix(p, p.gold_graph[0])
    assert prefix == f"```python\n{p.data['prompt'].rstrip()}\n    "
    assert p.data["prompt"] not in family.executor_instructions(p, p.gold_graph[0])
    body = p.data["canonical_solution"].lstrip(" ")  # the prefix holds the first indent
    assert _score(family, p, prefix + body + "```\nThis works.").passed, pid
    # The body-less repeat that prefilling is meant to prevent still fails.
    assert not _score(family, p, prefix + "```").passed, pid
  off = humaneval.HumanEval(prefill=False)
  p = problems["HumanEval/0"]
  assert off.reply_prefix(p, p.gold_graph[0]) == ""
  assert p.data["prompt"] in off.executor_instructions(p, p.gold_graph[0])


def test_canonical_oracle_runs_a_chunk():
  from configs.morse import humaneval_canonical
  from morse_jax.experiments import pipeline

  config = humaneval_canonical.get_config()
  config.task.skip = 162  # the last two problems
  summary = pipeline.canonical(config)
  assert (summary["tasks"], summary["passed"]) == (2, 2)


def test_the_checks_limit_counts_cpu_time(problems):
  """An endless loop is stopped by the check's CPU-time limit (not the call's wall clock), and a
  bad limit is refused naming the field."""
  family = humaneval.HumanEval(per_test_timeout_s=1.0)
  p = problems["HumanEval/0"]
  spin = "```python\ndef has_close_elements(numbers, threshold):\n    while True:\n        pass\n```"
  score = _score(family, p, spin)
  assert not score.passed and "CPU time" in score.details["reason"], score.details
  with pytest.raises(ValueError, match="per_test_timeout_s=-1"):
    humaneval.HumanEval(per_test_timeout_s=-1)
