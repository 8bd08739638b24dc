"""Passages: the corpus layout, validation of corpus lines, and rendering results for the agent.

Corpus JSONL follows Search-R1 / FlashRAG (wiki-18): one object per line,
`{"id": "0", "contents": "\"Title\"\\ntext"}`: the first line of `contents` is the title (in
double quotes), the rest is the text. `{"id", "title", "text"}` lines are accepted too and turned
into that layout.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterator, Sequence


class CorpusError(ValueError):
  """A corpus line that cannot be used; the message names the file, line number and field."""


@dataclasses.dataclass(frozen=True)
class Passage:
  id: str
  contents: str  # '"Title"\ntext', as stored and served
  score: float | None = None

  @property
  def title(self) -> str:
    """The first line of `contents`, without the surrounding double quotes."""
    first = self.contents.split("\n", 1)[0].strip()
    if len(first) >= 2 and first[0] == first[-1] == '"':
      first = first[1:-1]
    return first

  @property
  def text(self) -> str:
    return self.contents.split("\n", 1)[1] if "\n" in self.contents else ""

  def document(self) -> dict:
    """The Search-R1 `/retrieve` document object."""
    return {"id": self.id, "contents": self.contents}


def contents_of(title: str, text: str) -> str:
  return f'"{title}"\n{text}'


def parse_line(line: str, where: str) -> Passage:
  """One corpus line -> Passage; `where` ("file:line") prefixes every error message."""
  try:
    row = json.loads(line)
  except json.JSONDecodeError as e:
    raise CorpusError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
  if not isinstance(row, dict):
    raise CorpusError(f"{where}: expected a JSON object, got {type(row).__name__}")
  if "id" not in row:
    raise CorpusError(f"{where}: missing field 'id'")
  pid = row["id"]
  if isinstance(pid, bool) or not isinstance(pid, (str, int)) or str(pid) == "":
    raise CorpusError(f"{where}: field 'id' must be a non-empty string or integer, got {pid!r}")
  if "contents" in row:
    contents = row["contents"]
    if not isinstance(contents, str) or not contents.strip():
      raise CorpusError(f"{where}: field 'contents' must be a non-empty string, got "
                        f"{_short(contents)}")
  elif "text" in row:
    title, text = row.get("title", ""), row["text"]
    if not isinstance(title, str):
      raise CorpusError(f"{where}: field 'title' must be a string, got {_short(title)}")
    if not isinstance(text, str) or not text.strip():
      raise CorpusError(f"{where}: field 'text' must be a non-empty string, got {_short(text)}")
    contents = contents_of(title, text)
  else:
    raise CorpusError(f"{where}: missing field 'contents' (or 'text' with optional 'title')")
  return Passage(str(pid), contents)


def read_corpus(path: str) -> Iterator[Passage]:
  """Validated passages of a JSONL corpus, in order; blank lines are skipped; duplicate ids are an
  error (they would make `id` lookups ambiguous)."""
  seen: dict[str, int] = {}
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      passage = parse_line(line, f"{path}:{number}")
      if passage.id in seen:
        raise CorpusError(f"{path}:{number}: field 'id' value {passage.id!r} already used on "
                          f"line {seen[passage.id]}")
      seen[passage.id] = number
      yield passage


def validate_corpus(path: str) -> int:
  """Reads the whole corpus once (cheap next to embedding it) so that a bad line late in a large
  file fails before any model time is spent; returns the number of passages."""
  return sum(1 for _ in read_corpus(path))


def _short(value, limit: int = 60) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[:limit] + "..."


# ---- rendering for the agent --------------------------------------------------------------------

STYLES = ("search_r1", "verl")


def _render(index: int, passage: Passage, style: str) -> str:
  # Search-R1 (PeterGriffinJin/Search-R1 search_r1/llm_agent/generation.py `_passages2string`)
  # keeps the title line as is, quotes included: 'Doc 1(Title: "T") text\n'. verl's port, which
  # the APEx executor's search tool uses (volcengine/verl verl/tools/utils/search_r1_like_utils.py),
  # writes 'Doc 1 (Title: "T")\ntext' and separates documents by a blank line.
  title, _, text = passage.contents.partition("\n")
  if style == "search_r1":
    return f"Doc {index}(Title: {title}) {text}\n"
  if style == "verl":
    return f"Doc {index} (Title: {title})\n{text}\n\n"
  raise ValueError(f"style {style!r} is not one of {STYLES}")


def format_passages(passages: Sequence[Passage], max_chars: int | None = None,
                    style: str = "search_r1") -> str:
  """One query's results as the agent reads them. `max_chars` caps the whole string: when it
  would be longer, every document gets an equal share and is cut to it (ending in '...')."""
  blocks = [_render(i + 1, p, style) for i, p in enumerate(passages)]
  out = "".join(blocks)
  if max_chars is not None and len(out) > max_chars:
    if max_chars < 0:
      raise ValueError(f"max_chars must be >= 0, got {max_chars}")
    share = max_chars // max(len(blocks), 1)
    blocks = [b if len(b) <= share else _cut(b, share) for b in blocks]
    out = "".join(blocks)
  return out.strip() if style == "verl" else out


def _cut(block: str, size: int) -> str:
  end = "...\n"
  return block[:max(size - len(end), 0)] + end if size >= len(end) else block[:size]


def format_results(results: Sequence[Sequence[Passage]], max_chars: int | None = None,
                   style: str = "verl") -> str:
  """Several queries' results in one tool response, as verl's search tool joins them
  ('\\n---\\n' between queries); `max_chars` is split equally between the queries."""
  sep = "\n---\n"
  share = None
  if max_chars is not None:
    share = max(max_chars - len(sep) * (len(results) - 1), 0) // max(len(results), 1)
  return sep.join(format_passages(r, share, style) for r in results)
