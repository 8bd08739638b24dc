"""The training and evaluation pipelines behind `launchers.train` and `launchers.evaluate`."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp

from morse_jax import runtime
from morse_jax.baselines import run as baselines
from morse_jax.checkpoint.steps import Checkpoints, files_fingerprint, fingerprint
from morse_jax.experiments import evaluation, experiment, plots, records
from morse_jax.lora import embedders
from morse_jax.mas import engine_run, planner, runner
from morse_jax.rl import distributed, metrics
from morse_jax.rl.run import record, Run
from morse_jax.tasks import humaneval, scicode


def banner(text: str) -> None:
  print(f"\n==== {text} " + "=" * max(0, 60 - len(text)), flush=True)


def canonical(config) -> dict:
  """Every reference solution through the verifier; no model is loaded. HumanEval: each
  problem's canonical solution. SciCode: the gold code of every step of the problems that ship
  it (the 15 dev problems), each step scored with the gold code of the steps before it as its
  upstream and its targets computed from the gold code (or read from task.targets_h5)."""
  isolation = experiment.configure_sandbox(config)
  family = config.task.family
  if family == "humaneval":
    return {**_canonical_humaneval(config), "sandbox": isolation}
  if family == "scicode":
    return {**_canonical_scicode(config), "sandbox": isolation}
  raise ValueError(f"config.task.oracle='canonical' needs task.family 'humaneval' or 'scicode', "
                   f"got {family!r}")


def _canonical_humaneval(config) -> dict:
  family = humaneval.HumanEval()
  problems = experiment.chunk(config, humaneval.load(config.task.path or None))
  start, passed = time.perf_counter(), 0
  for p in problems:
    node = dict(p.gold_graph[0])
    passed += family.score_node(p, node, humaneval.canonical_artifact(p), {}).passed
  return {"tasks": len(problems), "passed": passed, "problem_pass": passed / len(problems),
          "seconds": time.perf_counter() - start}


def canonical_scicode_problem(family, problem) -> list[tuple[str, object]]:
  """(step number, NodeScore) of each gold step of one SciCode problem, gold code upstream."""
  upstream, scores = {}, []
  for node in problem.gold_graph:
    artifact = scicode.gold_artifact(problem, node["id"])
    scores.append((node["id"], family.score_node(problem, node, artifact, dict(upstream))))
    upstream[node["id"]] = artifact
  return scores


def _canonical_scicode(config) -> dict:
  family = scicode.SciCode(targets_h5=config.task.targets_h5 or None)
  problems = experiment.chunk(config, [p for p in scicode.load(config.task.path or None)
                                       if scicode.has_gold(p)])
  if not problems:
    raise ValueError("config.task.oracle='canonical': no SciCode problem ships ground_truth_code "
                     f"(task.path={config.task.path!r}; the installed dev problems do)")
  start = time.perf_counter()
  # A few problems at once: each step is one sandbox process; the first run of a step also
  # computes its targets (one more), later runs read them from the cache.
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    results = list(pool.map(lambda p: canonical_scicode_problem(family, p), problems))
  failed = []
  for p, scores in zip(problems, results):
    ok = sum(s.passed for _, s in scores)
    print(f"problem {p.id:>3} ({p.category}): {ok}/{len(scores)} gold steps pass", flush=True)
    failed += [f"{number}: {s.details.get('reason', s.reward)}" for number, s in scores
               if not s.passed]
  steps = sum(len(r) for r in results)
  passed = steps - len(failed)
  return {"problems": len(problems), "steps": steps, "passed": passed,
          "step_pass": passed / steps,
          "problem_pass": sum(all(s.passed for _, s in r) for r in results) / len(problems),
          "seconds": time.perf_counter() - start, "failed": "; ".join(failed)[:4000]}


def _check_targets(family, problems) -> None:
  """Families whose tests need data beside the problems (SciCode's targets) say so before a run
  rather than in the middle of one."""
  check = getattr(family, "check_targets", None)
  if check is not None:
    check(problems)


def evaluate(config, checkpoint: str | None = None, split: str = "test",
             name: str | None = None) -> dict:
  """Runs the system on a split; returns the summary and writes the per-node and per-problem
  records to <workdir>/<name>.jsonl (default name eval_<split>, beside launchers.evaluate's
  eval_<split>.json); config.eval.record_prompts adds each executor prompt's text."""
  runtime.use_cpu_threads(config)
  runtime.use_compilation_cache(config)
  banner("build")
  exp = experiment.build(config)
  problems = experiment.split(config, exp.problems, split)
  _check_targets(exp.family, problems)
  print(f"{len(problems)} {config.task.family} problems ({split}), system={config.system}, "
        f"mixture={config.mixture}")
  experts = router = None
  if config.mixture != "none":
    trainer = exp.trainer()
    state = trainer.init_state(jax.random.key(config.seed))
    if checkpoint:
      ckpt = Checkpoints(checkpoint, every=1, keep=1, metadata=trainer.metadata())
      state = ckpt.restore(state)
      print(f"restored step {int(state.step)} from {checkpoint}")
    experts, router = state.experts, state.router
  banner("plan")
  graphs = exp.graphs(problems)
  banner("run")
  outcomes, batch = [], config.eval.tasks_per_batch
  prompts = bool(config.eval.get("record_prompts", False))
  workdir = os.path.abspath(config.workdir)
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, f"{name or 'eval_' + split}.jsonl")
  start = time.perf_counter()
  for i in range(0, len(problems), batch):
    if config.system in baselines.SYSTEMS:  # one node per task, as `single`, many calls each
      outcomes += baselines.run(config.system,
                                baselines.backbone(exp.agents, config.eval.get("engine", False)),
                                exp.family, problems[i:i + batch],
                                experiment.baseline_config(config), seed=config.seed,
                                keep_prompts=prompts, rng=jax.random.key(config.seed))
    else:
      walk = engine_run.run if config.eval.get("engine", False) else runner.run
      outcomes += walk(exp.agents, exp.family, problems[i:i + batch], graphs[i:i + batch],
                       experts, router, rng=jax.random.key(config.seed),
                       merge_mode=config.router.merge_experts, seed=config.seed,
                       keep_prompts=prompts)
    # The records so far after every batch: a run stopped part way keeps what it finished.
    records.write(path, outcomes, prompts)
    print(f"{len(outcomes)}/{len(problems)} problems run, "
          f"{sum(bool(t.score and t.score.passed) for t in outcomes)} passed, "
          f"{time.perf_counter() - start:.0f} s", flush=True)
  summary = evaluation.summarize(outcomes)
  summary["seconds"] = time.perf_counter() - start
  if any(len(t.nodes) > 1 for t in outcomes):  # Sim_output needs two nodes (and an encoder)
    summary["sim_output"] = evaluation.heterogeneity(outcomes, embedders.SentenceEmbedder())
  nodes = [n for t in outcomes for n in t.nodes.values()]
  print(f"records: {path} ({len(nodes)} nodes, {sum(not n.score.passed for n in nodes)} failed, "
        f"{sum(bool(n.stats and n.stats.cut) for n in nodes)} cut at the token limit)")
  summary["records"] = path
  summary["sandbox"] = experiment.configure_sandbox(config)  # the isolation the scores ran under
  return summary


def train(config) -> dict:
  """Runs until config.train.steps updates (one per wave; a batch of tasks per call of the
  step) or config.train.max_minutes; returns the last wave's metrics. The run's checkpoints and
  metrics are `rl.run.Run`'s; a run started again resumes from its newest sound step."""

  runtime.use_cpu_threads(config)
  runtime.use_compilation_cache(config)
  d = config.distributed
  distributed.initialize(d.coordinator or None, d.num_processes or None,
                         None if d.process_id < 0 else d.process_id, auto=d.auto)
  banner("build")
  exp = experiment.build(config)
  problems = experiment.split(config, exp.problems, "train")
  if not problems:
    raise ValueError(f"no training problems for {config.task.family} (check task.path / split)")
  _check_targets(exp.family, problems)
  trainer, train = exp.trainer(), exp.train
  workdir = os.path.abspath(config.workdir)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "run_info.json"), "w") as f:  # what the rewards ran under
    json.dump({"sandbox": experiment.configure_sandbox(config), "runtime": runtime.describe()}, f)
  last = {}

  def step_fn(state):  # one batch of tasks: one update per DAG wave, metrics per wave
    nonlocal last
    cursor, n = int(state.cursor), train.tasks_per_step
    batch = [problems[(cursor + i) % len(problems)] for i in range(n)]
    state, outcomes, history = runner.train(trainer, state, exp.agents, exp.family, batch,
                                            exp.graphs(batch),
                                            merge_mode=config.router.merge_experts,
                                            seed=config.seed + cursor,
                                            skip_blocked=train.skip_blocked,
                                            train_merges=train.train_merges)
    problem_pass = sum(bool(t.score.passed) for t in outcomes) / len(outcomes)
    for m in history:
      m["problem_pass"] = problem_pass
    last = history[-1] if history else last
    return dataclasses.replace(state, cursor=jnp.int32(cursor + n)), history

  start, budget = time.perf_counter(), 60 * train.max_minutes

  def out_of_time(state) -> bool:
    if budget and time.perf_counter() - start > budget:
      print(f"time budget of {train.max_minutes} min reached at step {int(state.step)}")
      return True
    return False

  # Saves fall between batches (a resumed run restarts at a batch boundary), once at least
  # checkpoint_every updates passed: a batch's waves can step over a multiple of it.
  with Run(os.path.join(workdir, "ckpt"), metadata=trainer.metadata(),
           identity=run_identity(config, trainer.metadata(), problems),
           every=train.checkpoint_every, keep=train.keep, since_last_save=True,
           continue_other_run=train.continue_other_run) as run:
    state = run.restore(trainer.init_state(jax.random.key(config.seed)))
    if run.restored is not None:  # the newest good step; corrupt newer ones skipped and named
      print(f"resumed from step {run.restored} (cursor {int(state.cursor)})")
    print(f"{len(problems)} training problems; {train.steps} updates; "
          f"B={train.routes_per_node} M={train.group_size} algo={config.algo}")
    banner("train")
    run.loop(step_fn, state, steps=train.steps, logdir=workdir, should_stop=out_of_time)
  return last


def run_identity(config, metadata: dict, problems) -> dict:
  """What makes a training run this run and not another (checkpoints refuse another's folder):
  the trainer's metadata (model, LoRA, router, step configs), the seed, the system / mixture /
  algorithm, the task config, a fingerprint of the training problems (ids and statements, in
  order) and of the base weights (`files_fingerprint` of model.path: names, sizes and mtimes of
  its files, not their bytes; '' for none). Train length, checkpoint cadence, time budgets and
  evaluation settings are left out: changing them continues the same run."""
  return record(
      trainer=metadata, seed=config.seed, system=config.system, mixture=config.get("mixture"),
      algo=config.get("algo"), task=config.task.to_dict(),
      data=fingerprint([[p.id, p.statement] for p in problems]),
      base_weights={"path": os.path.abspath(os.path.expanduser(config.model.path))
                            if config.model.path else "",
                    "files": files_fingerprint(config.model.path)})


def plan(config, out: str, split: str = "test") -> dict:
  """Makes one graph per problem of a split with the planner and stores them as JSONL, so later
  runs read them with --config.task.plans (as the authors precompute theirs)."""
  banner("build")
  exp = experiment.build(config)
  problems = experiment.split(config, exp.problems, split)
  stats = planner.PlanStats()
  graphs = planner.plan(problems, exp.plan_generate, max_nodes=config.max_nodes, stats=stats)
  planner.save_plans(out, problems, graphs)
  return {"problems": len(problems), "retries": stats.retries, "fallbacks": stats.fallbacks,
          "mean_nodes": sum(len(g.nodes) for g in graphs) / max(len(graphs), 1)}


def before_identity(config) -> dict:
  """What the untrained system's held-out numbers depend on (as JSON reads it back: tuples
  become lists)."""
  return record(model=os.path.abspath(os.path.expanduser(config.model.path)),
                task=config.task.to_dict(), eval_max_new_tokens=config.eval.max_new_tokens,
                system=config.system, router_top_k=config.router.top_k)


def demo(config) -> dict:
  """The first run a new user sees: evaluate the untrained system on held-out tasks, train,
  evaluate again, and print a before/after table; metrics, TensorBoard logs and PNG plots go to
  the workdir."""
  workdir = os.path.abspath(config.workdir)
  banner("before training (held-out tasks)")
  identity = before_identity(config)
  if config.eval.before:
    # The untrained system does not depend on the seed, the algorithm or the mixture (adapters
    # start at zero, decoding is greedy), so seeds and ablations may reuse one measurement.
    with open(config.eval.before) as f:
      earlier = json.load(f)
    if earlier.get("before_identity") != identity:
      raise ValueError(f"config.eval.before={config.eval.before!r} was measured on other "
                       f"settings: {earlier.get('before_identity')} != {identity}")
    before = earlier["before"]
    # where its per-node records are, so this run's after pairs with them (benchmarks.rl_compare)
    before_records = earlier.get("before_records") or os.path.join(
        os.path.dirname(os.path.abspath(config.eval.before)), "eval_test_before.jsonl")
    print(f"reused from {config.eval.before}")
  else:
    before = evaluate(config, None, "test", name="eval_test_before")
    before_records = os.path.join(workdir, "eval_test_before.jsonl")
  print("  ".join(f"{k} {before[k]:.3f}" for k in ("step_pass", "problem_pass") if k in before))
  train(config)
  steps = len(metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl")))
  banner("after training (held-out tasks)")
  after = evaluate(config, os.path.join(workdir, "ckpt"), "test", name="eval_test_after")
  rows = [k for k in ("step_pass", "mean_step_pass", "problem_pass", "step_reward", "sim_output")
          if k in before and k in after]
  banner("result")
  print(f"{steps} updates\n{'metric':<16} {'before':>8} {'after':>8}")
  for k in rows:
    print(f"{k:<16} {before[k]:8.3f} {after[k]:8.3f}")
  held_out = {key: [(0, before[metric]), (steps, after[metric])]
              for key, metric in (("reward_mean", "step_reward"), ("problem_pass", "problem_pass"))
              if metric in before and metric in after}
  written = plots.training_plots(os.path.join(workdir, "metrics.jsonl"), workdir, held_out)
  summary = {"before": before, "after": after, "plots": written, "before_identity": identity,
             "before_records": before_records, "steps": steps}
  with open(os.path.join(workdir, "demo.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(f"plots: {', '.join(written)}\nTensorBoard: tensorboard --logdir {workdir}")
  return summary

