"""Models ready to run: loading a training run or an export, folding, prompts, continuation, and the inference forms.

    loaded = load("runs/x")                                   # a run's latest checkpoint, or an export directory
    variables, cfg = fold_if_tapered(loaded.variables, loaded.model_cfg)
    outputs = continue_prompts(variables, cfg, encode_prompts(loaded, ["Once upon a time"]), max_new_tokens=50)
"""

import dataclasses
import json
import os
from typing import Any

import flax.linen as nn
import jax
import orbax.checkpoint as ocp
from flax import traverse_util

from tapernorm_jax import damaged, files
from tapernorm_jax.inference import decode, export
from tapernorm_jax.inference.cpu_kernels import matvec
from tapernorm_jax.model import ModelConfig, Transformer, abstract_variables, param_paths
from tapernorm_jax.taper import fold as fold_lib

PyTree = Any
FORMS = ("baseline", "unfused", "folded", "identity")


@dataclasses.dataclass
class Loaded:
  """A model ready to run: variables, config and tokenizer (if any)."""

  variables: PyTree
  model_cfg: ModelConfig
  tokenizer: Any | None


def load_checkpoint(workdir: str | os.PathLike, step: int | None = None) -> tuple[PyTree, dict]:
  """Restores only {"params", "calib"} of the `state` item at `step` (default: latest) of a run directory, local or
  remote; returns (variables, config)."""
  workdir = files.workdir_path(workdir)
  config_path = workdir / "config.json"
  if not config_path.is_file():
    raise FileNotFoundError(f"{config_path} not found: --workdir must be a training run or an export directory")
  run_cfg = json.loads(config_path.read_text())
  model_cfg = ModelConfig.from_config(run_cfg["model"])
  directory = workdir / "checkpoints"
  with ocp.CheckpointManager(directory) as manager:
    steps = sorted(manager.all_steps())
    step = manager.latest_step() if step is None else step
    if step is None or step not in steps:
      raise FileNotFoundError(f"no checkpoint {'at step ' + str(step) if step is not None else ''} in "
                              f"{directory} (steps: {steps})")
    target = export.restore_target(model_cfg)
    damaged.quiet_aborted_reads()
    try:
      restored = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                                       partial_restore=True)))
    except Exception as e:  # TensorStore, JSON and Orbax errors: the files of this step are not what was written
      older = [s for s in steps if s < step]
      fix = f"load an older one with --step={older[-1]}" if older else "there is no older checkpoint"
      reason = damaged.read_error(e, os.fspath(directory / str(step)))
      raise damaged.DamagedCheckpointError(f"the checkpoint at step {step} in {directory} is damaged: {reason}; "
                                           f"{fix}", step, reason) from e
  return dict(restored["state"]), {**run_cfg, "restored_step": step}


def run_tokenizer(run_cfg: dict) -> Any | None:
  """The training run's tokenizer through `tapernorm_jax.data.prepare` (None when it cannot be prepared)."""
  try:
    from tapernorm_jax import data  # the training data stack: only when a run directory is loaded
    prepared = data.prepare(run_cfg["data"])
  except Exception as e:  # the model still runs on token ids
    print(f"(no tokenizer: {type(e).__name__}: {e}; pass token ids)")
    return None
  return prepared.tokenizer


def load(path: str | os.PathLike, step: int | None = None) -> Loaded:
  """Loads an export directory, or a training run's checkpoint with its tokenizer (either local or a URL)."""
  if export.is_export(path):
    exported = export.load(path)
    return Loaded(exported.variables, exported.model_cfg, export.load_tokenizer(exported))
  variables, run_cfg = load_checkpoint(path, step)
  return Loaded(variables, ModelConfig.from_config(run_cfg["model"]), run_tokenizer(run_cfg))


def fold_if_tapered(variables: PyTree, cfg: ModelConfig) -> tuple[PyTree, ModelConfig]:
  """Folds a model with tapered norms (its g = 0 forward); other models come back unchanged."""
  return fold_lib.fold(variables, cfg) if cfg.tapered else (variables, cfg)


def parse_token_ids(text: str, V: int) -> list[int]:
  """Comma-separated token ids, each in [0, V); ValueError naming the first bad one."""
  ids = []
  for item in filter(None, (t.strip() for t in text.split(","))):
    try:
      ids.append(int(item))
    except ValueError:
      raise ValueError(f"{text!r}: {item!r} is not a token id; give comma-separated integers") from None
    if not 0 <= ids[-1] < V:
      raise ValueError(f"{text!r}: token id {ids[-1]} is outside the vocabulary [0, {V})")
  return ids


def encode_prompts(loaded: Loaded, texts: list[str], token_lists: list[str] = ()) -> list[list[int]]:
  """Token ids per prompt: text through the tokenizer (after bos, as in training), or comma-separated ids."""
  prompts = [parse_token_ids(s, loaded.model_cfg.V) for s in token_lists]
  if texts:
    if loaded.tokenizer is None:
      raise ValueError("this model has no tokenizer here; give token ids instead of text")
    prompts += [[loaded.tokenizer.bos_id] + loaded.tokenizer.encode(text) for text in texts]
  if not prompts:
    raise ValueError("give at least one prompt (text or token ids)")
  return prompts


def fit_prompts(prompts: list[list[int]], cfg: ModelConfig, max_new_tokens: int,
                truncate: bool = False) -> tuple[list[list[int]], str | None]:
  """The prompts, each within the model's context: model.T tokens (llama), or model.T − max_new_tokens + 1 (gpt2,
  whose learned positions must also hold the new tokens). A longer one is a ValueError naming it; with `truncate`
  it keeps its last tokens, and the returned note counts what was cut (None when nothing was)."""
  room = cfg.T - max_new_tokens + 1 if cfg.family == "gpt2" else cfg.T
  if room < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens}: a gpt2 model with model.T={cfg.T} learned positions can "
                     f"generate at most {cfg.T} tokens")
  long = [(i, len(p)) for i, p in enumerate(prompts) if len(p) > room]
  if not long:
    return prompts, None
  what = f"model.T={cfg.T}" + (f" − max_new_tokens + 1 = {room}" if cfg.family == "gpt2" else
                                ", the context this RoPE model was trained on")
  if not truncate:
    i, n = long[0]
    others = f" ({len(long)} prompts are too long)" if len(long) > 1 else ""
    raise ValueError(f"prompt {i + 1} has {n} tokens, more than {what}{others}; shorten it, or keep its last {room} "
                     "tokens (truncate=True)")
  cut = [p[-room:] if len(p) > room else p for p in prompts]
  dropped = sum(n - room for _, n in long)
  return cut, (f"cut {len(long)} of {len(prompts)} prompt(s) to their last {room} tokens ({what}), dropping "
               f"{dropped} token(s) from their starts")


def continue_prompts(variables: PyTree, cfg: ModelConfig, prompts: list[list[int]], max_new_tokens: int,
                     temperature: float = 0.0, top_k: int = 0, seed: int = 0,
                     eos_id: int | None = None) -> list[list[int]]:
  """New tokens for each prompt (cut after EOS) from one jitted prefill-and-decode call."""
  prompt_BxP, lengths_B = decode.pad_prompts(prompts)
  if len(prompts) <= matvec.MAX_ROWS:  # decode steps of this few rows read each weight once (decode.py)
    variables = decode.with_matvec_weights(variables, cfg)
  tokens_BxN = decode.generate(variables, cfg, prompt_BxP, lengths_B, jax.random.key(seed),
                               max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, eos_id=eos_id)
  return decode.trim(jax.device_get(tokens_BxN), eos_id)


def perturbed(variables: PyTree, key: jax.Array, c_range: tuple[float, float] = (0.3, 3.0),
              spread: float = 0.3) -> PyTree:
  """Unboxed variables with every c drawn from `c_range` and every 1-D parameter (γ, γ̃, β, biases) moved by
  `spread`·N(0, 1): weights that look calibrated, so that every part of a fold or a form matters."""
  flat = traverse_util.flatten_dict(nn.unbox(variables))
  keys = iter(jax.random.split(key, len(flat)))
  out = {}
  for path, x in flat.items():
    k = next(keys)
    if path[0] == "calib" and path[-1] == param_paths.C:
      x = jax.random.uniform(k, x.shape, x.dtype, *c_range)
    elif path[0] == "params" and x.ndim == 1:
      x = x + spread * jax.random.normal(k, x.shape, x.dtype)
    out[path] = x
  return traverse_util.unflatten_dict(out)


def forms(variables: PyTree, cfg: ModelConfig) -> dict[str, tuple[PyTree, ModelConfig]]:
  """One set of tapered weights as `baseline` (plain norms), `unfused` (the g = 0 map as an explicit multiply),
  `folded` and `identity` (no norms: the upper bound), each with exactly the variables it reads."""
  if not cfg.tapered:
    raise ValueError(f"forms need a tapered model (internal_norm={cfg.internal_norm!r}, final_norm={cfg.final_norm!r})")
  plain = lambda mode: "plain" if mode in param_paths.CALIBRATED_MODES else mode
  configs = {"baseline": cfg.replace(internal_norm=plain(cfg.internal_norm), final_norm=plain(cfg.final_norm)),
             "unfused": cfg.fixed_form(), "identity": cfg.replace(internal_norm="identity", final_norm="identity")}
  out = {name: (select(variables, form_cfg), form_cfg) for name, form_cfg in configs.items()}
  out["folded"] = fold_lib.fold(variables, cfg)
  return {name: out[name] for name in FORMS}


def select(variables: PyTree, cfg: ModelConfig) -> PyTree:
  """The subset of `variables` that the model `cfg` reads."""
  flat = traverse_util.flatten_dict(variables)
  wanted = traverse_util.flatten_dict(nn.unbox(abstract_variables(cfg)))
  return traverse_util.unflatten_dict({k: flat[k] for k in wanted})


def last_token_logits(cfg: ModelConfig) -> Any:
  """A jitted last-token-logits forward (B×V): every block but the last on all positions, the rest on the last."""
  model = Transformer(cfg)

  def forward(variables: PyTree, tokens_BxT: jax.Array) -> jax.Array:
    h_Bx1xD = model.apply(variables, tokens_BxT, 0.0, method=Transformer.last_hidden)
    return model.apply(variables, h_Bx1xD, 0.0, method=Transformer.logits)[:, 0]

  return jax.jit(forward)
