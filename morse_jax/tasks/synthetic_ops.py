"""The building block of the synthetic suite: one subtask type (an `Op`) and its random inputs.

An op is one small function on integer lists, integers or strings, written three ways that must
agree: an English noun phrase (`doc`, for the statement and the node description), a Python body
(`code`, the reference implementation shown to a model) and a Python callable (`fn`, which makes
the expected values of the unit tests without running any source text). A test in
tests/tasks/test_synthetic.py runs every op's `code` in the sandbox against its `fn`.

Templates use `{a}`, `{b}` (the op's inputs) and `{k}` (its integer parameter, when it has one);
they are filled with `str.replace`, so code may use braces freely. Bodies must not use the local
names `a`, `b`, `xs` or `s`: those hold the inputs.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable

TYPES = {"L": "list", "I": "int", "S": "str"}
ANNOTATION = {"list": "list[int]", "int": "int", "str": "str"}
ARG = {"list": "xs", "str": "s"}  # the argument of every function of a task, by input type
DESCRIBE_INPUT = {"list": "a list of integers", "str": "a string"}

_VOWELS = "aeiou"
_CONSONANTS = "bcdfghjklmnpqrstvwxyz"


@dataclasses.dataclass(frozen=True)
class Op:
  """One subtask type. `inputs`/`output` are "list", "int" or "str"; two inputs make a merge."""

  key: str  # the type's id, e.g. "keep_greater_than"
  category: str
  inputs: tuple[str, ...]
  output: str
  doc: str  # noun phrase: "the elements of `{a}` that are even, in their original order"
  code: str  # function body (unindented lines, the last one returns)
  fn: Callable[..., Any]  # fn(k, a) or fn(k, a, b); k is None for ops without a parameter
  ks: tuple[int, ...] = ()  # the parameter's choices; () for none
  name: str = ""  # function name template; default `key`

  @property
  def arity(self) -> int:
    return len(self.inputs)

  def function_name(self, k: int | None) -> str:
    return _fill(self.name or self.key, None, None, k)

  def describe(self, k: int | None, a: str, b: str | None = None) -> str:
    return _fill(self.doc, a, b, k)

  def body(self, k: int | None, a: str, b: str | None = None) -> list[str]:
    return _fill(self.code, a, b, k).strip("\n").splitlines()

  def __call__(self, k: int | None, *args: Any) -> Any:
    return self.fn(k, *args)


def _fill(template: str, a: str | None, b: str | None, k: int | None) -> str:
  out = template
  for key, value in (("{a}", a), ("{b}", b), ("{k}", k)):
    if value is not None:
      out = out.replace(key, str(value))
  return out


def make(key: str, category: str, sig: str, doc: str, code: str, fn: Callable[..., Any],
         ks: tuple[int, ...] = (), name: str = "") -> Op:
  """An op from a compact signature: "L->L", "LI->L", "S->I" (L list, I int, S str)."""
  ins, out = sig.split("->")
  return Op(key, category, tuple(TYPES[c] for c in ins), TYPES[out], doc, code, fn, ks, name)


def random_list(rng: random.Random) -> list[int]:
  return [rng.randint(-9, 9) for _ in range(rng.randint(2, 8))]


def random_word(rng: random.Random) -> str:
  chars: list[str] = []
  for _ in range(rng.randint(1, 6)):
    if chars and rng.random() < 0.15:
      chars.append(chars[-1])  # doubled letters, so that collapsing runs has work to do
      continue
    roll = rng.random()
    c = (rng.choice(_VOWELS) if roll < 0.4 else rng.choice("0123456789") if roll < 0.5
         else rng.choice(_CONSONANTS))
    chars.append(c.upper() if rng.random() < 0.25 else c)
  return "".join(chars)


def random_str(rng: random.Random) -> str:
  return " ".join(random_word(rng) for _ in range(rng.randint(1, 5)))


def random_value(kind: str, rng: random.Random) -> Any:
  if kind == "list":
    return random_list(rng)
  if kind == "str":
    return random_str(rng)
  return rng.randint(-30, 30)


EMPTY = {"list": [], "str": "", "int": 0}  # the edge case every node's unit tests include
