"""Named held-out evaluation sets (`data.eval_sets = "name=path_or_glob,..."`), tokenized with the run's tokenizer.

Each set is local text files split into documents on `data.text_separator`, framed like the
training streams (`tokenizer.frame`), and cached in `<data_dir>/eval_sets/<name>-<kind>-<hash>`,
keyed by the files' fingerprints (path, size, mtime), the separator and the tokenizer's
fingerprint (the hash of its files), built atomically like the prepared corpora.

A set named in `data.filtered_eval_sets` is also evaluated as `<name>_filtered`: only its windows
whose every token occurs in a sample of the training stream (the Pile-filtered set of the GPT-2
comparison: the Pile's sequences without tokens OpenWebText never uses). `val` names the corpus's own
validation split there: `val_filtered` tells a loss that unseen token ids drive from one the model earns.
"""

import functools
import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from tapernorm_jax.data import cache_dirs, corpora, text_files
from tapernorm_jax.data.prepared import Prepared, read_stream, token_dtype, write_stream
from tapernorm_jax.data.tokenizer_choice import CorpusTokenizer

FORMAT_VERSION = 1  # bump when the layout or content of an eval-set directory changes
META = "meta.json"
TOKENS = "tokens.bin"
NAME = re.compile(r"[A-Za-z0-9_.-]+")
RESERVED = ("val", "tune")  # the training loop's names for the corpus's validation split and its tuning split


def parse(spec: str) -> dict[str, str]:
  """`"name=path_or_glob,..."` as {name: pattern}, in order; "" is no sets. Bad entries are an error naming them."""
  sets: dict[str, str] = {}
  for item in filter(None, (part.strip() for part in (spec or "").split(","))):
    name, sep, pattern = (s.strip() for s in item.partition("="))
    if not sep or not pattern or not NAME.fullmatch(name):
      raise ValueError(
        f"data.eval_sets entry {item!r} is not name=path_or_glob (name: letters, digits, _ . -); "
        "e.g. --config.data.eval_sets='wiki=/data/wiki.txt,books=/data/books/*.txt'"
      )
    if name in RESERVED:
      raise ValueError(
        f"data.eval_sets entry {item!r}: the name {name!r} is reserved for the corpus's own "
        "validation and tuning splits; pick another name"
      )
    if name in sets:
      raise ValueError(f"data.eval_sets names {name!r} twice; give each set its own name")
    sets[name] = pattern
  return sets


def cache_path(data_dir: Path, name: str, paths: list[Path], separator: str, tokenizer: CorpusTokenizer) -> Path:
  """The cache directory of eval set `name` made of `paths`, tokenized with `tokenizer`."""
  key = dict(
    format=FORMAT_VERSION,
    files=text_files.file_fingerprint(paths),
    separator=separator,
    tokenizer=dict(kind=tokenizer.kind, fingerprint=tokenizer.fingerprint),
  )
  return data_dir / "eval_sets" / f"{cache_dirs.slug(name)}-{tokenizer.kind}-{cache_dirs.digest(key)}"


def build(
  directory: Path, name: str, pattern: str, paths: list[Path], separator: str, tokenizer: CorpusTokenizer
) -> None:
  """Tokenizes the documents of `paths` into `directory` with its `meta.json`."""
  t0 = time.perf_counter()
  num_docs, num_tokens = write_stream(
    text_files.read_documents(paths, separator), tokenizer, directory / TOKENS, None, f"tokenizing eval set {name}"
  )
  if num_docs == 0:
    raise ValueError(f"eval set {name!r} ({pattern}) has no documents")
  meta = dict(
    format=FORMAT_VERSION,
    name=name,
    pattern=pattern,
    files=text_files.file_fingerprint(paths),
    separator=separator,
    tokenizer=dict(kind=tokenizer.kind, fingerprint=tokenizer.fingerprint),
    dtype=token_dtype(tokenizer.vocab_size).str,
    num_documents=num_docs,
    num_tokens=num_tokens,
    tokenize_s=time.perf_counter() - t0,
    created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
  )
  (directory / META).write_text(json.dumps(meta, indent=2) + "\n")


def load(directory: Path) -> np.ndarray:
  """The token stream of a complete eval-set directory, memory-mapped."""
  meta = json.loads((directory / META).read_text())
  return read_stream(directory / TOKENS, np.dtype(meta["dtype"]), meta["num_tokens"], directory)


def eval_sets(cfg: Any, prepared: Prepared) -> dict[str, np.ndarray]:
  """{name: 1-D token stream} of each set in `cfg.eval_sets`, tokenized with `prepared.tokenizer`, cached.

  The corpus's own validation split is not among them (the loop evaluates it as `val`). With
  `cfg.seq_len` set, a set shorter than one window of `seq_len + 1` tokens is an error.
  """
  sets = parse(corpora.setting(cfg, "eval_sets"))
  data_dir = corpora.data_directory(cfg)
  separator = corpora.setting(cfg, "text_separator")
  seq_len = corpora.setting(cfg, "seq_len")
  streams = {}
  for name, pattern in sets.items():
    paths = text_files.resolve(pattern, f"eval set {name!r}")
    directory = cache_path(data_dir, name, paths, separator, prepared.tokenizer)
    if not cache_dirs.is_complete(directory):
      cache_dirs.build_atomically(
        directory,
        functools.partial(
          build, name=name, pattern=pattern, paths=paths, separator=separator, tokenizer=prepared.tokenizer
        ),
      )
    streams[name] = load(directory)
    if seq_len and streams[name].shape[0] < int(seq_len) + 1:
      raise ValueError(
        f"eval set {name!r} ({pattern}) has {streams[name].shape[0]} tokens, fewer than one window of "
        f"seq_len + 1 = {int(seq_len) + 1}; give it more text or use a shorter seq_len"
      )
  return {**streams, **filtered_sets(cfg, prepared, {"val": prepared.tokens("validation"), **streams})}


def filtered_names(cfg: Any) -> list[str]:
  """The sets `cfg.filtered_eval_sets` names ("name,..."; "" is none)."""
  return [n.strip() for n in str(corpora.setting(cfg, "filtered_eval_sets")).split(",") if n.strip()]


def evaluated_names(cfg: Any) -> list[str]:
  """Every name `eval_sets` returns for `cfg`: each eval set, then `<name>_filtered` for each filtered one."""
  return [*parse(corpora.setting(cfg, "eval_sets")), *(f"{name}_filtered" for name in filtered_names(cfg))]


def filtered_sets(cfg: Any, prepared: Prepared, streams: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """{<name>_filtered: `filtered(...)`} for each set `cfg.filtered_eval_sets` names."""
  names = filtered_names(cfg)
  if not names:
    return {}
  for name in names:
    if name not in streams:
      raise ValueError(
        f"data.filtered_eval_sets names {name!r}, which is neither val nor in data.eval_sets "
        f"({', '.join(n for n in streams if n != 'val') or 'none'}); name one of those"
      )
  seq_len = corpora.setting(cfg, "seq_len")
  if not seq_len:
    raise ValueError("data.filtered_eval_sets needs data.seq_len (the windows it filters); set model.T")
  seen_V = seen_tokens(
    prepared.tokens("train"), prepared.tokenizer.vocab_size, int(corpora.setting(cfg, "filter_sample_tokens"))
  )
  out = {}
  for name in names:
    out[f"{name}_filtered"] = filtered(streams[name], seen_V, int(seq_len))
    if out[f"{name}_filtered"].size == 0:
      raise ValueError(
        f"eval set {name!r}: every window holds a token the training sample never has, so "
        f"{name}_filtered is empty; raise data.filter_sample_tokens (0: the whole train stream)"
      )
  return out


def seen_tokens(train_stream: np.ndarray, vocab_size: int, sample_tokens: int = 0) -> np.ndarray:
  """A (vocab_size,) bool mask of the token ids in the training sample: the stream's first `sample_tokens` (0: all)."""
  sample = train_stream[:sample_tokens] if sample_tokens > 0 else train_stream
  seen_V = np.zeros(vocab_size, bool)
  seen_V[np.unique(np.asarray(sample))] = True
  return seen_V


def filtered(stream: np.ndarray, seen_V: np.ndarray, seq_len: int) -> np.ndarray:
  """The non-overlapping windows of seq_len + 1 tokens of `stream` (the ones evaluation reads) whose every token is
  seen, concatenated (so evaluation's windows of the result are exactly those)."""
  window = seq_len + 1
  windows_NxW = np.asarray(stream[: stream.shape[0] // window * window]).reshape(-1, window)
  return windows_NxW[seen_V[windows_NxW].all(axis=1)].reshape(-1)
