"""OpenWebText (`Skylion007/openwebtext`) from parquet shards: the Hub's parquet conversion, or a local directory.

The dataset's own branch holds the original tar archives and a loading script; the Hub's dataset
viewer publishes a parquet conversion on the `refs/convert/parquet` branch, one document per row
in a `text` column: `plain_text/train/NNNN.parquet`, or `plain_text/partial-train/NNNN.parquet`
when only the first ~5 GB were converted. `LAYOUTS` lists where shards are looked for, in order;
the first layout with files is recorded in `<data_dir>/downloads/openwebtext/shards.json`, and each
shard is downloaded there when the reader first reaches it (a capped read fetches only the shards
it needs). `data.manual_dir` instead names a local directory of parquet files with a `text`
column (searched recursively, read in sorted path order).

OpenWebText has only a train split. Document `i` of the stream is held out for validation when
the `i`-th draw of `numpy.random.default_rng(validation_seed)` falls below `validation_fraction`
(nanoGPT holds out 0.05%); training gets every other document. With `max_documents = n > 0`,
training takes the first `n` training documents and validation the first
`max(MIN_VALIDATION_DOCUMENTS, ceil(fraction * n))` held-out ones, a prefix of the full split.
"""

import fnmatch
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tapernorm_jax.errors import DownloadError
from tapernorm_jax.storage.run_files import write_json_atomically

REPO = "Skylion007/openwebtext"
LAYOUTS = (  # (revision, glob) in the order tried
  ("refs/convert/parquet", "plain_text/train/*.parquet"),  # the dataset viewer's full conversion
  ("main", "data/train-*.parquet"),  # the repository itself, should it become parquet
  ("refs/convert/parquet", "plain_text/partial-train/*.parquet"),  # a partial conversion (first ~5 GB)
)
TEXT_COLUMN = "text"
MANIFEST = "shards.json"
READ_BLOCK = 1024  # rows per parquet read and per block of held-out draws
MIN_VALIDATION_DOCUMENTS = 8
VERSION = 1  # bump when the document order or the held-out rule changes

log = logging.getLogger(__name__)


def list_hub_files(revision: str) -> list[str]:
  """Every file of the dataset repository at `revision` (one Hub API call)."""
  import huggingface_hub

  return huggingface_hub.list_repo_files(REPO, repo_type="dataset", revision=revision)


def download_hub_file(revision: str, name: str, local_dir: Path) -> Path:
  """Downloads `name` at `revision` to `local_dir / name` (the Hub client renames a complete temporary file)."""
  import huggingface_hub

  return Path(huggingface_hub.hf_hub_download(REPO, name, repo_type="dataset", revision=revision, local_dir=local_dir))


def reason(error: Exception) -> str:
  """`Type: first line of the message`, for error messages."""
  text = str(error).strip()
  return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def offline_help() -> str:
  """How to read OpenWebText without internet access."""
  revision, pattern = LAYOUTS[0]
  return (
    f"Offline, download the shards on a machine that has internet access (`hf download {REPO} "
    f"--repo-type dataset --revision {revision} --include '{pattern}' --local-dir DIR`), copy DIR here and "
    f"pass --config.data.manual_dir=DIR: any directory of OpenWebText parquet files with a {TEXT_COLUMN!r} "
    "column."
  )


def hub_shards(downloads: Path) -> tuple[str, list[str]]:
  """(revision, shard names) of the first layout of `LAYOUTS` the Hub holds; listed once, then kept in a manifest."""
  import huggingface_hub.errors as hub_errors

  manifest = downloads / MANIFEST
  if manifest.is_file():
    saved = json.loads(manifest.read_text())
    return saved["revision"], saved["files"]
  listings: dict[str, list[str]] = {}
  tried = []
  for revision, pattern in LAYOUTS:
    tried.append(f"{pattern} at revision {revision}")
    if revision not in listings:
      try:
        listings[revision] = list_hub_files(revision)
      except hub_errors.RevisionNotFoundError:
        listings[revision] = []
      except Exception as e:  # offline: the Hub client raises OSError subclasses or its HTTP library's errors
        raise DownloadError(
          f"could not list the parquet shards of the Hugging Face dataset {REPO} ({reason(e)}); tried "
          f"{'; '.join(f'{p} at revision {r}' for r, p in LAYOUTS)}. {offline_help()}"
        ) from None
    names = sorted(name for name in listings[revision] if fnmatch.fnmatch(name, pattern))
    if names:
      if "partial-" in pattern:
        log.warning(
          "%s holds only a partial parquet conversion of OpenWebText (%s: %d shards, about the first 5 GB)",
          REPO,
          pattern,
          len(names),
        )
      downloads.mkdir(parents=True, exist_ok=True)
      write_json_atomically(str(manifest), dict(repo=REPO, revision=revision, pattern=pattern, files=names))
      return revision, names
  raise FileNotFoundError(
    f"the Hugging Face dataset {REPO} holds no parquet shards where expected (tried "
    f"{'; '.join(tried)}). {offline_help()}"
  )


def hub_paths(downloads: Path) -> Iterator[Path]:
  """The local path of each Hub shard, in order, each downloaded into `downloads` when first reached."""
  revision, names = hub_shards(downloads)
  for name in names:
    path = downloads / name
    if not path.is_file():
      log.info("downloading %s (revision %s) of %s", name, revision, REPO)
      try:
        path = download_hub_file(revision, name, downloads)
      except Exception as e:  # offline, or the Hub refused: same advice as for the listing
        raise DownloadError(
          f"could not download {name} (revision {revision}) of the Hugging Face dataset {REPO} "
          f"into {downloads} ({reason(e)}). {offline_help()}"
        ) from None
    yield path


def local_paths(manual_dir: str) -> list[Path]:
  """The parquet files under `manual_dir`, in sorted path order; a clear error if there are none."""
  directory = Path(os.path.expanduser(manual_dir))
  if not directory.is_dir():
    raise FileNotFoundError(
      f"data.manual_dir={manual_dir!r} is not a directory; for data.source='openwebtext' it "
      f"must hold OpenWebText's parquet files (or leave it empty to download them from {REPO})"
    )
  paths = sorted(
    p for p in directory.rglob("*.parquet") if p.is_file() and ".cache" not in p.relative_to(directory).parts
  )  # not the Hub client's own
  if not paths:
    raise FileNotFoundError(
      f"data.manual_dir={manual_dir!r} holds no *.parquet files; for data.source='openwebtext' "
      f"put OpenWebText's parquet shards there. {offline_help()}"
    )
  return paths


def read_texts(paths: Iterable[Path]) -> Iterator[str]:
  """The non-empty values of the `text` column of each parquet file, in order."""
  for path in paths:
    try:
      parquet = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
      raise ValueError(f"{path} is not a readable parquet file ({e}); delete or replace it") from None
    if TEXT_COLUMN not in parquet.schema_arrow.names:
      raise ValueError(
        f"{path} has no {TEXT_COLUMN!r} column (it has {parquet.schema_arrow.names}); OpenWebText's "
        f"parquet files hold one document per row in {TEXT_COLUMN!r}"
      )
    for batch in parquet.iter_batches(batch_size=READ_BLOCK, columns=[TEXT_COLUMN]):
      yield from filter(None, batch.column(0).to_pylist())


def validation_limit(max_documents: int, fraction: float) -> int | None:
  """How many held-out documents validation takes: all (None) when uncapped, else a few more than the fraction."""
  return max(MIN_VALIDATION_DOCUMENTS, math.ceil(fraction * max_documents)) if max_documents else None


def split_documents(texts: Iterable[str], split: str, fraction: float, seed: int, limit: int | None) -> Iterator[str]:
  """The documents of `split`: held out by seeded draws ("validation") or not ("train"), at most `limit`."""
  held_out = split == "validation"
  rng = np.random.default_rng(seed)
  it = iter(texts)
  count = 0
  while block := list(islice(it, READ_BLOCK)):
    for text, drawn in zip(block, rng.random(len(block)) < fraction):
      if drawn == held_out:
        yield text
        count += 1
        if count == limit:
          return
  if held_out and count == 0:
    raise ValueError(
      f"no OpenWebText document was held out for validation (data.validation_fraction={fraction}); "
      "raise data.validation_fraction or read more documents"
    )
