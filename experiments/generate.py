"""Continue prompts with a trained model: `python -m experiments.generate --workdir=DIR --prompt="Once upon a time"`.

DIR is a training run directory (its latest checkpoint, or `--step`, is restored: params and
calib only, no optimiser state) or an export directory (`tapernorm_jax.export`). A model with
tapered norms is folded first. `--prompt` may be repeated (one batch, ragged lengths);
`--tokens=1,2,3` feeds token ids instead of text. `--export_dir` also saves the folded model.
"""

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from absl import app, flags, logging
import jax
import orbax.checkpoint as ocp

from tapernorm_jax import decode, export
from tapernorm_jax import fold as fold_lib
from tapernorm_jax.model import ModelConfig

PyTree = Any

_FLAGS: dict[str, Any] = {}  # filled by define_flags() when run as a script; importing defines no flags


def define_flags() -> dict[str, Any]:
  """The command-line flags (defined only when run as a script, so tests and other tools can import this module)."""
  return dict(
      workdir=flags.DEFINE_string("workdir", None, "Training run directory or export directory.", required=True),
      prompt=flags.DEFINE_multi_string("prompt", [], "Prompt text; repeat for a batch."),
      tokens=flags.DEFINE_multi_string("tokens", [], "Prompt as comma-separated token ids; repeat for a batch."),
      step=flags.DEFINE_integer("step", None, "Checkpoint step to load (default: the latest)."),
      max_new_tokens=flags.DEFINE_integer("max_new_tokens", 100, "Tokens to generate per prompt."),
      temperature=flags.DEFINE_float("temperature", 0.0, "Sampling temperature; 0 is greedy."),
      top_k=flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens (0: all)."),
      seed=flags.DEFINE_integer("seed", 0, "Sampling seed."),
      dtype=flags.DEFINE_string("dtype", None, "Compute dtype (default: the model config's; `auto` is bfloat16 on "
                                "accelerators, float32 on CPU)."),
      no_fold=flags.DEFINE_bool("no_fold", False, "Run the unfolded model at g = 0 instead of folding it."),
      export_dir=flags.DEFINE_string("export_dir", None, "Also write the (folded) model as an export here."),
  )


@dataclasses.dataclass
class Loaded:
  """A model ready to run: variables, config, tokenizer (if any) and the tokenizer file (for exports)."""

  variables: PyTree
  model_cfg: ModelConfig
  tokenizer: Any | None
  tokenizer_path: Path | None


def load_checkpoint(workdir: str, step: int | None = None) -> tuple[PyTree, dict]:
  """Restores only {"params", "calib"} of the `state` item at `step` (default: latest); returns (variables, config)."""
  workdir = os.path.abspath(os.path.expanduser(workdir))
  config_path = os.path.join(workdir, "config.json")
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f"{config_path} not found: --workdir must be a training run or an export directory")
  with open(config_path) as f:
    run_cfg = json.load(f)
  model_cfg = ModelConfig.from_config(run_cfg["model"])
  with ocp.CheckpointManager(os.path.join(workdir, "checkpoints")) as manager:
    step = manager.latest_step() if step is None else step
    if step is None or step not in manager.all_steps():
      raise FileNotFoundError(f"no checkpoint {'at step ' + str(step) if step is not None else ''} in "
                              f"{workdir}/checkpoints (steps: {sorted(manager.all_steps())})")
    target = export.restore_target(model_cfg)
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                                     partial_restore=True)))
  return dict(restored["state"]), {**run_cfg, "restored_step": step}


def run_tokenizer(run_cfg: dict) -> tuple[Any | None, Path | None]:
  """The training run's tokenizer through `tapernorm_jax.data.prepare` (None when it cannot be prepared)."""
  try:
    from tapernorm_jax import data
    prepared = data.prepare(run_cfg["data"])
  except Exception as e:  # the model still runs on --tokens
    print(f"(no tokenizer: {type(e).__name__}: {e}; pass --tokens)")
    return None, None
  return prepared.tokenizer, Path(prepared.path) / export.TOKENIZER_FILE


def load(path: str, step: int | None = None) -> Loaded:
  """Loads an export directory, or a training run's checkpoint with its tokenizer."""
  if export.is_export(path):
    exported = export.load(path)
    return Loaded(exported.variables, exported.model_cfg, export.load_tokenizer(exported), exported.tokenizer_path)
  variables, run_cfg = load_checkpoint(path, step)
  tokenizer, tokenizer_path = run_tokenizer(run_cfg)
  return Loaded(variables, ModelConfig.from_config(run_cfg["model"]), tokenizer, tokenizer_path)


def fold_if_tapered(variables: PyTree, cfg: ModelConfig) -> tuple[PyTree, ModelConfig]:
  """Folds a model with tapered norms (its g = 0 forward); other models come back unchanged."""
  if fold_lib.has_tapered_norms(cfg):
    return fold_lib.fold(variables, cfg)
  return variables, cfg


def encode_prompts(loaded: Loaded, texts: list[str], token_lists: list[str]) -> list[list[int]]:
  """Token ids per prompt: text through the tokenizer (after bos, as in training), or explicit ids."""
  prompts = [[int(t) for t in s.split(",") if t.strip()] for s in token_lists]
  if texts:
    if loaded.tokenizer is None:
      raise app.UsageError("this model has no tokenizer here; pass --tokens=1,2,3 instead of --prompt")
    prompts += [[loaded.tokenizer.bos_id] + loaded.tokenizer.encode(text) for text in texts]
  if not prompts:
    raise app.UsageError("give at least one --prompt or --tokens")
  return prompts


def continue_prompts(variables: PyTree, cfg: ModelConfig, prompts: list[list[int]], max_new_tokens: int,
                     temperature: float = 0.0, top_k: int = 0, seed: int = 0,
                     eos_id: int | None = None) -> list[list[int]]:
  """New tokens for each prompt (cut after EOS) from one jitted prefill-and-decode call."""
  prompt_BxP, lengths_B = decode.pad_prompts(prompts)
  tokens_BxN = decode.generate(variables, cfg, prompt_BxP, lengths_B, jax.random.key(seed),
                               max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, eos_id=eos_id)
  return decode.trim(jax.device_get(tokens_BxN), eos_id)


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every restore at INFO
  f = {name: holder.value for name, holder in _FLAGS.items()}
  loaded = load(f["workdir"], f["step"])
  variables, cfg = loaded.variables, loaded.model_cfg
  if not f["no_fold"]:
    variables, cfg = fold_if_tapered(variables, cfg)
  if f["export_dir"]:
    out = export.save(f["export_dir"], variables, cfg, fold=False, tokenizer_path=loaded.tokenizer_path)
    print(f"exported to {out}")
  if f["dtype"]:
    cfg = cfg.replace(dtype=f["dtype"])
  prompts = encode_prompts(loaded, f["prompt"], f["tokens"])
  tok = loaded.tokenizer
  eos_id = tok.eos_id if tok is not None else None
  outputs = continue_prompts(variables, cfg, prompts, f["max_new_tokens"], f["temperature"], f["top_k"], f["seed"],
                             eos_id)
  for prompt, new in zip(prompts, outputs):
    if tok is None:
      print(f"{prompt} → {new}")
    else:
      print(f"{tok.decode(prompt)}{tok.decode(new)}")
      print("-" * 40)


if __name__ == "__main__":
  _FLAGS.update(define_flags())
  app.run(main)
