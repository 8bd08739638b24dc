"""What our small JSON-over-HTTP servers share (the search server, the chat server): quiet
logging unless the server is verbose, JSON replies that survive a client hanging up, and request
bodies bounded by Content-Length."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class BodyError(ValueError):
  """The request body cannot be read: `status` is the HTTP status to answer with."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status


class JsonHandler(BaseHTTPRequestHandler):
  """The server must have `verbose` (bool) and `count(status)`."""

  def log_message(self, format, *args):  # noqa: A002 -- the base class's signature
    if self.server.verbose:
      super().log_message(format, *args)

  def _send(self, status: int, payload: dict) -> None:
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    self.server.count(status)
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)
    except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
      pass

  def _body(self, max_bytes: int) -> bytes:
    """The request body; BodyError (411, 400, 413) when Content-Length is missing, not an
    integer, or over `max_bytes`."""
    length = self.headers.get("Content-Length")
    if length is None:
      raise BodyError(411, "missing Content-Length header")
    try:
      n = int(length)
    except ValueError:
      raise BodyError(400, f"Content-Length {length!r} is not an integer") from None
    if n < 0 or n > max_bytes:
      raise BodyError(413, f"body of {n} bytes; at most {max_bytes}")
    return self.rfile.read(n)
