"""The Search-R1 `/retrieve` server, run for real on loopback."""

import http.client
import json
import threading
import time
import urllib.parse

import pytest

from apex_jax.tools import SearchClient, SearchRequestError, server
from tests.apex.tools.test_index import PARAPHRASES


@pytest.fixture(scope="module")
def srv(retriever):
  with server.running(server.make_server(retriever, "127.0.0.1", 0, topk=3, max_topk=10)) as s:
    yield s


def post(srv, body: bytes | str, path="/retrieve", headers=None):
  """-> (status, parsed JSON body)."""
  host, port = srv.server_address[:2]
  conn = http.client.HTTPConnection(host, port, timeout=30)
  try:
    conn.request("POST", path, body=body, headers=headers or {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())
  finally:
    conn.close()


def test_round_trip_with_scores(srv):
  queries = [q for q, _ in PARAPHRASES[:3]]
  status, out = post(srv, json.dumps({"queries": queries, "topk": 2, "return_scores": True}))
  assert status == 200 and list(out) == ["result"] and len(out["result"]) == 3
  for (_, expected), docs in zip(PARAPHRASES, out["result"]):
    assert len(docs) == 2
    assert all(set(d) == {"document", "score"} and set(d["document"]) == {"id", "contents"}
               and isinstance(d["score"], float) for d in docs)
    assert docs[0]["document"]["id"] == expected and docs[0]["score"] >= docs[1]["score"]
    assert docs[0]["document"]["contents"].startswith('"')


def test_round_trip_without_scores_gives_documents(srv):
  for body in ({"queries": ["Who first walked on the moon?"], "topk": 1, "return_scores": False},
               {"queries": ["Who first walked on the moon?"], "topk": 1}):  # default: false
    status, out = post(srv, json.dumps(body))
    assert status == 200
    assert [[set(d) for d in r] for r in out["result"]] == [[{"id", "contents"}]]
    assert out["result"][0][0]["id"] == "p08"


@pytest.mark.parametrize("topk", [None, "absent"])
def test_missing_or_null_topk_means_the_server_default(srv, topk):
  body = {"queries": ["jazz", "volcano"]}
  if topk != "absent":
    body["topk"] = topk
  status, out = post(srv, json.dumps(body))
  assert status == 200 and [len(r) for r in out["result"]] == [3, 3]


def test_empty_query_list_gives_an_empty_result(srv):
  assert post(srv, json.dumps({"queries": []})) == (200, {"result": []})


MALFORMED = [
    (b"{not json", "body", "invalid JSON"),
    (b"\xff\xfe", "body", "not UTF-8"),
    (b"[1, 2]", "body", "expected a JSON object, got list"),
    (b'{"topk": 3}', "queries", "missing field 'queries'"),
    (b'{"queries": "who wrote hamlet"}', "queries", "must be a list of strings, got str"),
    (b'{"queries": ["ok", 5]}', "queries", "queries[1] must be a string, got int 5"),
    (b'{"queries": ["q"], "topk": "3"}', "topk", 'must be an integer, got str "3"'),
    (b'{"queries": ["q"], "topk": 2.5}', "topk", "must be an integer, got float 2.5"),
    (b'{"queries": ["q"], "topk": true}', "topk", "must be an integer, got bool true"),
    (b'{"queries": ["q"], "topk": -1}', "topk", "must be in [1, 10], got -1"),
    (b'{"queries": ["q"], "topk": 0}', "topk", "must be in [1, 10], got 0"),
    (b'{"queries": ["q"], "topk": 11}', "topk", "must be in [1, 10], got 11"),
    (b'{"queries": ["q"], "return_scores": "yes"}', "return_scores", "must be true or false"),
]


@pytest.mark.parametrize("body,field,message", MALFORMED)
def test_malformed_request_gets_400_naming_the_field(srv, body, field, message):
  status, out = post(srv, body)
  assert status == 400 and out["field"] == field and message in out["error"], out


def test_server_survives_bad_requests_and_counts_them(srv):
  before_requests, before_errors = srv.requests, srv.errors
  for body, _, _ in MALFORMED:
    assert post(srv, body)[0] == 400
  assert post(srv, b"{}", path="/nowhere")[0] == 404
  status, out = post(srv, json.dumps({"queries": ["espresso coffee"], "topk": 1}))
  assert status == 200 and out["result"][0][0]["id"] == "p10"
  assert srv.requests - before_requests == len(MALFORMED) + 2
  assert srv.errors - before_errors == len(MALFORMED) + 1


def test_body_without_content_length_gets_411(srv):
  host, port = srv.server_address[:2]
  conn = http.client.HTTPConnection(host, port, timeout=30)
  conn.putrequest("POST", "/retrieve")
  conn.endheaders()
  response = conn.getresponse()
  assert response.status == 411 and json.loads(response.read())["field"] == "Content-Length"
  conn.close()


def test_health(srv):
  host, port = srv.server_address[:2]
  conn = http.client.HTTPConnection(host, port, timeout=30)
  conn.request("GET", "/health")
  out = json.loads(conn.getresponse().read())
  conn.close()
  assert out["status"] == "ok" and out["count"] == 20 and out["dim"] == 384


def test_client_round_trip_and_4xx_not_retried(srv):
  client = SearchClient(srv.url, topk=2)
  results = client.search([q for q, _ in PARAPHRASES])
  assert [r[0].id for r in results] == [e for _, e in PARAPHRASES]
  assert all(len(r) == 2 and r[0].score >= r[1].score for r in results)
  base = urllib.parse.urlunsplit(urllib.parse.urlsplit(srv.url)._replace(path=""))
  assert SearchClient(base).url == srv.url  # a bare host:port gets /retrieve
  with pytest.raises(SearchRequestError, match="must be in \\[1, 10\\], got 50"):
    client.search(["q"], topk=50)
  assert client.stats()["retries"] == 0 and client.stats()["failures"] == 1


def test_concurrent_clients_get_their_own_results(srv):
  client = SearchClient(srv.url, topk=1, max_concurrency=8)
  calls_before, requests_before = srv.batcher.calls, srv.requests
  errors, results = [], {}

  def worker(i):
    try:
      query, expected = PARAPHRASES[i % len(PARAPHRASES)]
      for _ in range(3):
        results.setdefault(i, []).append((client.search([query])[0][0].id, expected))
    except Exception as e:  # noqa: BLE001 -- reported below
      errors.append(e)

  threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  assert not errors, errors
  assert sum(len(r) for r in results.values()) == 24
  assert all(got == expected for r in results.values() for got, expected in r)
  assert srv.requests - requests_before == 24
  # requests queued together share one encoder call: never more calls than requests
  assert 1 <= srv.batcher.calls - calls_before <= 24
  assert client.stats()["max_in_flight"] <= 8


class _Broken:
  """A retriever that fails: the server answers 500 and keeps serving."""

  def __init__(self, retriever):
    self.index = retriever.index
    self.fail = True
    self.retriever = retriever

  def retrieve(self, queries, topk):
    if self.fail:
      raise RuntimeError("encoder exploded")
    return self.retriever.retrieve(queries, topk)


def test_internal_error_gives_500_and_the_server_stays_up(retriever):
  broken = _Broken(retriever)
  with server.running(server.make_server(broken, "127.0.0.1", 0)) as s:
    status, out = post(s, json.dumps({"queries": ["jazz"]}))
    assert status == 500 and "encoder exploded" in out["error"]
    broken.fail = False
    status, out = post(s, json.dumps({"queries": ["jazz music New Orleans"], "topk": 1}))
    assert status == 200 and out["result"][0][0]["id"] == "p18"


def wait_until(condition, timeout_s=30.0):
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert time.monotonic() < deadline, "timed out waiting"
    time.sleep(0.01)


def test_batcher_merges_queued_requests_and_splits_results(retriever):
  """Requests queued while the worker is busy go through one retrieve call, each with its topk."""
  calls = []
  gate = threading.Event()

  class Slow:
    index = retriever.index

    def retrieve(self, queries, topk):
      calls.append((list(queries), topk))
      gate.wait(timeout=30)
      return retriever.retrieve(queries, topk)

  batcher = server.Batcher(Slow())
  out = {}
  first = threading.Thread(target=lambda: out.setdefault("a", batcher.submit(["jazz"], 1)))
  first.start()
  wait_until(lambda: calls)  # the worker is now blocked inside the first call
  rest = [threading.Thread(target=lambda k=k, q=q, n=n: out.setdefault(k, batcher.submit(q, n)))
          for k, q, n in (("b", ["volcano", "tokyo"], 2), ("c", ["bitcoin"], 3))]
  for i, t in enumerate(rest):  # one at a time, so the queue order is known
    t.start()
    wait_until(lambda: batcher.qsize() >= i + 1)
  gate.set()
  for t in [first, *rest]:
    t.join(timeout=60)
  batcher.close()
  assert calls == [(["jazz"], 1), (["volcano", "tokyo", "bitcoin"], 3)]
  assert [len(r) for r in out["a"]] == [1] and [len(r) for r in out["b"]] == [2, 2]
  assert [len(r) for r in out["c"]] == [3]
  assert out["b"][0][0].id == "p19" and out["c"][0][0].id == "p14"
