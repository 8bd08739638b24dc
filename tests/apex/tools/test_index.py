"""build_index: retrieval quality with the real MiniLM, the folder layout, bad corpus lines."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from apex_jax.tools import CorpusError, LocalSearch, index
from tests.apex.tools.conftest import PASSAGES, HashEncoder, write_corpus

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

# Paraphrases that share few content words with their passage.
PARAPHRASES = [
    ("When was the iron landmark in the French capital finished?", "p00"),
    ("How do plants turn light into sugar?", "p01"),
    ("Who first walked on the moon?", "p08"),
    ("Which scientist found the first antibiotic in a mould?", "p06"),
    ("What is the tallest peak in the world?", "p03"),
    ("Which Shakespeare play is about a Danish prince taking revenge?", "p04"),
]


@pytest.mark.parametrize("query,expected", PARAPHRASES)
def test_paraphrased_query_ranks_its_passage_first(retriever, query, expected):
  results = LocalSearch(retriever, topk=3).search([query])
  assert len(results) == 1 and len(results[0]) == 3
  assert results[0][0].id == expected, [p.id for p in results[0]]
  scores = [p.score for p in results[0]]
  assert scores == sorted(scores, reverse=True) and -1.0 <= scores[-1] <= scores[0] <= 1.0 + 1e-5


def test_batched_queries_equal_single_queries(retriever):
  queries = [q for q, _ in PARAPHRASES]
  batched = retriever.retrieve(queries, 2)
  single = [retriever.retrieve([q], 2)[0] for q in queries]
  assert [[p.id for p in r] for r in batched] == [[p.id for p in r] for r in single]
  for b, s in zip(batched, single):
    np.testing.assert_allclose([p.score for p in b], [p.score for p in s], atol=1e-5)


def test_folder_layout_and_lookup_by_row(index_dir, retriever):
  meta = json.load(open(os.path.join(index_dir, "meta.json")))
  assert meta["count"] == len(PASSAGES) and meta["dim"] == 384
  assert meta["normalise"] is True and meta["index_type"] == "flat"
  assert os.path.isdir(meta["model"])
  search_index = retriever.index
  for row, (pid, title, text) in enumerate(PASSAGES):
    passage = search_index.passage(row)
    # both corpus layouts end up as Search-R1's '"Title"\ntext'
    assert (passage.id, passage.contents) == (pid, f'"{title}"\n{text}')
    assert (passage.title, passage.text) == (title, text)
  vectors = search_index.index.reconstruct_n(0, search_index.count)
  np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
  assert not any(name.startswith("flat.tmp") for name in os.listdir(os.path.dirname(index_dir)))


def test_hnsw_index_agrees_with_flat_on_a_small_corpus(corpus_file, encoder, retriever, tmp_path):
  out = str(tmp_path / "hnsw")
  meta = index.build_index(corpus_file, out, encoder, index_type="hnsw", ef_search=32,
                           log=lambda _: None)
  assert meta["hnsw"] == {"m": 32, "ef_construction": 80, "ef_search": 32}
  hnsw = index.Retriever(out, encoder)
  assert hnsw.index.index.hnsw.efSearch == 32
  queries = [q for q, _ in PARAPHRASES]
  assert [r[0].id for r in hnsw.retrieve(queries, 3)] == [e for _, e in PARAPHRASES]


def test_progress_is_printed_per_batch(corpus_file, tmp_path):
  lines = []
  index.build_index(corpus_file, str(tmp_path / "i"), HashEncoder(), batch_size=7,
                    log=lines.append)
  assert lines and lines[-1].startswith(f"embedded {len(PASSAGES)}/{len(PASSAGES)} passages")


BAD_LINES = [
    ('{"id": "x", "contents": "\\"T\\"\\nok"', "invalid JSON"),
    ('["x", "y"]', "expected a JSON object"),
    ('{"contents": "\\"T\\"\\nok"}', "missing field 'id'"),
    ('{"id": "x", "contents": 7}', "field 'contents'"),
    ('{"id": "x", "contents": "  "}', "field 'contents'"),
    ('{"id": "x", "title": 3, "text": "ok"}', "field 'title'"),
    ('{"id": "x", "title": "T"}', "missing field 'contents'"),
    ('{"id": null, "contents": "ok"}', "field 'id'"),
    ('{"id": "p00", "contents": "\\"T\\"\\nduplicate"}', "already used on line 1"),
]


@pytest.mark.parametrize("line,message", BAD_LINES)
def test_bad_corpus_line_is_named_with_line_number_and_field(tmp_path, line, message):
  corpus = write_corpus(tmp_path / "c.jsonl", PASSAGES[:2])
  with open(corpus, "a") as f:
    f.write("\n" + line + "\n")  # a blank line (skipped, but counted): the bad one is line 4
  out = tmp_path / "out"
  with pytest.raises(CorpusError) as e:
    index.build_index(corpus, str(out), HashEncoder(), log=lambda _: None)
  assert f"c.jsonl:4: " in str(e.value) and message in str(e.value)
  assert not os.path.exists(out) and os.listdir(tmp_path) == ["c.jsonl"]


def test_existing_output_is_kept_unless_overwrite(corpus_file, tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("x")
  with pytest.raises(FileExistsError, match="not empty"):
    index.build_index(corpus_file, str(out), HashEncoder(), log=lambda _: None)
  meta = index.build_index(corpus_file, str(out), HashEncoder(), overwrite=True,
                           log=lambda _: None)
  assert meta["count"] == len(PASSAGES) and not (out / "keep.txt").exists()


def test_opening_a_folder_that_is_not_an_index_names_the_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="meta.json"):
    index.SearchIndex(str(tmp_path))


def test_encoder_dim_must_match_the_index(index_dir):
  with pytest.raises(ValueError, match="encoder dim 16 != index dim 384"):
    index.Retriever(index_dir, HashEncoder())


def _launch(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=60)


def test_build_index_launcher_rejects_a_bad_corpus_before_loading_the_model(tmp_path):
  corpus = tmp_path / "bad.jsonl"
  corpus.write_text('{"id": "a", "contents": "\\"T\\"\\ntext"}\n{"id": "b"}\n')
  done = _launch("launchers.build_index", f"--corpus={corpus}", f"--out={tmp_path / 'out'}")
  assert done.returncode == 1, done.stderr
  assert "bad.jsonl:2: missing field 'contents'" in done.stderr
  assert "load model" not in done.stdout and not (tmp_path / "out").exists()


def test_serve_search_launcher_rejects_a_folder_without_an_index(tmp_path):
  done = _launch("launchers.serve_search", f"--index={tmp_path}", "--port=0")
  assert done.returncode != 0 and "no meta.json" in done.stderr


def test_omp_threads_hold_in_the_thread_that_searches(corpus_file, tmp_path):
  """libgomp keeps omp_set_num_threads per thread: a server's worker thread must pin its own."""
  import threading

  import faiss

  out = str(tmp_path / "i")
  index.build_index(corpus_file, out, HashEncoder(), log=lambda _: None)
  seen = {}

  def run(name, search_index=None):
    if search_index is not None:
      search_index.search_vectors(HashEncoder().encode(["q"]), 2)
    seen[name] = faiss.omp_get_max_threads()

  def in_thread(*args):
    worker = threading.Thread(target=run, args=args)
    worker.start()
    worker.join()

  in_thread("fresh")
  pinned = seen["fresh"] + 1  # differs from a new thread's default on any machine
  in_thread("pinned", index.SearchIndex(out, omp_threads=pinned))
  in_thread("unpinned", index.SearchIndex(out))
  assert seen["pinned"] == pinned and seen["unpinned"] == seen["fresh"]
