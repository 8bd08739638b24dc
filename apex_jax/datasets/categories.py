"""Which memory category (`apex_jax.memory.CATEGORIES`) a dataset question goes to.

The APEx authors categorise every question, whatever the dataset, with an LLM restricted to the
nine named categories, "others" when the reply is unusable (J-Ding519/APEx
Memory-Serve/memory_serve.py, `classify_question_prompt` and `llm_classify_question`); they keep
no per-dataset mapping (HotpotQA's 'bridge' / 'comparison' say nothing about the answer's kind).
The loaders therefore take any `classify(question) -> category`:
- `keyword_category` (the default: offline, deterministic, free): the ordered rules below, on
  what the question asks for, first match wins, else "others";
- `apex_jax.memory.CentroidClassifier(embedder)` (nearest category centroid), what the memory
  bank itself routes with offline; `classifier(embedder)` builds it;
- `apex_jax.memory.LLMClassifier(llm)`: the authors' way.

Rule order matters: yes/no questions ("Is ...", "Were ...") are "others" whatever they mention
(their answer is yes or no, CATEGORY_EXAMPLES' "Is it true or false?"); "how old / how long / what
year" are time before "how many / how much" are property and before a bare "how" is process;
career words come before "who" (a relative "who" often sits inside a career question) and
function ("used for") before the generic "what is" of definition.
"""

from __future__ import annotations

import re
from typing import Callable

from apex_jax.datasets.records import DatasetError
from apex_jax.memory.buckets import CentroidClassifier
from apex_jax.memory.schema import CATEGORIES

Classifier = Callable[[str], str]

_YES_NO = r"^(is|are|was|were|do|does|did|can|could|has|have|had|will|would|should)\b"
_PLACES = ("city|country|state|town|county|region|continent|river|island|province|village|"
           "location|place|nation|street|mountain|lake|district|capital|area|venue")
_PEOPLE = ("person|man|woman|actor|actress|author|writer|director|singer|player|musician|artist|"
           "band|composer|politician|president|king|queen|founder|scientist|poet|producer|"
           "footballer|people|group|team")
_MOD = r"(\w+ ){0,2}"  # up to two modifiers: "what government position", "what New York city"
_KINDS_OF_EVENT = ("battle|war|election|event|tournament|championship|competition|ceremony|"
                   "festival|match|race|contest|fair|season|game")

# (category, pattern) in priority order; patterns run on the lower-cased question.
RULES: tuple[tuple[str, str], ...] = (
    ("others", _YES_NO),
    ("time", r"\bwhen\b|\b(what|which) (year|date|day|month|decade|century|era|period)\b|"
             r"\bhow (long|old)\b|\bin what year\b"),
    ("property", r"\bhow (many|much|tall|high|big|large|far|deep|wide|heavy|fast)\b|"
                 r"\b(what|which) (color|colour|size|height|length|population|number|amount|"
                 r"weight|percentage|area)\b|\bmade of\b"),
    ("location", rf"\bwhere\b|\b(what|which) {_MOD}({_PLACES})\b|\blocated\b"),
    ("career", rf"\b(what|which) {_MOD}(occupation|profession|job|position|office|title|rank|"
               r"sport)\b|"
               r"\b(occupation|profession)\b|\bworks? as\b|\bworked as\b"),
    ("event", rf"\b(what|which) {_MOD}({_KINDS_OF_EVENT})\b|\bwhat happened\b"),
    ("function", r"\bused (for|to)\b|\bpurpose\b|\bfunction\b|\bwhat (does|do|did) .+ do\b"),
    ("process", r"^how\b|\bhow (is|was|are|were|do|does|did|can)\b|"
                r"\bby what (means|method|process)\b|\bwhat (process|method|steps)\b"),
    ("human", rf"\bwho(m|se)?\b|\b(what|which) {_MOD}({_PEOPLE})\b"),
    ("definition", r"\bwhat (kind|type|sort|genre) of\b|\bwhat (is|are|was|were) (a|an)\b|"
                   r"\bwhat does .+ mean\b|\bdefinition\b|\bmeaning of\b"),
)
_COMPILED = tuple((category, re.compile(pattern)) for category, pattern in RULES)


def keyword_category(question: str) -> str:
  """The first rule of RULES that matches the lower-cased question; "others" when none does."""
  text = " ".join(question.lower().split())
  for category, pattern in _COMPILED:
    if pattern.search(text):
      return category
  return "others"


def classifier(embedder=None) -> Classifier:
  """`keyword_category`, or a `CentroidClassifier` over `embedder` (texts -> [n, d]) if given."""
  if embedder is None:
    return keyword_category
  return CentroidClassifier(embedder)


def checked(classify: Classifier, question: str, where: str) -> str:
  """classify(question), which must name one of CATEGORIES; `where` prefixes the error."""
  category = classify(question)
  if category not in CATEGORIES:
    raise DatasetError(f"{where}: the category classifier returned {category!r}, not one of "
                       f"{', '.join(CATEGORIES)}")
  return category

