"""Rule-based checks shared by the task families: find the code in a reply, reject code that does
not compile or is a stub, and run test snippets against a program in the sandbox.

Model output is never trusted: every check returns a reason string instead of raising. Tests run
in a trusted harness process (`harness.py`) against the program, which runs in the sandbox
(`harness_server.py`) and answers calls with plain data; all snippets of one program share one
sandbox call and one harness (a process start costs far more than a snippet). See
docs/SECURITY.md for the threat model.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import io
import json
import math
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import tokenize
import unicodedata
from typing import Sequence

from morse_jax.execution import sandbox

# CPython 3.11's parser is not thread-safe ("AST constructor recursion depth mismatch" when
# scorers run in threads), so every parse and compile of model code goes through this lock.
_PARSE_LOCK = threading.Lock()


def parse(code: str) -> ast.Module:
  with _PARSE_LOCK:
    return ast.parse(code)


# An opening fence line: indent, three or more backticks, a language word, then anything without
# a backtick. The rest of the line is checked with `in`, not by the pattern: `[^`\s]*[^`]*$`
# backtracks over every split of a long line that holds a backtick late (quadratic).
_OPEN = re.compile(r"(?P<indent>[ \t]*)(?P<fence>`{3,})[ \t]*(?P<lang>[^`\s]*)")
_PYTHON = ("python", "py", "python3", "py3")
_TOP_LEVEL = re.compile(r"^(?:async\s+def|def|class|import|from)\s|^@")
_TODO = re.compile(r"\bTODO\b")
_TODO_NOTE = re.compile(r"\bTODO\s*[:(\-]")  # "TODO: ...", "TODO(me)", "TODO - ..."
# Decorators and bases whose methods are stubs by design, not by laziness.
_ABSTRACT_DECORATORS = ("abstractmethod", "overload", "abstractproperty")
_ABSTRACT_BASES = ("ABC", "Protocol")


def _open_fence(line: str) -> re.Match | None:
  match = _OPEN.match(line)
  return match if match and "`" not in line[match.end():] else None


@dataclasses.dataclass(frozen=True)
class _Block:
  lang: str
  code: str
  closed: bool
  after: str  # indented lines right after the closing fence: a body the reply left outside


def _blocks(text: str) -> list[_Block]:
  blocks: list[_Block] = []
  lines = text.splitlines()
  i = 0
  while i < len(lines):
    match = _open_fence(lines[i])
    if not match:
      i += 1
      continue
    indent, fence = match["indent"], match["fence"]
    body, closed, i = [], False, i + 1
    while i < len(lines) and not closed:
      line, stripped = lines[i], lines[i].strip()
      closed = stripped.startswith(fence) and not stripped.strip("`")
      if not closed and stripped.endswith(fence):  # `return x```` closes on a code line
        line, closed = line.rstrip()[:-len(fence)], True
      if not closed or stripped.strip("`"):
        body.append(line[len(indent):] if line.startswith(indent) else line)
      i += 1
    after, j = [], i
    while closed and j < len(lines) and not _open_fence(lines[j]) and (
        not lines[j].strip() or lines[j][:1].isspace()):
      after.append(lines[j])
      j += 1
    while after and not after[-1].strip():
      after.pop()
    if closed or any(b.strip() for b in body):  # a stray trailing fence is no block
      blocks.append(_Block(match["lang"].lower(), "\n".join(body) + "\n", closed,
                           "\n".join(after) + "\n" if after else ""))
  return blocks


_TIERS = (lambda lang: lang in _PYTHON, lambda lang: lang == "", lambda lang: True)


def implements(code: str | None, entry_point: str) -> bool:
  """Whether code compiles, defines `entry_point` at top level with a real body (not only a
  docstring / pass / ...) and holds no placeholder: what a reply that solves the task must be."""
  if not code or syntax_error(code):
    return False
  tree = parse(code)
  defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
          and n.name == entry_point]
  # Python keeps the last definition of a name, so that is the one that must be real.
  return bool(defs) and _stub_kind(defs[-1].body) is None and placeholder(code) is None


def _with_body_after(block: _Block) -> str:
  """The block, or the block plus the indented lines after its fence when the block alone is a
  stub or does not compile (a reply that repeats the prompt's signature and docstring in a fence,
  then writes the body below it) and the two together compile without a stub."""
  if not block.after or not (syntax_error(block.code) or placeholder(block.code)):
    return block.code
  joined = block.code + block.after
  return joined if not syntax_error(joined) and not placeholder(joined) else block.code


def extract_code(text: str, entry_point: str | None = None) -> str | None:
  """The code of a reply; None when the text has no fence.

  With `entry_point`: the last block (```python first, then unlabelled, then any) that
  `implements` it, so a complete attempt is not hidden by a later repeat of the prompt's
  signature, a bare usage example or a block cut off at the token limit. Otherwise, and when no
  block implements it: the last ```python (or ```py) block, else the last unlabelled one, else
  the last of any language. A final fence left open (a reply cut off at the token limit) counts
  as a block running to the end; the syntax check judges what is in it, unless it does not
  compile and other blocks exist: then it is dropped. A stub block followed by indented lines
  outside the fence takes them as its body when that compiles without a stub."""
  blocks = _blocks(text)
  if not blocks:
    return None
  if entry_point:
    for wanted in _TIERS:
      for block in reversed([b for b in blocks if wanted(b.lang)]):
        for code in (block.code, block.code + block.after) if block.after else (block.code,):
          if implements(code, entry_point):
            return code
  last = blocks[-1]
  if len(blocks) > 1 and not last.closed and syntax_error(last.code):
    blocks = blocks[:-1]  # cut off mid-way: an earlier block is the better guess
  for wanted in _TIERS:
    chosen = [b for b in blocks if wanted(b.lang)]
    if chosen:
      return _with_body_after(chosen[-1])
  return None


MAX_DROPPED = 16  # trailing top-level statements unfenced_code may drop from a run of code


def unfenced_code(text: str, entry_point: str) -> str | None:
  """For replies whose code is not (or not only) in fences: the last run of code-like lines that
  `implements` entry_point. A run starts at a line that opens a top-level def, class, import or
  decorator and goes on over indented, blank and further such lines; prose at column 0 ends it.
  Trailing top-level statements that keep it from implementing the name (a body-less repeat of
  the signature, a repeat cut off at the token limit) are dropped, up to MAX_DROPPED of them:
  each try compiles the run again, so trying them all was quadratic in a run of many short
  statements. Ends before the first line that names entry_point are not tried."""
  lines = text.splitlines()
  found, i = None, 0
  while i < len(lines):
    if not _TOP_LEVEL.match(lines[i]):
      i += 1
      continue
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or lines[j][:1].isspace()
                              or _TOP_LEVEL.match(lines[j]) or lines[j][:1] in "#)]}"):
      j += 1
    # (NFKC: Python reads identifiers so, `def ａdd` defines add)
    named = next((k for k in range(i, j)
                  if entry_point in unicodedata.normalize("NFKC", lines[k])), j)
    starts = [k for k in range(named + 1, j) if _TOP_LEVEL.match(lines[k])]
    ends = [j] + starts[::-1][:MAX_DROPPED] if named < j else []
    for end in ends:  # the whole run, then without its last statements
      code = "\n".join(lines[i:end]).rstrip() + "\n"
      if implements(code, entry_point):
        found = code
        break
    i = j
  return found


def syntax_error(code: str) -> str | None:
  """A one-line message with the line number, or None when the code compiles. `compile`, not only
  `ast.parse`, so that errors found after parsing ('return' outside function) count too."""
  try:
    with _PARSE_LOCK:
      compile(code, "<artifact>", "exec", dont_inherit=True)
  except SyntaxError as e:
    text = (e.text or "").strip()
    where = f" at line {e.lineno}" if e.lineno else ""
    return f"syntax error{where}: {e.msg}" + (f": {text[:120]}" if text else "")
  except (ValueError, OverflowError, RecursionError, MemoryError) as e:  # null bytes, huge code
    return f"code does not compile: {type(e).__name__}: {e}"
  return None


def _is_docstring(stmt: ast.stmt) -> bool:
  return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
          and isinstance(stmt.value.value, str))


def _stub_kind(body: list[ast.stmt]) -> str | None:
  """Why a function body is a stub: nothing but pass / ... / a docstring / raise
  NotImplementedError."""
  rest = body[1:] if body and _is_docstring(body[0]) else body
  if not rest:
    return "only a docstring"
  kinds = set()
  for stmt in rest:
    if isinstance(stmt, ast.Pass):
      kinds.add("pass")
    elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
          and stmt.value.value is Ellipsis):
      kinds.add("...")
    elif isinstance(stmt, ast.Raise) and stmt.exc is not None and "NotImplementedError" in {
        getattr(stmt.exc, "id", None), getattr(getattr(stmt.exc, "func", None), "id", None)}:
      kinds.add("raise NotImplementedError")
    else:
      return None
  return " / ".join(sorted(kinds))


def _name(node: ast.expr) -> str:
  """`abc.abstractmethod` -> 'abstractmethod', `Protocol[T]` -> 'Protocol', other -> ''."""
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Attribute):
    return node.attr
  if isinstance(node, ast.Subscript):
    return _name(node.value)
  return ""


def _shadowed_defs(tree: ast.AST) -> set[int]:
  """ids of function definitions that a later definition of the same name in the same body
  replaces: they never run, so a stub among them is no placeholder (a reply that repeats the
  prompt's stub and then defines the function, as small models do)."""
  out: set[int] = set()
  for node in ast.walk(tree):
    body = getattr(node, "body", None)
    if not isinstance(body, list):
      continue
    last: dict[str, ast.AST] = {}
    for stmt in body:
      if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if stmt.name in last:
          out.add(id(last[stmt.name]))
        last[stmt.name] = stmt
  return out


def placeholder(code: str) -> str | None:
  """A description of the first stub found, or None. Stubs: a function whose body is only pass,
  `...`, a docstring or `raise NotImplementedError` (abstract methods, overloads and methods of
  ABC / Protocol classes excepted: those are stubs by design); a `# TODO` comment; a string
  literal holding a TODO note ('TODO:', 'TODO(', 'TODO -'; a bare 'TODO' word in a string may be
  data, e.g. a to-do app's status). Code that does not parse returns None: syntax_error reports
  it."""
  try:
    tree = parse(code)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return None
  exempt: set[int] = set()
  for cls in ast.walk(tree):
    if isinstance(cls, ast.ClassDef) and any(_name(b) in _ABSTRACT_BASES for b in cls.bases):
      exempt.update(id(f) for f in cls.body)
  exempt.update(_shadowed_defs(tree))
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and id(node) not in exempt:
      if any(_name(d.func if isinstance(d, ast.Call) else d) in _ABSTRACT_DECORATORS
             for d in node.decorator_list):
        continue
      kind = _stub_kind(node.body)
      if kind:
        return f"function {node.name!r} (line {node.lineno}) is a placeholder: its body is {kind}"
  try:
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
      if tok.type == tokenize.COMMENT and _TODO.search(tok.string):
        return f"TODO comment at line {tok.start[0]}: {tok.string.strip()[:80]}"
  except (tokenize.TokenError, SyntaxError):
    pass
  for node in ast.walk(tree):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      if _TODO_NOTE.search(node.value):
        return f"TODO string at line {node.lineno}: {node.value.strip()[:80]!r}"
  return None


@dataclasses.dataclass(frozen=True)
class CheckedCode:
  code: str | None  # the extracted code; None when none was found
  reason: str | None = None  # why the code is rejected; None when it passes every check

  @property
  def ok(self) -> bool:
    return self.code is not None and self.reason is None


@dataclasses.dataclass(frozen=True)
class CodeCheck:
  """extract -> syntax -> placeholder. `allow_unfenced` takes a reply without any fence as code
  (raw completions); otherwise a missing fence is a format failure."""

  allow_unfenced: bool = False
  check_placeholders: bool = True

  def __call__(self, text: str) -> CheckedCode:
    code = extract_code(text)
    if code is None:
      if not self.allow_unfenced:
        return CheckedCode(None, "no fenced code block in the reply")
      code = text
    if not code.strip():
      return CheckedCode(code, "the code block is empty")
    reason = syntax_error(code) or (placeholder(code) if self.check_placeholders else None)
    return CheckedCode(code, reason)


@dataclasses.dataclass(frozen=True)
class TestRun:
  __test__ = False  # not a pytest class

  passed: int
  total: int
  errors: list[str]
  isolation: str = ""
  flags: tuple[bool, ...] = ()  # per test, in order: passed (empty when no summary came back)

  @property
  def fraction(self) -> float:
    return self.passed / self.total if self.total else 0.0


_HERE = os.path.dirname(os.path.abspath(__file__))
_HARNESS_PATH = os.path.join(_HERE, "harness.py")
_HARNESS_GRACE_S = 5.0  # the trusted harness's own deadline past timeout_s


@functools.cache
def _site_paths() -> list[str]:
  """Where the harness finds numpy and scipy (for values and SciCode's tests): our site dirs."""
  return [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]


@functools.cache
def _source(path: str) -> str:
  """A file's text, read once: the harness and the server run from this copy, so a program
  that can write the project's files (reduced isolation as the scoring user) cannot change
  them for later runs."""
  with open(path, encoding="utf-8") as f:
    return f.read()


def _server_source() -> str:
  return _source(os.path.join(_HERE, "harness_server.py"))


def _close_all(fds: Sequence[int]) -> None:
  for fd in fds:
    os.close(fd)


def _await_harness(harness: subprocess.Popen, timeout_s: float) -> bool:
  """Whether the harness says it is non-dumpable (its first byte), within timeout_s. Under
  reduced isolation the programs start only then: run as our uid, they could otherwise open
  its memory or its stdin (the tests) before it protects itself."""
  fd = harness.stdout.fileno()
  return bool(select.select([fd], [], [], timeout_s)[0]) and os.read(fd, 1) == b"+"


def _strict_source() -> str:
  """strict.py, run inside the harness for the tests' comparisons (it has no project path)."""
  return _source(os.path.join(_HERE, "strict.py"))


def _identifiers(code: str) -> set[str] | None:
  """Every identifier and string constant in code (None: it does not parse)."""
  try:
    tree = parse(code)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return None
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Name):
      found.add(node.id)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      found.add(node.name)
    elif isinstance(node, ast.alias):
      found.add((node.asname or node.name).split(".")[0])
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      found.add(node.value)
  return found


def _module_names(code: str) -> set[str] | None:
  """Names code may bind at module level: top-level assignments, defs, classes and imports
  (function and class bodies aside), names declared `global` anywhere, and every string
  constant (a name bound through globals()[...]). None: it does not parse."""
  try:
    tree = parse(code)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return None
  found, stack = set(), list(tree.body)
  while stack:
    node = stack.pop()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      found.add(node.name)
      continue
    for child in ast.iter_child_nodes(node):
      stack.append(child)
    if isinstance(node, ast.Name):
      found.add(node.id)
    elif isinstance(node, ast.alias):
      found.add((node.asname or node.name).split(".")[0])
  for node in ast.walk(tree):
    if isinstance(node, ast.Global):
      found.update(node.names)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      found.add(node.value)
  return found


def _mentions(upstream: str, tests: Sequence[str], prelude: str) -> bool:
  """Whether a test may use something the upstream code defines (conservatively: a name the
  tests use, other than the builtins and what the trusted prelude binds, is one the upstream
  code may bind at module level, or something does not parse)."""
  defined, trusted = _module_names(upstream), _identifiers(prelude)
  used = [_identifiers(t) for t in tests]
  if defined is None or trusted is None or any(u is None for u in used):
    return True
  defined -= trusted | set(dir(builtins))
  return any(u & defined for u in used)


# A test's default wall-clock limit, from its CPU limit: generous, so that a correct program on a
# loaded machine (where its wall time is several times its CPU time) is not cut by it, yet a
# program that sleeps or blocks (no CPU used) is stopped.
WALL_FACTOR = 4.0
WALL_EXTRA_S = 10.0


def per_test_limits(per_test_timeout_s: float | None,
                    per_test_wall_s: float | None = None) -> dict[str, float]:
  """One test's limits, checked: {"cpu": CPU seconds, "wall": wall-clock seconds}, either left
  out when not set. The wall limit defaults to max(WALL_FACTOR x cpu, cpu + WALL_EXTRA_S)."""
  for field, value in (("per_test_timeout_s", per_test_timeout_s),
                       ("per_test_wall_s", per_test_wall_s)):
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value) or value <= 0):
      raise ValueError(f"{field}={value!r}: expected a positive number of seconds or None")
  cpu, wall = per_test_timeout_s, per_test_wall_s
  if cpu is not None and wall is not None and wall < cpu:
    raise ValueError(f"per_test_wall_s={wall!r} is below per_test_timeout_s={cpu!r}: the "
                     "wall-clock limit must be at least the CPU limit")
  if cpu is not None and wall is None:
    wall = max(WALL_FACTOR * cpu, cpu + WALL_EXTRA_S)
  return {k: float(v) for k, v in (("cpu", cpu), ("wall", wall)) if v is not None}


def run_tests(program: str, tests: Sequence[str], *, timeout_s: float = 10.0,
              per_test_timeout_s: float | None = None, per_test_wall_s: float | None = None,
              memory_mb: int = 512, shared_namespace: bool = False,
              files: dict[str, str] | None = None,
              prelude: str = "", remote: Sequence[str] | None = None,
              upstream: str | None = None, groups: Sequence[int] | None = None) -> TestRun:
  """Runs the test snippets against `program`; a test passes when it raises nothing.

  Two kinds of process, so the program can neither see nor touch the tests (docs/SECURITY.md):
  - the program (model-written, untrusted) runs in the sandbox as module `solution`, inside
    `harness_server`, and only answers calls;
  - the tests (trusted) run in `harness.py`, a separate plain subprocess that holds the test
    source, execs `prelude` (trusted code: HumanEval's prompt, SciCode's imports), binds every
    name a test uses that the prelude and the builtins do not bind (or, with `remote`, exactly
    those names) to a proxy of the program's object of that name, and makes every assert's
    comparison itself, on plain data decoded from the program's answers.
  `upstream`: code the program runs after (earlier steps' code); the program's sandbox runs
  `upstream` + `program`, and a second sandbox runs `upstream` alone, whose definitions the
  tests use, so the program cannot replace a function of the code it builds on. `shared_namespace`: the
  tests run in order in one namespace (a later test sees what an earlier one bound);
  otherwise each in a copy. `groups` (one id per test, equal ids adjacent): with
  `shared_namespace`, each run of equal ids gets a fresh namespace of its own, so one call can run
  a test suite several times over (the null programs' baseline, `tasks.nulls`). `per_test_timeout_s`: the CPU seconds one test may use, in each
  program's calls (a CPU timer there, and the CPU time of its processes, which the harness reads
  from /proc) and in the test's own code (a timer in the harness), so that machine load does not
  decide a reward; `per_test_wall_s`: the test's wall-clock limit, which stops a program that
  sleeps or blocks (default: `per_test_limits`); `timeout_s` bounds the whole call in wall-clock
  time. `files`: extra files, importable on both sides (e.g. SciCode's `scicode.compare`). When
  the harness gives no readable summary (timeout, crash), nothing counts as passed."""
  tests = list(tests)
  if groups is not None and len(groups) != len(tests):
    raise ValueError(f"run_tests: groups has {len(groups)} ids for {len(tests)} tests")
  limits = per_test_limits(per_test_timeout_s, per_test_wall_s)
  isolation = sandbox.ensure_available()
  if upstream and not _mentions(upstream, tests, prelude):  # nothing of it to protect: one sandbox
    program, upstream = f"{upstream}\n\n{program}", None
  codes = [("upstream", upstream), ("program", f"{upstream}\n\n{program}")] if upstream else [
      ("program", program)]
  job = {"tests": tests, "prelude": prelude, "support": dict(files or {}),
         "remote": list(remote) if remote is not None else None,
         "per_test": limits, "shared": bool(shared_namespace),
         "groups": [int(g) for g in groups] if groups is not None else None,
         "timeout": timeout_s, "memory_mb": max(memory_mb, 1024) * 2,
         "sys_path": _site_paths(), "strict": _strict_source()}
  out, err, results = _run_harness(codes, job, timeout_s=timeout_s, memory_mb=memory_mb,
                                   files=files)
  res = results.get("program")
  isolation = res.isolation if res is not None else isolation
  return _test_run(out, err, tests, isolation, timed_out=res is not None and res.timed_out,
                   timeout_s=timeout_s)


@dataclasses.dataclass
class _Servers:
  """The sandboxed programs of one `run_tests` call, before and while they run: per program two
  pipes (requests in, answers out) and the thread that runs it in the sandbox."""

  spec: list[dict] = dataclasses.field(default_factory=list)  # per program, for the harness
  harness_fds: list[int] = dataclasses.field(default_factory=list)  # the harness's pipe ends
  # the programs' ends: run_python owns them once its thread starts
  server_fds: list[int] = dataclasses.field(default_factory=list)
  threads: list[threading.Thread] = dataclasses.field(default_factory=list)
  launched: list[threading.Event] = dataclasses.field(default_factory=list)
  # each program's host pid: the harness measures its CPU time there
  pids: dict[str, int] = dataclasses.field(default_factory=dict)
  results: dict = dataclasses.field(default_factory=dict)  # label -> run_python's result or error

  def add(self, label: str, code: str, *, timeout_s: float, memory_mb: int,
          files: dict[str, str] | None) -> None:
    """One program's pipes and its (unstarted) thread."""
    req_r, req_w = os.pipe()
    self.harness_fds.append(req_w)
    self.server_fds.append(req_r)
    resp_r, resp_w = os.pipe()
    self.harness_fds.append(resp_r)
    self.server_fds.append(resp_w)
    self.spec.append({"label": label, "request_fd": req_w, "response_fd": resp_r})
    # _os._exit after the loop: a thread the program left running cannot keep it alive.
    source = _server_source() + f"\n_serve({code!r}, {req_r}, {resp_w})\n_os._exit(0)\n"
    launched = threading.Event()
    self.launched.append(launched)

    def on_start(pid):
      self.pids[label] = pid
      launched.set()

    def serve():
      try:
        self.results[label] = sandbox.run_python(source, timeout_s=timeout_s,
                                                 memory_mb=memory_mb, files=files,
                                                 pass_fds=(req_r, resp_w), on_start=on_start)
      except BaseException as e:  # pylint: disable=broad-except
        self.results[label] = e
      finally:
        launched.set()
    self.threads.append(threading.Thread(target=serve, daemon=True))

  def start(self, harness: subprocess.Popen, timeout_s: float) -> None:
    """The programs started once the harness has protected itself (`_await_harness`), each
    one's pid in `spec`; none when it did not."""
    _close_all(self.harness_fds)  # the harness holds them now: it sees EOF when a program ends
    self.harness_fds = []
    if not _await_harness(harness, timeout_s):
      self.threads = []  # closed unstarted: the harness sees the programs gone
      _close_all(self.server_fds)
    self.server_fds = []
    for t in self.threads:
      t.start()
    for event in self.launched if self.threads else ():
      event.wait(timeout_s)
    for server in self.spec:
      server["pid"] = self.pids.get(server["label"])

  def join(self) -> None:
    """Waits for the threads that started (each ends with its program's sandbox)."""
    for t in self.threads:
      if t.ident is not None:
        t.join()


def _run_harness(codes: Sequence[tuple[str, str]], job: dict, *, timeout_s: float,
                 memory_mb: int, files: dict[str, str] | None) -> tuple[bytes, bytes, dict]:
  """(the harness's stdout, its stderr, label -> each program's run_python result): the programs
  in their sandboxes, the harness sent `job` with their pipes; an error of a sandbox is raised
  once everything is shut down."""
  servers = _Servers()
  workdir = tempfile.mkdtemp(prefix="morse-harness-")
  harness = None
  try:
    for label, code in codes:
      servers.add(label, code, timeout_s=timeout_s, memory_mb=memory_mb, files=files)
    harness = _start_harness(workdir, servers.harness_fds)
    servers.start(harness, timeout_s)
    out, err = _send_job(harness, {"servers": servers.spec, **job}, timeout_s)
  finally:
    _close_all(servers.harness_fds + servers.server_fds)
    if harness is not None:
      try:
        os.killpg(harness.pid, 9)
      except (ProcessLookupError, PermissionError):
        pass
      harness.wait()
    servers.join()
    shutil.rmtree(workdir, ignore_errors=True)
  for res in servers.results.values():
    if isinstance(res, BaseException):
      raise res
  return out, err, servers.results


def _start_harness(workdir: str, fds: Sequence[int]) -> subprocess.Popen:
  """The trusted harness, a plain subprocess in its own session and a bare environment, holding
  the harness's ends of the programs' pipes."""
  return subprocess.Popen(  # -S: no site processing (faster); the job names site-packages
      [sys.executable, "-I", "-S", "-B", "-c", _source(_HARNESS_PATH)], stdin=subprocess.PIPE,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=workdir, start_new_session=True,
      env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir,
           "LANG": "C.UTF-8"}, pass_fds=tuple(fds))


def _send_job(harness: subprocess.Popen, job: dict, timeout_s: float) -> tuple[bytes, bytes]:
  """The harness's stdout and stderr after it ran `job`; empty output past its deadline."""
  try:
    return harness.communicate(json.dumps(job).encode(), timeout=timeout_s + _HARNESS_GRACE_S)
  except subprocess.TimeoutExpired:
    return b"", b"the trusted harness ran past its deadline"


def _test_run(out: bytes, err: bytes, tests: list[str], isolation: str, *, timed_out: bool,
              timeout_s: float) -> TestRun:
  """The harness's summary as a TestRun; without a readable one, nothing counts as passed."""
  try:
    summary = json.loads(out)
  except ValueError:
    summary = None
  if not (isinstance(summary, dict) and len(summary.get("passed", ())) == len(tests)):
    why = (err.decode(errors="replace").strip().splitlines() or ["no summary"])[-1][:200]
    return TestRun(0, len(tests), [f"test run failed: the harness gave no summary: {why}"],
                   isolation)
  if summary.get("harness_error"):
    return TestRun(0, len(tests), [f"test run failed: {summary['harness_error']}"], isolation)
  if summary.get("program_error"):
    return TestRun(0, len(tests), [str(summary["program_error"])[:400]], isolation)
  errors = []
  for i, (ok, err_text) in enumerate(zip(summary["passed"], summary["errors"])):
    if not ok:
      first = tests[i].strip().splitlines()[-1:] or [""]
      why = err_text or "failed"
      if timed_out:
        why += f" (the program timed out after {timeout_s} s)"
      errors.append(f"test {i} ({first[0][:100]}): {why}")
  flags = tuple(ok is True for ok in summary["passed"])
  return TestRun(sum(flags), len(tests), errors, isolation, flags)
