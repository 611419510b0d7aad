"""jax's persistent compilation cache in training runs: on by default, read back by the next run (jax's own
cache-hit events), off when asked, a damaged entry only recompiled, a bad setting named before anything runs."""

import os

import jax
import pytest

from configs import base
from tapernorm_jax.runtime import compilation_cache
from tapernorm_jax.train import loop

TINY = {
  "model.D": 32,
  "model.H": 4,
  "model.L": 1,
  "model.T": 32,
  "model.V": 512,
  "train.steps": 4,
  "train.batch_size": 8,
  "train.diag_every": 4,
  "train.eval_batches": 1,
  "checkpoint.every": 4,
  "taper.gate_warmup_frac": 0.25,
  "data.synthetic_train_stories": 200,
  "data.synthetic_valid_stories": 30,
}


@pytest.fixture(autouse=True)
def restore_cache_setting():
  """Each test leaves jax's cache as the session had it."""
  before = (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache)
  yield
  compilation_cache.use(before[0] if before[1] and before[0] else "off")


def run(tmp_path, name: str, cache: str) -> dict:
  """A four-step run in `tmp_path/name` with the compilation cache `cache`, nothing compiled in memory before it."""
  jax.clear_caches()
  cfg = base.override(
    base.get_config("all_taper"), {**TINY, "data.data_dir": str(tmp_path / "data"), "train.compilation_cache": cache}
  )
  return loop.run(cfg, tmp_path / name)


def cache_hits(during) -> int:
  """How many programs jax read from its persistent cache while `during()` ran."""
  hits = []
  listener = lambda event, **kwargs: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
  jax.monitoring.register_event_listener(listener)
  try:
    during()
  finally:
    jax.monitoring.unregister_event_listener(listener)
  return len(hits)


def test_a_second_run_reads_what_the_first_compiled(tmp_path):
  cache = str(tmp_path / "xla")
  assert cache_hits(lambda: run(tmp_path, "first", cache)) == 0
  entries = os.listdir(cache)
  assert entries  # every program of the run, however fast it compiled
  assert cache_hits(lambda: run(tmp_path, "second", cache)) >= 3  # train step, eval, diagnostics at least
  assert sorted(os.listdir(cache)) == sorted(entries)


def test_auto_is_the_default_and_lives_in_the_project_cache_directory(tmp_path, monkeypatch):
  monkeypatch.setenv("TAPERNORM_CACHE", str(tmp_path / "cache"))
  assert base.get_config("all_taper").train.compilation_cache == "auto"
  assert compilation_cache.use("auto") == str(tmp_path / "cache" / "xla")
  assert compilation_cache.use("off") is None and not jax.config.jax_enable_compilation_cache


def test_off_writes_nothing(tmp_path, monkeypatch):
  monkeypatch.setenv("TAPERNORM_CACHE", str(tmp_path / "cache"))
  run(tmp_path, "off", "off")
  assert not (tmp_path / "cache" / "xla").exists()


def test_a_damaged_entry_is_recompiled_not_used(tmp_path):
  cache = tmp_path / "xla"
  first = run(tmp_path, "first", str(cache))
  for entry in cache.iterdir():  # as a writer killed mid-write would leave them
    entry.write_bytes(entry.read_bytes()[:100])
  with pytest.warns(UserWarning, match="Error reading persistent compilation cache entry"):
    second = run(tmp_path, "second", str(cache))
  assert second["final_val_loss"] == first["final_val_loss"]


def test_a_file_where_the_cache_directory_should_be_is_named_before_anything_compiles(tmp_path):
  (tmp_path / "taken").write_text("a file")
  with pytest.raises(NotADirectoryError, match=r"train\.compilation_cache=.*taken is a file"):
    run(tmp_path, "bad", str(tmp_path / "taken"))
  assert not (tmp_path / "bad").exists()
