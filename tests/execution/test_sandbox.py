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

from morse_jax.execution import sandbox

REPO = pathlib.Path(__file__).resolve().parents[2]


def _bubblewrap_usable() -> bool:
  try:
    return sandbox._plan_for(sandbox.BWRAP, os.geteuid() == 0, "bubblewrap",
                             sandbox._interpreter()).isolation == "bubblewrap"
  except sandbox.SandboxUnavailableError:
    return False


def require_bubblewrap():
  """Skips isolation tests where bubblewrap cannot run, except under CI=true: there a missing
  bubblewrap fails them (.ci/run and `make venv` install it)."""
  if not _bubblewrap_usable():
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
      pytest.fail("bubblewrap is not usable here and CI=true: isolation tests must run "
                  f"(`{sandbox.INSTALL_HINT}`)")
    pytest.skip("bubblewrap is not usable here; .ci/run installs it")


@pytest.fixture
def bwrap():
  require_bubblewrap()


@pytest.fixture
def reduced(monkeypatch):
  """Reduced isolation, with an interpreter the unprivileged uid can run when ours is private."""
  monkeypatch.setenv(sandbox.ENV_VAR, "reduced")
  monkeypatch.setattr(sandbox, "_CHOSEN", None)
  if os.geteuid() == 0 and not _readable_by_all(sandbox._interpreter()):
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
      if os.path.exists(candidate) and _readable_by_all(os.path.realpath(candidate)):
        monkeypatch.setattr(sandbox, "INTERPRETER", candidate)
        break


def _readable_by_all(path: str) -> bool:
  path = os.path.realpath(path)
  while path not in ("/", ""):
    if not os.stat(path).st_mode & 0o005:
      return False
    path = os.path.dirname(path)
  return True


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
      print(os.getuid(), flush=True)
      while True:
        try:
          os.fork()
        except OSError:
          pass
      """, timeout_s=2)
  assert res.timed_out and res.returncode is None
  assert time.monotonic() - start < 15  # returns, not hangs (generous: CI machines are loaded)
  assert subprocess.run(["true"], check=False).returncode == 0  # the host can still fork.
  if os.geteuid() == 0:  # nothing of the run's uid survives (others' sandboxes may run now)
    uid = int(res.stdout.split()[0])
    assert uid >= sandbox._UID_BASE  # pylint: disable=protected-access
    time.sleep(0.2)
    left = [p for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}")
            and _uid(p) == uid]
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
       f"from morse_jax.execution import sandbox; sandbox.run_python({source!r}, timeout_s=60)"],
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


def test_refuses_without_bubblewrap(monkeypatch):
  """Fail closed: no bubblewrap and no choice of reduced isolation -> an error, not a run."""
  monkeypatch.setattr(sandbox, "BWRAP", f"/nonexistent/bwrap-{uuid.uuid4().hex}")
  monkeypatch.delenv(sandbox.ENV_VAR, raising=False)
  monkeypatch.setattr(sandbox, "_CHOSEN", None)
  with pytest.raises(sandbox.SandboxUnavailableError) as e:
    _run("open('/tmp/should-not-run', 'w')")
  message = str(e.value)
  for needle in ("bubblewrap", "apt-get install -y bubblewrap", "MORSE_SANDBOX=reduced",
                 'verifier.isolation = "reduced"', "configs/morse/common.py",
                 "morse_jax/experiments/experiment.py"):
    assert needle in message
  from morse_jax.execution import verifier  # pylint: disable=import-outside-toplevel
  with pytest.raises(sandbox.SandboxUnavailableError):
    verifier.run_tests("def f():\n  return 1\n", ["assert f() == 1"])
  monkeypatch.setattr(sandbox, "BWRAP", None)
  with pytest.raises(sandbox.SandboxUnavailableError):
    _run("pass")


def test_refuses_a_bubblewrap_that_cannot_build_a_sandbox(monkeypatch, tmp_path):
  fake = tmp_path / "bwrap"
  fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\n"
                  "exit 1\n")
  fake.chmod(0o755)
  monkeypatch.setattr(sandbox, "BWRAP", str(fake))
  monkeypatch.delenv(sandbox.ENV_VAR, raising=False)
  monkeypatch.setattr(sandbox, "_CHOSEN", None)
  with pytest.raises(sandbox.SandboxUnavailableError, match="cannot build a sandbox"):
    _run("pass")


def test_isolation_choice_is_validated(monkeypatch):
  with pytest.raises(ValueError):
    sandbox.set_isolation("none")
  monkeypatch.setenv(sandbox.ENV_VAR, "off")
  monkeypatch.setattr(sandbox, "_CHOSEN", None)
  with pytest.raises(sandbox.SandboxUnavailableError):
    sandbox.chosen_isolation()
  sandbox.set_isolation("reduced")
  try:
    assert sandbox.chosen_isolation() == "reduced"
  finally:
    sandbox.set_isolation(None)


def test_reduced_isolation_when_chosen(monkeypatch, caplog, reduced):
  monkeypatch.setattr(sandbox, "BWRAP", f"/nonexistent/bwrap-{uuid.uuid4().hex}")
  monkeypatch.setenv("SANDBOX_SECRET", "fallback-secret")
  with caplog.at_level(logging.WARNING):
    res = _run("import helper, os\nprint(input(), helper.X, os.environ.get('SANDBOX_SECRET'), "
               "os.getuid(), os.geteuid())", stdin="hi\n", files={"helper.py": "X = 7\n"})
    again = _run("while True:\n  pass\n", timeout_s=1)
  assert res.isolation == again.isolation == "rlimits"
  words = res.stdout.split()
  assert words[:3] == ["hi", "7", "None"], res.stderr
  assert int(words[3]) != 0 and int(words[4]) != 0  # never root
  assert again.timed_out
  assert [r for r in caplog.records if "reduced isolation" in r.getMessage()]


def test_reduced_isolation_refuses_an_interpreter_the_uid_cannot_run(monkeypatch, tmp_path):
  if os.geteuid() != 0:
    pytest.skip("only root drops to another uid")
  private = tmp_path / "private"
  private.mkdir(mode=0o700)
  exe = private / "python3"
  os.symlink(sandbox._interpreter(), exe)
  monkeypatch.setattr(sandbox, "INTERPRETER", None)
  monkeypatch.setenv("MORSE_SANDBOX_PYTHON", str(exe))
  monkeypatch.setattr(sandbox, "_interpreter", lambda: str(exe))  # no realpath: stays private
  monkeypatch.setenv(sandbox.ENV_VAR, "reduced")
  monkeypatch.setattr(sandbox, "_CHOSEN", None)
  monkeypatch.setattr(sandbox, "BWRAP", None)
  with pytest.raises(sandbox.SandboxUnavailableError, match="unprivileged uid"):
    _run("print('ran')")


def test_reduced_isolation_signals_only_its_own_group(reduced, monkeypatch):
  """The seccomp filter: even a process of the same uid (its own child, moved to another group)
  cannot be signalled; its own group, itself and its own threads can; setsid is refused."""
  monkeypatch.setattr(sandbox, "BWRAP", None)
  res = _run("""
      import os, signal, time
      pid = os.fork()
      if pid == 0:
        os.setpgid(0, 0)  # its own group (setsid is refused)
        time.sleep(30)
        os._exit(0)
      time.sleep(0.2)
      for target in (pid, os.getppid()):
        try:
          os.kill(target, signal.SIGKILL)
          print("killed", target)
        except OSError as e:
          print("refused", e.errno)
      os.killpg(0, 0)
      os.kill(os.getpid(), 0)
      signal.signal(signal.SIGUSR1, lambda *a: print("own signal"))
      signal.raise_signal(signal.SIGUSR1)
      try:
        os.setsid()
        print("setsid")
      except OSError as e:
        print("refused setsid", e.errno)
      """, timeout_s=10)
  assert res.returncode == 0, res.stderr
  assert res.stdout.split("\n")[:4] == ["refused 1", "refused 1", "own signal",
                                         "refused setsid 1"], res.stdout


def test_reduced_isolation_cannot_signal_outside_its_group(reduced, monkeypatch):
  if os.geteuid() != 0:
    pytest.skip("as non-root the uid is ours: the seccomp filter test covers it")
  monkeypatch.setattr(sandbox, "BWRAP", None)
  victim = subprocess.Popen(["sleep", "30"], start_new_session=True)
  try:
    res = _run(f"""
        import os, signal
        for target in ({victim.pid}, {os.getpid()}, 1):
          try:
            os.kill(target, signal.SIGKILL)
            print("killed", target)
          except OSError as e:
            print("refused", target, e.errno)
        try:
          os.killpg({victim.pid}, signal.SIGKILL)
          print("killed group")
        except OSError as e:
          print("refused group", e.errno)
        """)
    assert res.returncode == 0, res.stderr
    assert "killed" not in res.stdout and res.stdout.count("refused") == 4
    assert victim.poll() is None
  finally:
    victim.kill()
    victim.wait()


def test_reduced_isolation_leaves_no_survivors(reduced, monkeypatch):
  """A grandchild that left the session (setsid) and the process group still dies."""
  monkeypatch.setattr(sandbox, "BWRAP", None)
  marker = f"survivor-marker-{uuid.uuid4().hex}"
  res = _run(f"""
      import os, sys
      if os.fork() == 0:
        try:
          os.setsid()  # refused by the seccomp filter; the kill by uid would catch it anyway
        except OSError:
          pass
        if os.fork() == 0:
          os.execv("/bin/sleep", ["/bin/sleep", "60", "{marker}"])
        os._exit(0)
      if os.fork() == 0:
        os.setpgid(0, 0)
        os.execv("/bin/sleep", ["/bin/sleep", "61", "{marker}"])
      import time
      time.sleep(0.5)
      print("started")
      """, timeout_s=5)
  assert "started" in res.stdout, res.stderr
  deadline = time.monotonic() + 5
  while _marked_pids(marker, set()):
    assert time.monotonic() < deadline, "a process of the run outlived it"
    time.sleep(0.05)


def test_config_field_chooses_the_isolation(monkeypatch):
  from configs.morse import common  # pylint: disable=import-outside-toplevel
  from morse_jax.experiments import experiment  # pylint: disable=import-outside-toplevel

  monkeypatch.delenv(sandbox.ENV_VAR, raising=False)
  config = common.base()
  try:
    assert config.verifier.isolation == "bubblewrap"
    assert experiment.configure_sandbox(config) == "bubblewrap"
    monkeypatch.setenv(sandbox.ENV_VAR, "reduced")  # either one may choose reduced
    assert experiment.configure_sandbox(config) == "reduced"
    monkeypatch.delenv(sandbox.ENV_VAR)
    config.verifier.isolation = "reduced"
    assert experiment.configure_sandbox(config) == "reduced"
    config.verifier.isolation = "none"
    with pytest.raises(experiment.ConfigError, match="verifier.isolation"):
      experiment.configure_sandbox(config)
  finally:
    sandbox.set_isolation(None)
