"""The grain pipeline: contiguous shifted windows, determinism, exact resume, process sharding, eval windows."""

import json
from pathlib import Path

import numpy as np
import pytest

from tapernorm_jax import data
from tapernorm_jax.data import pipeline

N, T = 1000, 16


def ramp(n: int = N, eval_n: int = 200) -> data.Prepared:
  """A Prepared whose streams are 0, 1, 2, ...: a window's first token is its start."""
  streams = {"train": np.arange(n, dtype=np.uint16), "validation": np.arange(eval_n, dtype=np.uint16)}
  return data.Prepared(name="ramp", path=Path("."), tokenizer=None, streams=streams, meta={})


def take(it, k: int) -> list[np.ndarray]:
  return [next(it) for _ in range(k)]


def test_windows_are_contiguous_slices_with_the_shift():
  it = data.train_iterator(ramp(), batch_size=8, seq_len=T, seed=0, process_index=0, process_count=1)
  for batch in take(it, 20):
    assert batch.shape == (8, T + 1) and batch.dtype == np.int32
    starts = batch[:, 0]
    np.testing.assert_array_equal(batch, starts[:, None] + np.arange(T + 1))
    assert ((0 <= starts) & (starts <= N - T - 1)).all()
    inputs, targets = batch[:, :-1], batch[:, 1:]
    np.testing.assert_array_equal(targets[:, :-1], inputs[:, 1:])


def test_an_epoch_visits_every_start_once_in_random_order():
  it = data.train_iterator(ramp(), batch_size=1, seq_len=T, seed=0, process_index=0, process_count=1)
  starts = [int(b[0, 0]) for b in take(it, N - T)]
  assert sorted(starts) == list(range(N - T))
  assert starts != sorted(starts)
  assert [int(b[0, 0]) for b in take(it, 50)] != starts[:50]  # the next epoch is a new permutation


def test_same_seed_same_batches_other_seed_other_batches():
  def batches(seed):
    return np.stack(take(data.train_iterator(ramp(), 4, T, seed=seed, process_index=0, process_count=1), 10))

  np.testing.assert_array_equal(batches(3), batches(3))
  assert not np.array_equal(batches(3), batches(4))


@pytest.mark.parametrize("stop", [0, 1, 7, 250])  # 250 batches of 4 cross the epoch boundary (984 starts)
def test_restored_state_continues_exactly(stop):
  make = lambda: data.train_iterator(ramp(), 4, T, seed=1, process_index=0, process_count=1)  # noqa: E731
  uninterrupted = take(make(), stop + 10)
  it = make()
  take(it, stop)
  state = json.loads(json.dumps(it.get_state()))  # the state is JSON-serialisable
  resumed = make()
  resumed.set_state(state)
  for a, b in zip(take(resumed, 10), uninterrupted[stop:]):
    np.testing.assert_array_equal(a, b)


def test_processes_split_the_global_batch():
  single = take(data.train_iterator(ramp(), 8, T, seed=0, process_index=0, process_count=1), 5)
  parts = [take(data.train_iterator(ramp(), 8, T, seed=0, process_index=p, process_count=4), 5) for p in range(4)]
  for k in range(5):
    assert all(part[k].shape == (2, T + 1) for part in parts)
    merged = np.concatenate([part[k] for part in parts])
    assert sorted(map(tuple, merged)) == sorted(map(tuple, single[k]))


def test_batch_must_divide_by_process_count_and_default_is_jax():
  with pytest.raises(ValueError, match="multiple of the process count 3"):
    data.train_iterator(ramp(), 8, T, process_index=0, process_count=3)
  with pytest.raises(ValueError, match="process_index"):
    data.train_iterator(ramp(), 8, T, process_index=2, process_count=2)
  assert next(data.train_iterator(ramp(), 8, T)).shape == (8, T + 1)  # one JAX process here


def test_split_shorter_than_a_window_is_a_clear_error():
  with pytest.raises(ValueError, match="fewer than one window"):
    data.train_iterator(ramp(n=T), 2, T, process_index=0, process_count=1)
  with pytest.raises(ValueError, match="validation split of ramp has 200 tokens, fewer than one window"):
    data.eval_batches(ramp(), 2, 200, 1)
  with pytest.raises(ValueError, match="num_batches must be positive"):
    data.eval_batches(ramp(), 2, T, 0)


def test_eval_batches_are_fixed_non_overlapping_windows():
  batches = list(data.eval_batches(ramp(), 3, T, 2))
  assert len(batches) == 2 and all(b.shape == (3, T + 1) and b.dtype == np.int32 for b in batches)
  windows = np.concatenate(batches)
  starts = windows[:, 0]
  np.testing.assert_array_equal(windows, starts[:, None] + np.arange(T + 1))
  assert (starts % (T + 1) == 0).all() and len(set(starts)) == 6  # aligned, so disjoint
  assert starts.max() > 200 // 2  # spread over the split, not just its start
  again = np.concatenate(list(data.eval_batches(ramp(), 3, T, 2)))
  np.testing.assert_array_equal(windows, again)


def test_eval_batches_repeat_windows_when_the_split_is_short():
  starts = np.concatenate(list(data.eval_batches(ramp(), 4, T, 4)))[:, 0]  # 16 windows, 11 fit in 200 tokens
  assert len(starts) == 16 and sorted(set(starts)) == list(range(0, 11 * (T + 1), T + 1))


def test_real_prepared_windows_are_stream_slices(tmp_path):
  prepared = data.prepare(
    dict(
      source="synthetic",
      data_dir=str(tmp_path),
      synthetic_train_stories=100,
      synthetic_valid_stories=20,
      vocab_size=400,
    )
  )
  tokens = np.asarray(prepared.tokens("train")).astype(np.int32)
  windows = np.lib.stride_tricks.sliding_window_view(tokens, 33)
  batch = next(data.train_iterator(prepared, 4, 32, seed=0, process_index=0, process_count=1))
  for row in batch:
    assert (windows == row).all(axis=1).any()
  assert pipeline.gather_windows(np.array([5]), prepared.tokens("train"), 32)[0].tolist() == tokens[5:38].tolist()
