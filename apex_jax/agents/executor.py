"""The Executor: multi-turn search over a batch of questions, one sampler call per round (or, on
a generator's engine, each question's next turn as soon as its tool call returns: `_flow`).

Each assistant turn is `<think>...</think>` then one `<tool_call>{"name": "search", "arguments":
{"query_list": [...]}}</tool_call>` or `<answer>...</answer>` (apex_jax.tools.parse_turn). Every
round, all still-active questions generate their next turn in ONE `Generator.generate` call; all
their searches then go to the searcher in one call. A run ends at an answer, at a malformed turn
(counted; the authors' loop, Serve/Train_Planner/call_agent.py, ends there too; with
on_format_error="feedback" the error is shown instead), at a truncated turn, after max_turns
turns, when the question's max_llm_calls are spent, or when the context would exceed
max_context_tokens. Search failures are counted and shown to the model as verl's search tool
shows them ('{"result": "Search execution failed: ..."}').

A question may come with an image (`run(..., images=, data_ids=)`): it opens with the authors'
image prompt, its `<image>` marker in the first turn, and the run may call
`web_image_to_image_search` (`{"img_idx": "0"}`) once per episode (the resumed run included);
a second call is a format error (`repeated_image_search`, as rewards.executor_checks counts
it). The results (text with one marker per image, and the images) come back as the next user
turn in `<tool_response>`; a cache entry the tool cannot read is counted
(`image_search_errors`) and the model shows the authors' error text. Text-only questions are
not offered the tool (a call is `unknown_tool`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
from typing import Sequence

import jax

from apex_jax.agents import prompts
from apex_jax.agents.config import AgentConfig
from apex_jax.agents.conversation import ChatDeltas, Conversation
from apex_jax.agents.generator import takes_images
from apex_jax.agents.trajectory import Trajectory
from apex_jax.agents.turn_keys import TurnKeys
from apex_jax.tools import Answer, FormatError, Searcher, ToolCall, format_results, parse_turn
from apex_jax.tools import image_search as image_search_lib
from apex_jax.tools import images as images_lib

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Run:
  question: str
  conv: Conversation
  stats: collections.Counter
  turns: list[dict]  # per assistant turn: text, tool_output, queries, passage_ids, error
  answer: str | None = None
  done: bool = False
  run_turns: int = 0  # turns in this run (max_turns applies per run)
  data_id: str | None = None  # the image-search cache's folder name for this question
  has_image: bool = False
  image_searched: bool = False  # once per episode: carried into the resumed run

  def finish(self, reason: str) -> None:
    self.done = True
    self.stats[f"end_{reason}"] = 1


class Executor:
  def __init__(self, generator, searcher: Searcher, config: AgentConfig = AgentConfig(),
               tools: Sequence[str] = ("search",), image_search=None):
    """image_search: an `ImageSearch` (or anything with `search(data_id) -> ImageResults`);
    None: image questions get no image tool."""
    self.generator, self.searcher, self.config, self.tools = generator, searcher, config, tools
    self.image_search = image_search
    self.tokenizer = generator.tokenizer_of("executor")
    self.deltas = ChatDeltas(self.tokenizer)

  def run(self, questions: Sequence[str], plans: Sequence[str | None] | None = None, *,
          rng: jax.Array, images: Sequence | None = None,
          data_ids: Sequence[str | None] | None = None) -> list[Trajectory]:
    """One trajectory per question: [prompt, turn 1, tool output 1, turn 2, ...]. images: per
    question None or its decoded image (uint8 [448, 448, 3], `tools.images`); data_ids: per
    question its id in the image-search cache."""
    n = len(questions)
    plans = [None] * n if plans is None else list(plans)
    images = [None] * n if images is None else list(images)
    data_ids = [None] * n if data_ids is None else list(data_ids)
    if not len(plans) == len(images) == len(data_ids) == n:
      raise ValueError(f"Executor.run: {len(plans)} plans, {len(images)} images and "
                       f"{len(data_ids)} data_ids for {n} questions")
    style = self.config.prompt_style
    openings = [prompts.executor_messages(q, p, style, image=image is not None)
                for q, p, image in zip(questions, plans, images)]
    return self.run_openings(questions, openings, rng=rng, images=images, data_ids=data_ids)

  def run_openings(self, questions: Sequence[str], openings: Sequence[list[dict]], *,
                   rng: jax.Array, images: Sequence | None = None,
                   data_ids: Sequence[str | None] | None = None) -> list[Trajectory]:
    """`run` from given opening chats instead of the executor prompt with a plan (the
    baselines': retrieved memories or a rule in it, apex_jax.baselines); images / data_ids as
    `run`'s (an opening with an image has its `<image>` marker)."""
    n = len(questions)
    images = [None] * n if images is None else list(images)
    data_ids = [None] * n if data_ids is None else list(data_ids)
    if not len(openings) == len(images) == len(data_ids) == n:
      raise ValueError(f"Executor.run_openings: {len(openings)} openings, {len(images)} images "
                       f"and {len(data_ids)} data_ids for {n} questions")
    runs = []
    for q, m, image, data_id in zip(questions, openings, images, data_ids):
      shown = () if image is None else (image,)
      runs.append(_Run(q, Conversation.start(self.tokenizer, list(m), shown),
                       collections.Counter(), [], data_id=data_id, has_image=bool(shown)))
    return self._loop(runs, rng)

  def resume(self, previous: Sequence[Trajectory], replans: Sequence[str], *,
             rng: jax.Array) -> list[Trajectory]:
    """Continues each earlier run with a revised plan, as call_agent.py
    `continue_multimodal_dialogue`: the last turn loses its answer, the revised plan follows as a
    user message; the whole earlier chat is the new trajectory's prompt (not trained on). The
    LLM calls already made count against max_llm_calls."""
    if len(previous) != len(replans):
      raise ValueError(f"Executor.resume: {len(replans)} replans for {len(previous)} runs")
    runs = []
    for traj, replan in zip(previous, replans):
      messages = [dict(m) for m in traj.info["messages"]]
      if messages[-1]["role"] == "assistant":
        text = messages[-1]["content"]
        messages[-1]["content"] = text[:text.find("<answer>")].strip() if "<answer>" in text \
            else text.strip()
      messages.append(prompts.revised_plan_message(replan, self.config.prompt_style))
      stats = collections.Counter({"llm_calls": traj.stats.get("llm_calls", 0)})
      info = traj.info
      runs.append(_Run(info["question"],
                       Conversation.start(self.tokenizer, messages, info.get("images", ())),
                       stats, [], data_id=info.get("data_id"),
                       has_image=info.get("has_image", False),
                       image_searched=info.get("image_searched", False)))
    return self._loop(runs, rng)

  def _tools(self, r: _Run) -> tuple[str, ...]:
    """The tools a run may call: the image search only for a question with an image."""
    tools = tuple(t for t in self.tools if t != image_search_lib.NAME)
    if r.has_image and self.image_search is not None:
      tools += (image_search_lib.NAME,)
    return tools

  # ----------------------------------------------------------------------------------- loop

  def _loop(self, runs: list[_Run], rng) -> list[Trajectory]:
    for r in runs:
      self._check_budget(r)
    on_engine = getattr(self.generator, "on_engine", None)
    (self._flow if on_engine is not None and on_engine() else self._lockstep)(runs, rng)
    return [self._trajectory(r) for r in runs]

  def _lockstep(self, runs: list[_Run], rng) -> None:
    """Every round, all active runs' turns in one sampler call, then all their searches."""
    cfg = self.config
    round_ = 0
    while active := [r for r in runs if not r.done]:
      # a VL backbone takes each chat's images (question, search results) with its tokens
      shown = ({"images": [r.conv.images for r in active]}
               if takes_images(self.generator) else {})
      gens = self.generator.generate("executor", [r.conv.tokens() for r in active],
                                     rng=jax.random.fold_in(rng, round_),
                                     max_new_tokens=cfg.executor_max_new_tokens,
                                     sampling=cfg.sampling, **shown)
      if len(gens) != len(active):
        raise RuntimeError(f"generator returned {len(gens)} generations for {len(active)} "
                           f"prompts")
      round_ += 1
      self._after_turns(list(zip(active, gens)))

  def _flow(self, runs: list[_Run], rng) -> None:
    """The generator's engine: a run's next turn is submitted as soon as its tool call returns
    (no round barrier), with the key the lockstep loop gives it (`TurnKeys`); the searches of
    the turns that end at one engine step go to the searcher in one call."""
    cfg = self.config
    keys = TurnKeys(rng, len(runs), cfg.sampling.greedy)
    for i, r in enumerate(runs):
      if r.done:
        keys.end(i)
    pending = {}  # run index -> its turn on the engine
    while True:
      for i, r in enumerate(runs):
        if not r.done and i not in pending and (key := keys.key(i)) is not None:
          [pending[i]] = self.generator.submit("executor", [r.conv.tokens()], keys=[key],
                                               max_new_tokens=cfg.executor_max_new_tokens,
                                               sampling=cfg.sampling)
      if not pending:
        return
      self.generator.step()
      ended = [i for i, p in pending.items() if p.done]
      self._after_turns([(runs[i], pending.pop(i).result()) for i in ended])
      for i in ended:
        keys.record(i, runs[i].done)

  def _after_turns(self, turns: list) -> None:
    """(run, its generation) pairs: turns recorded, their searches run, budgets checked."""
    calls = []
    for r, gen in turns:
      call = self._take_turn(r, gen)
      if call is not None:
        calls.append((r, call))
    self._search(calls)
    for r, _ in turns:
      self._check_budget(r)

  def _take_turn(self, r: _Run, gen) -> ToolCall | None:
    """Records the turn; returns the tool call to run, or None (the run ended or goes on)."""
    r.conv.add_generated(gen)
    r.stats["turns"] += 1
    r.stats["llm_calls"] += 1
    r.run_turns += 1
    turn = {"text": gen.text, "tool_output": None, "queries": [], "passage_ids": [],
            "error": None}
    r.turns.append(turn)
    parsed = parse_turn(gen.text, tools=self._tools(r), max_queries=self.config.max_queries)
    if (isinstance(parsed, ToolCall) and parsed.name == image_search_lib.NAME
        and r.image_searched):
      parsed = FormatError("repeated_image_search",
                           f"{image_search_lib.NAME} may be called once per episode")
    if isinstance(parsed, Answer):
      r.answer = parsed.text
      r.finish("answer")
      return None
    if not gen.finished:  # cut off mid-turn: a tool call there is not trusted to be complete
      r.stats["truncated"] += 1
      r.finish("truncated")
      return None
    if isinstance(parsed, FormatError):
      r.stats["format_errors"] += 1
      r.stats[f"format_error_{parsed.code}"] += 1
      turn["error"] = str(parsed)
      if self.config.on_format_error == "end":
        r.finish("format_error")
      else:
        r.conv.add_messages(self.deltas, [{"role": "user", "content":
                                           prompts.FORMAT_FEEDBACK.format(error=parsed)}])
      return None
    r.stats["tool_calls"] += 1
    return parsed

  def _check_budget(self, r: _Run) -> None:
    cfg = self.config
    if r.done:
      return
    if r.run_turns >= cfg.max_turns:
      r.finish("max_turns")
    elif r.stats["llm_calls"] >= cfg.max_llm_calls:
      r.finish("max_llm_calls")
    elif len(r.conv) + cfg.executor_max_new_tokens > cfg.max_context_tokens:
      r.stats["context_overflow"] += 1
      r.finish("context")

  # --------------------------------------------------------------------------------- search

  def _search(self, calls: list[tuple[_Run, ToolCall]]) -> None:
    """All search calls of a round in one searcher call; if it fails, each call alone (so one
    bad request does not fail the others); a call that still fails shows the model the error.
    Image searches are cache lookups, one per call."""
    for r, call in calls:
      if call.name == image_search_lib.NAME:
        self._image_search(r)
    calls = [(r, call) for r, call in calls if call.name != image_search_lib.NAME]
    if not calls:
      return
    queries = [q for _, call in calls for q in call.queries]
    try:
      flat = self._searcher_call(queries)
    except Exception as err:  # noqa: BLE001 -- any searcher failure becomes tool output
      log.warning("batched search of %d queries failed (%s); retrying per call", len(queries),
                  err)
      flat = None
    pos = 0
    for r, call in calls:
      n = len(call.queries)
      if flat is not None:
        results, error = flat[pos:pos + n], None
      else:
        try:
          results, error = self._searcher_call(call.queries), None
        except Exception as err:  # noqa: BLE001
          results, error = None, err
      pos += n
      self._tool_output(r, call, results, error)

  def _searcher_call(self, queries: list[str]):
    results = self.searcher.search(queries, topk=self.config.topk)
    if not isinstance(results, list) or len(results) != len(queries):
      raise ValueError(f"searcher returned {type(results).__name__} of "
                       f"{len(results) if isinstance(results, list) else '?'} result lists for "
                       f"{len(queries)} queries")
    return results

  def _tool_output(self, r: _Run, call: ToolCall, results, error) -> None:
    turn = r.turns[-1]
    turn["queries"] = call.queries
    if error is not None:
      r.stats["search_errors"] += 1
      turn["error"] = f"search: {error}"
      text = json.dumps({"result": f"Search execution failed: {error}"}, ensure_ascii=False)
    else:
      turn["passage_ids"] = [[p.id for p in passages] for passages in results]
      # verl's search tool: one line per query, a count, then that query's results as JSON.
      text = "\n".join(
          f"A search for '{q}' found {len(passages)} results. "
          + json.dumps({"result": format_results([passages])}, ensure_ascii=False)
          for q, passages in zip(call.queries, results))
    # a marker in a passage would claim an image slot the chat has no image for
    text = images_lib.strip_markers(self._cut(r, text))
    turn["tool_output"] = text
    r.stats["tool_tokens"] += r.conv.add_messages(self.deltas, [prompts.tool_message(text)])

  def _image_search(self, r: _Run) -> None:
    """The cached results of the run's question as the next user turn (text with one marker
    per image, and the images); a failed lookup is counted and shows the authors' error text.
    The text is not cut to max_tool_tokens: its markers must stay with their images."""
    turn = r.turns[-1]
    turn["image_search"] = True
    r.image_searched = True
    r.stats["image_searches"] += 1
    try:
      results = self.image_search.search(r.data_id)
      text, shown = results.text, results.images
    except (image_search_lib.ImageSearchError, ValueError) as err:
      log.warning("image search for %r failed: %s", r.data_id, err)
      r.stats["image_search_errors"] += 1
      turn["error"] = f"{image_search_lib.NAME}: {err}"
      text, shown = image_search_lib.FAILED, ()
    turn["tool_output"] = text
    turn["images"] = len(shown)
    r.stats["tool_tokens"] += r.conv.add_messages(self.deltas, [prompts.tool_message(text)],
                                                  shown)

  def _cut(self, r: _Run, text: str) -> str:
    ids = self.tokenizer.encode(text)
    if len(ids) <= self.config.max_tool_tokens:
      return text
    r.stats["tool_outputs_cut"] += 1
    # Text encodes to no control token; a special id here is a vocabulary's unknown-word id,
    # whose spelling `<unk>` the tool never wrote (and text cannot encode back to it).
    cut = self.tokenizer.decode(ids[:self.config.max_tool_tokens], skip_special_tokens=True)
    return cut + " " + prompts.OMITTED

  def _trajectory(self, r: _Run) -> Trajectory:
    stats = {k: float(v) for k, v in r.stats.items()}
    for key in ("turns", "tool_calls", "format_errors", "search_errors", "truncated",
                "image_searches", "image_search_errors"):
      stats.setdefault(key, 0.0)
    stats["answered"] = float(r.answer is not None)
    return Trajectory("executor", r.conv.segments, r.conv.generated_text(), r.answer, stats,
                      info={"question": r.question, "turns": r.turns,
                            "messages": r.conv.messages, "images": list(r.conv.images),
                            "data_id": r.data_id, "has_image": r.has_image,
                            "image_searched": r.image_searched,
                            "searches": [{"turn": i, "queries": t["queries"],
                                          "passage_ids": t["passage_ids"]}
                                         for i, t in enumerate(r.turns) if t["queries"]]})


