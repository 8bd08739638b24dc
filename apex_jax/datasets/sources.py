"""Question sets with random access by index: tensorflow-datasets builders writing array_record,
read with `tfds.data_source` (no TensorFlow needed), built once into a cache and reused.

  train = source("hotpotqa", "/data/hotpotqa", "train")      # or the JSON file itself
  len(train); train[12345]                                   # a QAExample, as hotpotqa.load
  dev = source("twowiki", "/data/2wiki/dev.json", "dev")
  test = source("world", "data/world", "test")               # World.write's folder
  vqa = source("livevqa", "/data/livevqa", "test")           # image questions (image_qa)

The builders read the same files with the same loaders (`hotpotqa.load`, `twowiki.load`,
`corpus.read_examples`), so a malformed record stops the build with the loader's DatasetError
(file, record or line, field) and nothing is cached. Index i is the loader's i-th record. The
cache (`cache_dir`, else $MORSE_JAX_TFDS_DIR, else ~/.cache/morse_jax/tfds) is keyed by the
dataset, the split and each input file's absolute path, size and modification time: an edited
file is built again, an unchanged one is read from the cache without parsing the JSON.

Each record is one JSON text (the QAExample with its passages inline), so encoding needs no
TensorFlow; decoding is json.loads and the dataclasses' own checks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Sequence

from apex_jax.datasets import hotpotqa, image_qa, twowiki
from apex_jax.datasets.corpus import read_examples
from apex_jax.datasets.records import DatasetError, Hop, QAExample, SupportingFact
from apex_jax.tools.passages import Passage

# the paper's image benchmarks, each a folder (or file) in the MIA data's layout (image_qa)
IMAGE_SETS = ("infoseek", "livevqa", "mmsearch", "simplevqa", "mia")
NAMES = ("hotpotqa", "twowiki", "world") + IMAGE_SETS
FORMAT = 2  # bump when the record JSON changes: old caches are then not read
# the official file of each split, for a folder path
OFFICIAL = {
    "hotpotqa": {"train": "hotpot_train_v1.1.json", "dev_distractor":
                 "hotpot_dev_distractor_v1.json", "dev_fullwiki": "hotpot_dev_fullwiki_v1.json",
                 "test_fullwiki": "hotpot_test_fullwiki_v1.json"},
    "twowiki": {"train": "train.json", "dev": "dev.json", "test": "test.json"},
}


def default_cache_dir() -> str:
  return os.environ.get("MORSE_JAX_TFDS_DIR") or os.path.join(
      os.path.expanduser("~"), ".cache", "morse_jax", "tfds")


# ---- one record <-> JSON ----------------------------------------------------------------------


def example_json(e: QAExample) -> str:
  return json.dumps({
      "id": e.id, "question": e.question, "answers": list(e.answers), "category": e.category,
      "hops": e.hops, "kind": e.kind, "level": e.level,
      "supporting": None if e.supporting is None else [[f.title, f.sentence]
                                                       for f in e.supporting],
      "passages": [[p.id, p.contents] for p in e.passages],
      "evidences": [list(x) for x in e.evidences],
      "chain": [_hop_dict(h) for h in e.chain], "images": list(e.images),
      "caption": e.caption}, ensure_ascii=False)


def _hop_dict(h: Hop) -> dict:
  return {"query": h.query, "passage_id": h.passage_id, "title": h.title, "answer": h.answer}


def example_from_json(text: str | bytes) -> QAExample:
  r = json.loads(text)
  return QAExample(
      id=r["id"], question=r["question"], answers=tuple(r["answers"]), category=r["category"],
      hops=r["hops"], kind=r["kind"], level=r["level"],
      supporting=None if r["supporting"] is None else tuple(SupportingFact(t, s)
                                                            for t, s in r["supporting"]),
      passages=tuple(Passage(i, c) for i, c in r["passages"]),
      evidences=tuple(tuple(x) for x in r["evidences"]),
      chain=tuple(Hop(**h) for h in r["chain"]), images=tuple(r["images"]),
      caption=r["caption"])


# ---- inputs -----------------------------------------------------------------------------------


def input_files(name: str, path: str, split: str) -> list[str]:
  """The files a split is built from: [json] for HotpotQA / 2Wiki (a folder: the split's
  official file name), [<split>.jsonl, corpus.jsonl] for a world folder, [the split's .jsonl /
  .json] for an image set (a folder: `image_qa.split_file`)."""
  if name not in NAMES:
    raise ValueError(f"dataset {name!r} not in {NAMES}")
  if not split or not split.replace("_", "").isalnum():
    raise ValueError(f"split {split!r} must be letters, digits and underscores")
  if name == "world":
    files = [os.path.join(path, f"{split}.jsonl"), os.path.join(path, "corpus.jsonl")]
  elif name in IMAGE_SETS:
    files = [image_qa.split_file(path, split) if os.path.isdir(path) else path]
  elif os.path.isdir(path):
    if split not in OFFICIAL[name]:
      raise ValueError(f"{path} is a folder and {name} has no official file for split "
                       f"{split!r} (known: {sorted(OFFICIAL[name])}); give the JSON file")
    files = [os.path.join(path, OFFICIAL[name][split])]
  else:
    files = [path]
  for f in files:
    if not os.path.isfile(f):
      raise FileNotFoundError(f"{f}: no such file ({name} split {split!r})")
  return [os.path.abspath(f) for f in files]


def load_examples(name: str, files: Sequence[str]) -> list[QAExample]:
  """The JSON loader of `name` on `files` (the builders' input, the tests' reference)."""
  if name == "hotpotqa":
    return hotpotqa.load(files[0])
  if name == "twowiki":
    return twowiki.load(files[0])
  if name in IMAGE_SETS:
    return image_qa.load(files[0])
  return read_examples(files[0], files[1])


def cache_key(name: str, split: str, files: Sequence[str]) -> str:
  h = hashlib.sha256(f"{FORMAT}|{name}|{split}".encode())
  for f in files:
    st = os.stat(f)
    h.update(f"|{f}|{st.st_size}|{st.st_mtime_ns}".encode())
  return h.hexdigest()[:16]


# ---- the builders -----------------------------------------------------------------------------

_BUILDERS: dict = {}


def _builders() -> dict:
  """name -> builder class (defined on first use: importing tfds takes a second)."""
  if _BUILDERS:
    return _BUILDERS
  import tensorflow_datasets as tfds

  class _QA(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """One split of an APEx question set; `files` are the loader's inputs."""

    VERSION = tfds.core.Version("1.0.0")
    DATASET = ""

    def __init__(self, *, files: Sequence[str] = (), split: str = "train", **kwargs):
      self._files, self._split = list(files), split
      super().__init__(**kwargs)

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self, description=f"APEx {self.DATASET} questions as QAExample JSON",
          features=tfds.features.FeaturesDict({"record": tfds.features.Text()}),
          disable_shuffling=True)  # index i is the loader's i-th record

    def _split_generators(self, dl_manager):
      if not self._files:
        raise ValueError(f"{self.name}: no input files (build through sources.source)")
      return {self._split: self._generate_examples()}

    def _generate_examples(self):
      examples = load_examples(self.DATASET, self._files)  # the whole file checked first
      width = len(str(len(examples)))
      for i, e in enumerate(examples):
        yield f"{i:0{width}d}", {"record": example_json(e)}

  for name in NAMES:
    _BUILDERS[name] = type(f"Apex{name.capitalize()}", (_QA,), {"DATASET": name})
  return _BUILDERS


class Source:
  """Random access to one built split: len, [i] -> QAExample (negative i from the end),
  [a:b] -> a list of them."""

  def __init__(self, name: str, split: str, files: Sequence[str], data_dir: str, records):
    self.name, self.split, self.files, self.data_dir = name, split, list(files), data_dir
    self._records = records

  def __len__(self) -> int:
    return len(self._records)

  def __getitem__(self, i):
    if isinstance(i, slice):
      return [self[j] for j in range(*i.indices(len(self)))]
    if isinstance(i, bool) or not isinstance(i, int):
      raise TypeError(f"{self.name} {self.split}: index must be an int, got {i!r}")
    n = len(self)
    if not -n <= i < n:
      raise IndexError(f"{self.name} {self.split}: index {i} out of range ({n} records)")
    return example_from_json(self._records[i % n]["record"])

  def __iter__(self):
    return (self[i] for i in range(len(self)))

  def __repr__(self) -> str:
    return f"Source({self.name!r}, {self.split!r}, {len(self)} records, {self.data_dir!r})"


def source(name: str, path: str, split: str = "train", *, cache_dir: str | None = None) -> Source:
  """The split as an array_record data source, built on first use (tfds `download_and_prepare`
  runs the loader; a later call with unchanged files only opens the cache)."""
  import tensorflow_datasets as tfds

  files = input_files(name, path, split)
  data_dir = os.path.join(cache_dir or default_cache_dir(), name, cache_key(name, split, files))
  kwargs = dict(files=files, split=split, file_format="array_record")
  fresh = not os.path.exists(data_dir)
  try:  # builds (download_and_prepare) only when the cache has no finished copy
    records = tfds.data_source(_builders()[name].name, split=split, data_dir=data_dir,
                               builder_kwargs=kwargs)
  except Exception as e:
    if fresh:  # a failed first build leaves nothing behind (the folder is this key's alone)
      shutil.rmtree(data_dir, ignore_errors=True)
    if isinstance(e, DatasetError):
      raise
    cause = e  # tfds may wrap the loader's error: surface it as the loader's
    while cause is not None and not isinstance(cause, DatasetError):
      cause = cause.__cause__ or cause.__context__
    if cause is not None:
      raise cause from None
    raise
  return Source(name, split, files, data_dir, records)


def is_built(name: str, path: str, split: str = "train", *, cache_dir: str | None = None) -> bool:
  """Whether `source(...)` would open a cache without building."""
  import tensorflow_datasets as tfds  # noqa: F401  (the builders need it)

  files = input_files(name, path, split)
  data_dir = os.path.join(cache_dir or default_cache_dir(), name, cache_key(name, split, files))
  return _builders()[name](files=files, split=split, data_dir=data_dir,
                           file_format="array_record").is_prepared()
