"""Continue prompts with a trained model: `python -m experiments.generate --workdir=DIR --prompt="Once upon a time"`.

DIR is a training run directory (its latest checkpoint, or `--step`, is restored: params and
calib only, no optimiser state) or an export directory (`tapernorm_jax.export`). A model with
tapered norms is folded first. `--prompt` may be repeated (one batch, ragged lengths);
`--tokens=1,2,3` feeds token ids instead of text. `--export_dir` also saves the folded model.
The library side: `tapernorm_jax/inference.py`.
"""

from absl import app, flags, logging

from tapernorm_jax import export, inference

_WORKDIR = flags.DEFINE_string("workdir", None, "Training run directory or export directory.", required=True)
_PROMPT = flags.DEFINE_multi_string("prompt", [], "Prompt text; repeat for a batch.")
_TOKENS = flags.DEFINE_multi_string("tokens", [], "Prompt as comma-separated token ids; repeat for a batch.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to load (default: the latest).")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 100, "Tokens to generate per prompt.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature; 0 is greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens (0: all).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_DTYPE = flags.DEFINE_string("dtype", None, "Compute dtype (default: the model config's; `auto` is bfloat16 on "
                             "accelerators, float32 on CPU).")
_NO_FOLD = flags.DEFINE_bool("no_fold", False, "Run the unfolded model at g = 0 instead of folding it.")
_EXPORT_DIR = flags.DEFINE_string("export_dir", None, "Also write the (folded) model as an export here.")


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every restore at INFO
  loaded = inference.load(_WORKDIR.value, _STEP.value)
  variables, cfg = loaded.variables, loaded.model_cfg
  if not _NO_FOLD.value:
    variables, cfg = inference.fold_if_tapered(variables, cfg)
  if _EXPORT_DIR.value:
    out = export.save(_EXPORT_DIR.value, variables, cfg, fold=False, tokenizer=loaded.tokenizer)
    print(f"exported to {out}")
  if _DTYPE.value:
    cfg = cfg.replace(dtype=_DTYPE.value)
  try:
    prompts = inference.encode_prompts(loaded, _PROMPT.value, _TOKENS.value)
  except ValueError as e:
    raise app.UsageError(f"{e} (--prompt or --tokens)") from None
  tok = loaded.tokenizer
  eos_id = tok.eos_id if tok is not None else None
  outputs = inference.continue_prompts(variables, cfg, prompts, _MAX_NEW_TOKENS.value, _TEMPERATURE.value,
                                       _TOP_K.value, _SEED.value, eos_id)
  for prompt, new in zip(prompts, outputs):
    if tok is None:
      print(f"{prompt} → {new}")
    else:
      print(f"{tok.decode(prompt)}{tok.decode(new)}")
      print("-" * 40)


if __name__ == "__main__":
  app.run(main)
