"""The chat server's generation on the engine (`morse_jax.llm.engine`): continuous batching.

Each chat completion (each prompt of it, with its n choices) is one engine request group with its
own sampling settings, stop ids (the model's), token budget (`max_tokens`) and rng. One thread
steps the engines (one per route: the base model, each adapter) while any request is live, and
between steps admits queued requests into free slots: a short request ends, and is answered, as
soon as its own tokens are done, whatever else runs. After each step every live request with new
tokens puts `(tag, rows so far)` on its stream's queue, and a row whose text reaches a stop
string is cancelled there (its slot and pages freed at the next step).

Queue: requests wait here (`qsize`, at most `max_queue`: 503 beyond) until their rows fit in the
engine's free slots (`max_batch`). A cancelled Future (the client hung up) cancels the request's
handles: the engine frees its slots and pages at its next step; a queued one is dropped unrun.

Keys: with `seed`, prompt k's choices draw from `seeded_keys(seed, k, 1)` (choice j folds in j,
as `Engine.submit_group` does): a function of the seed, the prompt index and the choice alone,
whatever else runs. Without one, from the route's seed and call counter
(`InProcessChat.call_key`).

Images: a request's `image_url` parts (`ChatRequest.images`, on a Qwen2.5-VL chat) go with its
engine request, normalised for the tower.

Errors: a request the engine refuses at submission fails alone; a device call that fails fails
the requests whose rows it carried (`Engine._guarded`); anything else that goes wrong in a step
fails that engine's requests and the engine is built afresh for the next ones. The server keeps
serving in every case.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging

import jax

from morse_jax.llm import SamplingConfig, vision
from morse_jax.llm.engine import Engine, Request
from morse_jax.serving.http import QueueWorker, settle

from apex_jax.judges.inprocess import InProcessChat, build_engine, seeded_keys
from apex_jax.judges.protocol import ChatRequest

log = logging.getLogger(__name__)


def submit_choices(engine: Engine, request: Request, n: int) -> list:
  """n samples of `request`: one group sharing its prompt's pages when the group fits in the
  slots and the pool at once, else n requests with the keys the group's members would have
  (so a group larger than the pool is not left waiting forever)."""
  worst = engine.pages.pages_for(len(request.prompt) + request.max_new_tokens)
  if n <= engine.config.slots and n * worst <= engine.pages.capacity:
    return engine.submit_group(request, n)
  return [engine.submit(dataclasses.replace(request, rng=jax.random.fold_in(request.rng, j)))
          for j in range(n)]


@dataclasses.dataclass(eq=False)
class _Job:
  """One prompt of a request: its n engine handles, and what its stream has been sent."""

  prompt: list[int]
  req: ChatRequest
  chat: InProcessChat
  future: concurrent.futures.Future
  updates: object = None  # a queue that gets (tag, rows so far) after each step with new tokens
  tag: int = 0
  handles: list = dataclasses.field(default_factory=list)
  seen: list = dataclasses.field(default_factory=list)  # tokens per row at the last update
  stopped: list = dataclasses.field(default_factory=list)  # rows ended by a stop string

  def __getitem__(self, i):  # QueueWorker reads item[-1] as the future
    return (self.prompt, self.req, self.chat, self.future)[i]

  def rows(self) -> list[list[int]]:
    return [list(h.tokens) for h in self.handles]

  def ended(self, i: int) -> bool:
    return self.stopped[i] or self.handles[i].done


class EngineBatcher(QueueWorker):
  """`ChatBatcher`'s interface (`start`, `submit`, `qsize`, `close`, `dropped`) on the engine;
  see the module docstring. `calls`: engine steps taken; `rows`: rows admitted."""

  thread_name = "chat-engine"

  def __init__(self, chat: InProcessChat, max_batch: int = 64, max_queue: int = 256,
               cache_tokens: int = 1 << 16, step_tokens: int = 8, prefix_cache: bool = False):
    if max_batch < 1:
      raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    for name, value in (("cache_tokens", cache_tokens), ("step_tokens", step_tokens)):
      if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    self.chat, self.max_batch = chat, max_batch
    if not isinstance(prefix_cache, bool):
      raise ValueError(f"prefix_cache must be a bool, got {prefix_cache!r}")
    self.cache_tokens, self.step_tokens, self.prefix_cache = cache_tokens, step_tokens, prefix_cache
    self.calls = self.rows = 0
    self.engines: dict[int, tuple[Engine, object]] = {}  # id(route chat) -> (engine, its row)
    self.live: list[_Job] = []
    super().__init__(max_queue)

  def submit(self, prompt: list[int], req: ChatRequest, chat: InProcessChat | None = None):
    return self.start(prompt, req, chat).result()

  def start(self, prompt: list[int], req: ChatRequest, chat: InProcessChat | None = None,
            updates=None, tag: int = 0) -> concurrent.futures.Future:
    """Queues a request; its Future gets the completions (as `ChatBatcher.start`)."""
    future = concurrent.futures.Future()
    self._put(_Job(list(prompt), req, chat or self.chat, future, updates, tag))
    return future

  def engine(self, chat: InProcessChat) -> tuple[Engine, object]:
    if id(chat) not in self.engines:
      self.engines[id(chat)] = build_engine(chat, self.max_batch, self.cache_tokens,
                                            self.step_tokens, prefix_cache=self.prefix_cache)
    return self.engines[id(chat)]

  # -- the loop -----------------------------------------------------------------------------

  def _loop(self) -> None:
    while True:
      with self._cv:
        while not self._queue and not self.live and not self._closing:
          self._cv.wait()
        if not self._queue and not self.live:
          return
        admitted = self._take()
      for job in admitted:
        self._admit(job)
      self._drop_gone()
      for key in list(self.engines):
        engine = self.engines[key][0]
        if engine.busy:
          self._step(key, engine)

  def _take(self) -> list[_Job]:
    """Queued jobs (first come first served) while their rows fit in the free slots; jobs
    whose client left are dropped unrun. Under the lock."""
    free = self.max_batch - sum(len(j.handles) for j in self.live)
    taken = []
    while self._queue:
      job = self._queue[0]
      if job.future.cancelled():
        self._queue.popleft()
        self.dropped += 1
        continue
      need = min(job.req.n, self.max_batch)
      if need > free:
        break
      taken.append(self._queue.popleft())
      free -= need
    return taken

  def _admit(self, job: _Job) -> None:
    try:
      engine, route = self.engine(job.chat)
      rng = (seeded_keys(job.req.seed, job.tag, 1)[0] if job.req.seed is not None
             else job.chat.call_key())
      sampling = SamplingConfig(temperature=float(job.req.temperature), top_p=float(job.req.top_p))
      images = [vision.normalize(pixels) for _, pixels in job.req.images]
      request = Request(job.prompt, job.req.max_tokens, sampling, None, rng, route, images)
      n = job.req.n
      job.handles = submit_choices(engine, request, n)
    except Exception as e:  # noqa: BLE001 -- refused at submission: this request alone fails
      settle(job.future, error=e)
      return
    job.seen, job.stopped = [0] * n, [False] * n
    self.rows += n
    self.live.append(job)

  def _drop_gone(self) -> None:
    """Jobs whose Future was cancelled (the client hung up): their handles cancelled, so the
    engine frees their slots and pages at its next step."""
    for job in [j for j in self.live if j.future.cancelled()]:
      for h in job.handles:
        h.cancel()
      self.live.remove(job)
      with self._cv:
        self.dropped += 1

  def _step(self, key: int, engine: Engine) -> None:
    jobs = [j for j in self.live if id(j.chat) == key]
    try:
      engine.step()
      self.calls += 1
    except Exception as e:  # noqa: BLE001 -- the engine's state is suspect: a fresh one next
      log.error("chat engine: step failed: %s: %.200s", type(e).__name__, e)
      del self.engines[key]
      for job in jobs:
        self._end(job, error=e)
      return
    for job in jobs:
      try:
        self._publish(job)
      except Exception as e:  # noqa: BLE001 -- e.g. decoding its text: this request alone
        self._end(job, error=e)

  def _publish(self, job: _Job) -> None:
    """After a step: rows cut at a stop string, the stream's update, the answer when done."""
    error = next((h.error for h in job.handles if h.error is not None), None)
    if error is not None:
      return self._end(job, error=error)
    new = False
    for i, h in enumerate(job.handles):
      if len(h.tokens) == job.seen[i]:
        continue
      new, job.seen[i] = True, len(h.tokens)
      if job.req.stop and not h.done:  # a stop string may span steps: the whole text
        text = job.chat.completion(h.tokens, len(job.prompt), job.req.stop)
        if text.finish_reason == "stop":
          job.stopped[i] = True
          h.cancel()
    if all(job.ended(i) for i in range(len(job.handles))):
      return self._end(job, [job.chat.completion(h.tokens, len(job.prompt), job.req.stop)
                             for h in job.handles])
    if new and job.updates is not None:
      job.updates.put((job.tag, job.rows()))

  def _end(self, job: _Job, result=None, error: Exception | None = None) -> None:
    for h in job.handles:
      h.cancel()  # a no-op for rows already done; frees a failed request's other rows
    if job in self.live:
      self.live.remove(job)
    settle(job.future, result, error)
