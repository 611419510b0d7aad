"""TinyStories as a TFDS ArrayRecord dataset (no TensorFlow), from the released text files.

The raw files `TinyStoriesV2-GPT4-{train,valid}.txt` come from a manual directory when it
holds them, else they are downloaded from the dataset's hub location into
`<data_dir>/downloads/tinystories` (written as `.part`, renamed when complete). The builder
reads them from its manual dir, splits stories on `<|endoftext|>` and writes ArrayRecord
shards; TFDS builds in an `incomplete.*` directory and renames it when done. Read back with
`tfds.data_source`.
"""

import glob
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from etils import epath
import tensorflow_datasets as tfds
from tqdm import tqdm

from tapernorm_jax.data import text_files
from tapernorm_jax.errors import DownloadError

BASE_URL = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/"
FILES = {"train": "TinyStoriesV2-GPT4-train.txt", "validation": "TinyStoriesV2-GPT4-valid.txt"}
SEPARATOR = "<|endoftext|>"
NAME = "tiny_stories"  # the TFDS name of the builder below
DOWNLOAD_TIMEOUT_S = 60

log = logging.getLogger(__name__)


class TinyStories(tfds.core.GeneratorBasedBuilder):
  """TinyStories V2 (GPT-4 stories): one example per story, `{"text": str}`."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "TinyStoriesV2-GPT4 train/valid text files, split on <|endoftext|>."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = f"Place {FILES['train']} and {FILES['validation']} in the manual directory."

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    """This file. (tfds 4.9.10's own lookup imports the `importlib_resources` backport, absent on Python >= 3.9.)"""
    return epath.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    """Features and citation."""
    return tfds.core.DatasetInfo(
      builder=self,
      description="Short stories in simple English (Eldan & Li, 2023), GPT-4 generated subset.",
      features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
      homepage="https://huggingface.co/datasets/roneneldan/TinyStories",
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    """One generator per split over the raw file in the manual dir."""
    return {split: self._generate_examples(Path(dl_manager.manual_dir) / name) for split, name in FILES.items()}

  def _generate_examples(self, path: Path) -> Iterator[tuple[int, dict]]:
    """(index, {"text": story}) for each story of `path`; an error if it holds none."""
    count = 0
    for count, story in enumerate(text_files.read_documents([path], SEPARATOR), 1):
      yield count - 1, {"text": story}
    if count == 0:
      raise ValueError(f"{path} holds no stories (expected text separated by {SEPARATOR!r} lines)")


def check_raw_dir(directory: Path) -> None:
  """A clear error unless `directory` holds both raw files, non-empty."""
  for split, name in FILES.items():
    text_files.resolve(glob.escape(str(directory / name)), f"the TinyStories {split} file")


def download_file(url: str, dest: Path) -> None:
  """Downloads `url` to `dest` through a `.part` file renamed on completion."""
  part = dest.with_name(dest.name + ".part")
  with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, open(part, "wb") as f:
    total = int(response.headers.get("Content-Length") or 0) or None
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"downloading {dest.name}") as bar:
      while block := response.read(1 << 20):
        f.write(block)
        bar.update(len(block))
  os.replace(part, dest)


def raw_dir(data_dir: Path, manual_dir: str = "") -> Path:
  """A directory holding both raw files: the manual dir if it has them, else a download; one clear error if neither."""
  manual = Path(os.path.expanduser(manual_dir)) if manual_dir else None
  if manual is not None and all((manual / name).is_file() for name in FILES.values()):
    check_raw_dir(manual)
    return manual
  downloads = Path(data_dir) / "downloads" / "tinystories"
  downloads.mkdir(parents=True, exist_ok=True)
  url = ""
  try:
    for name in FILES.values():
      if not (downloads / name).is_file():
        url = BASE_URL + name
        log.info("downloading %s", url)
        download_file(url, downloads / name)
  except (urllib.error.URLError, OSError) as e:
    looked = f"the manual directory {manual} and {downloads}" if manual else f"{downloads} (data.manual_dir is not set)"
    raise DownloadError(
      f"could not download TinyStories: fetching {url} failed ({e}). Looked in {looked}. "
      f"Offline, put {FILES['train']} and {FILES['validation']} in a directory and pass "
      f"--config.data.manual_dir=DIR, or train on the offline corpus with --config.data.source=synthetic."
    ) from None
  check_raw_dir(downloads)
  return downloads


def builder(data_dir: Path) -> TinyStories:
  """The builder whose prepared data lives under `<data_dir>/tfds`."""
  return TinyStories(data_dir=str(Path(data_dir) / "tfds"), file_format="array_record")


def ensure_prepared(data_dir: Path, manual_dir: str = "") -> TinyStories:
  """The builder, its ArrayRecord dataset built first if it is not yet complete."""
  ds_builder = builder(data_dir)
  if not ds_builder.is_prepared():
    raw = raw_dir(data_dir, manual_dir)
    log.info("building the TinyStories ArrayRecord dataset from %s into %s", raw, ds_builder.data_dir)
    ds_builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(raw)))
  return ds_builder


def documents(data_dir: Path, split: str, block: int = 1024) -> Iterator[str]:
  """The stories of `split` in the prepared dataset's (shuffled) record order, read with `tfds.data_source`."""
  source = tfds.data_source(NAME, split=split, data_dir=str(Path(data_dir) / "tfds"), download=False)
  for start in range(0, len(source), block):
    for example in source.__getitems__(range(start, min(start + block, len(source)))):
      yield example["text"].decode("utf-8")


def num_documents(data_dir: Path, split: str) -> int | None:
  """How many stories `split` of the prepared dataset holds (None before it is built)."""
  ds_builder = builder(data_dir)
  return ds_builder.info.splits[split].num_examples if ds_builder.is_prepared() else None
