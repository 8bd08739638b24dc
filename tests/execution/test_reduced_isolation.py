"""Reduced isolation as an unprivileged scoring user (the probe's setting): the program runs as
that user's uid, so its files and processes are the program's to reach unless the verifier
protects them. Here the scorer runs as a fresh uid (as root, with setpriv) or as ourselves."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from morse_jax.execution import verifier

from tests.execution.test_sandbox import _readable_by_all

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The scoring process: one run_tests under reduced isolation; the job on stdin, the run on stdout.
SCORER = """
import ctypes, json, os, sys
from morse_jax.execution import verifier
job = json.load(sys.stdin)
run = verifier.run_tests(job["program"], job["tests"], prelude=job["prelude"],
                         upstream=job["upstream"], files=job["files"], timeout_s=job["timeout"],
                         per_test_timeout_s=job["cpu"], per_test_wall_s=job["wall"])
print(json.dumps({"passed": run.passed, "total": run.total, "errors": run.errors,
                  "isolation": run.isolation, "pid": os.getpid(), "uid": os.getuid(),
                  "dumpable_after": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)}))
"""


@pytest.fixture(scope="module")
def readable_code():
  """A folder holding morse_jax that any uid can read: the checkout, or (a checkout in a private
  folder, as CI's fresh clone is) a copy of the package in a temp folder, owned by us."""
  if _readable_by_all(REPO):
    yield REPO
    return
  top = tempfile.mkdtemp(prefix="repo-copy-")
  try:
    shutil.copytree(os.path.join(REPO, "morse_jax"), os.path.join(top, "morse_jax"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for root, dirs, files in os.walk(top):
      for name in dirs + files:
        os.chmod(os.path.join(root, name), 0o755 if name in dirs else 0o644)
    os.chmod(top, 0o755)
    yield top if _readable_by_all(top) else None
  finally:
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def unprivileged(readable_code):
  """(command prefix, uid, a temp dir that uid owns, the code's folder): how to run the scorer
  as a non-root uid."""
  top = tempfile.mkdtemp(prefix="morse-unpriv-")
  try:
    if os.geteuid() != 0:
      yield [sys.executable], os.getuid(), top, REPO
      return
    interpreter = next((c for c in ("/usr/bin/python3", "/usr/local/bin/python3")
                        if os.path.exists(c) and _readable_by_all(c)), None)
    if interpreter is None or shutil.which("setpriv") is None or readable_code is None:
      pytest.skip("as root this needs setpriv, an interpreter and code readable by all")
    uid = 0x48000000 + secrets.randbelow(1 << 20)
    os.chown(top, uid, uid)
    yield (["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", interpreter], uid,
           top, readable_code)
  finally:
    shutil.rmtree(top, ignore_errors=True)


def _score(unprivileged, program, tests, prelude="", upstream=None, files=None, cpu=None,
           wall=None, timeout=30.0):
  prefix, uid, top, code = unprivileged
  env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": top, "TMPDIR": top,
         "PYTHONPATH": code, "MORSE_SANDBOX": "reduced", "LANG": "C.UTF-8"}
  job = {"program": textwrap.dedent(program), "tests": tests, "prelude": prelude,
         "upstream": upstream, "files": files or {}, "cpu": cpu, "wall": wall,
         "timeout": timeout}
  proc = subprocess.run(prefix + ["-c", SCORER], input=json.dumps(job), capture_output=True,
                        text=True, env=env, cwd=top, timeout=timeout + 90, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["isolation"] == "rlimits" and out["uid"] == uid != 0, out
  return out


# Writes a typing.py and a helper.py (the name of the run's support module) that, once imported
# by the harness, record it and make every test pass, into every writable folder it finds
# (temp folders near its own and the cwd of every process it can see; not the checkout).
SHADOWING = """
import glob, os
MARK = os.path.join(os.path.dirname(os.getcwd()), "imported")
PAYLOAD = f'''
import __main__
open({MARK!r}, "a").write(__name__ + "\\\\n")
List = list
Y = 4
def _run(space, tests, per_test, shared, servers, summary):
  summary["passed"] = [True] * len(tests)
__main__._run = _run
'''
tops = (os.path.dirname(os.getcwd()), "/tmp")
found = set(glob.glob(os.path.join(tops[0], "*"))) | set(glob.glob("/tmp/morse-*"))
for pid in os.listdir("/proc"):
  try:
    found.add(os.readlink(f"/proc/{pid}/cwd"))
  except OSError:
    pass
written = []
for folder in sorted(found):
  if (os.path.isdir(folder) and os.access(folder, os.W_OK)
      and any(folder.startswith(t + "/") for t in tops)):
    for name in ("typing.py", "helper.py"):
      try:
        with open(os.path.join(folder, name), "w") as f:
          f.write(PAYLOAD)
        written.append(folder)
      except OSError:
        pass
with open(os.path.join(tops[0], "written"), "w") as f:
  f.write("\\n".join(written))
def f():
  return False
"""


def test_a_program_cannot_shadow_the_harnesss_imports(unprivileged):
  out = _score(unprivileged, SHADOWING, ["assert f() == 1", "import helper\nassert helper.Y == 3"],
               prelude="from typing import List\n", files={"helper.py": "Y = 3\n"})
  top = unprivileged[2]
  with open(os.path.join(top, "written")) as f:
    written = f.read().split()
  assert written, "the probe found no writable folder: it tested nothing"
  assert not os.path.exists(os.path.join(top, "imported")), written
  assert (out["passed"], out["total"]) == (1, 2), out  # the support module is the real one
  assert "test 0" in out["errors"][0]


# Opens /proc/<pid>/mem (read-write), environ and fd of every process of its uid it can see,
# its ancestors first, and records what it could open, at load and during a call; the control
# is a child it starts, which is dumpable.
MEMORY = """
import json, os, subprocess, sys
def ancestors(pid):
  chain = []
  while pid > 1:
    try:
      with open(f"/proc/{pid}/stat") as f:
        pid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
      break
    chain.append(pid)
  return chain
def probe(when):
  me = os.getpid()
  pids = ancestors(me) + [int(p) for p in os.listdir("/proc") if p.isdigit()]
  seen, opened = [], []
  for pid in dict.fromkeys(pids):
    try:
      if (pid == me or me in ancestors(pid)  # itself and its own children
          or os.stat(f"/proc/{pid}").st_uid != os.getuid()):
        continue
    except OSError:
      continue
    seen.append(pid)
    for what, mode in (("mem", "r+b"), ("environ", "rb")):
      try:
        open(f"/proc/{pid}/{what}", mode).close()
        opened.append([pid, what, ancestors(pid)])
      except OSError:
        pass
    try:
      os.listdir(f"/proc/{pid}/fd")
      opened.append([pid, "fd", ancestors(pid)])
    except OSError:
      pass
  child = subprocess.Popen([sys.executable, "-c", "import time; print(1, flush=True); "
                            "time.sleep(5)"], stdout=subprocess.PIPE)
  child.stdout.readline()  # it runs its own program now: dumpable again after exec
  try:  # the control: a process of ours that stayed dumpable
    open(f"/proc/{child.pid}/mem", "r+b").close()
    own = True
  except OSError:
    own = False
  with open(os.path.join(os.path.dirname(os.getcwd()), f"memory-{when}-{me}"), "w") as f:
    json.dump({"seen": seen, "opened": opened, "own": own, "ancestors": ancestors(me)}, f)
probe("load")
def f(x):
  probe("call")
  return g(x) + 1
"""


def test_a_program_cannot_open_the_scorers_memory(unprivileged):
  """The scorer, the harness and the upstream's server (all of the program's uid) are
  non-dumpable while the run lasts; the scorer is dumpable again afterwards."""
  upstream = "def g(x):\n  return 2 * x\n"
  out = _score(unprivileged, MEMORY, ["assert f(3) == g(3) + 1"], upstream=upstream)
  assert out["passed"] == 1, out
  assert out["dumpable_after"] == 1
  top = unprivileged[2]
  reports = []
  for name in sorted(os.listdir(top)):
    if name.startswith("memory-"):
      with open(os.path.join(top, name)) as f:
        reports.append(json.load(f))
  assert len(reports) == 2, reports  # at load and during the call
  scorer = out["pid"]
  for report in reports:
    assert report["own"] and report["ancestors"][0] == scorer, report
    assert scorer in report["seen"] and len(report["seen"]) >= 2, report
    # Ours: the scorer and what it started. Other processes of the uid (e.g. a non-root
    # caller's shell) are beyond the verifier: docs/SECURITY.md.
    ours = [o for o in report["opened"] if o[0] == scorer or scorer in o[2]]
    assert not ours, report


def test_a_program_that_stops_its_cpu_timer_is_stopped_as_this_uid(unprivileged):
  """The harness reads the CPU time of the program's processes from /proc as the scoring user
  (no root): a program that switched off its own CPU timer is stopped by that."""
  program = """
      import signal, time
      def f():
        signal.setitimer(signal.ITIMER_PROF, 0)
        start = time.process_time()
        while time.process_time() - start < 2.5:
          pass
        return 1
      """
  out = _score(unprivileged, program, ["assert f() == 1"], cpu=1.0, wall=60.0, timeout=120.0)
  assert out["passed"] == 0, out
  assert "measured on its processes" in out["errors"][0], out


def test_a_server_runs_its_program_only_after_the_go():
  """A server says it is armed (non-dumpable) before it runs any program code, and runs it only
  when the harness says go: the harness gives it once every server of the run is armed, so no
  program runs beside a server that is still starting (and dumpable)."""
  top = tempfile.mkdtemp(prefix="morse-go-")
  try:
    mark = os.path.join(top, "ran")
    program = f"open({mark!r}, 'w').close()\ndef f():\n  return 1\n"
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    source = (verifier._server_source()  # pylint: disable=protected-access
              + f"\n_serve({program!r}, {req_r}, {resp_w})\n_os._exit(0)\n")
    proc = subprocess.Popen([sys.executable, "-I", "-c", source], pass_fds=(req_r, resp_w))
    os.close(req_r)
    os.close(resp_w)
    reader = os.fdopen(resp_r, "rb")
    try:
      assert json.loads(reader.readline()) == {"armed": True}
      time.sleep(0.5)
      assert not os.path.exists(mark), "the program ran before the go"
      os.write(req_w, b"go\n")
      ready = json.loads(reader.readline())
      assert ready["ready"] and ready["names"] == {"f": "call"}, ready
      assert os.path.exists(mark)
    finally:
      os.close(req_w)
      reader.close()
      proc.wait(10)
  finally:
    shutil.rmtree(top, ignore_errors=True)
