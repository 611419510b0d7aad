"""The project's models as an lm-evaluation-harness model type, `tapernorm`: log-likelihoods through the model's own
forward, generation through its KV-cache decode, in the folded (inference) form or unfolded at g = 0.

    lm_eval.simple_evaluate(model="tapernorm", model_args="path=runs/x,form=folded", tasks=[...])  # after importing
    python -m tapernorm_jax.harness --model tapernorm --model_args path=runs/x --tasks lambada_openai    # the CLI
"""

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from lm_eval import utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from tapernorm_jax.errors import UserError
from tapernorm_jax.inference import forms, loading, prompts as prompts_lib
from tapernorm_jax.model import ModelConfig, Transformer

PyTree = Any
FORMS = ("folded", "unfolded")  # the inference form (norms folded away), or the trained model at g = 0


class HarnessError(UserError, ValueError):
  """A bad --model_args value; the message names it and the fix."""


@functools.partial(jax.jit, static_argnames="cfg")
def token_log_probs(
  variables: PyTree, cfg: ModelConfig, tokens_BxT: jax.Array, targets_BxT: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """log p(target | tokens up to it) at every position (B×T) and whether the target is the argmax there, at g = 0."""
  logits_BxTxV = Transformer(cfg).apply(variables, tokens_BxT, 0.0)
  log_probs_BxTxV = jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32), axis=-1)
  picked_BxT = jnp.take_along_axis(log_probs_BxTxV, targets_BxT[..., None], axis=-1)[..., 0]
  return picked_BxT, jnp.argmax(logits_BxTxV, axis=-1) == targets_BxT


def bucket(length: int, cap: int) -> int:
  """A padded length: the next power of two from 16, at most `cap` (few shapes, few compilations)."""
  return min(cap, max(16, 1 << (length - 1).bit_length()))


@register_model("tapernorm")
class TaperNormLM(TemplateLM):
  """A training run's latest checkpoint or an export directory, batched; `form`: folded or unfolded."""

  def __init__(
    self,
    path: str,
    form: str = "folded",
    batch_size: int | str = 8,
    step: int | str | None = None,
    max_length: int | str | None = None,
    **_: Any,
  ):
    super().__init__()
    if form not in FORMS:
      raise HarnessError(f"form={form!r}: choose {' or '.join(FORMS)} (folded: the norms folded away, as served)")
    loaded = loading.load(path, int(step) if step not in (None, "") else None)
    if loaded.tokenizer is None:
      raise HarnessError(
        f"path={path}: its tokenizer could not be loaded, and harness tasks are text; export the "
        "model with its tokenizer (experiments.generate --export_dir)"
      )
    self.variables, self.cfg = loaded.variables, loaded.model_cfg
    if form == "folded":
      self.variables, self.cfg = forms.inference_form(self.variables, self.cfg)
    self.tokenizer = loaded.tokenizer
    self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8  # "auto" → 8
    self.max_length = int(max_length) if max_length else self.cfg.T

  @property
  def eot_token_id(self) -> int:
    """The tokenizer's end of text."""
    return self.tokenizer.eos_id

  @property
  def prefix_token_id(self) -> int:
    """What an empty context starts from: the beginning-of-text token."""
    return self.tokenizer.bos_id

  def tok_encode(self, string: str, add_special_tokens: bool | None = None, **_: Any) -> list[int]:
    """Token ids, no bos/eos added."""
    return self.tokenizer.encode(string)

  def tok_decode(self, tokens: Sequence[int]) -> str:
    """Text of token ids."""
    return self.tokenizer.decode(tokens)

  def score(self, rows: Sequence[tuple[list[int], int]], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    """For each (tokens, n): the summed log-probability of the last n tokens given those before them, and whether
    each was the greedy choice; rows longer than max_length + 1 keep their last max_length + 1 tokens."""
    out: list[tuple[float, bool]] = [(0.0, True)] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))  # similar lengths share a padded shape
    for first in tqdm(range(0, len(order), self.batch_size), disable=disable_tqdm, desc="tapernorm: scoring"):
      chunk = order[first : first + self.batch_size]
      kept = [rows[i][0][-(self.max_length + 1) :] for i in chunk]
      T = bucket(max(len(k) - 1 for k in kept), self.max_length)
      tokens_BxT = np.zeros((self.batch_size, T), np.int32)
      targets_BxT = np.zeros((self.batch_size, T), np.int32)
      for b, k in enumerate(kept):
        tokens_BxT[b, : len(k) - 1], targets_BxT[b, : len(k) - 1] = k[:-1], k[1:]
      log_probs_BxT, greedy_BxT = jax.device_get(token_log_probs(self.variables, self.cfg, tokens_BxT, targets_BxT))
      for b, i in enumerate(chunk):
        end, n = len(kept[b]) - 1, rows[i][1]
        out[i] = (float(log_probs_BxT[b, end - n : end].sum()), bool(greedy_BxT[b, end - n : end].all()))
    return out

  def _loglikelihood_tokens(
    self, requests: Sequence[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **_: Any
  ) -> list[tuple[float, bool]]:
    """log p(continuation | context) of each (key, context tokens, continuation tokens)."""
    return self.score(
      [(context + continuation, len(continuation)) for _, context, continuation in requests], disable_tqdm
    )

  def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
    """log p(text) of each request's text, in windows of max_length tokens, each token predicted once."""
    windows, owners = [], []
    for i, request in enumerate(requests):
      (text,) = request.args
      for context, continuation in map(
        utils.make_disjoint_window,
        utils.get_rolling_token_windows(self.tok_encode(text), self.prefix_token_id, self.max_length, 1),
      ):
        windows.append((context + continuation, len(continuation)))
        owners.append(i)
    totals = [0.0] * len(requests)
    for owner, (log_prob, _) in zip(owners, self.score(windows, disable_tqdm)):
      totals[owner] += log_prob
    return totals

  def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
    """Greedy continuations through the KV-cache decode, batched by generation settings, each cut at the first of
    its request's stop sequences."""
    groups: dict[str, list[int]] = {}
    for i, request in enumerate(requests):
      groups.setdefault(repr(sorted(request.args[1].items())), []).append(i)
    out = [""] * len(requests)
    bar = tqdm(total=len(requests), disable=disable_tqdm, desc="tapernorm: generating")
    for members in groups.values():
      kwargs = requests[members[0]].args[1]
      until = kwargs.get("until") or [self.tok_decode([self.eot_token_id])]
      until = [until] if isinstance(until, str) else list(until)
      new = int(kwargs.get("max_gen_toks", 256))
      for first in range(0, len(members), self.batch_size):
        chunk = members[first : first + self.batch_size]
        prompts = [
          [self.prefix_token_id, *self.tok_encode(requests[i].args[0])][-max(1, self.max_length - new) :] for i in chunk
        ]
        for i, tokens in zip(
          chunk, prompts_lib.continue_prompts(self.variables, self.cfg, prompts, new, eos_id=self.eot_token_id)
        ):
          text = self.tok_decode(tokens)
          out[i] = min((text[: text.index(s)] for s in until if s and s in text), key=len, default=text)
        bar.update(len(chunk))
    bar.close()
    return out
