"""One APEx episode over a batch of questions: plan -> execute -> evaluate -> (replan -> execute).

Each step is one sampler call over every question still in it. Memories come from a MemoryBank
when one is given: the planner context (skill + top-k memories) for the plan, and k_replan (1)
new memories of the same bucket for the replan (the paper's; the authors' code shows none:
AgentConfig.replan_memories=False).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax

from apex_jax.agents.executor import Executor
from apex_jax.agents.planner import Decision, Planner
from apex_jax.agents.trajectory import Trajectory
from apex_jax.memory import skills as skills_lib
from apex_jax.memory.records import PlannerContext
from apex_jax.memory.schema import Bucket


@dataclasses.dataclass
class Episode:
  question: str
  y1: str | None  # the first run's answer
  y2: str | None  # the final answer (y1 when there was no replan)
  decision: Decision
  format_ok: bool  # the planner's format reward term
  plan: str
  replan: str | None
  planner: Trajectory  # plan, decision and replan turns in one conversation
  executor: list[Trajectory]  # the first run, and the resumed run after a replan
  context: PlannerContext | None
  replan_memory_ids: tuple[int, ...] = ()
  caption: str | None = None  # the question image's: its memory is stored with it

  @property
  def bucket(self) -> Bucket | None:
    return None if self.context is None else self.context.bucket

  @property
  def memory_ids(self) -> tuple[int, ...]:
    """Every memory shown to the planner (for MemoryBank.record_outcome)."""
    shown = () if self.context is None else self.context.memory_ids
    return tuple(dict.fromkeys(shown + self.replan_memory_ids))


def run_episode(planner: Planner, executor: Executor, questions: Sequence[str], *,
                rng: jax.Array, bank=None, categories: Sequence[str | None] | None = None,
                captions: Sequence[str | None] | None = None, use_memories: bool = True,
                use_skills: bool = True, images: Sequence | None = None,
                data_ids: Sequence[str | None] | None = None,
                plan_openings: Sequence[list[dict]] | None = None) -> list[Episode]:
  """The loop over a batch; bank None plans without memories or skills. use_memories /
  use_skills (MemoryBank.planner_context's options, the ablations): False shows the planner no
  instance memory (at the plan and the replan) / no skill document. captions route and score
  the memories (text-image bucket) and follow the question in the plan prompt; images (decoded,
  `tools.images`) and data_ids (the image-search cache's ids) go to the executor only.
  plan_openings: the planner's opening chats instead of its plan prompt (`Planner.plan`; a
  baseline's, with bank None)."""
  n = len(questions)
  categories = [None] * n if categories is None else list(categories)
  captions = [None] * n if captions is None else list(captions)
  images = [None] * n if images is None else list(images)
  data_ids = [None] * n if data_ids is None else list(data_ids)
  if not len(categories) == len(captions) == len(images) == len(data_ids) == n:
    raise ValueError(f"run_episode: {n} questions, {len(categories)} categories, "
                     f"{len(captions)} captions, {len(images)} images, {len(data_ids)} "
                     f"data_ids")
  k_plan, k_run, k_eval, k_replan, k_rerun = jax.random.split(rng, 5)
  contexts = [None] * n if bank is None else [
      bank.planner_context(q, c, category=cat, use_memories=use_memories, use_skills=use_skills)
      for q, c, cat in zip(questions, captions, categories)]
  runs = planner.plan(questions, contexts, rng=k_plan, captions=captions, openings=plan_openings)
  first = executor.run(questions, [r.plan for r in runs], rng=k_run, images=images,
                       data_ids=data_ids)
  decisions = planner.evaluate(runs, first, rng=k_eval)
  again = [i for i, d in enumerate(decisions) if d.replan]
  replan_ids: dict[int, tuple[int, ...]] = {}
  memories = []
  for i in again:
    text = None
    if bank is not None and use_memories and planner.config.replan_memories:
      found = bank.retrieve(questions[i], captions[i], category=contexts[i].bucket.category,
                            modality=contexts[i].bucket.modality, replan=True)
      replan_ids[i] = found.memory_ids
      text = skills_lib.render_memories([s.memory for s in found.correct],
                                        [s.memory for s in found.incorrect])
    memories.append(text)
  replans = planner.replan([runs[i] for i in again], memories, rng=k_replan)
  second = dict(zip(again, executor.resume([first[i] for i in again], replans, rng=k_rerun)))
  episodes = []
  for i, (q, r) in enumerate(zip(questions, runs)):
    y1 = first[i].answer
    y2 = second[i].answer if i in second else y1
    episodes.append(Episode(
        question=q, y1=y1, y2=y2, decision=decisions[i], format_ok=planner.format_ok(r),
        plan=r.plan, replan=r.replan, planner=r.trajectory(y2),
        executor=[first[i]] + ([second[i]] if i in second else []), context=contexts[i],
        replan_memory_ids=replan_ids.get(i, ()), caption=captions[i]))
  return episodes
