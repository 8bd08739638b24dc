"""The engine's page allocator, on the host: a free list of KV pages with reference counts.

Page 0 is never handed out: it is the page every unused page-table entry points at and where
idle rows' writes go (a trash page), so the device code needs no "is this entry real" branch.
A page shared by several rows (a group's prompt pages) has a reference count above one and
goes back to the free list when its last row releases it.

Reservations: the engine admits a request only when the pages it could still need (its prompt
plus its whole budget) fit beside what the live rows could still need, but allocates a page
only when a token is about to be written into it. KV held then follows the tokens live, and a
running row never finds the pool empty.
"""

from __future__ import annotations

import numpy as np

TRASH_PAGE = 0


class OutOfPages(RuntimeError):
  """More pages asked for than are free (the engine's reservations make this a bug)."""


class PageAllocator:
  """Pages 1..num_pages-1 with reference counts; `reserved` pages promised to running rows."""

  def __init__(self, num_pages: int, page_size: int):
    if num_pages < 2:
      raise ValueError(f"PageAllocator.num_pages must be >= 2 (page 0 is the trash page), got "
                       f"{num_pages!r}")
    if page_size < 1:
      raise ValueError(f"PageAllocator.page_size must be >= 1, got {page_size!r}")
    self.num_pages, self.page_size = num_pages, page_size
    self.refcount = np.zeros(num_pages, np.int32)
    # Popped from the end: low ids first, so a fresh engine's pages are laid out in order.
    self._free = list(range(num_pages - 1, 0, -1))
    self.reserved = 0

  @property
  def capacity(self) -> int:
    """Pages that can ever be handed out (all but the trash page)."""
    return self.num_pages - 1

  @property
  def free(self) -> int:
    return len(self._free)

  @property
  def used(self) -> int:
    """Distinct pages held (a shared page counts once)."""
    return self.capacity - self.free

  @property
  def available(self) -> int:
    """Free pages not promised to a running row."""
    return self.free - self.reserved

  def pages_for(self, tokens: int) -> int:
    return -(-tokens // self.page_size)

  def reserve(self, pages: int) -> None:
    if pages > self.available:
      raise OutOfPages(f"reserve: {pages} pages asked, {self.available} available")
    self.reserved += pages

  def unreserve(self, pages: int) -> None:
    self.reserved -= pages

  def allocate(self, n: int, reserved: bool = True) -> list[int]:
    """n fresh pages (reference count 1), taken from the reservation when `reserved`."""
    if n > self.free:
      raise OutOfPages(f"allocate: {n} pages asked, {self.free} free")
    pages = [self._free.pop() for _ in range(n)]
    self.refcount[pages] = 1
    if reserved:
      self.reserved -= n
    return pages

  def retain(self, pages) -> None:
    """One more row holds each of `pages` (a group member sharing its prompt's pages)."""
    for p in pages:
      if self.refcount[p] < 1:
        raise ValueError(f"retain: page {p} is not allocated")
      self.refcount[p] += 1

  def release(self, pages) -> None:
    """A row lets go of `pages`; those no row holds any more are free again."""
    for p in pages:
      if self.refcount[p] < 1:
        raise ValueError(f"release: page {p} is not allocated")
      self.refcount[p] -= 1
      if self.refcount[p] == 0:
        self._free.append(p)
