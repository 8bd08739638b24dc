"""Bucket routing: which category x modality a question belongs to.

Modality comes from the input: a non-blank caption or an image makes it "text-image" (as the
reference code's `_determine_modality`). The category comes from a classifier:
- `CentroidClassifier` (the offline default): cosine to a centroid per category (its short
  description and a few generic example questions), nearest wins;
- `LLMClassifier`: a model restricted to the category names, its reply parsed defensively; a
  reply naming no category (or several, or an exception) becomes "others" and is counted.
"""

from __future__ import annotations

import collections
import logging
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from apex_jax.memory.schema import CATEGORIES, MemoryBankError, check_category

log = logging.getLogger(__name__)

Embedder = Callable[[Sequence[str]], Any]  # texts -> array [n, d]

# One line per category: what kind of answer the question asks for.
CATEGORY_DESCRIPTIONS: Mapping[str, str] = {
    "location": "Where is a place, building, city, country or region located?",
    "human": "Who is the person: the name of an author, inventor, founder, actor or leader?",
    "time": "When did it happen: the year, date, century, period, duration or age?",
    "career": "What occupation, profession, job, title or office does a person hold?",
    "process": "How is something done or made: the steps, method, procedure or mechanism?",
    "definition": "What is something: the meaning or definition of a term or concept?",
    "event": "What happened: a battle, war, election, competition, ceremony or incident?",
    "function": "What is something used for: its purpose, role or function?",
    "property": "What attribute does it have: size, height, number, amount, color, material?",
    "others": "A question of some other kind that fits none of the usual types.",
}

# A few generic questions per category. A centroid over description + examples separates the
# categories far better than the description alone: with all-MiniLM-L6-v2, 15 of 18 held-out
# trivia questions (2 per category) right, against 11 of 18 with the descriptions only. Use
# LLMClassifier where routing matters more.
CATEGORY_EXAMPLES: Mapping[str, tuple[str, ...]] = {
    "location": ("Where is the place located?", "In which country is this city?",
                 "Where is the headquarters of the company?",
                 "Which river flows through the town?", "Where was the film shot?"),
    "human": ("Who is the person?", "Who wrote this book?", "Who founded the company?",
              "Which scientist discovered it?", "Which singer performed the song?",
              "Who played the lead role in the movie?"),
    "time": ("When did it happen?", "In what year was it built?", "On which date was she born?",
             "How long did the war last?", "How old was the king when he died?",
             "In which century did he live?"),
    "career": ("What is his occupation?", "What was her profession?", "What job did he have?",
               "Which office did the politician hold?", "What did she work as?"),
    "process": ("How is it made?", "What are the steps to do it?", "How does the procedure work?",
                "By what method is it produced?", "How does the body fight an infection?"),
    "definition": ("What is it?", "What does the word mean?",
                   "What is the definition of the term?", "What is this concept in science?",
                   "What is a neutron star?"),
    "event": ("What happened there?", "Which battle took place?",
              "What was the result of the election?", "Which tournament did the team win?",
              "What event started the revolution?"),
    "function": ("What is it used for?", "What is the purpose of the device?",
                 "What role does the organ play?", "What does the tool do?"),
    "property": ("How big is it?", "How many are there?", "What color is it?",
                 "What is it made of?", "How high is the mountain?", "How much does it weigh?"),
    "others": ("Is it true or false?", "Which one is better?", "Why did it happen?"),
}


def modality_of(caption: str | None = None, image: Any = None) -> str:
  """'text-image' when there is a non-blank caption or an image, else 'text-only'."""
  if image is not None or (isinstance(caption, str) and caption.strip()):
    return "text-image"
  return "text-only"


def _unit_rows(x: np.ndarray) -> np.ndarray:
  norms = np.linalg.norm(x, axis=1, keepdims=True)
  return x / np.where(norms > 0, norms, 1.0)


class CentroidClassifier:
  """category = argmax_c cos(e(question), centroid_c), ties to the earlier category, where
  centroid_c = mean of the unit embeddings of category c's description and example questions.

  The centroids are embedded once, on the first call.
  """

  def __init__(self, embedder: Embedder,
               descriptions: Mapping[str, str] = CATEGORY_DESCRIPTIONS,
               examples: Mapping[str, Sequence[str]] | None = None):
    if not descriptions:
      raise MemoryBankError("CentroidClassifier needs at least one category description")
    examples = (CATEGORY_EXAMPLES if descriptions is CATEGORY_DESCRIPTIONS else {}) \
        if examples is None else examples
    for name in list(descriptions) + list(examples):
      check_category(name, "CentroidClassifier category")
    self.embedder = embedder
    self.names = tuple(descriptions)
    self.texts = tuple((descriptions[n],) + tuple(examples.get(n, ())) for n in self.names)
    self._centroids: np.ndarray | None = None  # [c, d], unit rows

  def __call__(self, question: str) -> str:
    if self._centroids is None:
      self._centroids = _unit_rows(np.stack([
          _unit_rows(np.asarray(self.embedder(list(texts)), np.float64)).mean(0)
          for texts in self.texts]))
    q = np.asarray(self.embedder([question]), np.float64)
    if q.shape != (1, self._centroids.shape[1]):
      raise MemoryBankError(f"embedder returned shape {q.shape} for one question; expected "
                            f"(1, {self._centroids.shape[1]})")
    return self.names[int(np.argmax(self._centroids @ _unit_rows(q)[0]))]


CLASSIFY_PROMPT = """Classify the question into exactly one category by what its answer is.
Categories: {categories}.
Reply with the category name only.

Question: {question}"""

_THINK = re.compile(r"^.*</think>", re.DOTALL)


def parse_category(reply: str) -> str | None:
  """The single category a reply names, or None.

  Reasoning up to '</think>' is dropped. An exact (case-, quote- and punctuation-insensitive)
  match wins; otherwise the reply must mention exactly one category as a whole word.
  """
  text = _THINK.sub("", reply).strip().lower()
  bare = re.sub(r"[^a-z]", "", text)
  if bare in CATEGORIES:
    return bare
  found = {c for c in CATEGORIES if re.search(rf"\b{c}\b", text)}
  return found.pop() if len(found) == 1 else None


class LLMClassifier:
  """Asks `llm(prompt) -> reply` for a category; anything unusable becomes 'others', counted in
  `counts` under 'unparsed' (no single category in the reply) or 'error' (the call raised)."""

  def __init__(self, llm: Callable[[str], str], prompt: str = CLASSIFY_PROMPT):
    self.llm = llm
    self.prompt = prompt
    self.counts: collections.Counter[str] = collections.Counter()

  def __call__(self, question: str) -> str:
    prompt = self.prompt.format(categories=", ".join(CATEGORIES[:-1]), question=question)
    try:
      reply = self.llm(prompt)
    except Exception as err:  # a failed call must not stop the caller: route to 'others'
      self.counts["error"] += 1
      log.warning("category classifier call failed (%s); using 'others'", err)
      return "others"
    category = parse_category(reply) if isinstance(reply, str) else None
    if category is None:
      self.counts["unparsed"] += 1
      log.warning("category classifier reply %r names no single category; using 'others'",
                  reply if not isinstance(reply, str) else reply[:200])
      return "others"
    self.counts[category] += 1
    return category
