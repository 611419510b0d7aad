"""Prepared data: a tokenizer and one token stream per split, built once and cached on disk.

The cache directory `<data_dir>/prepared/<corpus>-<tokenizer>-<hash>` is keyed by the corpus's
content key and the tokenizer's key (`tokenizer_choice`: the SentencePiece settings, or GPT-2's
kind and file hash), so other settings never reuse a stale cache. It is built atomically
(`cache_dirs`) and holds the tokenizer's files, so it loads on its own. Each stream is the
concatenation, over the split's documents, of `tokenizer.frame(ids)` (`[bos, *ids, eos]` for
SentencePiece, `[*ids, eot]` for GPT-2), stored as raw little-endian integers (`uint16` when
the vocabulary fits) and read back memory-mapped.
"""

import dataclasses
import json
import logging
import time
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from tapernorm_jax.data import cache_dirs, corpora, tokenizer_choice
from tapernorm_jax.data.cache_dirs import COMPLETE  # noqa: F401 (callers and tests use prepared.COMPLETE)
from tapernorm_jax.data.tokenizer_choice import CorpusTokenizer, TokenizerChoice

FORMAT_VERSION = 1  # bump when the layout or content of a prepared directory changes
META = "meta.json"
ENCODE_BLOCK = 2048  # documents tokenized per call

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Prepared:
  """A corpus ready for training: its name, tokenizer and memory-mapped token streams."""

  name: str  # the corpus, for logs and results
  path: Path
  tokenizer: CorpusTokenizer  # encode, decode, bos_id, eos_id, vocab_size (SentencePiece or GPT-2)
  streams: dict[str, np.ndarray]  # split -> 1-D token ids (memory-mapped)
  meta: dict  # what `meta.json` records: corpus key, tokenizer settings, counts, build timings

  @property
  def vocab_size(self) -> int:
    """Number of token ids."""
    return self.tokenizer.vocab_size

  def num_tokens(self, split: str) -> int:
    """Length of the token stream of `split` ("train", "validation", or "tune" with data.tune_frac > 0)."""
    return int(self.tokens(split).shape[0])

  def tokens(self, split: str) -> np.ndarray:
    """The token stream of `split`."""
    if split not in self.streams:
      raise ValueError(f"split must be one of {sorted(self.streams)}, got {split!r}")
    return self.streams[split]


def cache_path(data_dir: Path, corpus: corpora.Corpus, choice: TokenizerChoice) -> Path:
  """The cache directory for `corpus` tokenized with `choice`."""
  key = dict(format=FORMAT_VERSION, corpus=corpus.key, tokenizer=choice.key)
  return data_dir / "prepared" / f"{cache_dirs.slug(corpus.name)}-{choice.slug}-{cache_dirs.digest(key)}"


def token_dtype(vocab_size: int) -> np.dtype:
  """The smallest little-endian unsigned type that holds every id."""
  return np.dtype("<u2" if vocab_size <= 1 << 16 else "<u4")


def blocks(items: Iterable[str], size: int) -> Iterator[list[str]]:
  """`items` in lists of `size` (the last may be shorter)."""
  it = iter(items)
  while block := list(islice(it, size)):
    yield block


def write_stream(
  documents: Iterable[str], tokenizer: CorpusTokenizer, path: Path, total: int | None, desc: str
) -> tuple[int, int]:
  """Tokenizes `documents` into `path` as `tokenizer.frame(ids)` per document; returns (documents, tokens)."""
  dtype = token_dtype(tokenizer.vocab_size)
  num_docs = num_tokens = 0
  with open(path, "wb") as f, tqdm(total=total, desc=desc, unit=" docs", mininterval=1.0) as bar:
    for block in blocks(documents, ENCODE_BLOCK):
      encoded = tokenizer.encode_batch(block)
      ids = np.fromiter(chain.from_iterable(tokenizer.frame(doc) for doc in encoded), dtype=dtype)
      f.write(ids.tobytes())
      num_docs += len(block)
      num_tokens += ids.size
      bar.update(len(block))
  return num_docs, num_tokens


def read_stream(path: Path, dtype: np.dtype, num_tokens: int, owner: Path) -> np.ndarray:
  """The stream at `path`, memory-mapped; a clear error if its size is not the recorded token count."""
  if path.stat().st_size != num_tokens * dtype.itemsize:
    raise ValueError(
      f"{path} holds {path.stat().st_size} bytes, not the {num_tokens} tokens "
      f"{owner / META} records; delete {owner} to rebuild it"
    )
  return np.memmap(path, dtype=dtype, mode="r", shape=(num_tokens,))


def build(directory: Path, corpus: corpora.Corpus, choice: TokenizerChoice) -> None:
  """Obtains the tokenizer (trained or fixed) and writes it, both token streams and `meta.json` into `directory`."""
  t0 = time.perf_counter()
  log.info("tokenizer for %s: %s", corpus.name, choice.slug)
  tokenizer = choice.make(corpus)
  tokenizer.save(directory)
  timings = {"tokenizer_train_s": time.perf_counter() - t0}
  splits = {}
  for split in corpora.SPLITS:
    t0 = time.perf_counter()
    num_docs, num_tokens = write_stream(
      corpus.documents(split),
      tokenizer,
      directory / f"{split}.bin",
      corpus.num_documents(split),
      f"tokenizing {corpus.name} {split}",
    )
    if num_docs == 0:
      raise ValueError(f"the {split} split of {corpus.name} has no documents")
    timings[f"tokenize_{split}_s"] = time.perf_counter() - t0
    splits[split] = dict(file=f"{split}.bin", num_documents=num_docs, num_tokens=num_tokens)
  meta = dict(
    format=FORMAT_VERSION,
    name=corpus.name,
    corpus=corpus.key,
    tokenizer=choice.key,
    dtype=token_dtype(tokenizer.vocab_size).str,
    splits=splits,
    timings=timings,
    created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
  )
  (directory / META).write_text(json.dumps(meta, indent=2) + "\n")


def load(directory: Path, choice: TokenizerChoice) -> Prepared:
  """The complete prepared directory `directory`, its token streams memory-mapped."""
  meta = json.loads((directory / META).read_text())
  tokenizer = choice.load(directory)
  dtype = np.dtype(meta["dtype"])
  streams = {
    split: read_stream(directory / info["file"], dtype, info["num_tokens"], directory)
    for split, info in meta["splits"].items()
  }
  return Prepared(name=meta["name"], path=directory, tokenizer=tokenizer, streams=streams, meta=meta)


def prepare(cfg: Any) -> Prepared:
  """The prepared corpus `cfg` (a `cfg.data` ConfigDict or dict) names: loaded from the cache or built once."""
  vocab_size = corpora.setting(cfg, "vocab_size")
  if not isinstance(vocab_size, (int, np.integer)) or vocab_size <= 0:
    raise ValueError(f"data.vocab_size must be a positive integer, got {vocab_size!r}")
  corpus = corpora.from_config(cfg)
  choice = tokenizer_choice.from_config(cfg, int(vocab_size))  # GPT-2: an error unless vocab_size matches it
  data_dir = corpora.data_directory(cfg)
  directory = cache_path(data_dir, corpus, choice)
  if not cache_dirs.is_complete(directory):
    log.info("preparing %s into %s", corpus.name, directory)
    cache_dirs.build_atomically(directory, lambda tmp: build(tmp, corpus, choice))
  prepared = hold_out_tune(load(directory, choice), float(corpora.setting(cfg, "tune_frac")))
  seq_len = corpora.setting(cfg, "seq_len")
  if seq_len:
    for split in prepared.streams:
      check_window(prepared, split, int(seq_len))
  log.info(
    "data: %s (%s), vocab %d, %s",
    prepared.name,
    directory,
    prepared.vocab_size,
    ", ".join(f"{s} {prepared.num_tokens(s):,} tokens" for s in prepared.streams),
  )
  return prepared


def hold_out_tune(prepared: Prepared, frac: float) -> Prepared:
  """`prepared` with the last `frac` of its train stream, from the first document start at or after that point, as
  the `tune` split (training reads only what is before it); `frac` = 0 returns `prepared` as it is."""
  if frac == 0.0:
    return prepared
  if not 0.0 < frac < 0.5:
    raise ValueError(
      f"data.tune_frac={frac}: must lie in [0, 0.5) (the share of the train stream held out for tuning; 0: none)"
    )
  train = prepared.tokens("train")
  target = int(round((1.0 - frac) * train.shape[0]))
  ends = np.flatnonzero(np.asarray(train[max(target - 1, 0) :]) == prepared.tokenizer.eos_id)  # documents end on eos
  if ends.size == 0 or (cut := max(target - 1, 0) + int(ends[0]) + 1) >= train.shape[0]:
    raise ValueError(
      f"data.tune_frac={frac}: no whole document lies in the last {frac:.0%} of the train stream of "
      f"{prepared.name} ({train.shape[0]:,} tokens); raise it or use more training documents"
    )
  return dataclasses.replace(prepared, streams={**prepared.streams, "train": train[:cut], "tune": train[cut:]})


def check_window(prepared: Prepared, split: str, seq_len: int) -> None:
  """A clear error unless `split` holds at least one window of `seq_len + 1` tokens."""
  if seq_len <= 0:
    raise ValueError(f"seq_len must be positive, got {seq_len}")
  if prepared.num_tokens(split) < seq_len + 1:
    raise ValueError(
      f"the {split} split of {prepared.name} has {prepared.num_tokens(split)} tokens, fewer than one window of "
      f"seq_len + 1 = {seq_len + 1}; use more data or a shorter seq_len"
    )
