"""Continue prompts with a trained model: `python -m experiments.generate --workdir=DIR --prompt="Once upon a time"`.

DIR is a training run directory (its latest checkpoint, or `--step`, is restored: params and
calib only, no optimiser state) or an export directory (`tapernorm_jax.inference.export`). A model with
tapered norms is folded first. `--prompt` may be repeated (one batch, ragged lengths);
`--tokens=1,2,3` feeds token ids instead of text. `--export_dir` also saves the folded model.
A prompt longer than the model's context (model.T; for gpt2, model.T − max_new_tokens + 1) is
refused, or with `--truncate_prompts` keeps its last tokens, with a warning that counts them.
The library side: `tapernorm_jax/inference/ (loading.py, forms.py, prompts.py)`.
"""

from absl import app, flags, logging

from tapernorm_jax import cli
from tapernorm_jax.inference import decode, export, forms, loading
from tapernorm_jax.inference import prompts as prompts_lib
from tapernorm_jax.model.config import DTYPES

_WORKDIR = flags.DEFINE_string("workdir", None, "Training run directory or export directory.", required=True)
_PROMPT = flags.DEFINE_multi_string("prompt", [], "Prompt text; repeat for a batch.")
_TOKENS = flags.DEFINE_multi_string("tokens", [], "Prompt as comma-separated token ids; repeat for a batch.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to load (default: the latest).")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 100, "Tokens to generate per prompt.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature; 0 is greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens (0: all).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_DTYPE = flags.DEFINE_string(
  "dtype", None, "Compute dtype (default: the model config's; `auto` is bfloat16 on accelerators, float32 on CPU)."
)
_NO_FOLD = flags.DEFINE_bool("no_fold", False, "Run the unfolded model at g = 0 instead of folding it.")
_EXPORT_DIR = flags.DEFINE_string("export_dir", None, "Also write the (folded) model as an export here.")
_TRUNCATE = flags.DEFINE_bool(
  "truncate_prompts",
  False,
  "Cut prompts longer than the model's context to their last tokens (with a warning) instead of refusing them.",
)


def check_sampling_flags() -> None:
  """--temperature, --top_k (against the vocabulary, once loaded) and --max_new_tokens, before anything is loaded."""
  try:
    decode.check_sampling(_TEMPERATURE.value, 0, 0)
    if _TOP_K.value < 0:
      raise ValueError(f"top_k={_TOP_K.value}: must be >= 0 (0 samples among all tokens)")
    if _MAX_NEW_TOKENS.value < 1:
      raise ValueError(f"max_new_tokens={_MAX_NEW_TOKENS.value}: must be >= 1")
  except ValueError as e:
    raise app.UsageError(f"--{e}") from None


def prompts_from_flags(loaded: loading.Loaded) -> list[list[int]]:
  """Token ids of every --tokens list, then of every --prompt text (after bos, as in training)."""
  prompts = []
  for text in _TOKENS.value:
    try:
      prompts.append(prompts_lib.parse_token_ids(text, loaded.model_cfg.V))
    except ValueError as e:
      raise app.UsageError(f"--tokens={e}") from None
  if _PROMPT.value and loaded.tokenizer is None:
    raise app.UsageError(
      f"--prompt={_PROMPT.value[0]!r}: {_WORKDIR.value} has no tokenizer here; give token ids "
      "with --tokens=1,2,3 instead"
    )
  return prompts + prompts_lib.encode_prompts(loaded, _PROMPT.value) if _PROMPT.value else prompts


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every restore at INFO
  check_sampling_flags()
  if not _PROMPT.value and not _TOKENS.value:
    raise app.UsageError("give a prompt: --prompt=TEXT or --tokens=1,2,3 (either may be repeated)")
  if _DTYPE.value and _DTYPE.value not in DTYPES:
    raise app.UsageError(f"--dtype={_DTYPE.value}: choose one of {', '.join(DTYPES)}")
  if _EXPORT_DIR.value:
    try:
      export.check_target(_EXPORT_DIR.value)
    except (NotADirectoryError, FileExistsError) as e:
      raise app.UsageError(f"--export_dir: {e}") from None
  loaded = loading.load(_WORKDIR.value, _STEP.value)
  variables, cfg = loaded.variables, loaded.model_cfg
  if not _NO_FOLD.value:
    variables, cfg = forms.inference_form(variables, cfg)
  try:
    decode.check_sampling(_TEMPERATURE.value, _TOP_K.value, cfg.V)
  except ValueError as e:
    raise app.UsageError(f"--{e}") from None
  prompts = prompts_from_flags(loaded)
  try:
    prompts, note = prompts_lib.fit_prompts(prompts, cfg, _MAX_NEW_TOKENS.value, truncate=_TRUNCATE.value)
  except ValueError as e:
    message = str(e).replace("(truncate=True)", "(--truncate_prompts)")
    raise app.UsageError(f"--{message}" if message.startswith("max_new_tokens=") else message) from None
  if note:
    logging.warning("%s", note)
  if _EXPORT_DIR.value:
    out = export.save(_EXPORT_DIR.value, variables, cfg, fold=False, tokenizer=loaded.tokenizer)
    print(f"exported to {out}")
  if _DTYPE.value:
    cfg = cfg.replace(dtype=_DTYPE.value)
  tok = loaded.tokenizer
  eos_id = tok.eos_id if tok is not None else None
  outputs = prompts_lib.continue_prompts(
    variables, cfg, prompts, _MAX_NEW_TOKENS.value, _TEMPERATURE.value, _TOP_K.value, _SEED.value, eos_id
  )
  for prompt, new in zip(prompts, outputs):
    if tok is None:
      print(f"{prompt} → {new}")
    else:
      print(f"{tok.decode(prompt)}{tok.decode(new)}")
      print("-" * 40)


if __name__ == "__main__":
  cli.run(main)
