"""A self-contained inference directory: (folded) variables, model config and tokenizer; no optimiser state.

    DIR/config.json        {"format": "tapernorm_jax.export", "version": 1, "model": {...}, "folded": ..., ...}
    DIR/variables/         Orbax checkpoint of {"params", "calib"} (plain arrays)
    DIR/model.safetensors  the same arrays with flat names, e.g. `params.block_0.attn.qkv`
    DIR/tokenizer/         the tokenizer, when one is given: `tokenizer.model` (SentencePiece) or
                           `vocab.json` + `merges.txt` (GPT-2's BPE); config.json names its kind

Loading needs only `model.py` (and `sentencepiece` or `tokenizers` for the tokenizer): no training code.
"""

import dataclasses
import json
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import safetensors.flax
from flax import traverse_util

from tapernorm_jax import damaged
from tapernorm_jax import fold as fold_lib
from tapernorm_jax import model
from tapernorm_jax.model import ModelConfig
from tapernorm_jax.tokenizer import SentencePiece

TOKENIZERS = {"sentencepiece": SentencePiece}  # kind → class with `load(directory)`; gpt2 is added lazily

PyTree = Any
FORMAT = "tapernorm_jax.export"
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
  tokenizer_dir: Path | None
  info: dict  # the whole config.json


def is_export(directory: str | Path) -> bool:
  """Whether `directory` holds an export (rather than, say, a training workdir)."""
  path = Path(directory) / CONFIG_FILE
  return path.is_file() and json.loads(path.read_text()).get("format") == FORMAT


def save(directory: str | Path, variables: PyTree, model_cfg: Any, *, fold: bool = True,
         tokenizer: Any = None, extra: dict | None = None) -> Path:
  """Writes the model (folded first when `fold` and it has tapered norms) as an export; returns the directory."""
  cfg = ModelConfig.from_config(model_cfg)
  variables = nn.unbox(variables)
  variables = {"params": variables["params"], "calib": variables.get("calib", {})}
  folded = fold and cfg.tapered
  if folded:
    variables, cfg = fold_lib.fold(variables, cfg)
  else:
    fold_lib.check_matches(variables, cfg)
  directory = Path(directory).absolute()
  if directory.exists() and not directory.is_dir():
    raise NotADirectoryError(f"{directory} is a file; give a new directory for the export")
  if directory.exists() and any(directory.iterdir()):
    raise FileExistsError(f"{directory} exists and is not empty; choose a new export directory")
  directory.mkdir(parents=True, exist_ok=True)
  host = jax.tree.map(np.asarray, jax.device_get(variables))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(directory / VARIABLES_DIR, host)
  safetensors.flax.save_file(flatten(host), str(directory / SAFETENSORS_FILE), metadata={"format": FORMAT})
  if tokenizer is not None:  # anything with `kind` and `save(directory)`: SentencePiece or GPT2Tokenizer
    (directory / TOKENIZER_DIR).mkdir()
    tokenizer.save(directory / TOKENIZER_DIR)
  info = dict(format=FORMAT, version=VERSION, model=dataclasses.asdict(cfg), folded=folded,
              tokenizer={"kind": tokenizer.kind, "dir": TOKENIZER_DIR} if tokenizer is not None else None,
              **(extra or {}))
  (directory / CONFIG_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
  return directory


def load(directory: str | Path, source: str = "orbax") -> Exported:
  """Loads an export from its Orbax checkpoint (`source="orbax"`) or its safetensors file."""
  directory = Path(directory).absolute()
  if not is_export(directory):
    raise FileNotFoundError(f"{directory} is not a {FORMAT} directory (no {CONFIG_FILE} with format={FORMAT!r})")
  info = json.loads((directory / CONFIG_FILE).read_text())
  if info["version"] != VERSION:
    raise ValueError(f"{directory} is export version {info['version']}; this code reads version {VERSION} (version 1 "
                     "named the norm parameters scale/scale_tilde/bias, now gamma/gamma_tilde/beta): export the "
                     "model again with this version")
  cfg = ModelConfig.from_config(info["model"])
  if source not in ("orbax", "safetensors"):
    raise ValueError(f"source={source!r}: choose 'orbax' or 'safetensors'")
  damaged.quiet_aborted_reads()
  try:
    if source == "orbax":
      with ocp.StandardCheckpointer() as checkpointer:
        variables = checkpointer.restore(directory / VARIABLES_DIR, restore_target(cfg))
    else:
      variables = unflatten(safetensors.flax.load_file(str(directory / SAFETENSORS_FILE)))
  except Exception as e:  # TensorStore, Orbax and safetensors errors: the files are not what was written
    where, other = (VARIABLES_DIR + "/", "safetensors") if source == "orbax" else (SAFETENSORS_FILE, "orbax")
    reason = damaged.read_error(e, str(directory / VARIABLES_DIR))
    raise damaged.DamagedCheckpointError(f"the export in {directory} is damaged: {where} cannot be read ({reason}); "
                                         f"export the model again, or load it with source={other!r}", None,
                                         reason) from e
  fold_lib.check_matches(variables, cfg)
  tokenizer_dir = directory / info["tokenizer"]["dir"] if info.get("tokenizer") else None
  return Exported(variables=variables, model_cfg=cfg, tokenizer_dir=tokenizer_dir, info=info)


def restore_target(cfg: ModelConfig, device: jax.Device | None = None) -> PyTree:
  """ShapeDtypeStructs of the model's params and calib, placed on one device (a restore target)."""
  placement = jax.sharding.SingleDeviceSharding(device or jax.devices()[0])
  shapes = nn.unbox(model.abstract_variables(cfg))
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
    from tapernorm_jax.gpt2_tokenizer import GPT2Tokenizer  # needs `tokenizers`: only for GPT-2 exports
    TOKENIZERS["gpt2"] = GPT2Tokenizer
  if kind not in TOKENIZERS:
    raise ValueError(f"{exported.tokenizer_dir}: unknown tokenizer kind {kind!r}")
  return TOKENIZERS[kind].load(exported.tokenizer_dir)
