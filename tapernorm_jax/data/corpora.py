"""The corpora a config can name (`synthetic`, `tinystories`, `text`), as one `Corpus` interface."""

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tapernorm_jax.data import stories, text_files

SOURCES = ("synthetic", "tinystories", "text")
SPLITS = ("train", "validation")

# Every `cfg.data` field this package reads, with the value used where a config lacks it.
DEFAULTS: dict[str, Any] = dict(
    source="synthetic", data_dir="~/.cache/tapernorm_jax", manual_dir="", text_train="", text_valid="",
    text_separator="<|endoftext|>", synthetic_train_stories=20_000, synthetic_valid_stories=1_000,
    synthetic_seed=0, vocab_size=None, seq_len=None,
    tokenizer_model="bpe", tokenizer_train_bytes=100_000_000)  # the last two are optional extras


def setting(cfg: Mapping | Any, name: str) -> Any:
  """`cfg.<name>` (a ConfigDict or a dict), or its default when the config lacks the field."""
  value = cfg.get(name, None) if hasattr(cfg, "get") else getattr(cfg, name, None)
  return DEFAULTS[name] if value is None else value


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A source of documents per split, with a name for logs and a key that identifies its content."""

  name: str  # what logs and results call it; never ambiguous between corpora
  key: dict  # JSON-ready: equal keys mean equal documents
  documents: Callable[[str], Iterator[str]]  # split -> its documents, in a fixed order
  num_documents: Callable[[str], int | None]  # split -> how many (None if unknown without reading)


def synthetic(cfg: Any) -> Corpus:
  """The offline procedurally generated story corpus."""
  seed = int(setting(cfg, "synthetic_seed"))
  counts = {"train": int(setting(cfg, "synthetic_train_stories")),
            "validation": int(setting(cfg, "synthetic_valid_stories"))}
  for split, count in counts.items():
    if count <= 0:
      raise ValueError(f"the synthetic corpus needs at least one {split} story, got {count}")
  return Corpus(
      name=f"synthetic-stories(seed={seed},train={counts['train']},valid={counts['validation']})",
      key=dict(source="synthetic", seed=seed, generator_version=stories.GENERATOR_VERSION, **counts),
      documents=lambda split: stories.generate(counts[split], seed, split),
      num_documents=counts.get)


def text(cfg: Any) -> Corpus:
  """Local text files: `text_train` and `text_valid` (paths or globs) split on `text_separator`."""
  patterns = {"train": setting(cfg, "text_train"), "validation": setting(cfg, "text_valid")}
  separator = setting(cfg, "text_separator")
  for split, pattern in patterns.items():
    if not pattern:
      field = "text_train" if split == "train" else "text_valid"
      raise ValueError(f"data.source='text' needs data.{field}: a path or glob of {split} text files")
  paths = {split: text_files.resolve(p, f"{split} text files") for split, p in patterns.items()}
  return Corpus(
      name=f"text(train={patterns['train']},valid={patterns['validation']})",
      key=dict(source="text", separator=separator, files={s: text_files.file_fingerprint(p) for s, p in paths.items()}),
      documents=lambda split: text_files.read_documents(paths[split], separator),
      num_documents=lambda split: None)


def tinystories(cfg: Any) -> Corpus:
  """TinyStories V2 through its TFDS ArrayRecord dataset, built (and downloaded) on first use."""
  from tapernorm_jax.data import tinystories as ts  # imports tensorflow_datasets: only when asked for

  data_dir = Path(os.path.expanduser(setting(cfg, "data_dir")))
  manual_dir = setting(cfg, "manual_dir")

  def documents(split: str) -> Iterator[str]:
    ts.ensure_prepared(data_dir, manual_dir)
    yield from ts.documents(data_dir, split)

  return Corpus(
      name="tinystories", key=dict(source="tinystories", tfds=f"{ts.NAME}:{ts.TinyStories.VERSION}"),
      documents=documents, num_documents=lambda split: ts.num_documents(data_dir, split))


def from_config(cfg: Any) -> Corpus:
  """The corpus `cfg.source` names."""
  source = setting(cfg, "source")
  if source not in SOURCES:
    raise ValueError(f"data.source must be one of {SOURCES}, got {source!r}")
  return {"synthetic": synthetic, "text": text, "tinystories": tinystories}[source](cfg)
