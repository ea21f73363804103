"""Memory planning: intermediate buffers of a schedule share memory when their lifetimes do not overlap."""
from __future__ import annotations
from kiln.device import Buffer

def plan_memory(items: list, intermediates: set[int]) -> None:
  """Rewrite `items[i].bufs` in place so that intermediate buffers (by id) reuse ones whose last reader ran earlier.

  A buffer is reused only by a kernel that starts strictly after the buffer's last use, and only for the same
  device, dtype and size, so no kernel ever reads and writes one buffer through different indices.
  """
  last_use: dict[int, int] = {}
  for i, item in enumerate(items):
    for b in item.bufs:
      if id(b) in intermediates: last_use[id(b)] = i
  free: dict[tuple, list[Buffer]] = {}
  releases: dict[int, list[Buffer]] = {}
  assigned: dict[int, Buffer] = {}
  for i, item in enumerate(items):
    new_bufs = []
    for b in item.bufs:
      if id(b) not in intermediates: new_bufs.append(b); continue
      if id(b) not in assigned:
        key = (b.device, b.dtype, b.size)
        pool = free.get(key)
        assigned[id(b)] = pool.pop() if pool else b
        releases.setdefault(last_use[id(b)], []).append(assigned[id(b)])
      new_bufs.append(assigned[id(b)])
    item.bufs = new_bufs
    for b in releases.pop(i, []): free.setdefault((b.device, b.dtype, b.size), []).append(b)
