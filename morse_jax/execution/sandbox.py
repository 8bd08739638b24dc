"""Runs untrusted Python (LLM-generated code) in a throwaway sandbox; nothing else may run it.

Preferred isolation is bubblewrap (`bwrap`): new PID, network, IPC and UTS namespaces, a
read-only root that holds only the interpreter, /usr and the libraries, and one writable
directory (a fresh temp dir, also the working directory). Inside, a small wrapper sets rlimits
(CPU, address space, file size, process count, no core files) and then execs the script.

RLIMIT_NPROC is not enforced for root (the kernel exempts uid 0 of the initial user namespace),
and a user namespace made by root maps back to uid 0, so it would not help. When we run as root
the wrapper therefore drops to a fresh, random high uid before exec: the limit binds, and because
it counts every process of a uid, a per-run uid keeps concurrent sandboxes (and the host's
`nobody` daemons) from sharing one budget. As non-root, bubblewrap makes a user namespace and the
wrapper sets the limit inside it, where the kernel counts only that namespace's processes.

Fail closed: without a working bubblewrap `run_python` raises SandboxUnavailableError (naming
bubblewrap and how to install it) unless the user chose reduced isolation, with the environment
variable MORSE_SANDBOX=reduced or the config field `verifier.isolation = "reduced"`
(configs/morse/common.py, applied by morse_jax/experiments/experiment.py through `set_isolation`).
Reduced isolation is rlimits, a temp dir, a cleared environment, its own session and a seccomp
filter (signals only to its own group, no ptrace, no setsid); it never runs the code as root (as
root it drops to a fresh unprivileged uid, and refuses when that uid cannot run the
interpreter), and at the end it kills the run's process group, every process of its session
and, as root, every process of its uid, so nothing of it outlives the run. While such a run is
in flight this process is non-dumpable, so code of our uid cannot open its memory. It has no
network, filesystem or PID isolation. See docs/SECURITY.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import json
import logging
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

# The bubblewrap binary (a name on PATH or a path). Tests set it to a missing one to simulate a
# host without it; the probe result is cached per value.
BWRAP: str | None = "bwrap"

ISOLATIONS = ("bubblewrap", "reduced")
ENV_VAR = "MORSE_SANDBOX"
# The isolation chosen in code (set_isolation, from config.verifier.isolation); None: the
# environment variable MORSE_SANDBOX decides, and without it bubblewrap is required.
_CHOSEN: str | None = None
INSTALL_HINT = "apt-get install -y bubblewrap"


class SandboxUnavailableError(RuntimeError):
  """Bubblewrap is required (the default) but missing or unable to build a sandbox here, or
  reduced isolation cannot run the code as an unprivileged user."""


def set_isolation(isolation: str | None) -> None:
  """Chooses the isolation for this process: "bubblewrap" (required, the default) or "reduced"
  (rlimits only; see the module docstring); None: the MORSE_SANDBOX environment variable."""
  global _CHOSEN
  if isolation is not None and isolation not in ISOLATIONS:
    raise ValueError(f"sandbox isolation {isolation!r} is not one of {ISOLATIONS}")
  _CHOSEN = isolation


def chosen_isolation() -> str:
  """The isolation the user asked for: set_isolation, else MORSE_SANDBOX, else "bubblewrap"."""
  if _CHOSEN is not None:
    return _CHOSEN
  env = os.environ.get(ENV_VAR, "").strip().lower()
  if env and env not in ISOLATIONS:
    raise SandboxUnavailableError(f"{ENV_VAR}={env!r} is not one of {ISOLATIONS}")
  return env or "bubblewrap"

_SCRIPT = "main.py"
_MAX_FILE_BYTES = 16 << 20
_UID_BASE = 0x50000000  # root drops to _UID_BASE + random: far above any real account.
_UID_SPAN = 1 << 24
_ORPHAN_GRACE_S = 1.0  # how long to keep reading once the script exited but a child holds a pipe.
_REAP_WAIT_S = 2.0
_PLAN_LOCK = threading.Lock()  # runners call us from many threads: probe and warn only once.

# Runs as `python -I -S -c _WRAPPER cpu_s as_bytes fsize nproc uid parent_pid script` inside the
# sandbox. It sets the limits itself so no preexec_fn runs in our (threaded) process, and the
# process limit is set inside bubblewrap's user namespace, where it counts only the sandbox.
# -E -s (not -I) for the script: -I would drop the script's directory from sys.path, so `files`
# could not be imported; the environment is cleared anyway.
_WRAPPER = """
import os, resource, sys
cpu, mem, fsize, nproc, uid, parent = map(int, sys.argv[1:7])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
if uid >= 0:
  os.setgroups([])
  os.setgid(uid)
  os.setuid(uid)
if parent > 0:
  import ctypes
  libc = ctypes.CDLL(None, use_errno=True)
  libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL; setuid above would have cleared it.
  if os.getppid() != parent:
    os._exit(137)
  # Reduced isolation: a seccomp filter lets the program signal only its own process group,
  # itself and its own threads (kill(0 | -pgid | own pid), tgkill(own pid)), and forbids ptrace,
  # pidfd_send_signal, the process_vm_* calls and setsid (so every process it starts stays in
  # its session, where _stop finds it); a failure to install it is fatal.
  # (audit arch, kill, tgkill, denied: tkill ptrace process_vm_readv/writev pidfd_send_signal
  # rt_sigqueueinfo rt_tgsigqueueinfo setsid, x32 bit)
  SYSCALLS = {"x86_64": (0xC000003E, 62, 234, (200, 101, 310, 311, 424, 129, 297, 112),
                         0x40000000),
              "aarch64": (0xC00000B7, 129, 131, (130, 117, 270, 271, 424, 138, 240, 157), None)}
  found = SYSCALLS.get(os.uname().machine)
  if found is None:
    sys.stderr.write("sandbox: no seccomp filter for this architecture\\n")
    os._exit(126)
  arch, kill, tgkill, denied, x32 = found
  me = os.getpid()
  LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
  ALLOW, DENY = 0x7FFF0000, 0x00050001  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
  prog = [(LD, "", "", 4), (JEQ, "", "deny", arch), (LD, "", "", 0)]
  if x32 is not None:
    prog.append((JGE, "deny", "", x32))
  prog += [(JEQ, "deny", "", nr) for nr in denied]
  prog += [(JEQ, "kill", "", kill), (JEQ, "tgkill", "", tgkill), (RET, "", "", ALLOW)]
  labels = {"kill": len(prog)}
  prog += [(LD, "", "", 16), (JEQ, "allow", "", 0), (JEQ, "allow", "", me),
           (JEQ, "allow", "deny", (-me) & 0xFFFFFFFF)]
  labels["tgkill"] = len(prog)
  prog += [(LD, "", "", 16), (JEQ, "allow", "deny", me)]
  labels["allow"] = len(prog)
  prog.append((RET, "", "", ALLOW))
  labels["deny"] = len(prog)
  prog.append((RET, "", "", DENY))
  class Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]
  class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]
  off = lambda i, label: labels[label] - i - 1 if label else 0
  code = (Filter * len(prog))(*[Filter(c, off(i, t), off(i, f), k)
                                for i, (c, t, f, k) in enumerate(prog)])
  fprog = Program(len(prog), code)
  if (libc.prctl(38, 1, 0, 0, 0) != 0  # PR_SET_NO_NEW_PRIVS
      or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0):  # PR_SET_SECCOMP, FILTER
    sys.stderr.write(f"sandbox: cannot install the seccomp filter: errno {ctypes.get_errno()}\\n")
    os._exit(126)
os.execv(sys.executable, [sys.executable, "-E", "-s", "-B", sys.argv[7]])
"""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """What a sandboxed run produced.

  returncode: the exit status (a death by signal reads 128 + signal, as bubblewrap reports it);
    None when the wall-clock timeout killed the run.
  stdout, stderr: decoded output, each cut at max_output_bytes.
  timed_out: the wall-clock timeout fired.
  truncated: stdout or stderr was longer than max_output_bytes.
  isolation: "bubblewrap", or "rlimits" when reduced isolation was chosen.
  """
  returncode: int | None
  stdout: str
  stderr: str
  timed_out: bool
  truncated: bool
  isolation: str


@dataclasses.dataclass(frozen=True)
class _Plan:
  isolation: str  # "bubblewrap" or "rlimits"
  bwrap: str | None  # resolved path when isolation == "bubblewrap"
  drop_uid: bool  # we are root: run as a fresh unprivileged uid


def run_python(source: str, *, stdin: str = "", timeout_s: float = 10.0, memory_mb: int = 512,
               max_output_bytes: int = 1 << 20, max_processes: int = 32,
               files: dict[str, str] | None = None,
               pass_fds: tuple[int, ...] = (),
               on_start: Callable[[int], None] | None = None) -> SandboxResult:
  """Runs `source` as a script in a fresh temp dir (its cwd) under the best isolation available.

  Args:
    source: the Python program.
    stdin: fed to the program's standard input.
    timeout_s: wall-clock limit; the CPU limit is ceil(timeout_s) + 1 seconds.
    memory_mb: address-space limit.
    max_output_bytes: cap on each of stdout and stderr kept; the rest is read and dropped.
    max_processes: process (and thread) limit for the sandbox.
    files: extra files, relative path -> text, written next to the script (e.g. test modules).
    pass_fds: open file descriptors the program inherits under the same numbers (the
      verifier's channel to the program). run_python owns them: it closes them here once the
      program has started (or failed to), so the other end sees EOF when the program ends.
    on_start: called with the host pid of the process started (bwrap, or under reduced
      isolation the program itself) once it exists; not called when none was started. The
      program runs in that pid's process tree (the verifier measures its CPU time there).

  Returns:
    A SandboxResult. The temp dir is always removed.

  Raises:
    SandboxUnavailableError: bubblewrap is required but unusable, or reduced isolation cannot
      run the code as an unprivileged user.
  """
  pass_fds = tuple(pass_fds)
  try:
    plan = _plan()
  except BaseException:
    _close(pass_fds)
    raise
  return _execute(plan, source, stdin=stdin, timeout_s=timeout_s, memory_mb=memory_mb,
                  max_output_bytes=max_output_bytes, max_processes=max_processes,
                  files=files or {}, pass_fds=pass_fds, on_start=on_start)


def _close(fds) -> None:
  for fd in fds:
    try:
      os.close(fd)
    except OSError:
      pass


def ensure_available() -> str:
  """The isolation runs get here ("bubblewrap" or "rlimits"); raises SandboxUnavailableError
  when the chosen one cannot run (see run_python)."""
  return _plan().isolation


def write_files(workdir: str, files: dict[str, str]) -> None:
  """Writes files (relative path -> text) under workdir, refusing paths that leave it."""
  _write_files(workdir, files, reserved=False)


def _plan() -> _Plan:
  with _PLAN_LOCK:
    return _plan_for(BWRAP, os.geteuid() == 0, chosen_isolation(), _interpreter())


def _refusal(reason: str) -> str:
  return (f"sandbox: {reason}. Model-written code runs only under bubblewrap unless you choose "
          f"reduced isolation. Install bubblewrap (`{INSTALL_HINT}`, or `make venv` as root), "
          f"or accept reduced isolation (rlimits, no network, filesystem or PID isolation) with "
          f"the environment variable {ENV_VAR}=reduced or the config field "
          f"`verifier.isolation = \"reduced\"` (configs/morse/common.py, read by "
          f"morse_jax/experiments/experiment.py); see docs/SECURITY.md")


@functools.cache
def _plan_for(bwrap: str | None, root: bool, isolation: str = "bubblewrap",
              interpreter: str = "") -> _Plan:
  """Probes once per setting whether the chosen isolation works here; raises when it does not."""
  if isolation == "bubblewrap":
    path = shutil.which(bwrap) if bwrap else None
    if not path:
      raise SandboxUnavailableError(_refusal(
          f"bubblewrap ({bwrap!r}) was not found" if bwrap else "bubblewrap is switched off"))
    plan = _Plan("bubblewrap", path, root)
    probe = _execute(plan, "pass")
    if probe.returncode != 0:
      raise SandboxUnavailableError(_refusal(
          f"bubblewrap ({path}) cannot build a sandbox here: {probe.stderr.strip()[-300:]!r}"))
    return plan
  # Reduced: never as root. Root drops to a fresh unprivileged uid, which must be able to run
  # the interpreter (it cannot when the interpreter lives under e.g. /root).
  if root:
    probe = _execute(_Plan("rlimits", None, True), "import os; print(os.getuid())")
    if probe.returncode != 0 or not probe.stdout.strip().isdigit() or int(probe.stdout) == 0:
      raise SandboxUnavailableError(
          f"sandbox: reduced isolation runs model code as an unprivileged uid, but that uid "
          f"cannot run the interpreter {_interpreter()} (it may live under a private directory "
          f"such as /root): {probe.stderr.strip()[-300:]!r}. Install bubblewrap "
          f"(`{INSTALL_HINT}`) or name an interpreter readable by all users in "
          f"MORSE_SANDBOX_PYTHON (e.g. /usr/bin/python3)")
  logging.warning("sandbox: reduced isolation (%s=reduced or verifier.isolation): rlimits, a "
                  "temp dir, a cleared environment and its own session, %s; no network, "
                  "filesystem or PID isolation", ENV_VAR,
                  "as a fresh unprivileged uid" if root else "as this user")
  return _Plan("rlimits", None, root)


def _execute(plan: _Plan, source: str, *, stdin: str = "", timeout_s: float = 10.0,
             memory_mb: int = 512, max_output_bytes: int = 1 << 20, max_processes: int = 32,
             files: dict[str, str] | None = None, pass_fds: tuple[int, ...] = (),
             on_start: Callable[[int], None] | None = None) -> SandboxResult:
  files = files or {}
  owned = list(pass_fds)  # closed by _run right after the start, or below on an early failure
  try:
    workdir = tempfile.mkdtemp(prefix="morse-sandbox-")
  except BaseException:
    _close(owned)
    raise
  try:
    _write_files(workdir, {_SCRIPT: source, **files}, reserved=_SCRIPT in files)
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if plan.drop_uid else -1
    if uid >= 0:
      _chown_tree(workdir, uid)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir,
           "LANG": "C.UTF-8"}
    nproc = max_processes
    if plan.isolation == "rlimits" and uid < 0 and os.geteuid() != 0:
      nproc += _own_task_count()  # no namespace: the limit counts all our uid's tasks.
    exe = _interpreter()
    cmd = [exe, "-I", "-S", "-c", _WRAPPER, str(math.ceil(timeout_s) + 1),
           str(memory_mb << 20), str(_MAX_FILE_BYTES), str(nproc), str(uid),
           str(os.getpid() if plan.isolation == "rlimits" else 0),
           os.path.join(workdir, _SCRIPT)]
    info = os.pipe() if plan.isolation == "bubblewrap" else None  # bwrap reports on it.
    if info:
      cmd = _bwrap_command(plan.bwrap, plan.drop_uid, exe, workdir, env, info[1]) + cmd
    with tempfile.TemporaryFile() as stdin_file:  # a file, so feeding it can never deadlock.
      stdin_file.write(stdin.encode())
      stdin_file.seek(0)
      with _not_dumpable(plan.isolation == "rlimits"):
        return _run(cmd, stdin_file, env, workdir, timeout_s, max_output_bytes, plan.isolation,
                    info, owned, uid, on_start)
  finally:
    _close(owned)
    _rmtree(workdir)


_DUMPABLE_LOCK = threading.Lock()
_UNDUMPABLE_RUNS = 0  # reduced-isolation runs in flight (runners call us from many threads)
_DUMPABLE_BEFORE = 1  # the setting found when the first of them started
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4


@contextlib.contextmanager
def _not_dumpable(needed: bool):
  """While a reduced-isolation run is in flight this process is non-dumpable (PR_SET_DUMPABLE
  0): code running as our uid cannot open /proc/<our pid>/mem, fds or environ (the kernel's
  ptrace access check; no ptrace call is needed for those, so the seccomp filter does not
  cover them). Also no core dumps, and a debugger of our uid cannot attach, until the last
  run ends; then dumpable again, as we found it. Children we exec are dumpable as usual."""
  global _UNDUMPABLE_RUNS, _DUMPABLE_BEFORE
  if not needed:
    yield
    return
  libc = ctypes.CDLL(None, use_errno=True)
  with _DUMPABLE_LOCK:
    if _UNDUMPABLE_RUNS == 0:
      _DUMPABLE_BEFORE = libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
      if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise SandboxUnavailableError(f"sandbox: reduced isolation cannot make this process "
                                      f"non-dumpable: errno {ctypes.get_errno()}")
    _UNDUMPABLE_RUNS += 1
  try:
    yield
  finally:
    with _DUMPABLE_LOCK:
      _UNDUMPABLE_RUNS -= 1
      if _UNDUMPABLE_RUNS == 0 and _DUMPABLE_BEFORE == 1:
        libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)


def _run(cmd: list[str], stdin_file, env: dict[str, str], cwd: str, timeout_s: float,
         cap: int, isolation: str, info: tuple[int, int] | None,
         pass_fds: list[int] | None = None, uid: int = -1,
         on_start: Callable[[int], None] | None = None) -> SandboxResult:
  """Starts `cmd` in its own session, reads capped output, enforces the wall-clock timeout.

  `info` is the pipe given to bwrap's --info-fd: it names the sandbox's init, see _stop.
  """
  deadline = time.monotonic() + timeout_s
  info_r, info_w = info or (-1, -1)
  extra = list(pass_fds or ())
  try:
    proc = subprocess.Popen(cmd, stdin=stdin_file, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True,
                            pass_fds=((info_w,) if info_w >= 0 else ()) + tuple(extra))
  except BaseException:
    if info_r >= 0:
      os.close(info_r)
    raise
  finally:
    if info_w >= 0:
      os.close(info_w)
    _close(extra)  # the program holds them now; the caller's list is emptied in place
    if pass_fds is not None:
      pass_fds.clear()
  out, err, info_json = bytearray(), bytearray(), bytearray()
  bufs = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
  truncated = timed_out = False
  init_pidfd = None
  try:
    if on_start is not None:
      on_start(proc.pid)
    with selectors.DefaultSelector() as sel:
      for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
      if info_r >= 0:
        sel.register(info_r, selectors.EVENT_READ)
      orphan_deadline = None
      while sel.get_map():
        now = time.monotonic()
        if orphan_deadline is None and proc.poll() is not None:
          orphan_deadline = now + _ORPHAN_GRACE_S
        end = deadline if orphan_deadline is None else min(deadline, orphan_deadline)
        if now >= end:
          timed_out = proc.poll() is None
          break
        for key, _ in sel.select(timeout=min(end - now, 0.1)):
          chunk = os.read(key.fd, 1 << 16)
          if key.fd == info_r:
            info_json += chunk
            if not chunk:
              sel.unregister(info_r)
              init_pidfd = _init_pidfd(info_json)
            continue
          if not chunk:
            sel.unregister(key.fd)
            continue
          buf = bufs[key.fd]
          room = cap - len(buf)
          if room > 0:
            buf += chunk[:room]
          truncated |= len(chunk) > room
    if not timed_out:
      try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:  # closed its pipes but kept running.
        timed_out = True
  finally:
    _stop(proc, init_pidfd, uid if isolation == "rlimits" else -1)
    proc.stdout.close()
    proc.stderr.close()
    if info_r >= 0:
      os.close(info_r)
  code = proc.returncode
  return SandboxResult(
      returncode=None if timed_out else (128 - code if code < 0 else code),
      stdout=out.decode("utf-8", errors="replace"),
      stderr=err.decode("utf-8", errors="replace"),
      timed_out=timed_out, truncated=truncated, isolation=isolation)


def _init_pidfd(info_json: bytes) -> int | None:
  """A pidfd for the sandbox's init named in bwrap's --info-fd JSON, or None once it is gone.

  A pidfd cannot later hit a reused pid; the namespace check makes sure the pid was not
  already reused (by an unrelated process, outside that namespace) when we opened it.
  """
  try:
    info = json.loads(info_json)
    pidfd = os.pidfd_open(int(info["child-pid"]))
  except (ValueError, KeyError, TypeError, OSError):
    return None
  try:
    if os.stat(f"/proc/{info['child-pid']}/ns/pid").st_ino == info.get("pid-namespace"):
      return pidfd
  except OSError:
    pass
  os.close(pidfd)
  return None


def _stop(proc: subprocess.Popen, init_pidfd: int | None, uid: int = -1) -> None:
  """Kills whatever still runs; a no-op after a clean exit.

  Under bubblewrap the sandbox's init dies first: that ends its whole PID namespace before we
  return, and bwrap reaps it. Killing bwrap alone would end the sandbox only asynchronously
  (--die-with-parent) and hand the init to the host's pid 1 to reap. Then the process group
  goes: that ends a timed-out run and, with reduced isolation, any orphans of the script; then
  (reduced isolation) every process left in the run's session (a child that left the process
  group) and, when the run had its own uid, every process of that uid (one that also left the
  session with setsid), until none is left.
  """
  if init_pidfd is not None:
    try:
      signal.pidfd_send_signal(init_pidfd, signal.SIGKILL)
      proc.wait(timeout=_REAP_WAIT_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
      pass
    finally:
      os.close(init_pidfd)
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  proc.wait()
  if init_pidfd is None:
    _kill_leftovers(proc.pid, uid)


def _kill_leftovers(sid: int, uid: int) -> None:
  """Kills every process of session `sid` and, when uid >= 0, every process of `uid`."""
  for _ in range(50):
    found = []
    for name in os.listdir("/proc"):
      if not name.isdigit():
        continue
      try:
        with open(f"/proc/{name}/stat", "rb") as f:
          stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] in (b"Z", b"X"):  # dead, waiting to be reaped: nothing left to kill
          continue
        session = int(fields[3])  # state, ppid, pgrp, session
        owner = os.stat(f"/proc/{name}").st_uid if uid >= 0 else -1
      except (OSError, ValueError, IndexError):
        continue
      if int(name) != os.getpid() and (session == sid or (uid >= 0 and owner == uid)):
        found.append(int(name))
    if not found:
      return
    for pid in found:
      try:
        os.kill(pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
    time.sleep(0.01)


def _bwrap_command(bwrap: str, root: bool, exe: str, workdir: str, env: dict[str, str],
                   info_fd: int) -> list[str]:
  """bwrap arguments: a read-only root with /usr, the interpreter and one writable dir."""
  cmd = [bwrap, "--die-with-parent", "--new-session"]
  if root:
    # No user namespace: root's would map back to uid 0 and the wrapper could not drop to an
    # unmapped uid. The two capabilities exist only until that drop.
    cmd += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
  else:
    cmd += ["--unshare-all"]
  bound = []
  for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
    if os.path.islink(top):
      cmd += ["--symlink", os.readlink(top), top]
    elif os.path.isdir(top):
      cmd += ["--ro-bind", top, top]
      bound.append(top)
  made = set()
  for path in ("/etc/ld.so.cache", "/etc/localtime"):
    if os.path.exists(path):
      cmd += _parent_dirs(path, made) + ["--ro-bind", path, path]
  for prefix in _python_prefixes(exe):
    if not any(_within(prefix, b) for b in bound):
      cmd += _parent_dirs(prefix, made) + ["--ro-bind", prefix, prefix]
      bound.append(prefix)
  cmd += _parent_dirs(workdir, made) + ["--bind", workdir, workdir]
  cmd += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/", "--chdir", workdir,
          "--clearenv"]
  for key, value in env.items():
    cmd += ["--setenv", key, value]
  return cmd + ["--info-fd", str(info_fd), "--"]


def _parent_dirs(path: str, made: set[str]) -> list[str]:
  """Makes the ancestors of a mount point 0755: bwrap copies modes such as /root's 0700."""
  args = []
  parent = os.path.dirname(path)
  chain = []
  while parent not in ("/", ""):
    chain.append(parent)
    parent = os.path.dirname(parent)
  for d in reversed(chain):
    if d not in made:
      made.add(d)
      args += ["--perms", "0755", "--dir", d]
  return args


def _python_prefixes(exe: str) -> list[str]:
  """Directories the interpreter needs, outermost only (e.g. a pyenv or /usr/local prefix)."""
  dirs = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix,
                                        os.path.dirname(os.path.dirname(exe)))}
  return sorted(d for d in dirs if d != "/" and not any(
      o != d and _within(d, o) for o in dirs))


def _within(path: str, top: str) -> bool:
  return path == top or path.startswith(top.rstrip("/") + "/")


# The interpreter that runs sandboxed code; None: the base interpreter of this one. Reduced
# isolation as root needs one the unprivileged uid can read (e.g. /usr/bin/python3 when ours is
# under /root); set it here or with MORSE_SANDBOX_PYTHON.
INTERPRETER: str | None = None


def _interpreter() -> str:
  """The base interpreter, not the venv's: the project's packages stay out of the sandbox."""
  chosen = INTERPRETER or os.environ.get("MORSE_SANDBOX_PYTHON")
  return os.path.realpath(chosen or getattr(sys, "_base_executable", None) or sys.executable)


def _write_files(workdir: str, files: dict[str, str], reserved: bool) -> None:
  if reserved:
    raise ValueError(f"files may not contain {_SCRIPT!r}: that name holds the source")
  for name, text in files.items():
    path = os.path.normpath(os.path.join(workdir, name))
    if os.path.isabs(name) or not _within(path, workdir) or path == workdir:
      raise ValueError(f"file name {name!r} must be a relative path inside the sandbox dir")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)


def _chown_tree(top: str, uid: int) -> None:
  for root, dirs, names in os.walk(top):
    os.chown(root, uid, uid)
    for name in dirs + names:
      os.chown(os.path.join(root, name), uid, uid)


def _rmtree(path: str) -> None:
  """Removes the temp dir even when the script chmod-ed parts of it unreadable."""
  def fix(func, p, _):
    try:
      os.chmod(os.path.dirname(p), 0o700)
      if os.path.isdir(p) and not os.path.islink(p):
        os.chmod(p, 0o700)
        shutil.rmtree(p, ignore_errors=True)
      else:
        func(p)
    except OSError:
      pass
  shutil.rmtree(path, onerror=fix)


def _own_task_count() -> int:
  """Tasks (threads included) our uid runs now: RLIMIT_NPROC counts them all, not just ours."""
  uid, count = os.getuid(), 0
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      try:
        if os.stat(f"/proc/{pid}").st_uid == uid:
          count += len(os.listdir(f"/proc/{pid}/task"))
      except OSError:
        pass
  return count
