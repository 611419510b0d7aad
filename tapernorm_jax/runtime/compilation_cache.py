"""jax's persistent compilation cache, on by default: a run's programs compiled once are read back by the next run.

    compilation_cache.use("auto")   # <cache dir>/xla ($TAPERNORM_CACHE, else ~/.cache/tapernorm_jax)
    compilation_cache.use("gs://bucket/xla")   # any epath URL jax can write to (the gcs extra for gs://)
    compilation_cache.use("off")

The training loop calls `use(cfg.train.compilation_cache)` before it compiles; a notebook or script does the same.
Every program is cached, however fast it compiled (jax's default skips those under a second), and the cache
keeps its most recently used 4 GiB (jax's default keeps everything). Entries are found by a hash of the program,
its compile options and the jax and XLA versions; one that cannot be read (a writer killed mid-write) costs a
warning and a recompile, never a wrong program.
"""

import os

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from tapernorm_jax.storage import run_files

OFF = ("off", "")
MAX_BYTES = 4 * 2**30  # least recently used entries go beyond this (jax keeps every entry by default)


def directory(setting: str) -> str | None:
  """The cache directory `setting` stands for ('auto': the project's cache directory's `xla`; 'off' or '': None)."""
  if setting in OFF:
    return None
  return os.path.join(run_files.cache_dir(), "xla") if setting == "auto" else setting


def use(setting: str) -> str | None:
  """Points jax's persistent compilation cache at `directory(setting)` (or turns it off); returns the directory.
  A file in the way, or a URL whose filesystem is not installed, is named as `train.compilation_cache`."""
  path = directory(setting)
  if path is not None:
    if run_files.is_url(path):
      run_files.workdir_path(path)  # MissingFilesystemError names the extra to install
    elif os.path.isfile(path):
      raise NotADirectoryError(f"train.compilation_cache={setting}: {path} is a file; give a directory, auto or off")
  if path == jax.config.jax_compilation_cache_dir and jax.config.jax_enable_compilation_cache == (path is not None):
    return path
  jax_cache.reset_cache()  # a cache jax opened already keeps its directory until reset
  jax.config.update("jax_enable_compilation_cache", path is not None)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
  return path
