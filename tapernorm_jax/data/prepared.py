"""Prepared data: a tokenizer and one token stream per split, built once and cached on disk.

The cache directory `<data_dir>/prepared/<corpus>-v<vocab>-<hash>` is keyed by the corpus's
content key and the tokenizer settings, so other settings never reuse a stale cache. It is
built in a temporary sibling directory, finished with a `COMPLETE` marker and renamed into
place: an interrupted build leaves nothing a later run would read as complete. Each stream is
the concatenation, over the split's documents, of `[bos, *ids, eos]`, stored as raw
little-endian integers (`uint16` when the vocabulary fits) and read back memory-mapped.
"""

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from tapernorm_jax.data import corpora, tokenizer_training as tokenizer_lib

FORMAT_VERSION = 1  # bump when the layout or content of a prepared directory changes
COMPLETE = "COMPLETE"
META = "meta.json"
ENCODE_BLOCK = 2048  # documents tokenized per call

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Prepared:
  """A corpus ready for training: its name, tokenizer and memory-mapped token streams."""

  name: str  # the corpus, for logs and results
  path: Path
  tokenizer: tokenizer_lib.Tokenizer
  streams: dict[str, np.ndarray]  # split -> 1-D token ids (memory-mapped)
  meta: dict  # what `meta.json` records: corpus key, tokenizer settings, counts, build timings

  @property
  def vocab_size(self) -> int:
    """Number of token ids."""
    return self.tokenizer.vocab_size

  def num_tokens(self, split: str) -> int:
    """Length of the token stream of `split` ("train" or "validation")."""
    return int(self.tokens(split).shape[0])

  def tokens(self, split: str) -> np.ndarray:
    """The token stream of `split`."""
    if split not in self.streams:
      raise ValueError(f"split must be one of {sorted(self.streams)}, got {split!r}")
    return self.streams[split]


def cache_path(data_dir: Path, corpus: corpora.Corpus, settings: tokenizer_lib.TokenizerSettings) -> Path:
  """The cache directory for `corpus` tokenized with `settings`."""
  key = json.dumps(dict(format=FORMAT_VERSION, corpus=corpus.key, tokenizer=settings.to_dict()), sort_keys=True)
  digest = hashlib.sha256(key.encode()).hexdigest()[:12]
  slug = re.sub(r"[^A-Za-z0-9.=,-]+", "_", corpus.name)[:80].strip("_")
  return data_dir / "prepared" / f"{slug}-v{settings.vocab_size}-{digest}"


def token_dtype(vocab_size: int) -> np.dtype:
  """The smallest little-endian unsigned type that holds every id."""
  return np.dtype("<u2" if vocab_size <= 1 << 16 else "<u4")


def blocks(items: Iterable[str], size: int) -> Iterator[list[str]]:
  """`items` in lists of `size` (the last may be shorter)."""
  it = iter(items)
  while block := list(islice(it, size)):
    yield block


def write_stream(documents: Iterable[str], tokenizer: tokenizer_lib.Tokenizer, path: Path, total: int | None,
                 desc: str) -> tuple[int, int]:
  """Tokenizes `documents` into `path` as `[bos, *ids, eos]` per document; returns (documents, tokens)."""
  dtype = token_dtype(tokenizer.vocab_size)
  bos, eos = tokenizer.bos_id, tokenizer.eos_id
  num_docs = num_tokens = 0
  with open(path, "wb") as f, tqdm(total=total, desc=desc, unit=" docs", mininterval=1.0) as bar:
    for block in blocks(documents, ENCODE_BLOCK):
      encoded = tokenizer.encode_batch(block)
      ids = np.fromiter(chain.from_iterable((bos, *doc, eos) for doc in encoded), dtype=dtype)
      f.write(ids.tobytes())
      num_docs += len(block)
      num_tokens += ids.size
      bar.update(len(block))
  return num_docs, num_tokens


def build(directory: Path, corpus: corpora.Corpus, settings: tokenizer_lib.TokenizerSettings) -> None:
  """Trains the tokenizer and writes both token streams and `meta.json` into `directory`."""
  t0 = time.perf_counter()
  log.info("training a %d-piece tokenizer on %s", settings.vocab_size, corpus.name)
  tokenizer = tokenizer_lib.train(corpus.documents("train"), settings, corpus.name)
  tokenizer.save(directory)
  timings = {"tokenizer_train_s": time.perf_counter() - t0}
  splits = {}
  for split in corpora.SPLITS:
    t0 = time.perf_counter()
    num_docs, num_tokens = write_stream(corpus.documents(split), tokenizer, directory / f"{split}.bin",
                                        corpus.num_documents(split), f"tokenizing {corpus.name} {split}")
    if num_docs == 0:
      raise ValueError(f"the {split} split of {corpus.name} has no documents")
    timings[f"tokenize_{split}_s"] = time.perf_counter() - t0
    splits[split] = dict(file=f"{split}.bin", num_documents=num_docs, num_tokens=num_tokens)
  meta = dict(format=FORMAT_VERSION, name=corpus.name, corpus=corpus.key, tokenizer=settings.to_dict(),
              dtype=token_dtype(tokenizer.vocab_size).str,
              splits=splits, timings=timings, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
  (directory / META).write_text(json.dumps(meta, indent=2) + "\n")


def load(directory: Path, settings: tokenizer_lib.TokenizerSettings) -> Prepared:
  """The complete prepared directory `directory`, its token streams memory-mapped."""
  meta = json.loads((directory / META).read_text())
  tokenizer = tokenizer_lib.load(directory, settings)
  dtype = np.dtype(meta["dtype"])
  streams = {}
  for split, info in meta["splits"].items():
    path = directory / info["file"]
    if path.stat().st_size != info["num_tokens"] * dtype.itemsize:
      raise ValueError(f"{path} holds {path.stat().st_size} bytes, not the {info['num_tokens']} tokens "
                       f"{directory / META} records; delete {directory} to rebuild it")
    streams[split] = np.memmap(path, dtype=dtype, mode="r", shape=(info["num_tokens"],))
  return Prepared(name=meta["name"], path=directory, tokenizer=tokenizer, streams=streams, meta=meta)


def build_atomically(final: Path, corpus: corpora.Corpus, settings: tokenizer_lib.TokenizerSettings) -> None:
  """Builds into a temporary sibling of `final`, marks it complete and renames it into place."""
  final.parent.mkdir(parents=True, exist_ok=True)
  if (final / COMPLETE).exists():  # another process finished it meanwhile
    return
  if final.exists():  # no COMPLETE marker: left by something other than this function; never trusted
    log.warning("removing incomplete prepared data at %s", final)
    shutil.rmtree(final)
  tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
  try:
    build(tmp, corpus, settings)
    (tmp / COMPLETE).write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")
    try:
      os.rename(tmp, final)
    except OSError:
      if not (final / COMPLETE).exists():  # another process finished first: keep theirs
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def prepare(cfg: Any) -> Prepared:
  """The prepared corpus `cfg` (a `cfg.data` ConfigDict or dict) names: loaded from the cache or built once."""
  vocab_size = corpora.setting(cfg, "vocab_size")
  if not isinstance(vocab_size, (int, np.integer)) or vocab_size <= 0:
    raise ValueError(f"data.vocab_size must be a positive integer, got {vocab_size!r}")
  corpus = corpora.from_config(cfg)
  settings = tokenizer_lib.TokenizerSettings(
      vocab_size=int(vocab_size), model_type=corpora.setting(cfg, "tokenizer_model"),
      train_bytes=int(corpora.setting(cfg, "tokenizer_train_bytes")))
  data_dir = Path(os.path.expanduser(corpora.setting(cfg, "data_dir")))
  directory = cache_path(data_dir, corpus, settings)
  if not (directory / COMPLETE).exists():
    log.info("preparing %s into %s", corpus.name, directory)
    build_atomically(directory, corpus, settings)
  prepared = load(directory, settings)  # its tokenizer has exactly `vocab_size` ids, or this raises
  seq_len = corpora.setting(cfg, "seq_len")
  if seq_len:
    for split in corpora.SPLITS:
      check_window(prepared, split, int(seq_len))
  log.info("data: %s (%s), vocab %d, %s", prepared.name, directory, prepared.vocab_size,
           ", ".join(f"{s} {prepared.num_tokens(s):,} tokens" for s in prepared.streams))
  return prepared


def check_window(prepared: Prepared, split: str, seq_len: int) -> None:
  """A clear error unless `split` holds at least one window of `seq_len + 1` tokens."""
  if seq_len <= 0:
    raise ValueError(f"seq_len must be positive, got {seq_len}")
  if prepared.num_tokens(split) < seq_len + 1:
    raise ValueError(
        f"the {split} split of {prepared.name} has {prepared.num_tokens(split)} tokens, fewer than one window of "
        f"seq_len + 1 = {seq_len + 1}; use more data or a shorter seq_len")
