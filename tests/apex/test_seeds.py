"""apex_jax.seeds: the per-seed table's statistics and orders, by hand."""

import ml_collections
import pytest

from apex_jax import seeds


def test_summarize_means_spreads_and_orders_by_hand():
  per_seed = {
      0: {"untrained": {"em": 0.25, "f1": 0.25}, "full": {"em": 0.5, "f1": 0.5},
          "without_memories": {"em": 0.25, "f1": 0.25}, "without_skills": {"em": 0.5, "f1": 0.5}},
      1: {"untrained": {"em": 0.5, "f1": 0.5}, "full": {"em": 0.75, "f1": 0.75},
          "without_memories": {"em": 0.5, "f1": 0.5}, "without_skills": {"em": 0.5, "f1": 0.625}},
  }
  s = seeds.summarize(per_seed)
  full = s["rows"]["full"]
  assert full["f1"] == [0.5, 0.75] and full["f1_mean"] == pytest.approx(0.625)
  assert full["f1_std"] == pytest.approx(0.1767767, abs=1e-6)  # sqrt(2 * 0.125^2 / 1)
  assert s["orders"]["full>without_memories"] == {"f1_held_on": 2, "ties": 0, "seeds": 2}
  assert s["orders"]["full>without_skills"] == {"f1_held_on": 1, "ties": 1, "seeds": 2}
  assert s["orders"]["full>untrained"] == {"f1_held_on": 2, "ties": 0, "seeds": 2}
  text = seeds.table(s)
  assert "full>without_skills: F1 higher on 1 of 2 seeds (1 ties)" in text
  assert text.splitlines()[0].split()[:3] == ["system", "F1", "s0"]


def test_orders_are_also_tested_over_the_pooled_questions_by_hand():
  row = lambda *f1: {"em": 0.0, "f1": sum(f1) / len(f1),
                     "f1_per_question": {f"q{i}": v for i, v in enumerate(f1)}}
  # seed 0: full better on q0, worse on q1; seed 1: better on q0 and q2, q1 tied
  per_seed = {0: {"full": row(1.0, 0.0, 1.0), "without_skills": row(0.0, 1.0, 1.0)},
              1: {"full": row(1.0, 0.5, 1.0), "without_skills": row(0.0, 0.5, 0.0)}}
  o = seeds.summarize(per_seed)["orders"]["full>without_skills"]
  assert (o["f1_held_on"], o["ties"]) == (1, 1)
  q = o["questions"]
  assert (q["a_better"], q["b_better"]) == (3, 1)
  assert q["mean_difference"] == pytest.approx((1 - 1 + 0 + 1 + 0 + 1) / 6)
  assert q["p_value"] == pytest.approx(10 / 16)  # |sum| >= 2 in 10 of the 16 sign patterns of 4
  assert "pooled questions: 3 better, 1 worse, mean +0.333, p 0.625" in seeds.table(
      seeds.summarize(per_seed))


def test_seed_worlds_gives_each_seed_its_own_world():
  c = ml_collections.ConfigDict(dict(seed=0, seeds=(0, 2), workdir="/tmp/w",
                                     data=dict(world_seed=777), seed_worlds=True))
  assert [seeds.seed_config(c, s).data.world_seed for s in (0, 2)] == [777, 779]
  c.seed_worlds = False
  assert seeds.seed_config(c, 2).data.world_seed == 777


def test_a_row_missing_in_a_seed_is_left_out_of_that_seed():
  s = seeds.summarize({0: {"full": {"em": 1.0, "f1": 1.0}},
                       1: {"full": {"em": 0.0, "f1": 0.0}, "untrained": {"em": 0.0, "f1": 0.0}}})
  assert s["rows"]["untrained"]["seeds"] == [1] and s["rows"]["untrained"]["f1_std"] == 0.0
  assert s["orders"] == {"full>untrained": {"f1_held_on": 0, "ties": 1, "seeds": 1}}


def test_each_seed_gets_its_own_workdir_and_seed():
  c = ml_collections.ConfigDict(dict(seed=0, seeds=(3, 4), workdir="/tmp/w"))
  c.lock()
  one = seeds.seed_config(c, 4)
  assert (one.seed, one.seeds, one.workdir) == (4, (), "/tmp/w/seed_4")
  assert (c.seed, c.workdir) == (0, "/tmp/w")


@pytest.mark.parametrize("bad", [(), (1, 1)])
def test_seeds_must_be_distinct(bad):
  with pytest.raises(ValueError, match="config.seeds"):
    seeds.run(ml_collections.ConfigDict(dict(seeds=bad, workdir="/tmp/w")))


def _fake_chain(c):
  """A stand-in for one seed's chain: rows from the seed, the worker's pid, and some output."""
  import os
  print(f"chain of seed {c.seed}")
  return {"full": {"em": c.seed / 10, "f1": c.seed / 10},
          "untrained": {"em": 0.0, "f1": float(os.getpid())}}


def test_seed_workers_run_the_seeds_in_separate_processes_with_their_own_logs(tmp_path):
  import os
  c = ml_collections.ConfigDict(dict(seeds=(2, 0, 1), seed=0, seed_workers=2,
                                     workdir=str(tmp_path)))
  s = seeds.run(c, one_seed=_fake_chain)
  assert s["seeds"] == [2, 0, 1] and s["rows"]["full"]["f1"] == [0.2, 0.0, 0.1]
  pids = set(s["rows"]["untrained"]["f1"])
  assert os.getpid() not in pids and 1 <= len(pids) <= 2
  for seed in (2, 0, 1):
    assert (tmp_path / f"seed_{seed}" / "log.txt").read_text() == f"chain of seed {seed}\n"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_seed_workers_must_be_a_positive_integer(bad):
  c = ml_collections.ConfigDict(dict(seeds=(0, 1), seed_workers=bad, workdir="/tmp/w"))
  with pytest.raises(ValueError, match="config.seed_workers"):
    seeds.run(c, one_seed=_fake_chain)
