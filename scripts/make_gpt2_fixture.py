"""Makes tests/fixtures/tiny_gpt2 (a tiny random Hugging Face GPT-2 and its logits); checks save_gpt2 output loads.

Dev-time only: needs PyTorch and transformers, which the package and the test suite never import.
Rerun it from the repository root in a separate venv:

    python3.11 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch==2.13.0 transformers numpy safetensors
    /tmp/hfvenv/bin/python scripts/make_gpt2_fixture.py

It writes `config.json` and `model.safetensors` (`save_pretrained`, keys with the `transformer.`
prefix) and `reference_logits.npz` (`ids` (2, 16) int32, `logits` (2, 16, 128) float32). The
model is deterministic (seed 0) and its LayerNorm γ, β and every bias are moved off their
initial 1 and 0 so that the import test sees them.

`--check_export DIR` instead loads DIR (written by `tapernorm_jax.hf.gpt2.save_gpt2` from the
fixture) with `GPT2LMHeadModel.from_pretrained` and prints its max logit difference from the
reference logits.
"""

import argparse
import pathlib

import numpy as np
import torch
import transformers

FIXTURE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny_gpt2"
SEED = 0
CONFIG = dict(
  vocab_size=128,
  n_positions=32,
  n_embd=64,
  n_layer=3,
  n_head=4,
  activation_function="gelu_new",
  layer_norm_epsilon=1e-5,
  resid_pdrop=0.0,
  embd_pdrop=0.0,
  attn_pdrop=0.0,
  bos_token_id=127,
  eos_token_id=127,
  tie_word_embeddings=True,
)
BATCH, LENGTH = 2, 16


def make_model() -> transformers.GPT2LMHeadModel:
  """A seeded random GPT-2 whose LayerNorm weights and all biases are perturbed away from 1 and 0."""
  torch.manual_seed(SEED)
  model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG, attn_implementation="eager")).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias"):
        p.copy_(0.1 * torch.randn_like(p))
      elif ".ln_" in name or name.startswith("transformer.ln_f"):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
  return model


def reference_ids() -> torch.Tensor:
  """The fixed (2, 16) batch of token ids."""
  return torch.randint(0, CONFIG["vocab_size"], (BATCH, LENGTH), generator=torch.Generator().manual_seed(SEED + 1))


def logits_of(model: transformers.GPT2LMHeadModel, ids_BxT: torch.Tensor) -> np.ndarray:
  """fp32 logits of `model` on ids."""
  with torch.no_grad():
    return model(ids_BxT).logits.float().numpy()


def make_fixture(out: pathlib.Path) -> None:
  """Saves the model with save_pretrained and its reference logits into `out`."""
  model = make_model()
  out.mkdir(parents=True, exist_ok=True)
  model.save_pretrained(out, safe_serialization=True)
  for extra in out.iterdir():  # keep only what the loader reads (e.g. drop generation_config.json)
    if extra.name not in ("config.json", "model.safetensors"):
      extra.unlink()
  ids_BxT = reference_ids()
  logits_BxTxV = logits_of(model, ids_BxT)
  reloaded = transformers.GPT2LMHeadModel.from_pretrained(out, attn_implementation="eager").eval()
  assert np.array_equal(logits_of(reloaded, ids_BxT), logits_BxTxV), "save_pretrained did not round-trip"
  np.savez(out / "reference_logits.npz", ids=ids_BxT.numpy().astype(np.int32), logits=logits_BxTxV)
  sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
  print(f"wrote {out}: {sizes}")


def check_export(directory: pathlib.Path, fixture: pathlib.Path) -> None:
  """Loads a save_gpt2 directory with transformers; prints its max logit difference from the reference."""
  reference = np.load(fixture / "reference_logits.npz")
  model = transformers.GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager").eval()
  logits_BxTxV = logits_of(model, torch.from_numpy(reference["ids"]).long())
  diff = np.abs(logits_BxTxV - reference["logits"]).max()
  print(
    f"{directory}: GPT2LMHeadModel.from_pretrained loads it; max |logits − reference| = {diff:.3g} "
    f"(max |reference| = {np.abs(reference['logits']).max():.3g})"
  )


def main() -> None:
  """Makes the fixture, or with --check_export checks an exported directory."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path, default=FIXTURE, help="fixture directory")
  parser.add_argument("--check_export", type=pathlib.Path, default=None, help="a save_gpt2 output directory")
  args = parser.parse_args()
  if args.check_export is not None:
    check_export(args.check_export, args.out)
  else:
    make_fixture(args.out)


if __name__ == "__main__":
  main()
