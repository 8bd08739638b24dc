"""Package layering: lower layers never import higher ones, and no import circle among our modules.

Two checks: importing a module in a fresh interpreter loads no module of a higher layer; and, read
from the source (every `import`, deferred ones inside functions included), no package imports a
higher one and no chain of imports leads from a module back to itself. The packages never import
the programs and settings around them (`configs`, `launchers`, `benchmarks`); apex_jax's own
packages import only lower layers of `APEX`. Our own modules are imported at the top of a file,
never inside a function.
"""

import ast
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOTS = ("morse_jax", "apex_jax", "configs", "launchers", "benchmarks")
MORSE = ("checkpoint", "llm", "lora", "rl", "execution", "tasks", "mas", "baselines",
         "experiments", "toy", "serving")


AROUND = ("configs", "launchers", "benchmarks")
# apex_jax's packages and top-level modules, lowest layer first, ordered by today's imports: each
# imports only layers below its own (morse_jax and third parties aside).
APEX = (("memory", "tools", "plots"), ("judges",), ("datasets", "agents"), ("training",),
        ("toy", "experiment", "ablations", "row_scores"), ("baselines",), ("pipeline",),
        ("seeds",), ("vision_demo",))


def _others(*keep: str) -> tuple[str, ...]:
  return tuple(f"morse_jax.{p}" for p in MORSE if p not in keep)


def _apex_layers() -> dict[str, tuple[str, ...]]:
  """apex_jax.<p> -> its own layer's other members and every higher layer's."""
  out = {}
  for i, layer in enumerate(APEX):
    for p in layer:
      out[f"apex_jax.{p}"] = tuple(f"apex_jax.{q}" for upper in APEX[i:] for q in upper if q != p)
  return out


# package -> packages it must never import (directly, at any depth of its own modules).
LAYERS = {
    "morse_jax": ("apex_jax",) + AROUND,
    "apex_jax": AROUND,
    **_apex_layers(),
    "morse_jax.llm": _others("llm"),
    "morse_jax.lora": _others("llm", "lora"),
    "morse_jax.rl": ("morse_jax.execution", "morse_jax.tasks", "morse_jax.mas",
                     "morse_jax.baselines", "morse_jax.experiments", "morse_jax.toy",
                     "morse_jax.serving"),
    "morse_jax.checkpoint": _others("checkpoint"),
    "morse_jax.execution": _others("execution"),
    "morse_jax.serving": _others("serving"),
    "morse_jax.tasks": ("morse_jax.mas", "morse_jax.baselines", "morse_jax.experiments",
                        "morse_jax.toy"),
    "morse_jax.mas": ("morse_jax.baselines", "morse_jax.experiments", "morse_jax.toy"),
    "morse_jax.baselines": ("morse_jax.experiments", "morse_jax.toy"),
}


def modules(repo: str, roots=ROOTS) -> dict[str, str]:
  """Dotted module name -> file, for every .py under the roots (a package by its __init__)."""
  found = {}
  for root in roots:
    for folder, _, files in os.walk(os.path.join(repo, root)):
      for name in files:
        if name.endswith(".py"):
          parts = os.path.relpath(os.path.join(folder, name), repo)[:-3].split(os.sep)
          if parts[-1] == "__init__":
            parts = parts[:-1]
          found[".".join(parts)] = os.path.join(folder, name)
  return found


def import_graph(repo: str, roots=ROOTS) -> dict[str, set[str]]:
  """Module -> the modules of ours it imports anywhere in its source. `from p import x` counts as
  importing p.x when that is a module, else p; the parent packages Python also runs are not
  edges (a package's __init__ re-exporting its submodules is no circle)."""
  mods = modules(repo, roots)
  graph = {}
  for name, path in mods.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    deps = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          up = package.split(".")[:len(package.split(".")) - node.level + 1]
          base = ".".join(up + ([base] if base else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
      else:
        continue
      for target in targets:
        while target and target not in mods:
          target = target.rpartition(".")[0]
        if target and target != name:
          deps.add(target)
    graph[name] = deps
  return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan, iterative), sorted."""
  index, low, on_stack, stack, found = {}, {}, set(), [], []
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph[start])))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = len(index)
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(graph[child]))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.append(member)
          if member == node:
            break
        if len(component) > 1:
          found.append(sorted(component))
  return sorted(found)


def _within(module: str, package: str) -> bool:
  return module == package or module.startswith(package + ".")


def layer_violations(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
  return sorted(f"{a} imports {b}" for a, deps in graph.items() for b in deps
                for package, forbidden in layers.items() if _within(a, package)
                for higher in forbidden if _within(b, higher))


@pytest.fixture(scope="module")
def graph():
  return import_graph(REPO)


def test_no_import_circle(graph):
  assert circles(graph) == []


def test_no_package_imports_a_higher_layer(graph):
  assert layer_violations(graph) == []


def test_every_apex_package_has_a_layer(graph):
  found = {".".join(m.split(".")[:2]) for m in graph if m.startswith("apex_jax.")}
  placed = {f"apex_jax.{p}" for layer in APEX for p in layer}
  assert (sorted(found - placed), sorted(placed - found)) == ([], [])  # (unplaced, gone)


def test_the_graph_sees_the_new_packages(graph):
  """The checks above read the packages by job, not a stale list."""
  assert "morse_jax.execution.verifier" in graph["morse_jax.tasks.humaneval"]
  assert "morse_jax.serving.http" in graph["apex_jax.tools.server"]
  assert "morse_jax.experiments.pipeline" in graph["launchers.train"]
  assert {"morse_jax.execution.sandbox"} <= graph["morse_jax.execution.verifier"]


def deferred_own_imports(repo: str, roots=("morse_jax", "apex_jax")) -> list[str]:
  """`module:line` of every import of our own packages inside a function: they belong at the
  top of the file, where a reader (and the layer check above) sees what a module depends on."""
  out = []
  for name, path in sorted(modules(repo, roots).items()):
    with open(path) as f:
      tree = ast.parse(f.read())
    for fn in ast.walk(tree):
      if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      for node in ast.walk(fn):
        if isinstance(node, ast.ImportFrom):
          mods = [("." if node.level else "") + (node.module or "")]
        elif isinstance(node, ast.Import):
          mods = [a.name for a in node.names]
        else:
          continue
        if any(m.startswith(".") or m.split(".")[0] in roots for m in mods):
          out.append(f"{name}:{node.lineno}")
  return sorted(set(out))


def test_our_own_modules_are_imported_at_the_top_of_files():
  assert deferred_own_imports(REPO) == []


def test_a_deferred_own_import_is_named(tmp_path):
  repo = _write(tmp_path, {
      "morse_jax/__init__.py": "", "morse_jax/a.py": "import json\nfrom morse_jax import b\n",
      "morse_jax/b.py": "def f():\n  import json\n  from morse_jax import a\n  return a\n"})
  assert deferred_own_imports(repo) == ["morse_jax.b:3"]


def _write(root, files: dict[str, str]) -> str:
  for rel, text in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
  return str(root)


def test_a_deferred_import_back_is_a_circle(tmp_path):
  repo = _write(tmp_path, {
      "pkg/__init__.py": "from pkg.a import A\n",
      "pkg/a.py": "from pkg import b\nA = 1\n",
      "pkg/b.py": "def f():\n  from pkg.a import A\n  return A\n",
      "pkg/c.py": "from . import b\n",
      "pkg/d.py": "import pkg.c\n"})
  graph = import_graph(repo, roots=("pkg",))
  assert graph["pkg.c"] == {"pkg.b"} and graph["pkg.d"] == {"pkg.c"}
  assert circles(graph) == [["pkg.a", "pkg.b"]]


def test_a_package_reexporting_its_modules_is_no_circle(tmp_path):
  repo = _write(tmp_path, {
      "pkg/__init__.py": "from pkg.a import A\nfrom pkg.b import B\n",
      "pkg/a.py": "A = 1\n",
      "pkg/b.py": "from pkg.a import A\nB = A\n"})
  assert circles(import_graph(repo, roots=("pkg",))) == []


def test_an_import_of_a_higher_layer_is_named(tmp_path):
  repo = _write(tmp_path, {
      "morse_jax/__init__.py": "", "morse_jax/execution/__init__.py": "",
      "morse_jax/mas/__init__.py": "", "morse_jax/mas/runner.py": "",
      "morse_jax/execution/verifier.py": "def f():\n  from morse_jax.mas import runner\n"})
  graph = import_graph(repo, roots=("morse_jax",))
  assert layer_violations(graph) == [
      "morse_jax.execution.verifier imports morse_jax.mas.runner"]


@pytest.mark.parametrize("files,violation", [
    ({"morse_jax/experiments/table2.py": "def f():\n  from configs.morse import common\n",
      "configs/morse/common.py": ""}, "morse_jax.experiments.table2 imports configs.morse.common"),
    ({"apex_jax/datasets/world_checks.py": "def f():\n  from apex_jax.toy import search\n",
      "apex_jax/toy/search.py": ""}, "apex_jax.datasets.world_checks imports apex_jax.toy.search"),
    ({"apex_jax/agents/executor.py": "import apex_jax.datasets\n",
      "apex_jax/datasets/__init__.py": ""}, "apex_jax.agents.executor imports apex_jax.datasets"),
])
def test_an_import_around_or_up_apex_layers_is_named(tmp_path, files, violation):
  folders = {"/".join(rel.split("/")[:i]) for rel in files for i in range(1, rel.count("/") + 1)}
  repo = _write(tmp_path, {**{f"{f}/__init__.py": "" for f in folders}, **files})
  graph = import_graph(repo, roots=("morse_jax", "apex_jax", "configs"))
  assert layer_violations(graph) == [violation]


@pytest.mark.parametrize("package,forbidden", [
    ("morse_jax.llm", "morse_jax.lora"),
    # The update batch and its builder sit below the jitted step.
    ("morse_jax.rl.rollout", "morse_jax.rl.train_step"),
    ("morse_jax.rl.compaction", "morse_jax.rl.train_step"),
    ("morse_jax.rl.batch", "morse_jax.rl.train_step"),
    # Code execution and HTTP serving load nothing of the model or the agents.
    ("morse_jax.execution.verifier", "jax"),
    ("morse_jax.serving.http", "jax"),
])
def test_package_does_not_import(package, forbidden):
  code = (f"import sys, {package}\n"
          f"bad = sorted(m for m in sys.modules if m == {forbidden!r} "
          f"or m.startswith({forbidden + '.'!r}))\n"
          "print(bad)\nsys.exit(1 if bad else 0)")
  run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, f"{package} imports {run.stdout.strip()}{run.stderr[-500:]}"
