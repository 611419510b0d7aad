"""OpenWebText from parquet: local shards, the Hub path (a fake download), the held-out split and the offline error."""

import json
import shutil
from pathlib import Path

from huggingface_hub import constants as hub_constants
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tapernorm_jax import data
from tapernorm_jax.data import corpora, stories
from tapernorm_jax.data import openwebtext as owt
from locations import SHARED_DATA

TRAIN_LAYOUT = "plain_text/train"


def documents(n: int, seed: int = 0) -> list[str]:
  """`n` distinct short documents."""
  return [f"Document {i}. {story}" for i, story in enumerate(stories.generate(n, seed=seed))]


def write_shards(directory: Path, docs: list[str], per_shard: int, layout: str = TRAIN_LAYOUT) -> list[Path]:
  """`docs` as parquet shards `<layout>/NNNN.parquet` (a `text` column and an extra one), small row groups."""
  (directory / layout).mkdir(parents=True, exist_ok=True)
  paths = []
  for k, start in enumerate(range(0, len(docs), per_shard)):
    rows = docs[start : start + per_shard]
    table = pa.table({"text": rows, "id": list(range(start, start + len(rows)))})
    paths.append(directory / layout / f"{k:04d}.parquet")
    pq.write_table(table, paths[-1], row_group_size=7)
  return paths


def owt_cfg(tmp_path: Path, **overrides) -> dict:
  """A small openwebtext `cfg.data`: a 5% held-out share so a few hundred documents give a validation split."""
  return (
    dict(source="openwebtext", data_dir=str(tmp_path / "cache"), validation_fraction=0.05, vocab_size=500, seq_len=32)
    | overrides
  )


class FakeHub:
  """Stands in for the Hub: lists the files under `root/<revision>` and copies them on download, counting calls."""

  def __init__(self, root: Path):
    self.root, self.listed, self.downloaded = root, [], []

  def list_files(self, revision: str) -> list[str]:
    self.listed.append(revision)
    base = self.root / revision.replace("/", "_")
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()) if base.is_dir() else []

  def download(self, revision: str, name: str, local_dir: Path) -> Path:
    self.downloaded.append(name)
    dest = Path(local_dir) / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(self.root / revision.replace("/", "_") / name, dest)
    return dest


@pytest.fixture
def hub(tmp_path, monkeypatch) -> FakeHub:
  fake = FakeHub(tmp_path / "hub")
  monkeypatch.setattr(owt, "list_hub_files", fake.list_files)
  monkeypatch.setattr(owt, "download_hub_file", fake.download)
  return fake


def test_read_texts_in_shard_order_skipping_empty_rows(tmp_path):
  docs = documents(30)
  paths = write_shards(tmp_path, [*docs[:10], "", *docs[10:]], per_shard=8)
  assert list(owt.read_texts(paths)) == docs
  pq.write_table(pa.table({"content": ["x"]}), tmp_path / "bad.parquet")
  with pytest.raises(ValueError, match="bad.parquet has no 'text' column"):
    list(owt.read_texts([tmp_path / "bad.parquet"]))


def test_held_out_split_is_deterministic_disjoint_and_complete(monkeypatch):
  docs = documents(2000)
  split = lambda s, seed=0, limit=None: list(owt.split_documents(docs, s, 0.05, seed, limit))  # noqa: E731
  train, valid = split("train"), split("validation")
  assert sorted(train + valid) == sorted(docs) and not set(train) & set(valid)
  assert 60 < len(valid) < 140  # about 5% of 2000
  assert split("validation") == valid and split("train") == train
  assert split("validation", seed=1) != valid
  monkeypatch.setattr(owt, "READ_BLOCK", 7)  # the draws do not depend on how the stream is cut into blocks
  assert split("validation") == valid
  assert split("train", limit=50) == train[:50] and split("validation", limit=8) == valid[:8]


def test_validation_takes_a_few_documents_even_when_capped():
  assert owt.validation_limit(0, 0.0005) is None
  assert owt.validation_limit(1000, 0.0005) == owt.MIN_VALIDATION_DOCUMENTS
  assert owt.validation_limit(1_000_000, 0.0005) == 500
  with pytest.raises(ValueError, match="no OpenWebText document was held out .* raise data.validation_fraction"):
    list(owt.split_documents(documents(20), "validation", 0.0005, 0, None))


def test_prepare_from_a_manual_dir(tmp_path):
  docs = documents(400)
  write_shards(tmp_path / "owt", docs, per_shard=150)
  cfg = owt_cfg(tmp_path, manual_dir=str(tmp_path / "owt"), max_documents=100)
  prepared = data.prepare(cfg)
  assert prepared.name == "openwebtext(max_documents=100)"
  assert prepared.meta["splits"]["train"]["num_documents"] == 100
  assert prepared.meta["splits"]["validation"]["num_documents"] == owt.MIN_VALIDATION_DOCUMENTS
  expected = list(owt.split_documents(docs, "validation", 0.05, corpora.DEFAULTS["validation_seed"], 8))
  tok, tokens = prepared.tokenizer, np.asarray(prepared.tokens("validation"))
  bos, eos = np.flatnonzero(tokens == tok.bos_id), np.flatnonzero(tokens == tok.eos_id)
  assert [tok.decode(tokens[b + 1 : e]) for b, e in zip(bos, eos)] == expected
  full = data.prepare(cfg | dict(max_documents=0))
  assert full.name == "openwebtext" and full.path != prepared.path
  assert full.meta["splits"]["train"]["num_documents"] + full.meta["splits"]["validation"]["num_documents"] == 400


def test_hub_path_downloads_only_the_shards_it_reads(tmp_path, hub, monkeypatch):
  docs = documents(600)
  write_shards(tmp_path / "hub" / "refs_convert_parquet", docs, per_shard=100)
  (tmp_path / "hub" / "refs_convert_parquet" / "plain_text" / "README.md").write_text("not a shard")
  monkeypatch.setattr(owt, "READ_BLOCK", 16)
  prepared = data.prepare(owt_cfg(tmp_path, max_documents=50))
  downloads = tmp_path / "cache" / "downloads" / "openwebtext"
  manifest = json.loads((downloads / owt.MANIFEST).read_text())
  assert manifest["revision"] == "refs/convert/parquet"
  assert manifest["files"] == [f"{TRAIN_LAYOUT}/{k:04d}.parquet" for k in range(6)]
  assert hub.listed == ["refs/convert/parquet"]
  assert hub.downloaded and hub.downloaded == manifest["files"][: len(hub.downloaded)] and len(hub.downloaded) < 6
  assert prepared.meta["splits"]["train"]["num_documents"] == 50
  hub.listed.clear()
  full = data.prepare(owt_cfg(tmp_path))  # the manifest is reused; downloaded shards are kept
  assert hub.listed == [] and sorted(hub.downloaded) == manifest["files"]
  assert sum(full.meta["splits"][s]["num_documents"] for s in corpora.SPLITS) == 600


def test_hub_falls_back_to_a_partial_conversion(tmp_path, hub, caplog):
  write_shards(
    tmp_path / "hub" / "refs_convert_parquet", documents(40), per_shard=20, layout="plain_text/partial-train"
  )
  revision, names = owt.hub_shards(tmp_path / "downloads")
  assert revision == "refs/convert/parquet" and names == [
    "plain_text/partial-train/0000.parquet",
    "plain_text/partial-train/0001.parquet",
  ]
  assert hub.listed == ["refs/convert/parquet", "main"] and "partial parquet conversion" in caplog.text


def test_hub_without_shards_is_a_clear_error(tmp_path, hub):
  with pytest.raises(FileNotFoundError, match="Skylion007/openwebtext holds no parquet shards .*manual_dir=DIR"):
    owt.hub_shards(tmp_path / "downloads")


def test_offline_error_names_the_repo_the_files_and_manual_dir(tmp_path, monkeypatch):
  monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)  # the real client, refusing to connect
  with pytest.raises(RuntimeError) as info:
    data.prepare(owt_cfg(tmp_path))
  message = str(info.value)
  for needle in (
    "Skylion007/openwebtext",
    "plain_text/train/*.parquet at revision refs/convert/parquet",
    "plain_text/partial-train/*.parquet",
    "OfflineModeIsEnabled",
    "--config.data.manual_dir=DIR",
    "hf download Skylion007/openwebtext --repo-type dataset --revision refs/convert/parquet",
  ):
    assert needle in message
  assert not (tmp_path / "cache" / "downloads" / "openwebtext" / owt.MANIFEST).exists()


def test_failed_download_names_the_file(tmp_path, hub, monkeypatch):
  write_shards(tmp_path / "hub" / "refs_convert_parquet", documents(40), per_shard=20)

  def offline(revision, name, local_dir):
    raise OSError("[Errno -2] Name or service not known")

  monkeypatch.setattr(owt, "download_hub_file", offline)
  with pytest.raises(RuntimeError, match="could not download plain_text/train/0000.parquet .*manual_dir=DIR"):
    data.prepare(owt_cfg(tmp_path))


def test_bad_fields_and_manual_dirs_are_clear_errors(tmp_path):
  with pytest.raises(ValueError, match="data.max_documents must be >= 0"):
    data.prepare(owt_cfg(tmp_path, max_documents=-1))
  with pytest.raises(ValueError, match="data.validation_fraction must be in"):
    data.prepare(owt_cfg(tmp_path, validation_fraction=0.0))
  with pytest.raises(FileNotFoundError, match="is not a directory"):
    data.prepare(owt_cfg(tmp_path, manual_dir=str(tmp_path / "missing")))
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="holds no \\*.parquet files"):
    data.prepare(owt_cfg(tmp_path, manual_dir=str(tmp_path / "empty")))


GPT2_DIR = SHARED_DATA / "gpt2"


@pytest.mark.skipif(not (GPT2_DIR / "vocab.json").is_file(), reason="../shared/data/gpt2 is not here")
def test_gpt2_tokens_put_one_eot_after_each_document(tmp_path):
  docs = [*documents(60), "A page quoting <|endoftext|> as text."]
  write_shards(tmp_path / "owt", docs, per_shard=30)
  prepared = data.prepare(
    owt_cfg(
      tmp_path,
      manual_dir=str(tmp_path / "owt"),
      tokenizer="gpt2",
      tokenizer_dir=str(GPT2_DIR),
      vocab_size=50257,
      validation_fraction=0.2,
    )
  )
  tok = prepared.tokenizer
  train = list(owt.split_documents(docs, "train", 0.2, corpora.DEFAULTS["validation_seed"], None))
  assert docs[-1] in train  # its literal `<|endoftext|>` is text: no EOT inside it
  tokens = np.asarray(prepared.tokens("train"))
  assert tokens.tolist() == [i for doc in train for i in (*tok.encode(doc), tok.eos_id)]
  assert np.count_nonzero(tokens == tok.eos_id) + prepared.meta["splits"]["validation"]["num_documents"] == len(docs)
