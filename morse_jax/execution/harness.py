"""The trusted side of the verifier: runs the test source, which the tested program never sees.

`verifier.run_tests` starts this file's text as a plain subprocess (`python -I -S -B -c <text>`,
the text read once by the verifier, so a program that writes the checkout cannot change it; its
own session, a private temp dir as cwd that is not on sys.path, a cleared environment) and
writes the job to its stdin: the trusted prelude (e.g. HumanEval's prompt, SciCode's import
lines), the test snippets, the support modules' source (imported from memory), and the pipe fds
to each sandboxed `harness_server` that holds model-written code. It answers on its own stdout,
which only the verifier reads: no marker, nothing the program can write to. Its first byte
there says it made itself non-dumpable; the verifier starts the programs only after it. Each
server says it is non-dumpable too (armed) and runs its program only on our go, which we give
once every server of the run is armed: no program runs beside a server still starting up.

The tests run here, in this process. A name a test uses that the prelude does not bind and the
program defines (or the names given as `remote`) is bound to a proxy; calling it asks the
sandbox to call the program's function and decodes the answer into plain data of exact builtin
types (int, float, str, bool, None, bytes, complex, list, tuple, dict, set, frozenset) or numpy
arrays / scalars and scipy sparse matrices rebuilt from raw bytes. Every comparison an assert
makes is therefore made here on values the program could only choose, never program code: an
object whose `__eq__` is always True (any class the program defines, a float subclass) reaches
us as an opaque proxy, and comparing, hashing, truth-testing or converting a proxy raises.

Nothing the program sends chooses what we import or call: a name the program bound to a module
gets the module we pick for that name (`_module_for`), and the global random states go to the
program only after a test seeded them and never come back (`_rng_state`).

A test's limit counts CPU time, not wall time, so that load on the machine does not decide a
reward (`_run`): the program's timer per call (armed with what the test has left), ours on the
test's own code, and the program's process tree read from /proc here (`check_cpu`: the program
can switch its timer off or under-report, not change what the kernel counts). A wall-clock
limit per test stops a program that sleeps or blocks.

Self-contained (stdlib; numpy and scipy imported only when a value needs them), so it runs with
-I and without the project on sys.path.
"""

import ast
import base64
import builtins
import importlib
import importlib.util
import json
import math
import os
import resource
import select
import signal
import sys
import time
import types

_MODULES = ("numpy", "scipy", "sympy", "mpmath")  # besides the stdlib: what tests may use
_MAX_REPLY = 512 << 20  # bytes of one reply line; more is an error, not a memory blow-up
_GRACE_S = 0.5
_CPU_CHECK_S = 0.2  # how often the program's CPU time is read from /proc while it is busy
_TICKS = os.sysconf("SC_CLK_TCK")


def _tree_cpu(pid):
  """CPU seconds used by the process tree under `pid` (the sandbox the verifier started: bwrap
  and the program, or the program itself), children that ended and were reaped included; None
  when it cannot be read. Measured by the kernel, so the program cannot under-report it."""
  total, stack, seen = 0, [pid], set()
  while stack:
    p = stack.pop()
    if p in seen:
      continue
    seen.add(p)
    try:
      with open(f"/proc/{p}/stat", "rb") as f:
        stat = f.read()
      fields = stat[stat.rindex(b")") + 2:].split()
      total += sum(int(n) for n in fields[11:15])  # utime stime cutime cstime
      for tid in os.listdir(f"/proc/{p}/task"):
        with open(f"/proc/{p}/task/{tid}/children", "rb") as f:
          stack.extend(int(c) for c in f.read().split())
    except (OSError, ValueError, IndexError):
      if p == pid:
        return None
  return total / _TICKS


class RemoteError(Exception):
  """An exception the tested code raised whose type is not a builtin Exception."""


class RemoteGone(Exception):
  """The tested program's process is gone (exited, crashed, killed, or stopped answering)."""


def _describe(e):
  try:
    text = str(e)
  except BaseException:  # pylint: disable=broad-except
    text = "<unprintable>"
  return (f"{type(e).__name__}: {text}" if text else type(e).__name__)[:300]


class Remote:
  """A value that lives in the sandbox: callable and inspectable, never comparable."""

  __slots__ = ("_server", "_ref", "_kind")

  def __init__(self, server, ref, kind):
    object.__setattr__(self, "_server", server)
    object.__setattr__(self, "_ref", ref)
    object.__setattr__(self, "_kind", kind)

  def __call__(self, *args, **kwargs):
    return self._server.request({"op": "call", "target": self._ref,
                                 "args": [self._server.encode(a) for a in args],
                                 "kwargs": {"$": "dict", "v": [[k, self._server.encode(v)]
                                                               for k, v in kwargs.items()]}})

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return self._server.request({"op": "getattr", "target": self._ref, "name": name})

  def __getitem__(self, key):
    return self._server.request({"op": "getitem", "target": self._ref,
                                 "key": self._server.encode(key)})

  def __iter__(self):
    return iter(self._server.request({"op": "list", "target": self._ref}))

  def __len__(self):
    value = self._server.request({"op": "len", "target": self._ref})
    if type(value) is not int:  # pylint: disable=unidiomatic-typecheck
      raise TypeError("len() of a tested object is not an int")
    return value

  def __repr__(self):
    return f"<tested-code {self._kind}>"

  def _refuse(self, *_):
    raise TypeError(f"a {self._kind} returned by the tested code is not plain data (int, float, "
                    "str, list, tuple, dict, numpy array, ...); the verifier compares plain "
                    "data only")

  __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = _refuse
  __float__ = __int__ = __index__ = __complex__ = __contains__ = _refuse
  __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _refuse
  __rtruediv__ = __abs__ = __neg__ = __pow__ = __rpow__ = __mod__ = __floordiv__ = _refuse
  __matmul__ = __rmatmul__ = __and__ = __or__ = __xor__ = __format__ = _refuse


class Server:
  """The pipe pair to one sandboxed harness_server."""

  def __init__(self, label, request_fd, response_fd, deadline, pid=None):
    self.label, self.req, self.resp, self.deadline = label, request_fd, response_fd, deadline
    self.pid = pid if isinstance(pid, int) and pid > 0 else None  # the sandbox's host pid
    self.cpu_limit = self.cpu_base = None  # the test's limit, the tree's CPU when it began
    self.cpu_checked = 0.0
    self.buf = bytearray()
    self.dead = None
    self.call_deadline = None  # the current test's wall-clock end, set by the test loop
    self.cpu_left = None  # CPU seconds the current test's calls may still use (the test loop)
    self.names = {}
    self.program_error = None
    self.seeds_sent = {}  # generator -> the seeding (see _SeedWatch) last sent to this program

  def close(self, why):
    if self.dead is None:
      self.dead = why
      for fd in (self.req, self.resp):
        try:
          os.close(fd)
        except OSError:
          pass

  def _readline(self, until):
    while True:
      at = self.buf.find(b"\n")
      if at >= 0:
        line = bytes(self.buf[:at])
        del self.buf[:at + 1]
        return line
      left = until - time.monotonic()
      if left <= 0:
        raise RemoteGone("the tested program did not answer in time")
      guarded = self.cpu_base is not None
      if not select.select([self.resp], [], [], min(left, _CPU_CHECK_S) if guarded else left)[0]:
        self.check_cpu()
        continue
      chunk = os.read(self.resp, 1 << 20)
      if not chunk:
        raise RemoteGone("the tested program exited or was killed before it answered")
      self.buf += chunk
      if len(self.buf) > _MAX_REPLY:
        raise RemoteGone("the tested program's answer is too large")

  def _start_message(self):
    """The server's next start-up line as JSON (None when it closed: `dead` says why)."""
    try:
      return json.loads(self._readline(self.deadline))
    except BaseException as e:  # pylint: disable=broad-except
      self.close(_describe(e))
      return None

  def arm(self):
    """Waits for the server's first line: it is non-dumpable and holds its program unrun."""
    armed = self._start_message()
    if self.dead is None and armed != {"armed": True}:
      self.close("garbled armed message")

  def go(self):
    """Lets an armed server run its program."""
    try:
      os.write(self.req, b"go\n")
    except OSError as e:
      self.close(_describe(e))

  def start(self):
    ready = self._start_message()
    if self.dead is not None:
      return
    if not isinstance(ready, dict):
      self.close("garbled start message")
      return
    error = ready.get("program_error")
    if error is not None:
      self.program_error = _remote_text(error)
      self.close("the program raised")
      return
    names = ready.get("names")
    if isinstance(names, dict):
      self.names = {k: v for k, v in names.items()
                    if type(k) is str and type(v) is str}  # pylint: disable=unidiomatic-typecheck

  def begin_test(self, cpu_limit):
    """The CPU time the program's calls may use in the next test: `cpu_limit` seconds (None:
    no limit), counted by the program's timer and, independently, on its process tree here."""
    self.cpu_left = self.cpu_limit = cpu_limit
    self.cpu_base = _tree_cpu(self.pid) if cpu_limit and self.pid else None
    self.cpu_checked = time.monotonic()

  def check_cpu(self, every=0.0):
    """Raises RemoteGone once the program's process tree has used more than the test's CPU
    limit (plus a grace): the stop for a program that switched off its own timer or
    under-reports. Reads /proc at most once per `every` seconds."""
    if self.cpu_base is None or time.monotonic() - self.cpu_checked < every:
      return
    self.cpu_checked = time.monotonic()
    used = _tree_cpu(self.pid)
    if used is not None and used - self.cpu_base > self.cpu_limit + _GRACE_S:
      raise RemoteGone(f"the tested program used more than its CPU time limit of "
                       f"{self.cpu_limit} s in this test (measured on its processes)")

  def request(self, message):
    if self.dead is not None:
      raise RemoteGone(f"the tested program is gone: {self.dead}")
    try:
      self.check_cpu(every=_CPU_CHECK_S)
    except RemoteGone as e:
      self.close(_describe(e))
      raise
    until = self.deadline if self.call_deadline is None else min(self.deadline,
                                                                 self.call_deadline)
    message["timeout"] = max(until - time.monotonic(), 0.001)
    if self.cpu_left is not None:
      if self.cpu_left <= 0:
        raise TimeoutError("the test's calls used up its CPU time limit")
      message["cpu"] = self.cpu_left
    if message["op"] == "call":
      message["rng"] = _rng_state(self)
    try:
      data = memoryview(json.dumps(message).encode() + b"\n")
      while data:
        data = data[os.write(self.req, data):]
      reply = json.loads(self._readline(until + _GRACE_S))
    except BaseException as e:  # a timeout or an alarm mid-read leaves the channel unusable
      self.close(_describe(e))
      if isinstance(e, (RemoteGone, TimeoutError)):
        raise
      raise RemoteGone(f"the channel to the tested program broke: {_describe(e)}") from None
    if not isinstance(reply, dict):
      raise RemoteGone("garbled answer")
    used = reply.get("cpu")  # as the program reports it; check_cpu stops one that lies
    if self.cpu_left is not None and isinstance(used, float) and math.isfinite(used) and used > 0:
      self.cpu_left -= used
    if "error" in reply:
      raise _exception(reply["error"])
    try:
      return _answer(self.decode(reply.get("value")))
    except RecursionError:
      raise RemoteGone("the tested program's answer is nested too deeply") from None

  def global_ref(self, name):
    return {"$": "global", "name": name}

  def encode(self, x, depth=0):
    """Our plain values, and proxies of this server, as the wire format."""
    if depth > 200:
      raise RecursionError("argument nested too deeply")
    t = type(x)
    if x is None or t in (bool, str, int, float):
      return x
    if t is list:
      return [self.encode(v, depth + 1) for v in x]
    if t in (tuple, set, frozenset):
      return {"$": t.__name__, "v": [self.encode(v, depth + 1) for v in x]}
    if t is dict:
      return {"$": "dict", "v": [[self.encode(k, depth + 1), self.encode(v, depth + 1)]
                                 for k, v in x.items()]}
    if t is complex:
      return {"$": "complex", "v": [x.real, x.imag]}
    if t is bytes:
      return {"$": "bytes", "v": base64.b64encode(x).decode("ascii")}
    if t is Remote:
      if x._server is self or x._ref.get("$") == "global":
        return x._ref
      raise TypeError("an object of one sandboxed program cannot be passed to another")
    np = sys.modules.get("numpy")
    if np is not None:
      if isinstance(x, np.ndarray):
        x = np.asarray(x)
        if x.dtype.hasobject:
          return {"$": "ndo", "shape": list(x.shape),
                  "v": [self.encode(v, depth + 1) for v in x.ravel()]}
        return {"$": "nd", "dtype": _dtype_spec(x.dtype), "shape": list(x.shape),
                "v": base64.b64encode(np.ascontiguousarray(x).tobytes()).decode("ascii")}
      if isinstance(x, np.generic) and not x.dtype.hasobject:
        return {"$": "npscalar", "dtype": _dtype_spec(x.dtype),
                "v": base64.b64encode(np.asarray(x).tobytes()).decode("ascii")}
    if t.__module__.startswith("scipy.sparse") and hasattr(x, "tocoo"):
      coo = x.tocoo()
      return {"$": "sparse", "format": x.format, "kind": "array" if "array" in t.__name__
              else "matrix", "shape": list(x.shape), "data": self.encode(coo.data, depth + 1),
              "row": self.encode(coo.row, depth + 1), "col": self.encode(coo.col, depth + 1)}
    raise TypeError(f"cannot pass a {t.__name__} to the tested code (plain data and the "
                    "tested code's own functions only)")

  def decode(self, v, depth=0):
    """Untrusted wire data -> plain values of exact builtin / numpy types, or proxies."""
    if depth > 200:
      raise RecursionError
    t = type(v)
    if v is None or t in (bool, str, int, float):
      return v
    if t is list:
      return [self.decode(i, depth + 1) for i in v]
    if t is not dict:
      raise TypeError(f"unexpected {t.__name__} in an answer")
    tag = v.get("$")
    items = v.get("v")
    if tag in ("tuple", "set", "frozenset"):
      return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](
          self.decode(i, depth + 1) for i in _list(items))
    if tag == "dict":
      return {self.decode(k, depth + 1): self.decode(i, depth + 1) for k, i in
              (_pair(p) for p in _list(items))}
    if tag == "complex":
      re, im = _pair(items)
      if type(re) not in (int, float) or type(im) not in (int, float):
        raise TypeError("bad complex")
      return complex(re, im)
    if tag == "bytes":
      return base64.b64decode(_str(items), validate=True)
    if tag == "ref":
      if type(v.get("id")) is not int:
        raise TypeError("bad reference")
      kind = str(v.get("type", "object"))[:80]
      return Remote(self, {"$": "ref", "id": v["id"]}, f"{kind} object")
    if tag in ("nd", "npscalar", "ndo"):
      import numpy as np  # pylint: disable=import-outside-toplevel
      shape = v.get("shape", [])
      if tag != "npscalar" and (type(shape) is not list or not all(
          type(n) is int and n >= 0 for n in shape)):
        raise TypeError("bad array shape")
      if tag == "ndo":
        values = [self.decode(i, depth + 1) for i in _list(items)]
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return arr.reshape(shape)
      dtype = _dtype(np, v.get("dtype"))
      raw = base64.b64decode(_str(items), validate=True)
      count = 1 if tag == "npscalar" else int(np.prod(shape, dtype=np.int64))
      if len(raw) != count * dtype.itemsize:
        raise TypeError("array bytes do not match its shape and dtype")
      data = np.frombuffer(raw, dtype=dtype)
      return data[0] if tag == "npscalar" else data.reshape(shape).copy()
    if tag == "sparse":
      import numpy as np  # pylint: disable=import-outside-toplevel
      import scipy.sparse as sp  # pylint: disable=import-outside-toplevel
      parts = [self.decode(v.get(k), depth + 1) for k in ("data", "row", "col")]
      if not all(type(p) is np.ndarray for p in parts):
        raise TypeError("bad sparse matrix")
      make = sp.coo_array if v.get("kind") == "array" else sp.coo_matrix
      fmt = _str(v.get("format"))
      if fmt not in ("coo", "csr", "csc", "bsr", "lil", "dok", "dia"):
        raise TypeError("bad sparse format")
      return make((parts[0], (parts[1], parts[2])), shape=tuple(v.get("shape"))).asformat(fmt)
    raise TypeError(f"unknown value tag {tag!r} in an answer")


def _rng_state(server):
  """The global random states (numpy's, Python's) a test seeded since this program's last call,
  which the call draws from as it would in one process (SciCode 47.4 seeds, then calls MC).
  Nothing else: an unseeded state is the harness's own (from os.urandom) and stays secret, and a
  state a test did not reseed is left to the program, which goes on from its own last draw. The
  state never comes back: the program cannot choose the test's next random inputs."""
  state = {}
  for key, seeding in _SeedWatch.seedings.items():
    if server.seeds_sent.get(key) != seeding:
      server.seeds_sent[key] = seeding
      state[key] = server.encode(_SeedWatch.get_state[key]())
  return state


class _SeedWatch:
  """Counts the seedings of the global generators: `random.seed` / `random.setstate`, and
  `numpy.random.seed` / `numpy.random.set_state` (wrapped when numpy.random is imported)."""

  seedings = {}
  get_state = {}

  @classmethod
  def watch(cls, key, module, setters, getter):
    cls.get_state[key] = getattr(module, getter)
    for name in setters:
      original = getattr(module, name)
      def seeding(*args, _original=original, **kwargs):
        result = _original(*args, **kwargs)
        cls.seedings[key] = cls.seedings.get(key, 0) + 1
        return result
      setattr(module, name, seeding)

  @classmethod
  def install(cls):
    import random  # pylint: disable=import-outside-toplevel
    cls.watch("py", random, ("seed", "setstate"), "getstate")
    sys.meta_path.insert(0, _AfterImport("numpy.random", lambda module: cls.watch(
        "np", module, ("seed", "set_state"), "get_state")))


class _AfterImport:
  """A meta path finder that runs `then(module)` once module `name` has been executed."""

  def __init__(self, name, then):
    self.name, self.then = name, then

  def find_spec(self, name, path=None, target=None):
    if name != self.name:
      return None
    for finder in sys.meta_path:
      if finder is self or not hasattr(finder, "find_spec"):
        continue
      spec = finder.find_spec(name, path, target)
      if spec is not None:
        break
    else:
      return None
    loader_exec = getattr(spec.loader, "exec_module", None)
    if loader_exec is not None:
      def exec_module(module):
        loader_exec(module)
        self.then(module)
      spec.loader.exec_module = exec_module
    return spec


class _SupportFinder:
  """Imports the support modules (e.g. SciCode's `scicode.compare`) from source held in memory:
  no folder on our sys.path holds them, so none the program could write is on it."""

  def __init__(self, files):
    self.sources, self.packages = {}, set()
    for path, text in files.items():
      if not path.endswith(".py"):
        continue
      parts = path[:-3].split("/")
      if parts[-1] == "__init__":
        parts = parts[:-1]
        self.packages.add(".".join(parts))
      self.sources[".".join(parts)] = text
      self.packages.update(".".join(parts[:i]) for i in range(1, len(parts)))

  def find_spec(self, name, path=None, target=None):
    if name not in self.sources and name not in self.packages:
      return None
    return importlib.util.spec_from_loader(name, self, is_package=name in self.packages)

  def create_module(self, spec):
    return None

  def exec_module(self, module):
    name = module.__name__
    if name in self.packages:
      module.__path__ = []
    exec(compile(self.sources.get(name, ""), f"<support {name}>", "exec"),  # pylint: disable=exec-used
         module.__dict__)


def _list(x):
  if type(x) is not list:
    raise TypeError("expected a list")
  return x


def _pair(x):
  if type(x) is not list or len(x) != 2:
    raise TypeError("expected a pair")
  return x


def _str(x):
  if type(x) is not str:
    raise TypeError("expected a string")
  return x


def _dtype_spec(dtype):
  return [list(f) for f in dtype.descr] if dtype.fields is not None else dtype.str


def _dtype(np, spec):
  if type(spec) is list:
    spec = [tuple(_list(f)) for f in spec]
  elif type(spec) is not str:
    raise TypeError("bad dtype")
  dtype = np.dtype(spec)
  if dtype.hasobject:
    raise TypeError("object dtype in raw array data")
  return dtype


# StopIteration / StopAsyncIteration are control flow: raised by the program into a test's `for`
# loop or `map` they would end the loop early and skip its asserts, so they arrive as RemoteError.
_SAFE = {name: cls for name, cls in vars(builtins).items()
         if isinstance(cls, type) and issubclass(cls, Exception)
         and not issubclass(cls, (StopIteration, StopAsyncIteration))}


def _remote_text(error):
  if not isinstance(error, dict):
    return "garbled error"
  kind, message = str(error.get("type", "Exception"))[:80], str(error.get("message", ""))[:300]
  return f"{kind}: {message}" if message else kind


def _exception(error):
  """The tested code's exception as ours: builtin Exception types keep their type (a test may
  expect a ValueError); others, StopIteration / StopAsyncIteration and SystemExit /
  KeyboardInterrupt become RemoteError."""
  kind = str(error.get("type", "")) if isinstance(error, dict) else ""
  message = str(error.get("message", ""))[:300] if isinstance(error, dict) else ""
  cls = _SAFE.get(kind)
  if cls is not None:
    try:
      return cls(message)
    except BaseException:  # pylint: disable=broad-except
      pass
  return RemoteError(_remote_text(error))


def _names(tests):
  """The free names of the tests: read by some test and bound by none. A name a test binds
  (`target = ...`, a def, an import, a loop variable, a parameter) is the tests' own, so it is
  never bound to the program's object of that name, even before the test binds it."""
  used, bound = set(), set()
  for test in tests:
    try:
      tree = ast.parse(test)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
      continue
    for n in ast.walk(tree):
      if isinstance(n, ast.Name):
        (used if isinstance(n.ctx, ast.Load) else bound).add(n.id)
      elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        bound.add(n.name)
      elif isinstance(n, ast.alias):
        bound.add((n.asname or n.name).split(".")[0])
      elif isinstance(n, ast.arg):
        bound.add(n.arg)
      elif isinstance(n, ast.ExceptHandler) and n.name:
        bound.add(n.name)
  return used - bound


def main():
  try:  # PR_SET_DUMPABLE 0: a program running as our uid cannot ptrace us or read our memory
    import ctypes  # pylint: disable=import-outside-toplevel
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
  except (OSError, AttributeError):
    pass
  os.write(1, b"+")  # non-dumpable now: the verifier may start the programs
  job = json.loads(sys.stdin.buffer.read())
  start = time.monotonic()
  deadline = start + float(job["timeout"])
  if job.get("memory_mb"):
    limit = int(job["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
  out = os.dup(1)
  os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
  # Our code comes from the verifier's memory (-c) and the support modules from the job, so no
  # folder on sys.path holds either: the cwd is not on it; the site dirs hold numpy and scipy.
  sys.path.extend(p for p in job.get("sys_path", ()) if p not in sys.path)
  sys.meta_path.insert(0, _SupportFinder(job.get("support") or {}))
  _SeedWatch.install()
  servers = [Server(s["label"], s["request_fd"], s["response_fd"], deadline, s.get("pid"))
             for s in job["servers"]]
  for server in servers:
    server.arm()
  if all(s.dead is None for s in servers):  # else none runs: the run fails on the dead one
    for server in servers:
      server.go()
  for server in servers:
    if server.dead is None:
      server.start()
  load_error = next((f"program raised {s.program_error}" if s.program_error else
                     f"program did not load: {s.dead}" for s in servers if s.dead is not None),
                    None)
  tests, per_test = job["tests"], job.get("per_test") or {}
  summary = {"passed": [False] * len(tests), "errors": [None] * len(tests),
             "program_error": load_error, "harness_error": None}
  space = _test_space(job)
  try:
    exec(compile(job.get("prelude", ""), "prelude", "exec"), space)  # pylint: disable=exec-used
  except BaseException as e:  # pylint: disable=broad-except
    summary["harness_error"] = f"the trusted prelude raised {_describe(e)}"
  if summary["program_error"] is None and summary["harness_error"] is None:
    _bind(space, servers, job.get("remote"), _names(tests))
    _run(space, tests, per_test, job.get("shared"), servers, summary, job.get("groups"))
  data = json.dumps(summary).encode()
  while data:
    data = data[os.write(out, data):]
  for server in servers:
    server.close("done")
  os._exit(0)


_ALIASES = {"np": "numpy", "sp": "scipy"}  # the usual short names, as tests write them


def _module_for(name):
  """The module we bind to a name a test uses and the program bound to a module: the module of
  that name (stdlib, numpy, scipy, sympy, mpmath) or a fixed alias (np -> numpy); else None."""
  module = _ALIASES.get(name, name)
  return module if module in _MODULES or module in sys.stdlib_module_names else None


_STRICT = None  # the strict comparisons (strict.py, shipped as source in the job)


def _load_strict(source):
  module = types.ModuleType("_morse_strict")
  exec(compile(source, "strict.py", "exec"), vars(module))  # pylint: disable=exec-used
  sys.modules[module.__name__] = module
  return module


def _answer(value):
  """A decoded answer with its arrays as strict.Answer (comparisons that refuse mismatches)."""
  return _STRICT.answer(value) if _STRICT is not None else value


def _test_space(job):
  """The tests' namespace: strict builtins (zip), numpy's comparisons made strict when the
  tests use numpy, and `strict_target` for the expected values a task writes into its tests."""
  global _STRICT  # pylint: disable=global-statement
  _STRICT = _load_strict(job["strict"])
  if any("numpy" in text for text in [job.get("prelude", ""), *job["tests"]]):
    importlib.import_module("numpy")
    _STRICT.patch_numpy()
  return {"__name__": "__test__", "__builtins__": _STRICT.test_builtins(),
          "strict_target": _STRICT.target}


def _bind(space, servers, remote, used):
  def resolve(name):
    for server in servers:  # upstream code first: the program cannot replace what it defines
      kind = server.names.get(name)
      if kind == "call":
        return Remote(server, server.global_ref(name), f"function {name!r}")
      if kind == "value":
        return server.request({"op": "global", "name": name})
      if kind is not None and kind.startswith("module:"):
        # A module the program imported: our own copy, never the program's (it may be patched),
        # and the one we choose for the name; the module the program names is never read.
        module = _module_for(name)
        if module is None:
          raise AttributeError(name)
        return importlib.import_module(module)
    raise AttributeError(name)

  class Solution(types.ModuleType):
    def __getattr__(self, name):
      if name.startswith("__"):
        raise AttributeError(name)
      return resolve(name)

  sys.modules["solution"] = Solution("solution")
  if remote is not None:
    wanted = list(remote)
  else:  # a name the tests use that neither the prelude nor the builtins provide
    wanted = [n for n in sorted(used) if n not in space and not hasattr(builtins, n)]
  for name in wanted:
    try:
      space[name] = resolve(name)
    except AttributeError:
      pass
    except Exception:  # pylint: disable=broad-except
      pass  # a value that cannot be fetched: the test that uses it fails with a NameError


def _run(space, tests, per_test, shared, servers, summary, groups=None):
  """Runs each test under its limits (`per_test`): "cpu", the CPU seconds each program may use in
  the test's calls (its own timer, armed per call, and its processes' CPU time read here:
  `check_cpu`) and the test's own code may use here (ITIMER_PROF), so that load on the machine
  does not decide a reward; "wall", the wall-clock seconds of the whole test, which stop a
  program that sleeps or blocks (no CPU used). `shared`: the tests share one namespace, or with
  `groups` (an id per test) one namespace per run of equal ids."""
  cpu, wall = per_test.get("cpu"), per_test.get("wall")
  def over_wall(*_):
    raise TimeoutError(f"test ran longer than its wall-clock limit of {wall} s")
  def over_cpu(*_):
    raise TimeoutError(f"the test's own code used more than its CPU time limit of {cpu} s")
  scope, group = space, None
  for i, test in enumerate(tests):
    if not shared:
      scope = dict(space)
    elif groups and groups[i] != group:
      scope, group = dict(space), groups[i]
    until = time.monotonic() + wall if wall else None
    for server in servers:
      server.call_deadline = until
      server.begin_test(cpu)
    try:
      if wall:
        signal.signal(signal.SIGALRM, over_wall)
        signal.setitimer(signal.ITIMER_REAL, wall + _GRACE_S)
      if cpu:
        signal.signal(signal.SIGPROF, over_cpu)
        signal.setitimer(signal.ITIMER_PROF, cpu + _GRACE_S)
      exec(compile(test, f"test_{i}", "exec"), scope)  # pylint: disable=exec-used
      summary["passed"][i] = True
    except BaseException as e:  # pylint: disable=broad-except
      summary["errors"][i] = _describe(e)
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.setitimer(signal.ITIMER_PROF, 0)


if __name__ == "__main__":
  main()
