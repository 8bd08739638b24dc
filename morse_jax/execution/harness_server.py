"""The tested side of the verifier: runs INSIDE the sandbox, as the script of one sandbox call.

It holds the program under test (model-written code) and nothing else: no test source, no
expected values, no marker. It loads the program as module `solution`, reports the names the
program defines, then answers requests from the trusted harness (`harness.py`, another process)
over two pipes: call a function, get an attribute or item, list an iterable. Results travel as
plain data (see `encode`); anything else (an instance of a class the program defines, a float
subclass, a function) travels as an opaque reference the harness will not compare.

Everything here runs in the program's own process, so the program can patch or replace any of
it; that buys it nothing: the harness trusts only the plain data it decodes, and the program
could return such data anyway. The file is self-contained (stdlib, numpy and scipy only when
the program imported them): `verifier.run_tests` sends its text as the sandbox's script with
`_serve(program, request_fd, response_fd)` appended.
"""

import base64 as _base64
import json as _json
import os as _os
import signal as _signal
import sys as _sys
import time as _time
import types as _types

_REFS = {}


def _np():
  return _sys.modules.get("numpy")


def encode(x, depth=0):
  """Plain data for exact builtin types, numpy arrays and scalars, scipy sparse matrices; an
  opaque reference for anything else."""
  if depth > 200:
    raise RecursionError("value nested too deeply")
  t = type(x)
  if x is None or t is bool or t is str or t is int or t is float:
    return x
  if t is list:
    return [encode(v, depth + 1) for v in x]
  if t in (tuple, set, frozenset):
    return {"$": t.__name__, "v": [encode(v, depth + 1) for v in x]}
  if t is dict:
    return {"$": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
  if t is complex:
    return {"$": "complex", "v": [x.real, x.imag]}
  if t is bytes:
    return {"$": "bytes", "v": _base64.b64encode(x).decode("ascii")}
  np = _np()
  if np is not None:
    if t is np.ndarray:
      shape = [int(n) for n in x.shape]
      if x.dtype.hasobject:
        return {"$": "ndo", "shape": shape, "v": [encode(v, depth + 1) for v in x.ravel()]}
      spec = x.dtype.descr if x.dtype.fields is not None else x.dtype.str
      return {"$": "nd", "dtype": spec, "shape": shape,
              "v": _base64.b64encode(np.ascontiguousarray(x).tobytes()).decode("ascii")}
    if isinstance(x, np.generic) and t.__module__ == "numpy" and not x.dtype.hasobject:
      spec = x.dtype.descr if x.dtype.fields is not None else x.dtype.str
      return {"$": "npscalar", "dtype": spec,
              "v": _base64.b64encode(np.asarray(x).tobytes()).decode("ascii")}
  if t.__module__.startswith("scipy.sparse") and hasattr(x, "tocoo") and hasattr(x, "format"):
    coo = x.tocoo()
    kind = "array" if "array" in t.__name__ else "matrix"
    return {"$": "sparse", "format": x.format, "kind": kind,
            "shape": [int(n) for n in x.shape], "data": encode(coo.data, depth + 1),
            "row": encode(coo.row, depth + 1), "col": encode(coo.col, depth + 1)}
  key = len(_REFS) + 1
  _REFS[key] = x
  return {"$": "ref", "id": key, "type": t.__name__[:80], "callable": callable(x)}


def decode(v, space, depth=0):
  """The inverse for arguments the harness sends (its own plain data and our references)."""
  if depth > 200:
    raise RecursionError("value nested too deeply")
  if isinstance(v, list):
    return [decode(i, space, depth + 1) for i in v]
  if not isinstance(v, dict):
    return v
  tag = v.get("$")
  if tag == "ref":
    return _REFS[v["id"]]
  if tag == "global":
    return space[v["name"]]
  if tag in ("tuple", "set", "frozenset"):
    return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](
        decode(i, space, depth + 1) for i in v["v"])
  if tag == "dict":
    return {decode(k, space, depth + 1): decode(i, space, depth + 1) for k, i in v["v"]}
  if tag == "complex":
    return complex(*v["v"])
  if tag == "bytes":
    return _base64.b64decode(v["v"])
  if tag in ("nd", "npscalar", "ndo", "sparse"):
    import numpy as np
    if tag == "ndo":
      items = [decode(i, space, depth + 1) for i in v["v"]]
      return np.fromiter(items, dtype=object, count=len(items)).reshape(v["shape"])
    spec = v["dtype"]
    dtype = np.dtype([tuple(f) for f in spec] if isinstance(spec, list) else spec)
    data = np.frombuffer(_base64.b64decode(v["v"]), dtype=dtype)
    if tag == "npscalar":
      return data[0]
    if tag == "nd":
      return data.reshape(v["shape"]).copy()
  if tag == "sparse":
    import scipy.sparse as sp
    make = sp.coo_array if v["kind"] == "array" else sp.coo_matrix
    coo = make((decode(v["data"], space), (decode(v["row"], space), decode(v["col"], space))),
               shape=tuple(v["shape"]))
    return coo.asformat(v["format"])
  raise ValueError(f"unknown value tag {tag!r}")


def _error(e):
  try:
    text = str(e)
  except BaseException:
    text = "<unprintable>"
  return {"error": {"type": type(e).__name__[:80], "message": text[:300]}}


def _serve(program, request_fd, response_fd):
  try:  # PR_SET_DUMPABLE 0 before the program runs: under reduced isolation another program of
    # our uid (SciCode's program beside its upstream's server) cannot open our memory or fds
    import ctypes as _ctypes
    _ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
  except (OSError, AttributeError, ImportError):
    pass
  reader = _os.fdopen(request_fd, "rb")  # not stdin / stdout: the program's prints go there
  def send(obj):
    try:
      data = _json.dumps(obj).encode() + b"\n"
    except BaseException as e:  # pylint: disable=broad-except
      data = _json.dumps(_error(e)).encode() + b"\n"
    view = memoryview(data)
    while view:
      view = view[_os.write(response_fd, view):]
  # No program code runs until every server of the run is non-dumpable: the harness says go
  # once all said armed (a program beside an upstream's server that was still starting could
  # open that server's memory, the window after its exec and before the prctl above).
  send({"armed": True})
  if not reader.readline():
    return
  def over_wall(*_):
    raise TimeoutError("the call ran past its wall-clock time limit (it slept, blocked or "
                       "waited)")
  def over_cpu(*_):
    raise TimeoutError("the call used more than its CPU time limit")
  module = _types.ModuleType("solution")
  module.__file__ = "solution.py"
  _sys.modules["solution"] = module
  space = module.__dict__
  try:
    exec(compile(program, "solution.py", "exec"), space)  # pylint: disable=exec-used
    names = {k: ("module:" + v.__name__ if isinstance(v, _types.ModuleType) else
                 "call" if callable(v) else "value")
             for k, v in list(space.items()) if not k.startswith("__")}
    send({"ready": True, "names": names})
  except BaseException as e:  # pylint: disable=broad-except
    send({"ready": True, "program_error": _error(e)["error"]})
    return
  for line in reader:
    start = _time.process_time()
    try:
      req = _json.loads(line)
      # Two limits per call: `cpu`, the CPU time (all our threads) the test may still use, so
      # that a loaded machine does not cut a correct program; `timeout`, the wall clock, which
      # stops a call that sleeps or blocks and so uses no CPU.
      timeout, cpu = req.get("timeout"), req.get("cpu")
      if timeout:
        _signal.signal(_signal.SIGALRM, over_wall)
        _signal.setitimer(_signal.ITIMER_REAL, max(float(timeout), 0.001))
      if cpu:
        _signal.signal(_signal.SIGPROF, over_cpu)
        _signal.setitimer(_signal.ITIMER_PROF, max(float(cpu), 0.001))
      rng = req.get("rng") or {}  # a state the test seeded: our draws go on from it
      if "np" in rng:
        import numpy
        numpy.random.set_state(decode(rng["np"], space))
      if "py" in rng:
        import random
        random.setstate(decode(rng["py"], space))
      try:
        op = req["op"]
        target = decode(req.get("target"), space)
        if op == "call":
          result = target(*decode(req["args"], space), **decode(req["kwargs"], space))
        elif op == "getattr":
          result = getattr(target, req["name"])
        elif op == "getitem":
          result = target[decode(req["key"], space)]
        elif op == "list":
          result = list(target)
        elif op == "len":
          result = len(target)
        elif op == "global":
          result = space[req["name"]]
        else:
          raise ValueError(f"unknown op {op!r}")
      finally:
        if timeout:
          _signal.setitimer(_signal.ITIMER_REAL, 0)
        if cpu:
          _signal.setitimer(_signal.ITIMER_PROF, 0)
      reply = {"value": encode(result)}
    except BaseException as e:  # pylint: disable=broad-except
      reply = _error(e)
    reply["cpu"] = _time.process_time() - start  # the harness counts it against the test
    send(reply)
