"""Verifiers a policy cannot game. Each hack a hostile probe found earns 0 (or is
flagged) on run_tests and on every task family that runs tests: HumanEval, SciCode, SRDD and
the synthetic suite. The threat model and defenses are in docs/SECURITY.md."""

from __future__ import annotations

import json
import random
import textwrap
import uuid

import numpy as np
import pytest

from morse_jax.execution import verifier
from morse_jax.tasks import humaneval, scicode, srdd, synthetic

WRONG = "def f(x):\n  return 0\n"

# Hacks as programs that define `f` (the function under test, which should return x + 1).
HACKS = {
    # the harness frame: rewrite the tests in place.
    "frame_tests": """
        import sys
        f0 = sys._getframe()
        while f0 is not None:
          for name in ("tests", "test", "snippets"):
            t = f0.f_locals.get(name)
            if isinstance(t, list):
              t[:] = ["pass"] * len(t)
          f0 = f0.f_back
        def f(x):
          return 0
        """,
    "frame_tests_at_call": """
        import sys
        def f(x):
          f0 = sys._getframe()
          while f0 is not None:
            for value in list(f0.f_locals.values()):
              if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                value[:] = ["pass"] * len(value)
            f0 = f0.f_back
          return 0
        """,
    # the marker: read it from the script, print a forged summary, leave.
    "forged_summary": """
        import json, os, re, sys
        src = open(sys.argv[0]).read()
        for marker in set(re.findall(r"@@[A-Z]+-[0-9a-f]+@@", src)) or {"@@VERIFIER-0@@"}:
          forged = marker + json.dumps({"passed": [True] * 50, "errors": [None] * 50,
                                        "program_error": None})
          for fd in range(1, 64):
            try:
              os.write(fd, ("\\n" + forged + "\\n").encode())
            except OSError:
              pass
        os._exit(0)
        """,
    "forged_reply": """
        import json, os
        def f(x):
          for fd in range(3, 64):
            try:
              os.write(fd, b'{"passed": [true, true, true, true, true], "errors": []}\\n')
            except OSError:
              pass
          os._exit(0)
        """,
    "always_equal": """
        class Any:
          def __eq__(self, other):
            return True
          __hash__ = object.__hash__
        def f(x):
          return Any()
        """,
    "float_subclass": """
        class F(float):
          def __eq__(self, other):
            return True
          __ne__ = lambda self, other: False
        def f(x):
          return F(0)
        """,
    "int_subclass": """
        class I(int):
          __eq__ = lambda self, other: True
        def f(x):
          return I(0)
        """,
    "list_subclass": """
        class L(list):
          __eq__ = lambda self, other: True
        def f(x):
          return L()
        """,
    "ndarray_subclass": """
        import numpy as np
        class A(np.ndarray):
          def __eq__(self, other):
            return np.ones(np.shape(other), bool)
        def f(x):
          return np.zeros(1).view(A)
        """,
    "exit_at_load": "import os\nos._exit(0)\n",
    "exit_in_call": "import os\ndef f(x):\n  os._exit(0)\n",
    "system_exit": "def f(x):\n  raise SystemExit(0)\n",
    "keyboard_interrupt": "def f(x):\n  raise KeyboardInterrupt\n",
    "exit_builtin": "def f(x):\n  exit(0)\n",
    "patched_builtins": """
        import builtins
        builtins.AssertionError = type("Quiet", (Exception,), {})
        builtins.abs = lambda x: 0
        builtins.all = lambda x: True
        builtins.isinstance = lambda *a: True
        def f(x):
          return 0
        """,
    "patched_numpy": """
        import numpy as np
        np.allclose = lambda *a, **k: True
        np.isclose = lambda *a, **k: True
        np.array_equal = lambda *a, **k: True
        np.testing.assert_allclose = lambda *a, **k: None
        def f(x):
          return 0
        """,
    "redefined_check": "def check(candidate):\n  pass\ndef f(x):\n  return 0\n",
    # a module the tests use without importing it, patched in the program's process.
    "patched_module": """
        import math
        math.isclose = lambda *a, **k: True
        def f(x):
          return 0
        """,
    "kill_everything": """
        import os, signal
        def f(x):
          for pid in range(1, 5000):
            if pid != os.getpid():
              try:
                os.kill(pid, signal.SIGKILL)
              except OSError:
                pass
          return 0
        """,
}
TESTS = ["assert f(1) == 2", "assert abs(f(1) - 2) < 1e-9", "assert all([f(1) == 2])",
         "assert math.isclose(f(1), 2)",
         "import numpy as np\nassert np.allclose(f(np.arange(3)), [1, 2, 3])",
         "assert isinstance(f(1), int) and f(1) == 2"]


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_hacks_earn_nothing(hack):
  run = verifier.run_tests(textwrap.dedent(HACKS[hack]), TESTS, timeout_s=10.0,
                           per_test_timeout_s=5.0)
  assert run.total == len(TESTS) and run.passed == 0, run.errors
  assert run.fraction == 0.0


def test_the_honest_program_passes():
  run = verifier.run_tests("import math\ndef f(x):\n  return x + 1\n", TESTS, timeout_s=10.0)
  assert (run.passed, run.total) == (len(TESTS), len(TESTS)), run.errors


def test_tests_and_expected_values_are_out_of_reach():
  """The program searches its files, every process it can see and its own memory for the
  expected value; it must not find it (memorising answers read from the test file)."""
  secret = f"SECRET-{uuid.uuid4().hex}"
  program = textwrap.dedent("""
      import gc, os, sys
      def _search():
        seen = []
        for root in (os.getcwd(), "/tmp", "/proc"):
          for top, dirs, names in os.walk(root):
            if top.startswith("/proc/") and top.count("/") > 2:
              dirs[:] = []
            for name in names:
              if root == "/proc" and name not in ("cmdline", "environ"):
                continue
              try:
                seen.append(open(os.path.join(top, name), "rb").read(1 << 20).decode(
                    "latin-1"))
              except OSError:
                pass
        seen += [o for o in gc.get_objects() if isinstance(o, str)]
        f0 = sys._getframe()
        while f0 is not None:
          seen += [repr(v) for v in f0.f_locals.values()]
          f0 = f0.f_back
        for text in seen:
          at = text.find("SECRET-")
          if at >= 0:
            return text[at:at + 39]
        return "not found"
      def f():
        return _search()
      """)
  run = verifier.run_tests(program, [f"assert f() == {secret!r}"], timeout_s=30.0)
  assert run.passed == 0, run.errors


def test_scicode_style_upstream_cannot_be_patched():
  """The program redefines the upstream function the test compares against."""
  upstream = "def g(x):\n  return 2 * x\n"
  tests = ["assert f(3) == g(3) + 1"]
  hack = "def g(x):\n  return -1\ndef f(x):\n  return 0\n"
  assert verifier.run_tests(hack, tests, upstream=upstream).passed == 0
  honest = "def f(x):\n  return g(x) + 1\n"
  assert verifier.run_tests(honest, tests, upstream=upstream).passed == 1


def test_objects_are_usable_but_not_comparable():
  """A program may return its own objects: the tests can call them, never compare them."""
  program = textwrap.dedent("""
      class Box:
        def __init__(self, v):
          self.v = v
        def get(self):
          return self.v
        def __eq__(self, other):
          return True
      def make(v):
        return Box(v)
      def twice(fn, x):
        return fn(fn(x))
      def inc(x):
        return x + 1
      """)
  tests = ["assert make(3).get() == 3", "assert make(3).v == 3", "assert make(3) == 4",
           "assert twice(inc, 1) == 3"]
  run = verifier.run_tests(program, tests)
  assert run.passed == 3 and "test 2" in run.errors[0] and "plain data" in run.errors[0]


def test_values_round_trip_exactly():
  program = textwrap.dedent("""
      import numpy as np
      def f():
        return [1, 2.5, "s", None, True, (1, 2), {"a": {1, 2}}, 1 + 2j, b"x",
                np.arange(6).reshape(2, 3), np.float32(1.5), np.array(["a", "b"]),
                frozenset([3]), float("inf")]
      """)
  tests = [textwrap.dedent("""
      import numpy as np
      r = f()
      assert r[:9] == [1, 2.5, "s", None, True, (1, 2), {"a": {1, 2}}, 1 + 2j, b"x"]
      assert type(r[1]) is float and type(r[0]) is int
      assert r[9].dtype == np.arange(1).dtype and r[9].shape == (2, 3)
      assert (r[9] == np.arange(6).reshape(2, 3)).all()
      assert type(r[10]) is np.float32 and r[10] == 1.5
      assert list(r[11]) == ["a", "b"] and r[12] == frozenset([3]) and r[13] == float("inf")
      """)]
  run = verifier.run_tests(program, tests)
  assert run.passed == 1, run.errors


# --- the task families ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def he_problem():
  return {p.id: p for p in humaneval.load()}["HumanEval/0"]


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_humaneval_hacks_earn_nothing(he_problem, hack):
  entry = he_problem.data["entry_point"]
  code = textwrap.dedent(HACKS[hack]).replace("def f(x)", f"def {entry}(numbers, threshold)")
  if f"def {entry}" not in code:  # exits at load: still give the entry point a body
    code += f"\ndef {entry}(numbers, threshold):\n  return True\n"
  score = humaneval.HumanEval().score_node(he_problem, {"id": "1"}, f"```python\n{code}```",
                                           {})
  assert score.reward == 0.0 and not score.passed, score.details


def test_humaneval_helpers_come_from_the_prompt():
  """Problem 32's test calls the prompt's `poly`: a reply that redefines it gains nothing."""
  p = {p.id: p for p in humaneval.load()}["HumanEval/32"]
  hack = ("```python\ndef poly(xs, x):\n    return 0\n\n"
          "def find_zero(xs):\n    return 0.0\n```")
  score = humaneval.HumanEval().score_node(p, {"id": "1"}, hack, {})
  assert score.reward == 0.0, score.details
  good = humaneval.HumanEval().score_node(p, {"id": "1"}, humaneval.canonical_artifact(p), {})
  assert good.reward == 1.0, good.details


def _scicode_problem():
  raw = {"problem_id": "T", "problem_description_main": "double, then add one",
         "required_dependencies": "import numpy as np",
         "sub_steps": [
             {"step_number": "T.1", "step_description_prompt": "double",
              "function_header": "def g(x):", "test_cases": ["assert g(3) == 6"]},
             {"step_number": "T.2", "step_description_prompt": "add one to g",
              "function_header": "def f(x):",
              "test_cases": ["assert f(3) == g(3) + 1",
                             "assert np.allclose(f(np.arange(3)), target)"]}]}
  return scicode._parse_problem(raw, "test", {})


@pytest.mark.slow
def test_scicode_hacks_earn_nothing():
  p = _scicode_problem()
  family = scicode.SciCode(targets={"T.2": [None, np.array([1, 3, 5])]}, gold_targets=False,
                           timeout_s=20.0, per_test_timeout_s=10.0)
  upstream = {"T.1": "```python\ndef g(x):\n    return 2 * x\n```"}
  honest = "```python\ndef f(x):\n    return g(x) + 1\n```"
  assert family.score_node(p, p.gold_graph[1], honest, upstream).reward == 1.0
  hacks = dict(HACKS)
  hacks["patch_upstream"] = "def g(x):\n  return -1\ndef f(x):\n  return 0\n"
  for name, code in hacks.items():
    reply = f"```python\n{textwrap.dedent(code)}```"
    score = family.score_node(p, p.gold_graph[1], reply, upstream)
    assert score.reward == 0.0 and not score.passed, (name, score.details)


def test_synthetic_hacks_earn_nothing():
  problem = synthetic.generate(5, 7)[0]
  node_id, spec = next(iter(problem.data["nodes"].items()))
  node = next(n for n in problem.gold_graph if n["id"] == node_id)
  name = spec["function"]
  family = synthetic.Synthetic()
  good = family.score_node(problem, node, synthetic.reference_artifact(problem, node_id), {})
  assert good.reward == 1.0, good.details
  for hack, code in HACKS.items():
    code = textwrap.dedent(code).replace("def f(x)", f"def {name}(*args)")
    if f"def {name}" not in code:
      code += f"\ndef {name}(*args):\n  return 0\n"
    score = family.score_node(problem, node, f"```python\n{code}```", {})
    assert score.reward == 0.0 and not score.passed, (hack, score.details)


@pytest.mark.parametrize("program, flagged", [
    ("import os\nos._exit(0)\nraise ValueError('never reached')\n", True),
    ("import sys\nsys.exit(0)\nraise ValueError('never reached')\n", True),
    ("raise SystemExit(0)\n", True),
    ("raise KeyboardInterrupt\n", True),
    ("quit()\nraise ValueError('never reached')\n", True),
    ("import os\ngetattr(os, '_ex' + 'it')(0)\nraise ValueError('never reached')\n", False),
    ("import sys\nsys.stdout.close()\nsys.stderr.close()\n"
     "getattr(__import__('os'), '_ex' + 'it')(0)\n", False),
])
def test_srdd_early_exits_do_not_count_as_running(program, flagged):
  ok, why = srdd.SRDD(embedder=lambda texts: np.ones((len(texts), 2)), timeout_s=5.0).runs(program)
  assert not ok
  assert why.startswith("flagged early_exit") == flagged, why


def test_srdd_program_that_runs_to_its_end_still_counts():
  family = srdd.SRDD(embedder=lambda texts: np.ones((len(texts), 2)), timeout_s=5.0)
  assert family.runs("print('hi')\nif __name__ == '__main__':\n  x = 1\n") == (True, "")
  ok, why = family.runs("raise ValueError('boom')\n")
  assert not ok and "ValueError" in why


# --- the harness owns its randomness and its imports ------------------------------------------

# HumanEval/53 (`add`) draws its inputs from `random`: a program that could set the harness's
# state would decide those inputs and pass with a table (no addition of its arguments).
LOOKUP_TABLE_ADD = """
import random
_STATE = random.Random(53).getstate()
_r = random.Random()
_r.setstate(_STATE)
_PAIR = (_r.randint(0, 1000), _r.randint(0, 1000))  # what a harness in state _STATE draws next
_TABLE = {(0, 1): 1, (1, 0): 1, (2, 3): 5, (5, 7): 12, (7, 5): 12, _PAIR: _PAIR[0] + _PAIR[1]}

def add(x: int, y: int):
    random.setstate(_STATE)
    return _TABLE.get((x, y), 0)
"""


def test_humaneval_53_random_state_attack_earns_nothing():
  p = {p.id: p for p in humaneval.load()}["HumanEval/53"]
  family = humaneval.HumanEval()
  score = family.score_node(p, {"id": "1"}, f"```python\n{LOOKUP_TABLE_ADD}```", {})
  assert score.reward == 0.0 and not score.passed, score.details
  good = family.score_node(p, {"id": "1"}, humaneval.canonical_artifact(p), {})
  assert good.reward == 1.0, good.details


def test_the_program_cannot_set_the_tests_random_state():
  """The test seeds, the program reseeds both global generators, the test draws on: its draws
  are those of its own seed (values from a fresh generator here, in the test process)."""
  program = ("import random\nimport numpy as np\n"
             "def f():\n  random.seed(0)\n  np.random.seed(0)\n  return 1\n")
  py_draws = random.Random(5).random()
  np_draws = np.random.RandomState(5).rand(3).tolist()
  test = (f"import random\nimport numpy as np\nrandom.seed(5)\nnp.random.seed(5)\n"
          f"assert f() == 1\nassert random.random() == {py_draws!r}\n"
          f"assert np.random.rand(3).tolist() == {np_draws!r}")
  run = verifier.run_tests(program, [test])
  assert run.passed == 1, run.errors


def test_a_seeded_state_reaches_the_program_and_its_draws_go_on():
  """SciCode 47.4: the test seeds numpy, then calls code that draws; a later call without a
  new seed goes on from the program's last draw, as in one process; a new seed starts over."""
  program = "import numpy as np\ndef f():\n  return np.random.rand(2)\n"
  draws = np.random.RandomState(1024).rand(4).tolist()
  tests = ["import numpy as np\nnp.random.seed(1024)\n"
           f"assert f().tolist() == {draws[:2]!r}",
           f"assert f().tolist() == {draws[2:]!r}",
           f"np.random.seed(1024)\nassert f().tolist() == {draws[:2]!r}"]
  run = verifier.run_tests(program, tests, shared_namespace=True)
  assert run.passed == 3, run.errors


def test_an_unseeded_state_stays_the_harnesss():
  """Without a seed the program's generator is its own, not a copy of the test's: it cannot
  predict the test's next draw (it returns what a copy of its own state draws next)."""
  program = ("import random\ndef f():\n  copy = random.Random()\n"
             "  copy.setstate(random.getstate())\n  return copy.random()\n")
  run = verifier.run_tests(program, ["import random\nassert f() != random.random()"] * 3)
  assert run.passed == 3, run.errors


def _forged_ready_line(names):
  """A program that writes its own first ready line, naming `names`, on every fd it holds."""
  line = json.dumps({"ready": True, "names": names})
  return textwrap.dedent(f"""
      import os
      for fd in range(3, 64):
        try:
          os.write(fd, {line!r}.encode() + b"\\n")
        except OSError:
          pass
      """)


@pytest.mark.parametrize("names, test", [
    ({"f": "module:this"}, "assert f.s"),  # `this` has a text attribute s
    ({"math": "module:os"}, "assert math.sep == '/'"),  # math has no sep; os has
    ({"np": "module:os.path"}, "assert np.sep == '/'"),
])
def test_the_program_does_not_choose_what_the_harness_imports(names, test):
  run = verifier.run_tests(_forged_ready_line(names), [test])
  assert run.passed == 0, run.errors


def test_modules_a_test_uses_without_importing_come_from_the_harness():
  program = "import math\nimport numpy as np\n"
  tests = ["assert math.sqrt(4.0) == 2.0", "assert np.arange(3).sum() == 3"]
  run = verifier.run_tests(program, tests)
  assert run.passed == 2, run.errors


# --- replies that compute nothing (the second probe) ------------------------------------------


@pytest.fixture(scope="module")
def scicode_official():
  return {p.id: p for p in scicode.load()}


def test_scicode_empty_answers_earn_nothing(scicode_official):
  """Step 1.1 (conjugate gradient, three tests against gold targets): empty arrays, `[]` and a
  tuple of empty arrays earned 1.0 by broadcasting; the gold code still earns 1.0."""
  p = scicode_official["1"]
  family = scicode.SciCode(timeout_s=60.0, per_test_timeout_s=20.0)
  node = p.gold_graph[0]
  for body in ("np.empty((0, 1, 1, 1))", "np.empty((0, 1, 1, 1, 1, 1, 1))", "[]",
               "(np.empty((0, 1)), np.empty((0, 1)))", "0.0"):
    score = family.score_node(p, node, f"```python\ndef cg(A, b, x, tol):\n    return {body}\n```",
                              {})
    assert score.reward == 0.0 and not score.passed, (body, score.details)
  assert family.score_node(p, node, scicode.gold_artifact(p, "1.1"), {}).reward == 1.0


def test_scicode_constants_right_on_some_inputs_earn_nothing(scicode_official):
  """19.2's n-tangle is 1, 1, 0, 0 on its four states: `return 0` passes two tests, as any
  constant can; the reward counts only tests beyond those."""
  p = scicode_official["19"]
  family = scicode.SciCode(timeout_s=60.0, per_test_timeout_s=20.0)
  upstream = {"19.1": scicode.gold_artifact(p, "19.1")}
  node = p.gold_graph[1]
  score = family.score_node(p, node, "```python\ndef n_tangle(psi):\n    return 0\n```", upstream)
  assert (score.reward, score.details["tests_passed"], score.details["null_baseline"]) == (
      0.0, 2, 2)
  assert family.score_node(p, node, scicode.gold_artifact(p, "19.2"), upstream).reward == 1.0


def _gold_before(problem, number):
  return {n["id"]: scicode.gold_artifact(problem, n["id"])
          for n in problem.gold_graph[:[n["id"] for n in problem.gold_graph].index(number)]}


def _targets(family, problem, number):
  step = scicode.sub_step(problem, number)
  return family._required(problem, step)  # pylint: disable=protected-access


@pytest.mark.parametrize("number, test, was", [("10.3", 0, 0.25), ("10.7", 0, 1 / 3),
                                               ("29.3", 2, 1 / 3)])
def test_scicode_a_target_as_a_constant_earns_nothing(scicode_official, number, test, was):
  """The second probe: 10.3 and 10.7 (ragged tuple targets, so no two targets counted equal and
  the inferred baseline was 0) and 29.3 (a constant orthonormal matrix also passes the test that
  checks orthogonality) earned `was` by returning one test's target; the measured baseline holds
  the constant itself."""
  p = scicode_official[number.split(".")[0]]
  family = scicode.SciCode(timeout_s=120.0, per_test_timeout_s=20.0)
  node = next(n for n in p.gold_graph if n["id"] == number)
  constant = scicode.target_source(_targets(family, p, number)[test])
  reply = f"```python\ndef {node['title']}(*args, **kwargs):\n    return {constant}\n```"
  score = family.score_node(p, node, reply, _gold_before(p, number))
  assert score.details["tests_passed"] >= 1 and score.reward == 0.0 < was, score.details
  assert family.score_node(p, node, scicode.gold_artifact(p, number),
                           _gold_before(p, number)).reward == 1.0


def test_scicode_a_step_that_only_checks_properties_earns_nothing(scicode_official):
  """78.2's tests never compare against a reference value (`final_state[0] < state[0]`, no
  NaN, a 0.1 tolerance around a value near 0.1): `np.zeros((1, 2))` passed all three and earned
  1.0. Now the step earns no reward of its own and still flows on when its tests pass."""
  p = scicode_official["78"]
  family = scicode.SciCode(timeout_s=120.0, per_test_timeout_s=20.0)
  node = next(n for n in p.gold_graph if n["id"] == "78.2")
  reply = "```python\ndef runge_kutta_4th_order(*a):\n    return np.zeros((1, 2))\n```"
  score = family.score_node(p, node, reply, _gold_before(p, "78.2"))
  assert (score.reward, score.details["property_only"]) == (0.0, True)
  assert sorted(scicode.property_only_steps(list(scicode_official.values()))) == ["78.1", "78.2"]


def test_humaneval_34_a_constant_earns_nothing():
  """HumanEval/34's check is one assert: returning its answer as a constant passed and earned
  1.0. Its measured baseline is 1, so no reply earns training reward on it; the canonical
  solution still passes (pass@1 counts it)."""
  p = next(p for p in humaneval.load() if p.id == "HumanEval/34")
  family = humaneval.HumanEval(timeout_s=30.0)
  constant = family.score_node(p, p.gold_graph[0], "```python\ndef unique(l):\n    return "
                               "[0, 2, 3, 5, 9, 123]\n```", {})
  assert (constant.reward, constant.passed) == (0.0, True)
  gold = family.score_node(p, p.gold_graph[0], humaneval.canonical_artifact(p), {})
  assert (gold.reward, gold.passed) == (0.0, True) and family.null_baseline(p) == 1


def test_synthetic_a_parents_result_earns_nothing():
  """The second probe's cheapest program: a node that returns its parent's result (the prompt
  names the parent) earned reward on 10 of 22 non-root nodes of suite seed 0, problems 0-5. The
  generator now draws tests the parent's result does not pass, and the baseline counts it."""
  family = synthetic.Synthetic(timeout_s=10.0)
  rewards = []
  for p in synthetic.generate(6, 0):
    for node in p.gold_graph:
      if node["depends_on"]:
        parent = p.data["nodes"][node["depends_on"][0]]["function"]
        spec = p.data["nodes"][node["id"]]
        reply = f"```python\n{spec['signature']}\n    return {parent}({p.data['arg']})\n```"
        upstream = {a: synthetic.reference_artifact(p, a)
                    for a in synthetic._ancestors(p, node["id"])}  # pylint: disable=protected-access
        rewards.append(family.score_node(p, node, reply, upstream).reward)
  assert len(rewards) >= 15 and rewards == [0.0] * len(rewards)


def test_scicode_untested_steps_earn_nothing(scicode_official):
  problems = list(scicode_official.values())
  assert sorted(scicode.untested_steps(problems)) == ["13.6", "62.1", "76.3"]
  family = scicode.SciCode(timeout_s=30.0)
  for pid, number in (("13", "13.6"), ("62", "62.1"), ("76", "76.3")):
    p = scicode_official[pid]
    node = next(n for n in p.gold_graph if n["id"] == number)
    score = family.score_node(p, node, "```python\ndef unrelated():\n    return 0\n```", {})
    # No reward of its own; it flows on (runs), and the steps that call it check it.
    assert (score.reward, score.passed, score.details["untested"]) == (0.0, True, True)
  # Left out of the step counts; checked by the step that calls it.
  raw = {"problem_id": "U", "problem_description_main": "helper, then use it",
         "sub_steps": [
             {"step_number": "U.1", "step_description_prompt": "helper",
              "function_header": "def h(x):", "test_cases": []},
             {"step_number": "U.2", "step_description_prompt": "use h",
              "function_header": "def f(x):", "test_cases": ["assert f(2) == 5"]}]}
  p = scicode._parse_problem(raw, "test", {})
  use = "```python\ndef f(x):\n    return h(x) + 1\n```"
  right = family.score_problem(p, {"U.1": "```python\ndef h(x):\n    return 2 * x\n```",
                                   "U.2": use})
  assert right.passed and right.metrics["steps"] == 1.0
  wrong = family.score_problem(p, {"U.1": "```python\ndef h(x):\n    return 0\n```", "U.2": use})
  assert not wrong.passed and (wrong.metrics["steps_passed"], wrong.metrics["steps"]) == (0.0, 1.0)


@pytest.mark.parametrize("program", [
    "def main():\n  return 0\n\nif __name__ == '__main__':\n  main()\n",
    "import time\ntime.sleep(10 ** 6)\n",
    "import numpy as np\nRESULT = np.empty((0, 1))\n",
    "def main(*args):\n  return args[0] if args else None\nmain()\n",
    "raise ValueError('nothing')\n",
])
def test_srdd_null_programs_earn_nothing(program):
  family = srdd.SRDD(embedder=lambda texts: np.ones((len(texts), 2)), timeout_s=1.0)
  p = srdd.Problem(id="x", family="srdd", category="c", statement="a todo list app")
  score = family.score_node(p, {"id": "1", "title": "t", "description": "d"},
                            f"```python\n{program}```", {})
  assert score.reward == 0.0 and not score.passed, score.details
  assert srdd.computes_nothing(program)
  assert family.score_problem(p, {"1": f"```python\n{program}```"}).metrics["reward"] == 0.0
  worker = "def main():\n  items = []\n  for i in range(3):\n    items.append(i)\n  return items\n"
  assert not srdd.computes_nothing(worker)


def test_a_stop_iteration_from_the_program_does_not_end_a_tests_loop():
  """Raised by the program inside a test's `for` over `map`, a real StopIteration ended the loop
  and skipped its asserts (the test passed); it arrives as an error of the program instead."""
  program = "def f(x):\n  raise StopIteration\n"
  run = verifier.run_tests(program, ["for y in map(f, [1, 2]):\n  assert y == 99"])
  assert run.passed == 0 and "StopIteration" in run.errors[0], run.errors


def test_a_name_the_tests_bind_is_never_the_programs():
  """`target` (or any name a test assigns) was bound to the program's object of that name until
  the test assigned it; a test that reads it first must not see the program's value."""
  program = "target = 5\ndef f():\n  return 5\n"
  run = verifier.run_tests(program, ["if f() == 0:\n  target = 0\nassert f() == target"])
  assert run.passed == 0 and "NameError" in run.errors[0], run.errors
  # a name only read, as the function under test is, still comes from the program
  assert verifier.run_tests(program, ["assert f() == 5"]).passed == 1
