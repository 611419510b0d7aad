"""The TinyStories TFDS builder on local files: manual dir, the download path (file:// URLs), and clear errors."""

import shutil
import urllib.error
from pathlib import Path

import pytest
import tensorflow_datasets as tfds

from tapernorm_jax import data
from tapernorm_jax.data import stories
from tapernorm_jax.data import tinystories as ts
from locations import SHARED_DATA

SAMPLE = SHARED_DATA / "tinystories" / "sample.txt"
TRAIN, VALID = ts.FILES["train"], ts.FILES["validation"]


def write_release(directory: Path, train: list[str], valid: list[str]) -> Path:
  """Writes the two raw files in the release format: each story followed by an `<|endoftext|>` line."""
  directory.mkdir(parents=True, exist_ok=True)
  for name, docs in ((TRAIN, train), (VALID, valid)):
    (directory / name).write_text("".join(f"{doc}\n<|endoftext|>\n" for doc in docs), encoding="utf-8")
  return directory


def read_back(data_dir: Path, split: str) -> list[str]:
  """The stories of `split` read with `tfds.data_source`."""
  source = tfds.data_source(ts.NAME, split=split, data_dir=str(data_dir / "tfds"), download=False)
  return [source[i]["text"].decode("utf-8") for i in range(len(source))]


def test_builder_from_manual_dir(tmp_path):
  train = list(stories.generate(40, seed=5))
  valid = list(stories.generate(7, seed=5, split="validation"))
  manual = write_release(tmp_path / "manual", train, valid)
  builder = ts.ensure_prepared(tmp_path / "cache", str(manual))
  assert builder.info.splits["train"].num_examples == 40
  assert sorted(read_back(tmp_path / "cache", "train")) == sorted(train)
  assert sorted(read_back(tmp_path / "cache", "validation")) == sorted(valid)
  assert sorted(ts.documents(tmp_path / "cache", "validation", block=3)) == sorted(valid)
  assert ts.num_documents(tmp_path / "cache", "validation") == 7


@pytest.mark.skipif(not SAMPLE.is_file(), reason="../shared/data/tinystories/sample.txt is not here")
def test_builder_on_the_real_sample(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  for name in (TRAIN, VALID):
    shutil.copy(SAMPLE, manual / name)
  ts.ensure_prepared(tmp_path / "cache", str(manual))
  expected = [s.strip() for s in SAMPLE.read_text(encoding="utf-8").split("<|endoftext|>") if s.strip()]
  assert len(expected) == 5
  got = read_back(tmp_path / "cache", "train")
  assert sorted(got) == sorted(expected)
  assert any("“Wow, that is a really amazing vase!" in s for s in got)


def test_download_path_with_a_file_url(tmp_path, monkeypatch):
  hub = write_release(tmp_path / "hub", list(stories.generate(20)), list(stories.generate(4, split="validation")))
  monkeypatch.setattr(ts, "BASE_URL", hub.as_uri() + "/")
  ts.ensure_prepared(tmp_path / "cache", "")
  downloads = tmp_path / "cache" / "downloads" / "tinystories"
  for name in (TRAIN, VALID):
    assert (downloads / name).read_bytes() == (hub / name).read_bytes()
  assert not list(downloads.glob("*.part"))
  assert len(read_back(tmp_path / "cache", "validation")) == 4


def test_prepare_tinystories_end_to_end(tmp_path):
  train, valid = list(stories.generate(300)), list(stories.generate(30, split="validation"))
  manual = write_release(tmp_path / "manual", train, valid)
  cfg = dict(source="tinystories", data_dir=str(tmp_path / "cache"), manual_dir=str(manual), vocab_size=500, seq_len=64)
  prepared = data.prepare(cfg)
  assert prepared.name == "tinystories"
  assert prepared.vocab_size == 500
  assert prepared.meta["splits"]["validation"]["num_documents"] == 30
  shutil.rmtree(manual)  # the cache needs neither the raw files nor the TFDS dataset again
  shutil.rmtree(tmp_path / "cache" / "tfds")
  assert data.prepare(cfg).num_tokens("train") == prepared.num_tokens("train")


def test_offline_without_manual_dir_names_everything(tmp_path, monkeypatch):
  def offline(url, timeout=None):
    raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

  monkeypatch.setattr(ts.urllib.request, "urlopen", offline)
  with pytest.raises(RuntimeError) as info:
    ts.ensure_prepared(tmp_path / "cache", "")
  message = str(info.value)
  downloads = str(tmp_path / "cache" / "downloads" / "tinystories")
  for needle in (
    ts.BASE_URL + TRAIN,
    downloads,
    "data.manual_dir is not set",
    "data.manual_dir=DIR",
    TRAIN,
    VALID,
    "source=synthetic",
  ):
    assert needle in message
  assert not (tmp_path / "cache" / "tfds" / ts.NAME / "1.0.0").exists()


def test_manual_dir_without_the_files_is_named(tmp_path, monkeypatch):
  monkeypatch.setattr(ts, "BASE_URL", (tmp_path / "nowhere").as_uri() + "/")
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / TRAIN).write_text("only the train file\n<|endoftext|>\n")
  with pytest.raises(RuntimeError, match=f"Looked in the manual directory {manual}.*{VALID}"):
    ts.ensure_prepared(tmp_path / "cache", str(manual))


def test_empty_file_is_a_clear_error(tmp_path):
  manual = write_release(tmp_path / "manual", ["A story."], ["Another."])
  (manual / VALID).write_text("")
  with pytest.raises(ValueError, match=f"validation file: these files are empty: .*{VALID}"):
    ts.ensure_prepared(tmp_path / "cache", str(manual))


def test_no_stories_fails_then_a_fixed_file_builds(tmp_path):
  manual = write_release(tmp_path / "manual", ["A story.", "Two."], [])
  (manual / VALID).write_text("\n<|endoftext|>\n  \n")
  with pytest.raises(Exception, match="holds no stories"):
    ts.ensure_prepared(tmp_path / "cache", str(manual))
  assert not ts.builder(tmp_path / "cache").is_prepared()  # the failed build is not taken as complete
  write_release(manual, ["A story.", "Two."], ["Fixed."])
  ts.ensure_prepared(tmp_path / "cache", str(manual))
  assert read_back(tmp_path / "cache", "validation") == ["Fixed."]


def test_non_utf8_bytes_are_replaced(tmp_path):
  manual = write_release(tmp_path / "manual", ["x"], ["y"])
  (manual / TRAIN).write_bytes(b"Bad \xff byte.\n<|endoftext|>\nGood.\n<|endoftext|>\n")
  ts.ensure_prepared(tmp_path / "cache", str(manual))
  assert sorted(read_back(tmp_path / "cache", "train")) == ["Bad \ufffd byte.", "Good."]
