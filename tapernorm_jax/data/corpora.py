"""The corpora a config can name (`synthetic`, `tinystories`, `text`, `openwebtext`), as one `Corpus` interface."""

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tapernorm_jax.storage import run_files
from tapernorm_jax.data import stories, text_files

SOURCES = ("synthetic", "tinystories", "text", "openwebtext")
SPLITS = ("train", "validation")

# Every `cfg.data` field this package reads, with the value used where a config lacks it.
DEFAULTS: dict[str, Any] = dict(
  source="synthetic",  # one of SOURCES
  data_dir="",  # prepared corpora, eval sets and downloads live here ("": run_files.cache_dir())
  manual_dir="",  # tinystories: a directory with the raw text files; openwebtext: a directory of parquet files
  text_train="",
  text_valid="",  # source=text: path or glob of the train / validation text files
  text_separator="<|endoftext|>",  # splits text files (source=text and eval_sets) into documents
  synthetic_train_stories=20_000,
  synthetic_valid_stories=1_000,
  synthetic_seed=0,  # source=synthetic
  max_documents=0,  # openwebtext: read at most this many training documents (0 = all)
  validation_fraction=0.0005,  # openwebtext: share of documents held out as the validation split (nanoGPT's)
  validation_seed=2357,  # openwebtext: seed of the held-out draw
  tokenizer="sentencepiece",  # "sentencepiece" (trained on the corpus) or "gpt2" (fixed, from tokenizer_dir)
  tokenizer_dir="gpt2",  # tokenizer=gpt2: a directory with vocab.json + merges.txt, or a hub name
  eval_sets="",  # named held-out sets "name=path_or_glob,...", tokenized with the run's tokenizer
  filtered_eval_sets="",  # names among eval_sets also evaluated as <name>_filtered (evaluation_sets.filtered)
  filter_sample_tokens=0,  # the training sample those filters read: the train stream's first N tokens (0: all)
  tune_frac=0.0,  # > 0: this share of the train stream's tail (whole documents) is held out as the `tune` split,
  # which tuning studies select on; training never reads it, and the reported validation split is untouched
  vocab_size=None,
  seq_len=None,  # set by tapernorm_jax/train/run_config.py from model.V and model.T
  tokenizer_model="bpe",
  tokenizer_train_bytes=100_000_000,
)  # tokenizer=sentencepiece: model type, training text


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
  counts = {
    "train": int(setting(cfg, "synthetic_train_stories")),
    "validation": int(setting(cfg, "synthetic_valid_stories")),
  }
  for split, count in counts.items():
    if count <= 0:
      raise ValueError(f"the synthetic corpus needs at least one {split} story, got {count}")
  return Corpus(
    name=f"synthetic-stories(seed={seed},train={counts['train']},valid={counts['validation']})",
    key=dict(source="synthetic", seed=seed, generator_version=stories.GENERATOR_VERSION, **counts),
    documents=lambda split: stories.generate(counts[split], seed, split),
    num_documents=counts.get,
  )


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
    num_documents=lambda split: None,
  )


def data_directory(cfg: Any) -> Path:
  """`data.data_dir`, or the cache directory where it is empty (a local path; a URL is refused naming the field)."""
  return run_files.local_path(setting(cfg, "data_dir") or run_files.cache_dir(), "data.data_dir")


def tinystories(cfg: Any) -> Corpus:
  """TinyStories V2 through its TFDS ArrayRecord dataset, built (and downloaded) on first use."""
  from tapernorm_jax.data import tinystories as ts  # imports tensorflow_datasets: only when asked for

  data_dir = data_directory(cfg)
  manual_dir = setting(cfg, "manual_dir")

  def documents(split: str) -> Iterator[str]:
    ts.ensure_prepared(data_dir, manual_dir)
    yield from ts.documents(data_dir, split)

  return Corpus(
    name="tinystories",
    key=dict(source="tinystories", tfds=f"{ts.NAME}:{ts.TinyStories.VERSION}"),
    documents=documents,
    num_documents=lambda split: ts.num_documents(data_dir, split),
  )


def openwebtext(cfg: Any) -> Corpus:
  """OpenWebText from the Hub's parquet conversion (or the parquet files in `manual_dir`), validation held out."""
  from tapernorm_jax.data import openwebtext as owt  # imports pyarrow: only when asked for

  max_documents = int(setting(cfg, "max_documents"))
  fraction, seed = float(setting(cfg, "validation_fraction")), int(setting(cfg, "validation_seed"))
  if max_documents < 0:
    raise ValueError(f"data.max_documents must be >= 0 (0 = all documents), got {max_documents}")
  if not 0 < fraction < 1:
    raise ValueError(f"data.validation_fraction must be in (0, 1), got {fraction}; nanoGPT holds out 0.0005")
  manual_dir = setting(cfg, "manual_dir")
  if manual_dir:
    paths = owt.local_paths(manual_dir)
    origin = dict(files=text_files.file_fingerprint(paths))
    shards = lambda: iter(paths)  # noqa: E731
  else:
    downloads = data_directory(cfg) / "downloads" / "openwebtext"
    origin = dict(repo=owt.REPO, layouts=owt.LAYOUTS)
    shards = lambda: owt.hub_paths(downloads)  # noqa: E731
  limits = {"train": max_documents or None, "validation": owt.validation_limit(max_documents, fraction)}
  return Corpus(
    name="openwebtext" + (f"(max_documents={max_documents})" if max_documents else ""),
    key=dict(
      source="openwebtext",
      version=owt.VERSION,
      **origin,
      max_documents=max_documents,
      validation_fraction=fraction,
      validation_seed=seed,
      min_validation=owt.MIN_VALIDATION_DOCUMENTS,
    ),
    documents=lambda split: owt.split_documents(owt.read_texts(shards()), split, fraction, seed, limits[split]),
    num_documents=lambda split: limits[split] if split == "train" else None,
  )


def from_config(cfg: Any) -> Corpus:
  """The corpus `cfg.source` names."""
  source = setting(cfg, "source")
  if source not in SOURCES:
    raise ValueError(f"data.source must be one of {SOURCES}, got {source!r}")
  return {"synthetic": synthetic, "text": text, "tinystories": tinystories, "openwebtext": openwebtext}[source](cfg)
