"""A self-contained inference directory: (folded) variables, model config and tokenizer; no optimiser state.

    DIR/config.json        {"format": "tapernorm_jax.export", "version": 1, "model": {...}, "folded": ..., ...}
    DIR/variables/         Orbax checkpoint of {"params", "calib"} (plain arrays)
    DIR/model.safetensors  the same arrays with flat names, e.g. `params.block_0.attn.qkv`
    DIR/tokenizer/         the tokenizer, when one is given: `tokenizer.model` (SentencePiece) or
                           `vocab.json` + `merges.txt` (GPT-2's BPE); config.json names its kind
    DIR/manifest.json      the size and SHA-256 of every file above (`integrity.py`), checked before loading

Loading needs only the `model` package (and `sentencepiece` or `tokenizers` for the tokenizer): no training code.
DIR may be local or a URL (`gs://bucket/export`); a remote tokenizer is copied to a local directory to load.
"""

import dataclasses
import json
import os
import pathlib
import tempfile
import warnings
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import safetensors.flax
from etils import epath
from flax import traverse_util

from tapernorm_jax.storage import unreadable, run_files, integrity
from tapernorm_jax.model import ModelConfig, abstract_variables, check_matches
from tapernorm_jax.taper import fold as fold_lib
from tapernorm_jax.tokenizers.sentencepiece import SentencePiece

TOKENIZERS = {"sentencepiece": SentencePiece}  # kind → class with `load(directory)`; gpt2 is added lazily

PyTree = Any
FORMAT = "tapernorm_jax.export"  # the on-disk format name, kept from before the package split
VERSION = 2  # 2: norm parameters named gamma/gamma_tilde/beta (1: scale/scale_tilde/bias)
CONFIG_FILE = "config.json"
VARIABLES_DIR = "variables"
SAFETENSORS_FILE = "model.safetensors"
TOKENIZER_DIR = "tokenizer"


@dataclasses.dataclass
class Exported:
  """What an export directory holds, loaded."""

  variables: PyTree  # {"params": ..., "calib": ...}
  model_cfg: ModelConfig
  tokenizer_dir: epath.Path | None
  info: dict  # the whole config.json


def is_export(directory: str | os.PathLike) -> bool:
  """Whether `directory` holds an export (rather than, say, a training workdir)."""
  path = run_files.workdir_path(directory) / CONFIG_FILE
  return path.is_file() and json.loads(path.read_text()).get("format") == FORMAT


def interrupted(directory: epath.Path) -> bool:
  """Whether `directory` holds only what an interrupted `save` leaves: no config.json, nothing `save` does not write."""
  written = (VARIABLES_DIR, SAFETENSORS_FILE, TOKENIZER_DIR, integrity.MANIFEST, f"{CONFIG_FILE}.tmp-")
  names = [item.name for item in directory.iterdir()]
  return CONFIG_FILE not in names and all(name.startswith(written) for name in names)


def check_target(directory: str | os.PathLike) -> None:
  """Raises unless `directory` is new, empty or an interrupted export (which `save` writes again): an export never
  overwrites anything else."""
  directory = run_files.workdir_path(directory)
  if directory.exists() and not directory.is_dir():
    raise NotADirectoryError(f"{directory} is a file; give a new directory for the export")
  if directory.exists() and any(directory.iterdir()) and not interrupted(directory):
    what = "holds a complete export" if is_export(directory) else "exists and is not empty"
    raise FileExistsError(f"{directory} {what}; give a new directory (an export never overwrites one)")


def save(
  directory: str | os.PathLike,
  variables: PyTree,
  model_cfg: Any,
  *,
  fold: bool = True,
  tokenizer: Any = None,
  extra: dict | None = None,
) -> epath.Path:
  """Writes the model (folded first when `fold` and it has norms that fold) as an export; returns the directory."""
  cfg = ModelConfig.from_config(model_cfg)
  variables = nn.unbox(variables)
  variables = {"params": variables["params"], "calib": variables.get("calib", {})}
  folded = fold and cfg.foldable
  if folded:
    variables, cfg = fold_lib.fold(variables, cfg)
  else:
    check_matches(variables, cfg)
  directory = run_files.workdir_path(directory)
  check_target(directory)
  if directory.exists() and any(directory.iterdir()):
    warnings.warn(
      f"{directory} holds an export that was interrupted (no {CONFIG_FILE}); writing it again",
      RuntimeWarning,
      stacklevel=2,
    )
    directory.rmtree()
  directory.mkdir(parents=True, exist_ok=True)
  host = jax.tree.map(np.asarray, jax.device_get(variables))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(directory / VARIABLES_DIR, host)
  with run_files.atomic_path(directory / SAFETENSORS_FILE) as tmp:
    safetensors.flax.save_file(flatten(host), tmp, metadata={"format": FORMAT})
  if tokenizer is not None:  # anything with `kind` and `save(directory)`: SentencePiece or GPT2Tokenizer
    save_tokenizer(tokenizer, directory / TOKENIZER_DIR)
  info = dict(
    format=FORMAT,
    version=VERSION,
    model=cfg.to_dict(),
    folded=folded,
    tokenizer={"kind": tokenizer.kind, "dir": TOKENIZER_DIR} if tokenizer is not None else None,
    **(extra or {}),
  )
  integrity.record(directory)  # sizes and hashes of the files above; config.json, which marks the export, last
  run_files.write_json_atomically(directory / CONFIG_FILE, info)
  return directory


def load(directory: str | os.PathLike, source: str = "orbax") -> Exported:
  """Loads an export from its Orbax checkpoint (`source="orbax"`) or its safetensors file, after checking every file
  against the export's manifest: damage to what is read is an error naming the file, damage to the other copy a
  warning."""
  directory = run_files.workdir_path(directory)
  if not is_export(directory):
    raise FileNotFoundError(f"{directory} is not a {FORMAT} directory (no {CONFIG_FILE} with format={FORMAT!r})")
  info = json.loads((directory / CONFIG_FILE).read_text())
  if info["version"] != VERSION:
    raise ValueError(
      f"{directory} is export version {info['version']}; this code reads version {VERSION} (version 1 "
      "named the norm parameters scale/scale_tilde/bias, now gamma/gamma_tilde/beta): export the "
      "model again with this version"
    )
  cfg = ModelConfig.from_config(info["model"])
  if source not in ("orbax", "safetensors"):
    raise ValueError(f"source={source!r}: choose 'orbax' or 'safetensors'")
  where, other = (VARIABLES_DIR + "/", "safetensors") if source == "orbax" else (SAFETENSORS_FILE, "orbax")
  if problem := integrity.check(directory, (where, TOKENIZER_DIR + "/")):
    fix = "export the model again" + (f", or load it with source={other!r}" if problem.startswith(where) else "")
    raise unreadable.DamagedCheckpointError(f"the export in {directory} is damaged: {problem}; {fix}", None, problem)
  if problem := integrity.check(directory, (SAFETENSORS_FILE if source == "orbax" else VARIABLES_DIR + "/",)):
    warnings.warn(
      f"the export in {directory} is damaged: {problem}; loading its intact {where.rstrip('/')} "
      "copy instead, but export the model again before sharing it",
      RuntimeWarning,
      stacklevel=2,
    )
  unreadable.quiet_aborted_reads()
  try:
    if source == "orbax":
      with ocp.StandardCheckpointer() as checkpointer:
        variables = checkpointer.restore(directory / VARIABLES_DIR, restore_target(cfg))
    else:
      path = directory / SAFETENSORS_FILE  # read whole from an object store, memory-mapped locally
      local = not run_files.is_url(path)
      variables = unflatten(
        safetensors.flax.load_file(os.fspath(path)) if local else safetensors.flax.load(path.read_bytes())
      )
  except Exception as e:  # TensorStore, Orbax and safetensors errors: the files are not what was written
    reason = unreadable.read_error(e, os.fspath(directory / VARIABLES_DIR))
    raise unreadable.DamagedCheckpointError(
      f"the export in {directory} is damaged: {where} cannot be read ({reason}); "
      f"export the model again, or load it with source={other!r}",
      None,
      reason,
    ) from e
  check_matches(variables, cfg)
  tokenizer_dir = directory / info["tokenizer"]["dir"] if info.get("tokenizer") else None
  return Exported(variables=variables, model_cfg=cfg, tokenizer_dir=tokenizer_dir, info=info)


def restore_target(cfg: ModelConfig, device: jax.Device | None = None) -> PyTree:
  """ShapeDtypeStructs of the model's params and calib, placed on one device (a restore target)."""
  placement = jax.sharding.SingleDeviceSharding(device or jax.devices()[0])
  shapes = nn.unbox(abstract_variables(cfg))
  shapes = {"params": shapes["params"], "calib": shapes.get("calib", {})}
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placement), shapes)


def flatten(tree: PyTree) -> dict[str, Any]:
  """Nested dict → flat names joined by dots (`params.block_0.attn.qkv`)."""
  return {".".join(k): v for k, v in traverse_util.flatten_dict(tree).items()}


def unflatten(flat: dict[str, Any]) -> PyTree:
  """Flat dotted names → nested dict."""
  return traverse_util.unflatten_dict({tuple(k.split(".")): v for k, v in flat.items()})


def load_tokenizer(exported: Exported) -> Any:
  """The export's tokenizer (SentencePiece or GPT2Tokenizer), or None if it carries none."""
  if exported.tokenizer_dir is None:
    return None
  kind = exported.info["tokenizer"]["kind"]
  if kind == "gpt2":
    from tapernorm_jax.tokenizers.gpt2_bpe import GPT2Tokenizer  # needs `tokenizers`: only for GPT-2 exports

    TOKENIZERS["gpt2"] = GPT2Tokenizer
  if kind not in TOKENIZERS:
    raise ValueError(f"{exported.tokenizer_dir}: unknown tokenizer kind {kind!r}")
  directory = exported.tokenizer_dir
  return TOKENIZERS[kind].load(run_files.download_tree(directory) if run_files.is_url(directory) else directory)


def save_tokenizer(tokenizer: Any, directory: epath.Path) -> None:
  """Writes the tokenizer's files into the new `directory`: into a temporary one renamed into place locally (whole or
  absent under its name), through a local temporary one uploaded when it is remote."""
  if not run_files.is_url(directory):
    staging = epath.Path(run_files.staging_path(directory))
    staging.mkdir()
    tokenizer.save(staging)
    staging.rename(directory)
    return
  with tempfile.TemporaryDirectory(prefix="tapernorm-tokenizer-") as local:
    tokenizer.save(pathlib.Path(local))
    run_files.upload_tree(local, directory)
