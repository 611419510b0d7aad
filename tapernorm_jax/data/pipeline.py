"""The grain pipeline: batches of random contiguous windows of `T + 1` tokens, and fixed eval windows.

Training (the paper's sampling): every start position of a window in the training stream,
shuffled by `seed` (a new permutation each epoch), sharded by JAX process, batched and
gathered from the memory-mapped stream. Process `p` of `P` takes positions `p, p + P, ...`
of the shuffled order, so the union of the processes' `k`-th batches is the single-process
`k`-th batch. The iterator is a grain `DatasetIterator`: `get_state()` is a small JSON dict
and `set_state` resumes exactly where it was taken.
"""

import functools
from collections.abc import Iterator

import grain
import numpy as np

from tapernorm_jax.data.prepared import Prepared, check_window


def gather_windows(starts_B: np.ndarray, tokens: np.ndarray, seq_len: int) -> np.ndarray:
  """The windows `tokens[s : s + seq_len + 1]` for each start, as int32 (B, seq_len + 1)."""
  return tokens[starts_B[:, None] + np.arange(seq_len + 1)].astype(np.int32)


def process_layout(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  """(index, count) of this process; JAX's values where either is None."""
  if process_index is None or process_count is None:
    import jax  # only here: the pipeline itself needs no JAX

    process_index, process_count = jax.process_index(), jax.process_count()
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index must be in [0, {process_count}), got {process_index}")
  return process_index, process_count


def train_dataset(
  prepared: Prepared,
  batch_size: int,
  seq_len: int,
  seed: int = 0,
  process_index: int | None = None,
  process_count: int | None = None,
  split: str = "train",
) -> grain.MapDataset:
  """This process's infinite MapDataset of int32 batches (batch_size // process_count, seq_len + 1)."""
  process_index, process_count = process_layout(process_index, process_count)
  if batch_size <= 0 or batch_size % process_count:
    raise ValueError(f"batch_size={batch_size} must be a positive multiple of the process count {process_count}")
  check_window(prepared, split, seq_len)
  tokens = prepared.tokens(split)
  num_starts = tokens.shape[0] - seq_len  # windows of seq_len + 1 tokens start at 0 .. N - seq_len - 1
  starts = grain.MapDataset.range(num_starts).shuffle(seed=seed).repeat()
  starts = starts[process_index::process_count].batch(batch_size // process_count, drop_remainder=True)
  return starts.map(functools.partial(gather_windows, tokens=tokens, seq_len=seq_len))


def train_iterator(
  prepared: Prepared,
  batch_size: int,
  seq_len: int,
  seed: int = 0,
  process_index: int | None = None,
  process_count: int | None = None,
  num_threads: int = 0,
  prefetch: int = 0,
) -> grain.DatasetIterator:
  """A checkpointable iterator over this process's training batches (see `train_dataset`).

  `num_threads`/`prefetch` > 0 read ahead on background threads; the default reads in the
  calling thread, which the data benchmark found fastest for this cheap gather.
  """
  dataset = train_dataset(prepared, batch_size, seq_len, seed, process_index, process_count)
  options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch)
  return iter(dataset.to_iter_dataset(options))


def eval_starts(num_tokens: int, seq_len: int, count: int) -> np.ndarray:
  """`count` starts of non-overlapping windows, spread evenly over the stream (cycled if it holds fewer)."""
  num_windows = num_tokens // (seq_len + 1)
  if num_windows >= count:
    slots = np.arange(count, dtype=np.int64) * num_windows // count
  else:
    slots = np.arange(count, dtype=np.int64) % num_windows
  return slots * (seq_len + 1)


def eval_windows(
  tokens: np.ndarray, batch_size: int, seq_len: int, num_batches: int, name: str = "the token stream"
) -> Iterator[np.ndarray]:
  """`num_batches` int32 batches (batch_size, seq_len + 1) of non-overlapping windows of `tokens`, always the same.

  The windows are spread evenly over the stream; if it holds fewer than batch_size * num_batches
  windows, they repeat in order (every window is used equally often when the count divides).
  `name` says which stream in errors.
  """
  if batch_size <= 0 or num_batches <= 0:
    raise ValueError(f"batch_size and num_batches must be positive, got {batch_size} and {num_batches}")
  if seq_len <= 0:
    raise ValueError(f"seq_len must be positive, got {seq_len}")
  if tokens.shape[0] < seq_len + 1:
    raise ValueError(
      f"{name} has {tokens.shape[0]} tokens, fewer than one window of seq_len + 1 = {seq_len + 1}; "
      "use more text or a shorter seq_len"
    )
  starts = eval_starts(tokens.shape[0], seq_len, batch_size * num_batches).reshape(num_batches, batch_size)
  return (gather_windows(starts_B, tokens, seq_len) for starts_B in starts)


def eval_batches(
  prepared: Prepared, batch_size: int, seq_len: int, num_batches: int, split: str = "validation"
) -> Iterator[np.ndarray]:
  """The fixed evaluation batches of `split` of `prepared`: `eval_windows` of its token stream."""
  check_window(prepared, split, seq_len)
  return eval_windows(prepared.tokens(split), batch_size, seq_len, num_batches, f"the {split} split of {prepared.name}")
