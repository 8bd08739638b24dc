"""The shared rule checks; the run_tests cases go through the real sandbox."""

from __future__ import annotations

import time

import pytest

from morse_jax.execution import verifier


def test_extract_code_prefers_the_last_python_block():
  text = ("intro\n```python\nx = 1\n```\nthen\n```\nplain = 2\n```\n"
          "```py\ny = 2\n```\n```bash\nls\n```\n")
  assert verifier.extract_code(text) == "y = 2\n"


def test_extract_code_falls_back_to_unlabelled_then_any():
  assert verifier.extract_code("```\na = 1\n```\n```bash\nls\n```") == "a = 1\n"
  assert verifier.extract_code("```bash\nls -l\n```") == "ls -l\n"
  assert verifier.extract_code("no fence here: def f(): pass") is None


def test_extract_code_open_fence_indent_and_inline_close():
  assert verifier.extract_code("sure\n```python\ndef f():\n  return 1") == "def f():\n  return 1\n"
  assert verifier.extract_code("1. step\n   ```python\n   x = 1\n   ```\n") == "x = 1\n"
  assert verifier.extract_code("```Python\nx = 1```") == "x = 1\n"
  # Blank lines are kept; a stray fence after the last block opens nothing.
  assert verifier.extract_code("```\na = 1\n\nb = 2\n```\nbye\n```") == "a = 1\n\nb = 2\n"
  # Indentation inside an unindented fence is kept (a body completion needs it).
  assert verifier.extract_code("```python\n    return x\n```") == "    return x\n"


def test_syntax_error_names_the_line():
  assert verifier.syntax_error("x = 1\n") is None
  message = verifier.syntax_error("x = 1\ndef f(:\n  pass\n")
  assert message.startswith("syntax error at line 2")
  assert "outside function" in verifier.syntax_error("x = 1\nreturn x\n")
  assert "null bytes" in verifier.syntax_error("x = '\0'\0")


@pytest.mark.parametrize("code, needle", [
    ("def f(x):\n  pass\n", "'f'"),
    ("def g(x):\n  '''Doc.'''\n  ...\n", "'g'"),
    ("def h():\n  raise NotImplementedError\n", "NotImplementedError"),
    ("class A:\n  def m(self):\n    raise NotImplementedError('later')\n", "'m'"),
    ("def k():\n  '''Only a docstring.'''\n", "docstring"),
    ("def ok():\n  return 1  # TODO: handle 0\n", "TODO comment at line 2"),
    ("def ok():\n  return 'TODO: write me'\n", "TODO string"),
    ("def f():\n  return 1\n\ndef f():\n  pass\n", "line 4"),  # the stub is what runs
    ("def f():\n  '''Doc.'''\n\ndef g():\n  return f()\n", "'f'"),  # another name
])
def test_placeholder_found(code, needle):
  assert needle in verifier.placeholder(code)


@pytest.mark.parametrize("code", [
    "def f(x):\n  try:\n    return 1 / x\n  except ZeroDivisionError:\n    pass\n  return 0\n",
    "import abc\nclass B(abc.ABC):\n  @abc.abstractmethod\n  def m(self):\n    pass\n",
    "from typing import Protocol\nclass P(Protocol):\n  def m(self) -> int: ...\n",
    "STATUS = ['TODO', 'DONE']\nlabel = 'my TODO list'\nTODO = 1\n",
    "def f(:\n  pass\n",  # not parsable: syntax_error's business
    # A repeated stub replaced by a later definition never runs (small models write this).
    "def f(x):\n  '''Doc.'''\n\ndef f(x):\n  '''Doc.'''\n  return x\n",
    "class A:\n  def m(self):\n    pass\n  def m(self):\n    return 1\n",
])
def test_placeholder_not_found(code):
  assert verifier.placeholder(code) is None


def test_code_check_reasons():
  check = verifier.CodeCheck()
  assert check("def f(): return 1").reason == "no fenced code block in the reply"
  assert verifier.CodeCheck(allow_unfenced=True)("def f(): return 1").ok
  assert "line 1" in check("```python\ndef f(:\n```").reason
  assert "'f'" in check("```python\ndef f():\n  pass\n```").reason
  assert check("```python\n\n```").reason == "the code block is empty"
  good = check("```python\ndef f():\n  return 1\n```")
  assert good.ok and good.code == "def f():\n  return 1\n"


def test_run_tests_counts_each_snippet():
  program = ("def f(x):\n  return x + 1\nprint('noise ' * 1000)\n"
             "if __name__ == '__main__':\n  raise SystemExit(3)\n")
  tests = ["assert f(1) == 2", "assert f(1) == 3", "raise ValueError('boom')", "x = (",
           "while True:\n  pass", "from solution import f as g\nassert g(2) == 3"]
  # The loop is stopped after its CPU limit; timeout_s, the whole call's wall clock, leaves
  # room for that on a loaded machine, so the last test still runs.
  run = verifier.run_tests(program, tests, timeout_s=30.0, per_test_timeout_s=0.5)
  assert (run.passed, run.total) == (2, 6), run.errors
  assert run.isolation
  joined = "\n".join(run.errors)
  for needle in ("test 1 (assert f(1) == 3): AssertionError", "ValueError: boom",
                 "test 3", "TimeoutError"):
    assert needle in joined


def test_run_tests_shared_namespace_and_files():
  """SciCode's harness runs a step's tests in order in one script: later tests see names that
  earlier ones bound, even one that failed after binding them; by default each test is alone."""
  tests = ["x = 5\nassert x == 6", "assert x == 5", "import helper\nassert helper.Y + x == 8"]
  files = {"helper.py": "Y = 3\n"}
  shared = verifier.run_tests("", tests, timeout_s=5.0, shared_namespace=True, files=files)
  assert (shared.passed, shared.total) == (2, 3) and "test 0" in shared.errors[0]
  alone = verifier.run_tests("", tests, timeout_s=5.0, files=files)
  assert (alone.passed, alone.total) == (0, 3) and "NameError" in alone.errors[1]


def test_run_tests_program_error_fails_every_test():
  run = verifier.run_tests("import sys\nsys.stdout.close()\nraise KeyError('k')\n",
                           ["assert True", "assert True"], timeout_s=5.0)
  assert (run.passed, run.total) == (0, 2)
  assert run.errors[0].startswith("program raised KeyError")


def test_run_tests_summary_cannot_be_forged_by_patching():
  program = ("import builtins, json\njson.dumps = lambda obj: '{\"passed\": [true]}'\n"
             "builtins.exec = lambda *a: None\nbuiltins.dict = lambda *a: {}\n")
  run = verifier.run_tests(program, ["assert False"], timeout_s=5.0)
  assert (run.passed, run.total) == (0, 1) and "AssertionError" in run.errors[0]


def test_run_tests_program_that_dies_or_hangs_while_loading():
  run = verifier.run_tests("import os\nos._exit(0)\n", ["assert True"], timeout_s=5.0)
  assert run.passed == 0 and run.errors[0].startswith("program did not load: "), run.errors
  run = verifier.run_tests("while True:\n  pass\n", ["assert True"], timeout_s=1.0)
  assert run.passed == 0 and run.errors[0].startswith("program did not load: "), run.errors


def test_run_tests_without_a_readable_summary(monkeypatch, tmp_path):
  fake = tmp_path / "harness.py"
  fake.write_text("import sys\nsys.stdout.write('{not json')\nsys.stderr.write('boom\\n')\n")
  monkeypatch.setattr(verifier, "_HARNESS_PATH", str(fake))
  run = verifier.run_tests("x = 1", ["assert True"], timeout_s=5.0)
  assert (run.passed, run.total) == (0, 1)
  assert run.errors == ["test run failed: the harness gave no summary: boom"]


STUB = 'def add(a, b):\n    """Sum of a and b."""\n'
REAL = STUB + "    return a + b\n"


def test_extract_code_takes_the_block_that_implements_the_entry_point():
  # A small model's habit: the real attempt, then the prompt's signature repeated, body-less.
  text = f"Here you go:\n```python\n{REAL}```\nThe function:\n```python\n{STUB}```\n"
  assert verifier.extract_code(text) == STUB  # without the name, the last python block
  assert verifier.extract_code(text, "add") == REAL
  # A usage example after it does not hide it either; other names do not count.
  usage = f"```python\n{REAL}```\n```python\nprint(add(1, 2))\n```"
  assert verifier.extract_code(usage, "add") == REAL
  assert verifier.extract_code(usage, "sub") == "print(add(1, 2))\n"
  # Only stubs of the name: the usual rule, so the stub is what gets rejected.
  assert verifier.extract_code(f"```python\n{STUB}```\n```\n{STUB}```", "add") == STUB


def test_an_unterminated_broken_last_block_does_not_hide_an_earlier_one():
  cut = f"```python\n{REAL}```\nAgain:\n```python\ndef add(a, b):\n    \"\"\"Sum of"
  assert verifier.extract_code(cut) == REAL
  assert verifier.extract_code(cut, "add") == REAL
  # Kept when it compiles, or when it is the only block (the syntax check then names the line).
  assert verifier.extract_code("```python\nx = 1\n```\n```python\ny = 2") == "y = 2\n"
  only = '```python\ndef add(a, b):\n    """Sum'
  assert verifier.extract_code(only) == 'def add(a, b):\n    """Sum\n'


def test_extract_code_joins_a_body_written_below_a_repeated_signature():
  text = f"```python\n{STUB}```\n    return a + b\n\nThis returns the sum.\n"
  assert verifier.extract_code(text) == REAL
  assert verifier.extract_code(text, "add") == REAL
  # Lines that do not complete it stay out; a complete block takes nothing from below.
  assert verifier.extract_code(f"```python\n{STUB}```\n    - a list item\n") == STUB
  assert verifier.extract_code(f"```python\n{REAL}```\n    return 0\n") == REAL
  assert verifier.extract_code("```python\ndef add(a, b):\n```\n    return a + b\n") == (
      "def add(a, b):\n    return a + b\n")  # a signature alone does not compile


def test_unfenced_code_finds_the_definition_in_prose():
  reply = f"Sure! Here is the code:\nimport math\n\n{REAL}\nThis adds a and b.\n"
  assert verifier.extract_code(reply) is None  # no fence: extract_code's contract
  assert verifier.unfenced_code(reply, "add") == f"import math\n\n{REAL}"
  # Followed by a body-less repeat, or one cut off: the complete one before it.
  assert verifier.unfenced_code(f"{REAL}\n{STUB}", "add") == REAL
  assert verifier.unfenced_code(f"{REAL}\n{STUB[:-5]}", "add") == REAL
  assert verifier.unfenced_code(f"Here:\n{STUB}\nDone.", "add") is None  # body-less
  assert verifier.unfenced_code(f"{REAL}", "sub") is None


@pytest.mark.parametrize("code, ok", [
    (REAL, True), (STUB, False), (STUB + "    pass\n", False), (REAL + "# TODO: tests\n", False),
    (REAL + STUB, False),  # the later (stub) definition is the one Python keeps
    ("class add:\n    x = 1\n", False), ("def add(a, b):\n  return (", False), (None, False),
])
def test_implements(code, ok):
  assert verifier.implements(code, "add") is ok


def test_run_tests_does_not_wait_for_threads_the_program_left():
  program = ("import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n"
             "def f():\n  return 1\n")
  start = time.monotonic()
  run = verifier.run_tests(program, ["assert f() == 1"], timeout_s=30.0)
  assert run.passed == 1 and time.monotonic() - start < 15
