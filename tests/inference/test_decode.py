"""KV-cache decoding: step-by-step logits equal the full forward; ragged prefill; the jitted sampling loop."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tapernorm_jax.runtime import hardware
from tapernorm_jax.benchmarks import decode as bench
from tapernorm_jax.benchmarks import decode_tables
from tapernorm_jax.benchmarks.timing import read_bandwidth
from tapernorm_jax.inference import decode
from tapernorm_jax.inference import forms as forms_lib
from tapernorm_jax.model import ModelConfig, abstract_variables, init, sharding
from tapernorm_jax.taper.fold import fold
from model_helpers import logits_at, perturbed_variables

FORMS = ("baseline", "fixed", "folded", "dyt", "derf")  # the point-wise norms have no fold: they decode as they are


def _model(family: str, form: str, **changes) -> tuple[dict, ModelConfig]:
  """Variables and config of a small model whose outputs depend on every parameter (γ̃, β, c ≠ defaults)."""
  norm = {"baseline": "plain", "fixed": "fixed", "folded": "taper"}.get(form, form)
  cfg = ModelConfig(
    **{
      **dict(
        family=family,
        V=61,
        D=32,
        H=4,
        L=2,
        T=24,
        internal_norm=norm,
        final_norm=norm,
        init_std=0.2,
        tie_embeddings=False,
      ),
      **changes,
    }
  )  # untied: less copying
  variables = perturbed_variables(cfg)
  return fold(variables, cfg) if form == "folded" else (variables, cfg)


def _rel_err(a: jax.Array, b: jax.Array) -> float:
  return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a)))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_step_by_step_decode_reproduces_the_full_forward(family, form):
  variables, cfg = _model(family, form, T=12)
  tokens_BxT = jax.random.randint(jax.random.key(2), (3, cfg.T), 0, cfg.V)
  full_BxTxV = logits_at(cfg, variables, tokens_BxT, 0.0)
  step = jax.jit(lambda c, tok, i: decode.decode_step(variables, cfg, tok, i, c))
  cache = decode.init_cache(cfg, 3, cfg.T)
  for t in range(cfg.T):
    logits_BxV, cache = step(cache, tokens_BxT[:, t], jnp.full((3,), t, jnp.int32))
    assert _rel_err(full_BxTxV[:, t], logits_BxV) < 1e-5, t


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_ragged_prefill_then_decode_matches_the_forward_of_each_prompt(family):
  variables, cfg = _model(family, "folded")
  prompts = [[3, 1, 4, 1, 5, 9, 2], [6, 5], [3, 5, 8, 9]]
  prompt_BxP, lengths_B = decode.pad_prompts(prompts, pad_id=60)
  cache = decode.init_cache(cfg, 3, 12)
  logits_BxV, cache = decode.prefill(variables, cfg, prompt_BxP, lengths_B, cache)
  nxt_B = jnp.asarray([7, 8, 9], jnp.int32)
  logits2_BxV, _ = decode.decode_step(variables, cfg, nxt_B, jnp.asarray(lengths_B), cache)
  extended_BxP, _ = decode.pad_prompts([p + [int(t)] for p, t in zip(prompts, nxt_B)])
  full_BxPxV = logits_at(cfg, variables, extended_BxP)  # causal: the padding after a prompt is never seen
  for b, p in enumerate(prompts):
    assert _rel_err(full_BxPxV[b, len(p) - 1], logits_BxV[b]) < 1e-5
    assert _rel_err(full_BxPxV[b, len(p)], logits2_BxV[b]) < 1e-5


@pytest.mark.parametrize("data,fsdp", [(8, 1), (4, 2)])
def test_decoding_on_a_mesh_matches_one_device(data, fsdp):
  """Prompts, cache and tokens split over 8 devices (each writing its own cache rows), weights whole or FSDP-split."""
  variables, cfg = _model("llama", "folded", D=64)
  prompts = [[3, 1, 4, 1, 5, 9, 2], [6, 5], [3, 5, 8, 9], [2, 7]] * 2
  prompt_BxP, lengths_B = decode.pad_prompts(prompts, pad_id=60)
  mesh = sharding.make_mesh(data, fsdp)
  placed = jax.device_put(variables, sharding.shardings(abstract_variables(cfg), mesh))
  assert (fsdp > 1) == any(x.sharding.shard_shape(x.shape) != x.shape for x in jax.tree.leaves(placed))

  def run(variables, mesh, cache):
    first_BxV, cache = jax.jit(functools.partial(decode.prefill, cfg=cfg, mesh=mesh))(
      variables, prompt_BxP=prompt_BxP, lengths_B=lengths_B, cache=cache
    )
    second_BxV, _ = jax.jit(functools.partial(decode.decode_step, cfg=cfg, mesh=mesh))(
      variables, tokens_B=jnp.arange(8, dtype=jnp.int32), index_B=jnp.asarray(lengths_B), cache=cache
    )
    return first_BxV, second_BxV

  cache = decode.init_cache(cfg, 8, 12)
  split = run(placed, mesh, jax.device_put(cache, sharding.batch_sharding(mesh)))
  for one_BxV, split_BxV in zip(run(variables, None, cache), split):
    assert _rel_err(one_BxV, split_BxV) < 1e-5


def _greedy_by_full_forward(variables, cfg, prompts, n):
  """Reference: greedy continuation recomputing the whole forward for every token."""
  forward = lambda t: logits_at(cfg, variables, t, 0.0)
  out = []
  for p in prompts:
    seq = list(p)
    for _ in range(n):
      padded = np.zeros((1, cfg.T), np.int32)
      padded[0, : len(seq)] = seq
      seq.append(int(jnp.argmax(forward(padded)[0, len(seq) - 1])))
    out.append(seq[len(p) :])
  return out


@pytest.mark.parametrize("form", ["fixed", "folded"])
def test_greedy_generation_of_a_ragged_batch_equals_recomputing_the_forward(form):
  variables, cfg = _model("llama", form)
  prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [6, 5], [3, 5, 8]]
  prompt_BxP, lengths_B = decode.pad_prompts(prompts)
  out_BxN = decode.generate(variables, cfg, prompt_BxP, lengths_B, jax.random.key(0), max_new_tokens=10)
  assert out_BxN.shape == (3, 10)
  assert np.asarray(out_BxN).tolist() == _greedy_by_full_forward(variables, cfg, prompts, 10)


def test_eos_stops_a_row_and_everything_after_it_is_eos():
  variables, cfg = _model("gpt2", "folded")
  prompt_BxP, lengths_B = decode.pad_prompts([[3, 1, 4, 1], [2, 7]])
  free = np.asarray(decode.generate(variables, cfg, prompt_BxP, lengths_B, jax.random.key(0), max_new_tokens=8))
  eos = int(free[0, 2])
  stopped = np.asarray(
    decode.generate(variables, cfg, prompt_BxP, lengths_B, jax.random.key(0), max_new_tokens=8, eos_id=eos)
  )
  for row_free, row, kept in zip(free, stopped, decode.trim(stopped, eos)):
    first = list(row_free).index(eos) if eos in row_free else len(row_free)
    np.testing.assert_array_equal(row[: first + 1], row_free[: first + 1])
    assert (row[first:] == eos).all() and kept == list(row_free[: first + 1])


def test_generation_is_one_compiled_while_loop():
  variables, cfg = _model("llama", "folded")
  run = lambda prompt: decode.generate(
    variables, cfg, *decode.pad_prompts(prompt), jax.random.key(0), max_new_tokens=5, temperature=0.8, top_k=5
  )
  before = decode.generate._cache_size()
  run([[1, 2, 3], [4, 5, 6]])
  run([[7, 8, 9], [1]])
  assert decode.generate._cache_size() == before + 1
  jaxpr = jax.make_jaxpr(lambda v, t, n: decode.generate(v, cfg, t, n, jax.random.key(0), max_new_tokens=5))(
    variables, *decode.pad_prompts([[1, 2]])
  )
  assert "while" in str(jaxpr)


def test_sampling_greedy_temperature_and_top_k():
  logits_BxV = jnp.log(jnp.asarray([[0.1, 0.2, 0.3, 0.4]] * 4000))
  key = jax.random.key(0)
  assert (decode.sample(logits_BxV, key) == 3).all()
  assert (decode.sample(logits_BxV, key, temperature=1.0, top_k=1) == 3).all()
  freq = np.bincount(np.asarray(decode.sample(logits_BxV, key, temperature=1.0)), minlength=4) / 4000
  np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.03)
  top2 = np.bincount(np.asarray(decode.sample(logits_BxV, key, temperature=1.0, top_k=2)), minlength=4) / 4000
  np.testing.assert_allclose(top2, [0, 0, 3 / 7, 4 / 7], atol=0.03)
  cold = np.bincount(np.asarray(decode.sample(logits_BxV, key, temperature=0.1)), minlength=4) / 4000
  assert cold[3] > 0.9
  np.testing.assert_array_equal(decode.sample(logits_BxV, key, 1.0), decode.sample(logits_BxV, key, 1.0))


def test_remat_model_decodes_like_the_plain_one():
  variables, cfg = _model("llama", "fixed")
  prompt_BxP, lengths_B = decode.pad_prompts([[1, 2, 3, 4]])
  args = (prompt_BxP, lengths_B, jax.random.key(0))
  np.testing.assert_array_equal(
    decode.generate(variables, cfg, *args, max_new_tokens=4),
    decode.generate(variables, cfg.replace(remat=True), *args, max_new_tokens=4),
  )


def test_requests_past_the_learned_positions_are_refused():
  variables, cfg = _model("gpt2", "baseline")
  with pytest.raises(ValueError, match="exceeds model.T=24"):
    decode.generate(variables, cfg, *decode.pad_prompts([[1] * 20]), jax.random.key(0), max_new_tokens=10)
  with pytest.raises(ValueError, match="at least one token"):
    decode.pad_prompts([[1], []])


@pytest.mark.slow  # compiles four forms twice; the benchmark's smoke run
def test_decode_benchmark_runs_every_form_on_the_same_weights():
  cfg = bench.model_config("cpu", "internal_taper", "float32").replace(V=97, L=1)
  variables = forms_lib.perturbed(init(cfg, jax.random.key(0)), jax.random.key(1))
  forms = forms_lib.forms(variables, cfg)
  assert list(forms) == list(forms_lib.FORMS)
  forms["dyt"] = forms_lib.pointwise(variables, cfg, "dyt", jax.random.key(2))
  embeds = [np.asarray(v["params"]["embed"]) for v, _ in forms.values()]
  assert all(np.array_equal(e, embeds[0]) for e in embeds)  # one set of weights; only the norms differ
  assert forms["identity"][1].internal_norm == forms["folded"][1].internal_norm == "identity"
  assert forms["dyt"][1].internal_norm == forms["dyt"][1].final_norm == "dyt"
  s = bench.Settings(
    size="cpu",
    variant="internal_taper",
    batches=(1,),
    lengths=(16,),
    decode_batches=(2,),
    prompt=8,
    new_tokens=4,
    repeats=1,
    warmup=1,
    min_sample_s=0.0,
    dtype="float32",
    seed=0,
    pointwise=("dyt",),
  )
  results = {
    "date": "today",
    "hardware": hardware.describe(),
    "settings": vars(s),
    "params": 1,
    "bandwidth": read_bandwidth(1 << 20, repeats=1),
    "forward": bench.bench_forward(forms, s),
    "decode": bench.bench_decode(forms, s),
  }
  step = results["decode"][0]["forms"]["folded"]["bytes_per_step"]
  assert step["cache"] == 2 * cfg.L * 2 * cfg.D * (8 + 4 - 1) * 4  # k and v, B = 2 rows, P + N − 1 slots, fp32
  table = decode_tables.markdown(results)
  assert "| 1 | 16 |" in table and "| 2 | 8 | 4 |" in table
  assert table.count("| identity | dyt |") == 2  # a column in the forward and the decode table


def test_benchmark_flags_come_from_the_settings_dataclass():
  from absl import flags
  from tapernorm_jax import cli

  flag_values = flags.FlagValues()
  holders = cli.define_flags(bench.Settings, {f: "help" for f in bench.Settings.__dataclass_fields__}, flag_values)
  flag_values(["prog", "--batches=2,8", "--size=9m", "--min_sample_s=0.5", "--dtype=float32"])
  s = cli.from_flags(bench.Settings, holders)
  assert s == bench.Settings(size="9m", batches=(2, 8), min_sample_s=0.5, dtype="float32")
  with pytest.raises(ValueError, match="size='2m'"):
    bench.Settings(size="2m")
  with pytest.raises(ValueError, match=r"pointwise=\['rms'\]"):
    bench.Settings(pointwise=("rms",))
