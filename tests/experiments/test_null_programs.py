"""The null-program sweep as a property of the suite: a reply that computes nothing (a constant,
an empty container or array, the input unchanged, a raise, an exit, a sleep past the limit; each
node's targets as constants, zeros / ones like them, its parents' results) earns reward 0 on
every problem and step of every task family. The default run samples a few
problems per family; the whole sweep (`python -m benchmarks.null_sweep`) is marked slow."""

from __future__ import annotations

import concurrent.futures

import pytest

from benchmarks import null_sweep
from morse_jax.experiments import null_programs
from morse_jax.tasks import humaneval, scicode, srdd, synthetic


def _rewards(family, cases):
  jobs = [(p, n, null, body) for p, n in cases
          for null, body in null_programs.node_nulls(family, p, n).items()]
  with concurrent.futures.ThreadPoolExecutor(4) as pool:  # the sleeping ones wait, idle
    rewards = list(pool.map(lambda job: null_programs.score(family, *job), jobs))
  return {(p.id, n, null): r for (p, n, null, _), r in zip(jobs, rewards) if r != 0.0}


def test_null_programs_are_what_they_say():
  code = null_programs.function("f", "return 3 empty arrays")
  space = {}
  exec(code, space)  # pylint: disable=exec-used
  value = space["f"](1)
  assert isinstance(value, tuple) and [a.shape for a in value] == [(0, 1, 1, 1, 1, 1, 1)] * 3
  exec(null_programs.function("g", "return the first input"), space)  # pylint: disable=exec-used
  assert space["g"]([4, 5]) == [4, 5]
  assert null_programs.script("return 0").endswith("__main__':\n    main()\n```\n")
  assert len(null_programs.NAMES) == 26
  with pytest.raises(ValueError, match="null='nothing'"):
    null_programs.function("f", "nothing")


@pytest.mark.slow
def test_a_sample_of_every_family_earns_nothing():
  """One problem or step per family, the 26 generic null programs and the node's own, short time
  limits: HumanEval/29 (a list answer, [] for the empty input), SciCode 19.2 (after 19.1's gold
  code; targets 1, 1, 0, 0; 29.3 and the other cases of the second probe:
  tests/execution/test_verifier_hacks.py), a synthetic subtask with a parent, an SRDD
  requirement."""
  he = next(p for p in humaneval.load() if p.id == "HumanEval/29")
  hits = _rewards(humaneval.HumanEval(timeout_s=2.0), [(he, "1")])
  sc = next(p for p in scicode.load() if p.id == "19")
  hits |= _rewards(scicode.SciCode(timeout_s=20.0, per_test_timeout_s=2.0), [(sc, "19.2")])
  p = synthetic.generate(1, 100)[0]
  child = next(n["id"] for n in p.gold_graph if n["depends_on"])
  hits |= _rewards(synthetic.Synthetic(timeout_s=2.0), [(p, child)])
  fixture = srdd.load(null_sweep.SRDD_FIXTURE)[0]
  hits |= _rewards(srdd.SRDD(embedder=null_sweep.bag_of_words, timeout_s=1.0), [(fixture, "1")])
  assert not hits


@pytest.mark.slow
@pytest.mark.parametrize("family", null_sweep.FAMILIES)
def test_the_whole_sweep_earns_nothing(family):
  result = null_sweep.sweep(family, per_op=1, workers=2)
  assert result["reward_gt_0"] == 0, result["hits"][:20]
