"""Prompts in, continuations out: token ids or text through the tokenizer, fitted to the model's context, continued by
one jitted prefill-and-decode call.

    variables, cfg = forms.inference_form(loaded.variables, loaded.model_cfg)
    outputs = prompts.continue_prompts(variables, cfg, prompts.encode_prompts(loaded, ["Once upon a time"]), 50)
"""

from typing import Any

import jax

from tapernorm_jax.inference import decode
from tapernorm_jax.cpu_kernels import few_rows
from tapernorm_jax.inference.loading import Loaded
from tapernorm_jax.model import ModelConfig

PyTree = Any


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


def fit_prompts(
  prompts: list[list[int]], cfg: ModelConfig, max_new_tokens: int, truncate: bool = False
) -> tuple[list[list[int]], str | None]:
  """The prompts, each within the model's context: model.T tokens (llama), or model.T − max_new_tokens + 1 (gpt2,
  whose learned positions must also hold the new tokens). A longer one is a ValueError naming it; with `truncate`
  it keeps its last tokens, and the returned note counts what was cut (None when nothing was)."""
  room = cfg.T - max_new_tokens + 1 if cfg.family == "gpt2" else cfg.T
  if room < 1:
    raise ValueError(
      f"max_new_tokens={max_new_tokens}: a gpt2 model with model.T={cfg.T} learned positions can "
      f"generate at most {cfg.T} tokens"
    )
  long = [(i, len(p)) for i, p in enumerate(prompts) if len(p) > room]
  if not long:
    return prompts, None
  what = f"model.T={cfg.T}" + (
    f" − max_new_tokens + 1 = {room}" if cfg.family == "gpt2" else ", the context this RoPE model was trained on"
  )
  if not truncate:
    i, n = long[0]
    others = f" ({len(long)} prompts are too long)" if len(long) > 1 else ""
    raise ValueError(
      f"prompt {i + 1} has {n} tokens, more than {what}{others}; shorten it, or keep its last {room} "
      "tokens (truncate=True)"
    )
  cut = [p[-room:] if len(p) > room else p for p in prompts]
  dropped = sum(n - room for _, n in long)
  return cut, (
    f"cut {len(long)} of {len(prompts)} prompt(s) to their last {room} tokens ({what}), dropping "
    f"{dropped} token(s) from their starts"
  )


def continue_prompts(
  variables: PyTree,
  cfg: ModelConfig,
  prompts: list[list[int]],
  max_new_tokens: int,
  temperature: float = 0.0,
  top_k: int = 0,
  seed: int = 0,
  eos_id: int | None = None,
) -> list[list[int]]:
  """New tokens for each prompt (cut after EOS) from one jitted prefill-and-decode call."""
  prompt_BxP, lengths_B = decode.pad_prompts(prompts)
  variables, projection = few_rows.prepare(variables, cfg, len(prompts))  # a few rows on CPU: faster products
  tokens_BxN = decode.generate(
    variables,
    cfg,
    prompt_BxP,
    lengths_B,
    jax.random.key(seed),
    max_new_tokens=max_new_tokens,
    temperature=temperature,
    top_k=top_k,
    eos_id=eos_id,
    projection=projection,
  )
  return decode.trim(jax.device_get(tokens_BxN), eos_id)
