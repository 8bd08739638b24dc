"""The real agents behind the training loops: one rollout per stage for `run_stages`, and the
episode / evolution hooks of `run_ttrl`.

  stages = [Stage(StageConfig("executor", ...), train_examples, ExecutorRollout(search, bank, cfg)),
            Stage(StageConfig("distiller", ...), buckets, DistillerRollout(bank, cfg)),
            Stage(StageConfig("planner", ...), train_examples, PlannerRollout(search, bank, cfg))]
  run_ttrl(..., episode_fn=TtrlEpisodes(search, bank, cfg), distill_fn=None,
           evolve_fn=evolve_with(cfg))

Each rollout samples the G trajectories of all its inputs in one batched loop (the inputs
repeated G times), and scores them with `rewards.py`:
  executor   0.7 acc + 0.2 tool + 0.1 format; acc = `accuracy.py` on its <answer>: the LLM
             judge (the paper's; the authors' `extra_info["acc_score"]` is a binary judge
             verdict, J-Ding519/APEx Executor-Train/Train/local_search/mmsearch.py
             `compute_score`) with the rule metric as the counted fallback, or the rule alone;
             the frozen planner writes one plan per question first (the authors' training rows
             carry a plan: same file, `CustomRLHFDataset`), shown to all G runs.
  distiller  0.5 quality + 0.1 format + 0.4 evolution rationality on the bucket's evolution
             batch; quality from `skill_judge` when given, else the authors' rule fallback.
  planner    0.7 acc(y2) + 0.2 acc(y1) + 0.05 format + 0.05 decision over G full episodes
             (plan -> frozen executor -> decide -> maybe replan -> executor); acc as above.
Each rollout keeps the counts of its last call in `metrics` (judge_calls, judge_fallbacks,
skill_judge_calls, skill_judge_fallbacks), which `run_stages` adds to the step's metrics.
The sampling temperature of a stage applies to every module in its rollout (AgentConfig has one),
its max_new_tokens to the trained module's turns. Only generated tokens carry log-probs, so the
packed loss mask is 1 on them alone.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Sequence

import jax

from apex_jax.agents import prompts
from apex_jax.agents.config import AgentConfig
from apex_jax.agents.conversation import Conversation
from apex_jax.agents.distiller import Distiller
from apex_jax.agents.episode import Episode, run_episode
from apex_jax.agents.executor import Executor
from apex_jax.agents.planner import Planner
from apex_jax.agents.trajectory import Trajectory
from apex_jax.datasets.image_qa import episode_inputs
from apex_jax.judges.skill_judge import SkillItem
from apex_jax.memory import format_batch
from apex_jax.memory.schema import as_bucket
from apex_jax.tools import images as images_lib
from apex_jax.training import rewards as rw
from apex_jax.training.accuracy import RULES, AccuracyItem, as_accuracy, rule_accuracy
from apex_jax.training.ttrl import PlannerEpisode

ACCURACY = RULES
_SKILL_FIELDS = rw.SKILL_FIELDS


def answer_accuracy(answer: str | None, answers: Sequence[str], metric: str = "em") -> float:
  """The rule judge's score of an answer against its gold aliases; no answer scores 0."""
  return rule_accuracy(answer, answers, metric)


def stage_agent_config(base: AgentConfig, stage) -> AgentConfig:
  """The agents' settings inside one stage: its temperature, its turn length for its module."""
  return dataclasses.replace(base, temperature=stage.temperature,
                             **{f"{stage.module}_max_new_tokens": stage.max_new_tokens})


def _repeat(items: Sequence, g: int) -> list:
  return [x for x in items for _ in range(g)]


def _groups(items: Sequence, g: int) -> list[list]:
  return [list(items[i:i + g]) for i in range(0, len(items), g)]


@dataclasses.dataclass
class ExecutorRollout:
  """rollout_fn of the executor stage; batch: QAExamples. bank None: plans without memories;
  plan False: no plan (the executor alone, as its prompt allows); accuracy: "em" / "f1" (the
  rule) or a scorer (`accuracy.JudgedAccuracy`); image_search: the image questions' tool
  (their captions, images and cache ids come from the examples, `image_qa.episode_inputs`)."""

  searcher: object
  bank: object
  agent_config: AgentConfig
  plan: bool = True
  accuracy: object = "em"
  image_search: object = None
  metrics: dict = dataclasses.field(default_factory=dict, init=False)

  def __post_init__(self):
    self.scorer = as_accuracy(self.accuracy, "ExecutorRollout")

  def __call__(self, batch, generator, rng, stage):
    cfg = stage_agent_config(self.agent_config, stage)
    questions = [ex.question for ex in batch]
    inputs = episode_inputs(batch)
    k_plan, k_run = jax.random.split(rng)
    plans = [None] * len(batch)
    if self.plan:
      contexts = [None] * len(batch) if self.bank is None else [
          self.bank.planner_context(ex.question, ex.caption, category=ex.category)
          for ex in batch]
      plans = [r.plan for r in Planner(generator, cfg).plan(questions, contexts, rng=k_plan,
                                                            captions=inputs["captions"])]
    g = stage.group_size
    executor = Executor(generator, self.searcher, cfg, image_search=self.image_search)
    trajs = executor.run(_repeat(questions, g), _repeat(plans, g), rng=k_run,
                         images=_repeat(inputs["images"], g),
                         data_ids=_repeat(inputs["data_ids"], g))
    examples = _repeat(batch, g)
    accs = self.scorer.score_many([AccuracyItem(ex.question, traj.answer, ex.answers)
                                   for traj, ex in zip(trajs, examples)])
    self.metrics = dict(self.scorer.metrics)
    rewards = []
    for traj, acc in zip(trajs, accs):
      reward = rw.executor_reward(traj.text, acc)
      traj.info["reward"] = dict(reward.parts)
      rewards.append(reward.total)
    return _groups(trajs, g), _groups(rewards, g)


# skill_judge(reply, bucket, batch) -> grade in [0, 1] or None (the judge failed: rule fallback);
# or a judges.SkillJudge, asked once per rollout for every reply that holds JSON
SkillJudge = Callable[[str, object, Sequence], "float | None"]


def _skill_doc(skill) -> str:
  return "null" if skill is None else json.dumps(
      {k: v for k, v in skill.to_dict().items() if k in _SKILL_FIELDS}, ensure_ascii=False)


@dataclasses.dataclass
class DistillerRollout:
  """rollout_fn of the distiller stage; batch: buckets. Each bucket's evolution batch and current
  skill are read from the bank; the replies are scored, never applied (training only).
  skill_judge: a `judges.SkillJudge` (the paper's LLM quality; replies without JSON score 0 and
  are not sent), a callable, or None (the rule-based quality alone)."""

  bank: object
  agent_config: AgentConfig
  skill_judge: object = None
  # "format" / "evolution" -> a SkillJudge grading that term (the paper's J_skill); absent: rules
  term_judges: dict = dataclasses.field(default_factory=dict)
  metrics: dict = dataclasses.field(default_factory=dict, init=False)

  def _qualities(self, texts, inputs) -> list:
    """Per reply: the judge's grade, or None (no judge, or it gave none: rule fallback)."""
    if self.skill_judge is None:
      return [None] * len(texts)
    if not hasattr(self.skill_judge, "grade_many"):
      return [self.skill_judge(t, b, mems) for t, (b, mems, _) in zip(texts, inputs)]
    return self._grades(self.skill_judge, "skill_judge", texts, inputs)

  def _grades(self, judge, name: str, texts, inputs) -> list:
    """`judge`'s grade per reply with JSON (None: no grade, the rule's), counted in metrics as
    <name>_calls / <name>_fallbacks."""
    parsed = [rw.parse_skill_reply(t) for t in texts]
    ask = [i for i, p in enumerate(parsed) if p is not None]
    grades = judge.grade_many([
        SkillItem(json.dumps(parsed[i], ensure_ascii=False), format_batch(inputs[i][1]),
                  _skill_doc(inputs[i][2])) for i in ask])
    if len(grades) != len(ask):
      raise RuntimeError(f"{name} returned {len(grades)} grades for {len(ask)} replies")
    out = [None] * len(texts)
    for i, grade in zip(ask, grades):
      out[i] = grade
    self.metrics.update({f"{name}_calls": float(len(ask)),
                         f"{name}_fallbacks": float(sum(g is None for g in grades))})
    return out

  def __call__(self, batch, generator, rng, stage):
    cfg = stage_agent_config(self.agent_config, stage)
    inputs = []
    for b in batch:
      memories = self.bank.evolution_batch(b)
      if not memories:
        raise ValueError(f"DistillerRollout: bucket {tuple(as_bucket(b))} holds no memories "
                         f"(build the memories first)")
      inputs.append((as_bucket(b), memories, self.bank.get_skill(b)))
    g = stage.group_size
    tokenizer = generator.tokenizer_of("distiller")
    convs = [Conversation.start(tokenizer, prompts.skill_messages(b, mems, skill, cfg.prompt_style))
             for b, mems, skill in _repeat(inputs, g)]
    gens = generator.generate("distiller", [c.tokens() for c in convs], rng=rng,
                              max_new_tokens=cfg.distiller_max_new_tokens, sampling=cfg.sampling)
    if len(gens) != len(convs):
      raise RuntimeError(f"generator returned {len(gens)} generations for {len(convs)} prompts")
    for conv, gen in zip(convs, gens):
      conv.add_generated(gen)
    texts, repeated = [gen.text for gen in gens], _repeat(inputs, g)
    self.metrics = {}
    qualities = self._qualities(texts, repeated)
    unknown = set(self.term_judges) - {"format", "evolution"}
    if unknown:
      raise ValueError(f"DistillerRollout.term_judges: {sorted(unknown)} not in "
                       f"('format', 'evolution')")
    terms = {term: self._grades(judge, f"skill_{term}_judge", texts, repeated)
             for term, judge in self.term_judges.items()}
    none = [None] * len(texts)
    trajs, rewards = [], []
    for j, (conv, gen, (b, mems, skill), quality) in enumerate(zip(convs, gens, repeated,
                                                                    qualities)):
      reward = rw.distiller_reward(gen.text, None if skill is None else skill.to_dict(), quality,
                                   format_grade=terms.get("format", none)[j],
                                   evolution_grade=terms.get("evolution", none)[j])
      trajs.append(Trajectory("distiller", conv.segments, gen.text, gen.text,
                              {"llm_calls": 1.0, "truncated": float(not gen.finished)},
                              info={"bucket": tuple(b), "reward": dict(reward.parts)}))
      rewards.append(reward.total)
    return _groups(trajs, g), _groups(rewards, g)


def planner_turn_texts(episode: Episode) -> tuple[str, str, str | None]:
  """(plan, decision, replan or None): the planner's raw replies, think blocks included."""
  said = [m["content"] for m in episode.planner.info["messages"] if m["role"] == "assistant"]
  if len(said) < 2:
    raise ValueError(f"planner conversation of {episode.question!r:.60} has {len(said)} replies; "
                     f"an episode has a plan and a decision")
  return said[0], said[1], said[2] if len(said) > 2 else None


def planner_episode_reward(episode: Episode, answers: Sequence[str], metric: str = "em", *,
                           acc1: float | None = None, acc2: float | None = None) -> rw.Reward:
  """The planner's reward of one episode; acc1 / acc2 given (a judge's scores of y1 and, after
  a replan, y2), else the rule `metric` scores them."""
  plan, decision, replan = planner_turn_texts(episode)
  if acc1 is None:
    acc1 = answer_accuracy(episode.y1, answers, metric)
  if acc2 is None and episode.decision.replan:
    acc2 = answer_accuracy(episode.y2, answers, metric)
  return rw.planner_reward(plan=plan, decision=decision, y1_correct=acc1,
                           y2_correct=acc2 if episode.decision.replan else None, replan=replan)


@dataclasses.dataclass
class PlannerRollout:
  """rollout_fn of the planner stage; batch: QAExamples; G whole episodes per question;
  accuracy as ExecutorRollout's (y1 of every episode and y2 of the replanned ones are scored
  in one call)."""

  searcher: object
  bank: object
  agent_config: AgentConfig
  accuracy: object = "em"
  image_search: object = None
  metrics: dict = dataclasses.field(default_factory=dict, init=False)

  def __post_init__(self):
    self.scorer = as_accuracy(self.accuracy, "PlannerRollout")

  def __call__(self, batch, generator, rng, stage):
    cfg = stage_agent_config(self.agent_config, stage)
    g = stage.group_size
    examples = _repeat(batch, g)
    episodes = run_episode(Planner(generator, cfg),
                           Executor(generator, self.searcher, cfg,
                                    image_search=self.image_search),
                           [ex.question for ex in examples], rng=rng, bank=self.bank,
                           categories=[ex.category for ex in examples],
                           **episode_inputs(examples))
    items = [AccuracyItem(ex.question, ep.y1, ex.answers) for ep, ex in zip(episodes, examples)]
    again = [i for i, ep in enumerate(episodes) if ep.decision.replan]
    items += [AccuracyItem(examples[i].question, episodes[i].y2, examples[i].answers)
              for i in again]
    accs = self.scorer.score_many(items)
    self.metrics = dict(self.scorer.metrics)
    acc2 = dict(zip(again, accs[len(episodes):]))
    trajs, rewards = [], []
    for i, (ep, ex) in enumerate(zip(episodes, examples)):
      reward = planner_episode_reward(ep, ex.answers, acc1=accs[i], acc2=acc2.get(i))
      ep.planner.info["reward"] = dict(reward.parts)
      trajs.append(ep.planner)
      rewards.append(reward.total)
    return _groups(trajs, g), _groups(rewards, g)


# ---------------------------------------------------------------------------------------- TTRL


def episode_trace(episode: Episode) -> str:
  """The executor's whole trace (first run, then the run after a replan), as the judges and
  the Distiller's summary prompt read it (prompts.render_trace)."""
  turns = [t for run in episode.executor for t in run.info["turns"]]
  return prompts.render_trace(episode.question, turns)


@dataclasses.dataclass
class TtrlEpisodes:
  """episode_fn of `run_ttrl`: G episodes per query, routed to the bucket of the context the
  loop computed. summarize (on by default, as the paper keeps memories): the stored workflow is
  the Distiller's summary of the trace (`PlannerEpisode.summary`; the judges read the trace;
  the authors' memory server, Memory-Serve/memory_serve.py `get_trace_prompt`; one more sampler
  call per batch), else the raw trace."""

  searcher: object
  bank: object
  agent_config: AgentConfig
  summarize: bool = True
  image_search: object = None  # the image questions' tool (experiment.image_searcher)

  def __call__(self, queries, contexts, generator, rng, config) -> list[list[PlannerEpisode]]:
    cfg = dataclasses.replace(self.agent_config, temperature=config.temperature,
                              planner_max_new_tokens=config.max_new_tokens)
    g = config.group_size
    k_episode, k_summary = jax.random.split(rng)
    repeated = _repeat(queries, g)
    # a query with an image: the executor's first turn shows it and may call the image search
    # on its cache id, as in memory building, the stages and the evaluation
    images = _repeat([images_lib.decode_base64(q.images[0], f"query {q.data_id!r} images[0]")
                      if q.images else None for q in queries], g)  # each decoded once
    executor = Executor(generator, self.searcher, cfg, image_search=self.image_search)
    episodes = run_episode(Planner(generator, cfg), executor,
                           [q.question for q in repeated], rng=k_episode,
                           bank=self.bank,
                           categories=[c.bucket.category for c in _repeat(contexts, g)],
                           captions=[q.caption for q in repeated], images=images,
                           data_ids=[q.data_id if q.images else None for q in repeated])
    traces = [episode_trace(ep) for ep in episodes]
    summaries = [None] * len(traces)
    if self.summarize:  # the judges still read the whole trace; the bank stores the summary
      summaries = [s.text for s in Distiller(generator, cfg).summarize(traces, rng=k_summary)]
    out = [PlannerEpisode(ep.planner, ep.plan, ep.y2 or "", trace, float(ep.format_ok),
                          replan_memory_ids=ep.replan_memory_ids, summary=summary)
           for ep, trace, summary in zip(episodes, traces, summaries)]
    return _groups(out, g)


def evolve_with(agent_config: AgentConfig):
  """evolve_fn of `run_ttrl`: `Distiller.evolve` on the touched buckets (it applies its replies
  to the bank itself, counts bad ones in bank.distiller_errors and dropped absorbed ids in
  bank.unknown_absorbed_ids, overwritten categories / modalities in bank.bucket_overwrites)."""
  def evolve(bank, buckets, generator, rng):
    return [e.result for e in Distiller(generator, agent_config).evolve(bank, buckets, rng=rng)]
  return evolve
