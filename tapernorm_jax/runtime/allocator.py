"""glibc's malloc told to keep freed memory for reuse, so that XLA:CPU's per-step buffers stop costing page faults.

XLA:CPU allocates each execution's scratch buffer afresh (305 MB for a 30M train step at 1 × 512) and frees it at
the end. glibc serves a block that large with `mmap` and returns it with `munmap`, so every step touches a fresh
mapping: tens of thousands of page faults, each page zeroed by the kernel (9–13% of a 9M or 30M CPU step's cycles
under `perf` on this project's machine; docs/benchmarks.md). With one arena, no `mmap` for large blocks and no
trimming, the freed block stays in the heap and the next step reuses it. The settings apply only to threads that
have not allocated yet, and jax 0.12 starts threads when it is imported, so `keep_freed_memory()` runs before jax
is imported. The entry points call it (`experiments/__init__.py`, and `cli.run` again: there it holds fully only on
jax lines that start their threads with the backend); a notebook or script calls it itself, first, and then trains
as fast as `python -m experiments.NAME` (docs/library.md). Importing the package sets nothing: a library that
changed process-wide state on import would surprise its users. `in_effect()` says what holds; results.json records
it. This module imports nothing of jax. `TAPERNORM_KEEP_FREED_MEMORY=0` leaves malloc as it is.
"""

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # mallopt parameters (glibc's malloc.h)
_NEVER_TRIM = -1  # mallopt(3): -1 turns trimming off; 2**31 - 1, the largest int, still trims a free top over 2 GiB


_FIRST: dict[str, object] = {}  # the first call's outcome: what the threads started since then were given


def keep_freed_memory() -> str:
  """Sets glibc's malloc to one arena, no `mmap` and no trimming; '' when set, else why not (not glibc, or turned
  off). The process keeps its peak heap until it exits, as it would for a long run anyway."""
  why_not = _set()
  _FIRST.setdefault("why_not", why_not)
  _FIRST.setdefault("before_jax", "jax" not in sys.modules)
  return why_not


def in_effect() -> dict[str, object]:
  """What malloc runs with: `keeps_freed_memory`, and `set_before_jax` (false: jax's first threads kept the default
  arenas), or the reason it was not set."""
  if not _FIRST:
    return {"keeps_freed_memory": False, "why_not": "never set (no entry point, and keep_freed_memory() not called)"}
  return {
    "keeps_freed_memory": not _FIRST["why_not"],
    "why_not": _FIRST["why_not"],
    "set_before_jax": _FIRST["before_jax"],
  }


def _set() -> str:
  """mallopt's settings; '' when set, else why not."""
  if os.environ.get("TAPERNORM_KEEP_FREED_MEMORY", "1") == "0":
    return "turned off by TAPERNORM_KEEP_FREED_MEMORY=0"
  if not sys.platform.startswith("linux"):
    return f"malloc is not glibc's on {sys.platform}"
  try:
    mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
  except (OSError, AttributeError):
    return "this libc has no mallopt (not glibc)"
  settings = {M_ARENA_MAX: 1, M_MMAP_MAX: 0, M_TRIM_THRESHOLD: _NEVER_TRIM}
  refused = [param for param, value in settings.items() if mallopt(param, value) != 1]
  return f"mallopt refused parameters {refused}" if refused else ""
