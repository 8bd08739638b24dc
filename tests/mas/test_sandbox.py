"""The sandbox contains what LLM-written code might do: escape, leak, hog or hang."""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from morse_jax.mas import sandbox

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def bwrap():
  """Skips isolation tests where bubblewrap cannot run (the fallback is tested on its own)."""
  if sandbox._plan().isolation != "bubblewrap":
    pytest.skip("bubblewrap is not usable here; .ci/run installs it")


def _run(source: str, **kw) -> sandbox.SandboxResult:
  return sandbox.run_python(textwrap.dedent(source), **kw)


def _marked_pids(marker: str, exclude: set[int]) -> list[int]:
  pids = []
  for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) not in exclude:
      try:
        if marker.encode() in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
          pids.append(int(pid))
      except OSError:
        pass
  return pids


def test_stdout_stdin_returncode_and_files():
  res = _run("""
      import helper
      print(helper.double(int(input())))
      raise SystemExit(3)
      """, stdin="21\n", files={"helper.py": "def double(x):\n  return 2 * x\n"})
  assert (res.returncode, res.stdout, res.timed_out, res.truncated) == (3, "42\n", False, False)


def test_syntax_error_fails_with_stderr():
  res = _run("def f(:\n  pass\n")
  assert res.returncode != 0 and "SyntaxError" in res.stderr


def test_temp_dir_is_removed(tmp_path, monkeypatch):
  monkeypatch.setattr(sandbox.tempfile, "tempdir", str(tmp_path))
  res = _run("open('out.txt', 'w').write('ok'); import os; print(os.getcwd())")
  assert res.returncode == 0 and res.stdout.startswith(str(tmp_path))
  assert list(tmp_path.iterdir()) == []


def test_bad_file_names_are_refused():
  with pytest.raises(ValueError):
    sandbox.run_python("pass", files={"../escape.py": ""})
  with pytest.raises(ValueError):
    sandbox.run_python("pass", files={"main.py": ""})


def test_network_is_blocked(bwrap):
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    res = _run(f"""
        import socket
        for addr in [("127.0.0.1", {port}), ("8.8.8.8", 53)]:
          try:
            socket.create_connection(addr, timeout=2).close()
            print("connected", addr)
          except OSError as e:
            print("blocked", addr, e)
        """)
  assert res.returncode == 0, res.stderr
  assert res.stdout.count("blocked") == 2 and "connected" not in res.stdout


def test_writes_outside_the_temp_dir_fail(bwrap):
  targets = [pathlib.Path(f"/tmp/pwned_{uuid.uuid4().hex}"),
             REPO / f"pwned_{uuid.uuid4().hex}"]
  try:
    res = _run(f"""
        for path in {[str(t) for t in targets]!r}:
          try:
            open(path, "w").write("pwned")
            print("wrote", path)
          except OSError as e:
            print("refused", path, e)
        """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("refused") == 2
    assert not any(t.exists() for t in targets)
  finally:
    for t in targets:
      t.unlink(missing_ok=True)


def test_parent_environment_is_invisible(bwrap, monkeypatch):
  secret = f"secret-{uuid.uuid4().hex}"
  monkeypatch.setenv("SANDBOX_SECRET", secret)
  res = _run(f"""
      import os
      print(dict(os.environ))
      for pid in ["1", "self", "{os.getpid()}"] + [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
          print(pid, open(f"/proc/{{pid}}/environ", "rb").read())
        except OSError as e:
          print(pid, e)
      """)
  assert res.returncode == 0, res.stderr
  assert "HOME" in res.stdout and "SANDBOX_SECRET" not in res.stdout and secret not in res.stdout


def test_process_count_is_bounded(bwrap):
  # As root this only holds because the sandbox drops to an unprivileged uid.
  res = _run("""
      import os, time
      n = 0
      try:
        while n < 200:
          if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
          n += 1
      except OSError:
        pass
      print(n)
      """, max_processes=16)
  assert res.returncode == 0, res.stderr
  assert 0 < int(res.stdout) < 16


def test_fork_bomb_is_contained(bwrap):
  start = time.monotonic()
  res = _run("""
      import os
      while True:
        try:
          os.fork()
        except OSError:
          pass
      """, timeout_s=2)
  assert res.timed_out and res.returncode is None
  assert time.monotonic() - start < 15  # returns, not hangs (generous: CI machines are loaded)
  assert subprocess.run(["true"], check=False).returncode == 0  # the host can still fork.
  if os.geteuid() == 0:  # nothing of the sandbox's uid survives.
    time.sleep(0.2)
    left = [p for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}")
            and _uid(p) >= sandbox._UID_BASE]
    assert left == []


def _uid(pid: str) -> int:
  try:
    return os.stat(f"/proc/{pid}").st_uid
  except OSError:
    return -1


def test_memory_bomb_fails_cleanly():
  res = _run("x = bytearray(4 << 30)\nprint('allocated')", memory_mb=512)
  assert res.returncode != 0 and "allocated" not in res.stdout
  assert "MemoryError" in res.stderr


def test_infinite_loop_times_out():
  start = time.monotonic()
  res = _run("while True:\n  pass\n", timeout_s=1)
  assert res.timed_out and res.returncode is None
  assert time.monotonic() - start < 10  # returns, not hangs (generous: CI machines are loaded)


def test_huge_output_is_truncated():
  res = _run("import sys\nsys.stdout.write('x' * (50 << 20))\nprint('done', file=sys.stderr)")
  assert res.truncated and res.returncode == 0
  assert len(res.stdout) == 1 << 20 and res.stderr == "done\n"


def test_sandbox_dies_with_its_parent(bwrap):
  marker = f"sandbox-marker-{uuid.uuid4().hex}"
  source = textwrap.dedent(f"""
      import os, sys
      os.fork()  # both processes wait, marked in their command line.
      os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{marker}"])
      """)
  helper = subprocess.Popen(
      [sys.executable, "-c",
       f"from morse_jax.mas import sandbox; sandbox.run_python({source!r}, timeout_s=60)"],
      cwd=REPO)
  workdirs = set()
  try:
    deadline = time.monotonic() + 20
    while len(pids := _marked_pids(marker, {helper.pid})) < 2:
      assert time.monotonic() < deadline and helper.poll() is None, "sandbox never started"
      time.sleep(0.05)
    workdirs = {os.readlink(f"/proc/{pid}/cwd") for pid in pids}
  finally:
    os.kill(helper.pid, signal.SIGKILL)
    helper.wait()
  deadline = time.monotonic() + 5
  while _marked_pids(marker, set()):
    assert time.monotonic() < deadline, "sandboxed processes outlived their parent"
    time.sleep(0.05)
  for workdir in workdirs:  # a killed parent cannot clean up its temp dir; we do.
    assert os.path.basename(workdir).startswith("morse-sandbox-")
    shutil.rmtree(workdir)


def test_fallback_without_bubblewrap(monkeypatch, caplog):
  monkeypatch.setattr(sandbox, "BWRAP", f"/nonexistent/bwrap-{uuid.uuid4().hex}")
  monkeypatch.setenv("SANDBOX_SECRET", "fallback-secret")
  with caplog.at_level(logging.WARNING):
    res = _run("import helper, os\nprint(input(), helper.X, os.environ.get('SANDBOX_SECRET'))",
               stdin="hi\n", files={"helper.py": "X = 7\n"})
    again = _run("while True:\n  pass\n", timeout_s=1)
  assert res.isolation == again.isolation == "rlimits"
  assert (res.returncode, res.stdout) == (0, "hi 7 None\n")
  assert again.timed_out
  warnings = [r for r in caplog.records if "isolation is reduced" in r.getMessage()]
  assert len(warnings) == 1 and "not found" in warnings[0].getMessage()
