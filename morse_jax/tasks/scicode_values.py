"""Test-target values as tagged JSON, exact both ways.

`encode` runs inside the sandbox (this file is copied there as a module: it imports only the
standard library at the top, numpy and scipy where a value needs them), `decode` in our process,
so no pickle of sandbox output is ever loaded here. The round trip keeps types and bits:

  None, bool, str, int            as JSON (ints of any size)
  float                           as JSON when finite (repr round-trips), else tagged
  complex, bytes, tuple, list, set, frozenset, dict (any keys, in order)
  numpy arrays                    dtype (structured ones by descr) + shape + raw bytes; object
                                  arrays item by item
  numpy scalars                   dtype + raw bytes (np.float64 stays np.float64)
  scipy sparse matrices / arrays  format, kind and their component arrays

Anything else (a sympy expression, a user class) raises TypeError naming the type: the caller
reports which test produced it.
"""

from __future__ import annotations

import base64
import math
from typing import Any

FORMAT = 1


def _b64(data: bytes) -> str:
  return base64.b64encode(data).decode("ascii")


def _dtype(dtype) -> Any:
  # dtype.str drops the field names of a structured dtype; descr keeps them.
  return encode(dtype.descr) if dtype.fields is not None else dtype.str


def _array(value) -> dict:
  import numpy as np  # pylint: disable=g-import-not-at-top

  shape = [int(n) for n in value.shape]
  if value.dtype.hasobject:
    return {"t": "ndarray", "dtype": "object", "shape": shape,
            "items": [encode(v) for v in value.ravel()]}
  return {"t": "ndarray", "dtype": _dtype(value.dtype), "shape": shape,
          "b64": _b64(np.ascontiguousarray(value).tobytes())}


def _sparse(value) -> dict:
  import scipy.sparse  # pylint: disable=g-import-not-at-top

  out = {"t": "sparse", "format": value.format, "shape": [int(n) for n in value.shape],
         "kind": "matrix" if scipy.sparse.isspmatrix(value) else "array"}
  if value.format in ("csr", "csc", "bsr"):
    out.update(data=_array(value.data), indices=_array(value.indices),
               indptr=_array(value.indptr))
    if value.format == "bsr":
      out["blocksize"] = [int(n) for n in value.blocksize]
    return out
  coo = value.tocoo()  # coo itself, and lil / dok / dia rebuilt through coo
  out.update(data=_array(coo.data), row=_array(coo.row), col=_array(coo.col))
  return out


def encode(value: Any) -> Any:
  """A JSON-able form of `value` that `decode` turns back into an equal value of the same type."""
  module = type(value).__module__
  if module.startswith("scipy.sparse"):
    return _sparse(value)
  if module == "numpy" or module.startswith("numpy."):
    import numpy as np  # pylint: disable=g-import-not-at-top
    if isinstance(value, np.ndarray) and type(value) is np.ndarray:
      return _array(value)
    if isinstance(value, np.generic):  # before float: np.float64 is a float subclass
      if value.dtype.hasobject:
        raise TypeError("encode: cannot store a numpy object scalar")
      return {"t": "npscalar", "dtype": _dtype(value.dtype), "b64": _b64(value.tobytes())}
    if isinstance(value, np.dtype):
      return {"t": "dtype", "dtype": _dtype(value)}
  if value is None or type(value) in (bool, str):
    return value
  if type(value) is int:
    return value
  if type(value) is float:
    return value if math.isfinite(value) else {"t": "float", "v": repr(value)}
  if type(value) is complex:
    return {"t": "complex", "re": encode(value.real), "im": encode(value.imag)}
  if type(value) is bytes:
    return {"t": "bytes", "b64": _b64(value)}
  if type(value) is list:
    return [encode(v) for v in value]
  if type(value) in (tuple, set, frozenset):
    return {"t": type(value).__name__, "v": [encode(v) for v in value]}
  if type(value) is dict:
    return {"t": "dict", "items": [[encode(k), encode(v)] for k, v in value.items()]}
  raise TypeError(f"encode: cannot store a value of type {module}.{type(value).__qualname__}")


def _decode_dtype(spec: Any):
  import numpy as np  # pylint: disable=g-import-not-at-top

  return np.dtype(decode(spec) if isinstance(spec, (dict, list)) else spec)


def _decode_array(obj: dict):
  import numpy as np  # pylint: disable=g-import-not-at-top

  shape = tuple(obj["shape"])
  if obj["dtype"] == "object":
    items = [decode(v) for v in obj["items"]]
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):  # one by one: np.array would merge equal-shaped items
      out[i] = item
    return out.reshape(shape)
  data = base64.b64decode(obj["b64"])
  return np.frombuffer(data, dtype=_decode_dtype(obj["dtype"])).reshape(shape).copy()


def _decode_sparse(obj: dict):
  import scipy.sparse  # pylint: disable=g-import-not-at-top

  fmt, shape = obj["format"], tuple(obj["shape"])
  suffix = "matrix" if obj["kind"] == "matrix" else "array"
  if fmt in ("csr", "csc", "bsr"):
    make = getattr(scipy.sparse, f"{fmt}_{suffix}")
    parts = (_decode_array(obj["data"]), _decode_array(obj["indices"]),
             _decode_array(obj["indptr"]))
    if fmt == "bsr":
      return make(parts, shape=shape, blocksize=tuple(obj["blocksize"]))
    return make(parts, shape=shape)
  coo = getattr(scipy.sparse, f"coo_{suffix}")(
      (_decode_array(obj["data"]), (_decode_array(obj["row"]), _decode_array(obj["col"]))),
      shape=shape)
  return coo if fmt == "coo" else coo.asformat(fmt)


def decode(obj: Any) -> Any:
  """The value `encode` wrote. Raises ValueError on anything `encode` does not write."""
  if obj is None or isinstance(obj, (bool, str, int, float)):
    return obj
  if isinstance(obj, list):
    return [decode(v) for v in obj]
  if not isinstance(obj, dict) or "t" not in obj:
    raise ValueError(f"decode: not an encoded value: {str(obj)[:200]}")
  tag = obj["t"]
  if tag == "float":
    return float(obj["v"])
  if tag == "complex":
    return complex(decode(obj["re"]), decode(obj["im"]))
  if tag == "bytes":
    return base64.b64decode(obj["b64"])
  if tag in ("tuple", "set", "frozenset"):
    return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](decode(v) for v in obj["v"])
  if tag == "dict":
    return {decode(k): decode(v) for k, v in obj["items"]}
  if tag == "ndarray":
    return _decode_array(obj)
  if tag == "npscalar":
    import numpy as np  # pylint: disable=g-import-not-at-top
    return np.frombuffer(base64.b64decode(obj["b64"]), dtype=_decode_dtype(obj["dtype"]))[0]
  if tag == "dtype":
    return _decode_dtype(obj["dtype"])
  if tag == "sparse":
    return _decode_sparse(obj)
  raise ValueError(f"decode: unknown tag {tag!r}")
