"""`python -m tapernorm_jax.harness --model tapernorm --model_args path=RUN_OR_EXPORT_DIR,form=folded --tasks ...`:
lm-eval's command line (every flag of `lm_eval`) with the `tapernorm` model type registered, which the plain `lm_eval`
command cannot load (lm-eval 0.4 finds models only in its own package)."""

import sys


def main() -> None:
  """Registers the model type, then hands the arguments to lm-eval's own entry point."""
  from tapernorm_jax import harness  # registers `tapernorm` where lm-eval is installed

  if harness.missing:
    print(
      f"error: python -m tapernorm_jax.harness needs lm-eval: {harness.missing} is not installed; {harness.INSTALL}",
      file=sys.stderr,
    )
    sys.exit(2)
  from lm_eval.__main__ import cli_evaluate

  cli_evaluate()


if __name__ == "__main__":
  main()
