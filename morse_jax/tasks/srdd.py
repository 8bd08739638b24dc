"""SRDD (ChatDev's Software Requirement Description Dataset): write a one-file Python program
(`main.py`) from a short requirement. There is no gold graph: the planner makes one.

Step reward of a node (the authors' rule), on the node's code run after its upstream code:
  raw = 0.5 * smoke + 0.5 * complete + 0.7 * cos(task, code) + 0.3 * cos(subtask, code)
  u   = raw / 2.0            (2.0 is raw's maximum, so u is in [0, 1])
- smoke: the code compiles and runs in the sandbox without error (see `runs`);
- complete: 1, or 0 when the code holds a placeholder (`verifier.placeholder`: a stub function
  body, a `# TODO`);
- cos: cosine similarity of embeddings (an injected embedder, default the MiniLM
  SentenceEmbedder) of the requirement text and the code, clipped to [0, 1]. Comments and
  docstrings are removed from the code first, so pasting the requirement into a comment earns
  nothing.
A node passes (may flow downstream) when smoke and complete are both 1. Unlike the authors'
rule, a node earns u = 0 when its code does not run (smoke 0) or computes nothing
(`computes_nothing`: only constants, names, returns, raises, sleeps, exits, empty arrays); such
replies would otherwise keep the complete and cos terms, and a policy settles for them.

Evaluation of a finished program (all nodes' code joined in graph order), after ChatDev:
- exec: 1 when the joined program compiles and runs (`runs`), else 0; an empty program is 0.
- completeness: 1 when the program holds no placeholder and no node was blocked, else 0.
- executability: ChatDev's per-program executability, which is the same test as exec (averaged
  over programs it is ChatDev's "percentage of software that compiles and runs").
- consistency: cos(requirement, program code) as above.
- eci_mean = mean and eci_product = product of (completeness, executability, consistency);
  the product is ChatDev's "quality".
- reward = eci_mean when exec is 1, else 0 (also 0 when the program computes nothing).
  `passed` = exec and completeness.
"Runs" follows ChatDev's check: the program exits with code 0 within the timeout, or is still
running at the timeout (a GUI loop or server) with no traceback on stderr (`timeout_ok`).
Exiting with code 0 counts only when the program ran to its end: it runs under a small runner
that reports completion on a pipe after the program's last statement, so `os._exit(0)`,
`sys.exit(0)` or `raise SystemExit` halfway through do not count. A program that ends itself
explicitly (sys.exit, exit, quit, os._exit, os.abort, os.kill, raise SystemExit /
KeyboardInterrupt) is flagged (`early_exit`) and does not run: smoke 0 (docs/SECURITY.md).
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import os
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from morse_jax.execution import sandbox, verifier
from morse_jax.lora.embedders import SentenceEmbedder
from morse_jax.tasks.base import NodeScore, Problem, ProblemScore

FAMILY = "srdd"
COLUMNS = ("name", "description", "category")
Embedder = Callable[[Sequence[str]], np.ndarray]  # texts -> [n, d]


def load(path: str) -> list[Problem]:
  """Problems of an SRDD CSV with a header row naming (case-insensitively) name, description,
  category; other columns are ignored. Ids are the names (a repeated name gets '#2', '#3')."""
  problems, counts = [], {}
  with open(path, newline="", encoding="utf-8-sig") as f:
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None:
      raise ValueError(f"{path}: empty file; expected a header row {', '.join(COLUMNS)}")
    index = {h.strip().lower(): i for i, h in enumerate(header)}
    for column in COLUMNS:
      if column not in index:
        raise ValueError(f"{path}:1: header lacks column {column!r} (found {header})")
    line = reader.line_num
    for row in reader:
      start, line = line + 1, reader.line_num
      if not any(cell.strip() for cell in row):
        continue
      values = {}
      for column in COLUMNS:
        if index[column] >= len(row) or not row[index[column]].strip():
          raise ValueError(f"{path}:{start}: field {column!r} is missing or empty")
        values[column] = row[index[column]].strip()
      name = values["name"]
      counts[name] = counts.get(name, 0) + 1
      pid = name if counts[name] == 1 else f"{name}#{counts[name]}"
      problems.append(Problem(id=pid, family=FAMILY, category=values["category"],
                              statement=f"{name}: {values['description']}",
                              data={"name": name, "description": values["description"]}))
  return problems


def split(problems: Sequence[Problem], which: str, seed: int = 0,
          holdout: int = 8) -> list[Problem]:
  """Out-of-domain split: `holdout` categories, drawn with `seed` from the sorted category
  names, are the test set; the rest train."""
  if which not in ("train", "test"):
    raise ValueError(f"split: which={which!r}; expected 'train' or 'test'")
  categories = sorted({p.category for p in problems})
  if not 0 < holdout < len(categories):
    raise ValueError(f"split: cannot hold out {holdout} of {len(categories)} categories")
  picked = np.random.default_rng(seed).choice(len(categories), holdout, replace=False)
  held = {categories[i] for i in picked}
  return [p for p in problems if (p.category in held) == (which == "test")]


def strip_comments(code: str) -> str:
  """The code without comments and docstrings (ast round trip; a regex when it does not parse)."""
  try:
    tree = verifier.parse(code)
  except (SyntaxError, ValueError, RecursionError):
    return _without_comment_lines(code)
  for node in ast.walk(tree):
    body = getattr(node, "body", None)
    if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)):
      node.body = body[1:] or [ast.Pass()]
  return ast.unparse(tree)


def _without_comment_lines(code: str) -> str:
  """`re.sub(r"(?m)^\\s*#.*$\\n?", "", code)` in linear time: each line whose first non-blank is
  '#' goes, with its newline and the blank lines right before it (over which that `\\s*` runs).
  The regex read a run of blank lines again from each of its line starts: quadratic."""
  lines = code.split("\n")
  kept, blanks = [], []  # blanks: the blank lines since the last kept one, each with its "\n"
  for k, line in enumerate(lines):
    piece = line + "\n" if k < len(lines) - 1 else line
    first = line.lstrip()
    if first.startswith("#"):
      blanks = []
    elif not first:
      blanks.append(piece)
    else:
      kept += blanks + [piece]
      blanks = []
  return "".join(kept + blanks)


def _has_pass_line(code: str) -> bool:
  """Whether a line is `pass`, alone or before a comment: what the search
  `(?m)^\\s*pass\\s*(#.*)?$` finds, one line at a time (the pattern's `\\s*` ran over a run
  of blank lines again from each of its line starts: quadratic)."""
  for line in code.split("\n"):
    first = line.lstrip()
    if first.startswith("pass"):
      rest = first[len("pass"):].lstrip()
      if not rest or rest.startswith("#"):
        return True
  return False


# Runs the program as __main__ and, only when its last statement finished, reports on the fd.
_RUNNER = """
import os as _os, sys as _sys, types as _types
def _run(program, fd):
  main = _types.ModuleType("__main__")
  main.__file__ = "main.py"
  _sys.modules["__main__"] = main
  exec(compile(program, "main.py", "exec"), main.__dict__)
  _os.write(fd, b"done")
"""
_EXITS = {("sys", "exit"), ("os", "_exit"), ("os", "abort"), ("os", "kill"), ("os", "killpg"),
          ("signal", "raise_signal"), ("signal", "pthread_kill")}


def early_exit(code: str) -> str | None:
  """Where the code ends its own process explicitly, or None (see the module docstring)."""
  try:
    tree = verifier.parse(code)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return None
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      f = node.func
      if isinstance(f, ast.Name) and f.id in ("exit", "quit", "_exit", "abort", "kill"):
        return f"{f.id}() at line {node.lineno}"
      if isinstance(f, ast.Attribute) and (getattr(f.value, "id", ""), f.attr) in _EXITS:
        return f"{f.value.id}.{f.attr}() at line {node.lineno}"
    if isinstance(node, ast.Raise) and node.exc is not None:
      exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
      if getattr(exc, "id", getattr(exc, "attr", "")) in ("SystemExit", "KeyboardInterrupt"):
        return f"raise {getattr(exc, 'id', getattr(exc, 'attr', ''))} at line {node.lineno}"
  return None


# Calls that compute nothing: waiting, leaving, an empty allocation, importing.
_INERT_CALLS = ("sleep", "exit", "quit", "_exit", "empty", "__import__")


def _inert(node: ast.AST, defined: set[str]) -> bool:
  """An expression that computes nothing: constants, names, containers of them, an input's item
  by a constant index, a choice between such, a call of an inert callable or of a function the
  code defines (each of which is checked itself)."""
  if isinstance(node, (ast.Constant, ast.Name)):
    return True
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return all(_inert(e, defined) for e in node.elts)
  if isinstance(node, ast.Dict):
    return all(_inert(e, defined) for e in [*node.values, *(k for k in node.keys if k)])
  if isinstance(node, (ast.UnaryOp, ast.BinOp)):  # constant arithmetic: 10 ** 6, -1
    return all(isinstance(n, (ast.Constant, ast.UnaryOp, ast.BinOp, ast.operator, ast.unaryop))
               for n in ast.walk(node))
  if isinstance(node, ast.Subscript):
    return isinstance(node.value, ast.Name) and isinstance(node.slice, ast.Constant)
  if isinstance(node, ast.IfExp):
    return all(_inert(e, defined) for e in (node.test, node.body, node.orelse))
  if isinstance(node, ast.Attribute):
    return _inert(node.value, defined)
  if isinstance(node, ast.Call):
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    if name not in _INERT_CALLS and name not in defined:
      return False
    if isinstance(f, ast.Attribute) and not _inert(f.value, defined):
      return False
    return all(_inert(a, defined) for a in [*node.args, *(k.value for k in node.keywords)])
  return False


def _inert_body(body: list[ast.stmt], defined: set[str]) -> bool:
  for stmt in body:
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass, ast.Global, ast.Nonlocal)):
      continue
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      if not _inert_body(stmt.body, defined):
        return False
    elif isinstance(stmt, (ast.Return, ast.Expr)):
      if stmt.value is not None and not _inert(stmt.value, defined):
        return False
    elif isinstance(stmt, ast.Raise):
      continue
    elif isinstance(stmt, ast.Assign):
      if not _inert(stmt.value, defined) or not all(isinstance(t, ast.Name)
                                                     for t in stmt.targets):
        return False
    elif isinstance(stmt, ast.If) and _main_guard(stmt.test):
      if not _inert_body(stmt.body, defined) or not _inert_body(stmt.orelse, defined):
        return False
    else:
      return False
  return True


def _main_guard(test: ast.expr) -> bool:
  return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
          and test.left.id == "__name__")


def computes_nothing(code: str) -> bool:
  """Whether the code does no work at all: every statement (module level and in every function
  and class) only imports, binds or returns constants, names, an input's item or containers of
  them, raises, or calls a function of the code or one that waits, exits or allocates an empty
  array; no operator, loop, branch (besides the `__main__` guard) or other call. Such a program
  earns no reward however long it "runs" (a sleep past the limit counts as running)."""
  try:
    tree = verifier.parse(code)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return False
  defined = {n.name for n in ast.walk(tree)
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
  return _inert_body(tree.body, defined)


def _complete(code: str) -> bool:
  if verifier.syntax_error(code):  # no AST: fall back to the text
    return not (_has_pass_line(code) or re.search(r"\bTODO\b", code))
  return verifier.placeholder(code) is None


@dataclasses.dataclass
class SRDD:
  embedder: Embedder | None = None  # default: a SentenceEmbedder, made on first use
  timeout_s: float = 5.0
  timeout_ok: bool = True
  name: str = FAMILY

  def embed(self, texts: Sequence[str]) -> np.ndarray:
    if self.embedder is None:
      self.embedder = SentenceEmbedder()
    return np.asarray(self.embedder(list(texts)), np.float64)

  def consistency(self, texts: Sequence[str], code: str) -> list[float]:
    """Cosine of each requirement text with the stripped code, clipped to [0, 1]."""
    stripped = strip_comments(code).strip()
    if not stripped:
      return [0.0] * len(texts)
    vectors = self.embed([*texts, stripped])  # [n + 1, d]
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return [float(np.clip(v @ vectors[-1], 0.0, 1.0)) for v in vectors[:-1]]

  def runs(self, program: str) -> tuple[bool, str]:
    """(whether the program compiles and runs, why not)."""
    if not program.strip():
      return False, "empty program"
    error = verifier.syntax_error(program)
    if error:
      return False, error
    flag = early_exit(program)
    if flag:
      return False, f"flagged early_exit: the program ends itself ({flag})"
    done_r, done_w = os.pipe()
    try:
      res = sandbox.run_python(_RUNNER + f"_run({program!r}, {done_w})\n",
                               timeout_s=self.timeout_s, pass_fds=(done_w,))
      os.set_blocking(done_r, False)
      try:
        finished = os.read(done_r, 16) == b"done"
      except BlockingIOError:
        finished = False
    finally:
      os.close(done_r)
    tail = (res.stderr.strip().splitlines() or [""])[-1][:300]
    if res.timed_out:
      ok = self.timeout_ok and "Traceback" not in res.stderr
      return ok, "" if ok else f"timed out after {self.timeout_s} s {tail}".strip()
    if res.returncode == 0 and finished:
      return True, ""
    if res.returncode == 0:
      return False, "the program stopped before its end (an early exit)"
    return False, f"exit code {res.returncode}: {tail}"

  def executor_instructions(self, problem: Problem, node: Mapping[str, Any]) -> str:
    return (f"We are building one Python program, main.py, for this software requirement:\n"
            f"{problem.statement}\n\nYour subtask: {node.get('title', '')}\n"
            f"{node.get('description', '')}\n\nWrite the code for this subtask only. The code of "
            "the earlier subtasks is placed before yours in main.py, so use what it defines and "
            "do not repeat it. The program must run without user input or error. Reply with the "
            "code in one ```python block, with no placeholders (`pass` bodies, TODO).")

  def score_node(self, problem: Problem, node: Mapping[str, Any], artifact: str,
                 upstream: Mapping[str, str]) -> NodeScore:
    checked = verifier.CodeCheck(check_placeholders=False)(artifact)
    if checked.code is None or not checked.code.strip():
      return NodeScore(0.0, False, {"reason": checked.reason})
    code = checked.code
    prefix = [verifier.extract_code(a) or a for a in upstream.values()]
    smoke, why = self.runs("\n\n".join([*prefix, code]))
    complete = _complete(code)
    task_c, sub_c = self.consistency(
        [problem.statement, f"{node.get('title', '')}: {node.get('description', '')}"], code)
    raw = 0.5 * smoke + 0.5 * complete + 0.7 * task_c + 0.3 * sub_c
    nothing = computes_nothing(code)
    details = {"smoke": float(smoke), "complete": float(complete), "task_consistency": task_c,
               "subtask_consistency": sub_c, "computes_nothing": float(nothing)}
    reason = why or (verifier.placeholder(code) if not complete else None)
    if nothing:
      reason = "; ".join(filter(None, ["the code computes nothing", reason]))
    if reason:
      details["reason"] = reason
    if why.startswith("flagged "):
      details["flagged"] = why.split()[1]
    # No reward for code that does not run or computes nothing (a policy would settle for it).
    reward = raw / 2.0 if smoke and not nothing else 0.0
    return NodeScore(reward, smoke and complete and not nothing, details)

  def program(self, problem: Problem, artifacts: Mapping[str, str | None]) -> tuple[str, int]:
    """(main.py: the nodes' code joined in graph order, how many nodes were blocked)."""
    order = [n["id"] for n in problem.gold_graph or ()]
    ids = [i for i in order if i in artifacts] + [i for i in artifacts if i not in order]
    parts = [verifier.extract_code(artifacts[i]) or artifacts[i] for i in ids
             if artifacts[i] is not None]
    return "\n\n".join(parts), len(ids) - len(parts)

  def score_problem(self, problem: Problem, artifacts: Mapping[str, str | None]) -> ProblemScore:
    program, blocked = self.program(problem, artifacts)
    executes, _ = self.runs(program)
    exec_ = float(executes)
    completeness = float(bool(program.strip()) and blocked == 0 and _complete(program))
    consistency = self.consistency([problem.statement], program)[0]
    eci = (completeness, exec_, consistency)
    metrics = {"exec": exec_, "completeness": completeness, "executability": exec_,
               "consistency": consistency, "eci_mean": float(np.mean(eci)),
               "eci_product": float(np.prod(eci))}
    metrics["computes_nothing"] = float(bool(program.strip()) and computes_nothing(program))
    metrics["reward"] = metrics["eci_mean"] if executes and not metrics["computes_nothing"] else 0.0
    metrics["flagged"] = float(early_exit(program) is not None)
    return ProblemScore(bool(executes and completeness), metrics)
