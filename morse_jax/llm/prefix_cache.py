"""The engine's prefix cache: full KV pages of finished rows, found again by the tokens they hold.

An agent's next turn is its last prompt, its reply and a tool's result: without a cache the
engine prefills the whole conversation again at every turn, and each sample of a GRPO group
submitted as its own request prefills the same prompt again. With `EngineConfig.prefix_cache`,
a row that ends leaves its full pages here (one reference each), keyed by a hash chain over the
page's tokens and every token before it (vLLM's automatic prefix caching); an admitted request
takes the longest run of its prompt's full pages found (at least its last token is prefilled, for
its logits) and prefills only the rest. Pages only the cache holds are evicted oldest-used first
when an admission needs pages.

A chain starts from the row's `root`: its route on the engine adapter (k / v depend on the LoRA
experts a row carries), so rows of other routes never share pages. The engine clears the cache
when its adapter changes and never caches a row with images or a failed row.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Sequence

import numpy as np

from morse_jax.llm.pages import PageAllocator


def root_of(route_leaves: Sequence[np.ndarray] | None) -> bytes:
  """The chain's start for a row of this route (None: an engine without an adapter)."""
  h = hashlib.blake2b(digest_size=16)
  for leaf in route_leaves or ():
    a = np.ascontiguousarray(leaf)
    h.update(str((a.dtype, a.shape)).encode())
    h.update(a.tobytes())
  return h.digest()


class PrefixCache:
  """Chain key -> page, least recently used first."""

  def __init__(self, allocator: PageAllocator):
    self.pages = allocator
    self._entries: collections.OrderedDict[bytes, int] = collections.OrderedDict()
    self.stats = collections.Counter()

  def __len__(self) -> int:
    return len(self._entries)

  def keys(self, root: bytes, tokens: np.ndarray, n_pages: int,
           known: Sequence[bytes] = ()) -> list[bytes]:
    """The chain keys of the first n_pages full pages of `tokens`; `known`: the keys of its
    first pages already computed (a row's prompt pages, hashed at admission)."""
    size, out = self.pages.page_size, list(known[:n_pages])
    h = out[-1] if out else root
    tokens = np.asarray(tokens, np.int32)
    for j in range(len(out), n_pages):
      h = hashlib.blake2b(h + tokens[j * size:(j + 1) * size].tobytes(), digest_size=16).digest()
      out.append(h)
    return out

  def match(self, keys: Sequence[bytes]) -> list[int]:
    """The pages of the longest run of `keys` from the first one, retained for the caller."""
    found = []
    for key in keys:
      page = self._entries.get(key)
      if page is None:
        break
      self._entries.move_to_end(key)
      found.append(page)
    self.pages.retain(found)
    self.stats["lookups"] += 1
    self.stats["pages_asked"] += len(keys)
    self.stats["pages_hit"] += len(found)
    return found

  def insert(self, keys: Sequence[bytes], pages: Sequence[int]) -> None:
    """A finished row's full pages (one more reference each); keys already held stay as they are."""
    for key, page in zip(keys, pages):
      if key in self._entries:
        self._entries.move_to_end(key)
        continue
      self.pages.retain([page])
      self._entries[key] = page

  def held(self) -> list[int]:
    """The pages the cache holds a reference to."""
    return list(self._entries.values())

  def cached_only(self) -> int:
    """Pages no row holds, only the cache (freed by `evict`)."""
    return sum(1 for p in self._entries.values() if self.pages.refcount[p] == 1)

  def evict(self, need: int) -> int:
    """Frees up to `need` pages only the cache holds, least recently used first; how many."""
    freed = 0
    for key in list(self._entries):
      if freed >= need:
        break
      page = self._entries[key]
      if self.pages.refcount[page] == 1:
        del self._entries[key]
        self.pages.release([page])
        freed += 1
    self.stats["evicted"] += freed
    return freed

  def clear(self) -> None:
    for page in self._entries.values():
      self.pages.release([page])
    self._entries.clear()
