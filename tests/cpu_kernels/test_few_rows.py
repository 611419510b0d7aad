"""The CPU few-row projections (`few_rows`, `matvec.rows`): products against float64 numpy, decoding through the
model's projection seam against decoding with the model's own einsum."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tapernorm_jax.inference import decode
from tapernorm_jax.cpu_kernels import few_rows, matvec
from tapernorm_jax.model import ModelConfig
from tapernorm_jax.model.seams import einsum
from kernels import needs_compiler
from model_helpers import perturbed_variables


@needs_compiler
@pytest.mark.parametrize("R", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("K,O", [(64, 300), (37, 17), (515, 1)])
def test_rows_equal_a_float64_product(R, K, O):
  rng = np.random.default_rng(R * K + O)
  x_RxK, w_OxK = rng.standard_normal((R, K), np.float32), rng.standard_normal((O, K), np.float32)
  expected_RxO = x_RxK.astype(np.float64) @ w_OxK.astype(np.float64).T
  got_RxO = np.asarray(jax.jit(matvec.rows)(x_RxK, w_OxK))
  np.testing.assert_allclose(got_RxO, expected_RxO, rtol=0, atol=1e-5 * np.abs(expected_RxO).max())


@pytest.mark.parametrize(
  "x_shape,w_shape,dtype",
  [((9, 8), (4, 8), jnp.float32), ((2, 8), (4, 7), jnp.float32), ((2, 8), (4, 8), jnp.bfloat16)],
)
def test_rows_name_what_they_cannot_take(x_shape, w_shape, dtype):
  with pytest.raises(ValueError, match=r"matvec\.rows: x .* needs 1 to 8 float32 rows"):
    matvec.rows(jnp.ones(x_shape, dtype), jnp.ones(w_shape, dtype))


_prefill = jax.jit(decode.prefill, static_argnums=1, static_argnames="projection")
_step = jax.jit(decode.decode_step, static_argnums=1, static_argnames="projection")


def _decode(variables: dict, cfg: ModelConfig, B: int, projection=einsum) -> list:
  """Step-by-step logits after a ragged prefill of B prompts, through `projection`."""
  prompt_BxP, lengths_B = decode.pad_prompts([[1 + b + i for i in range(3 + 2 * b)] for b in range(B)])
  cache = decode.init_cache(cfg, B, 16)
  logits_BxV, cache = _prefill(variables, cfg, prompt_BxP, lengths_B, cache, projection=projection)
  steps = [logits_BxV]
  for i in range(3):
    tokens_B = jnp.argmax(steps[-1], -1).astype(jnp.int32)
    logits_BxV, cache = _step(variables, cfg, tokens_B, lengths_B + i, cache, projection=projection)
    steps.append(logits_BxV)
  return steps


def _assert_same_steps(got: list, want: list) -> None:
  for got_BxV, want_BxV in zip(got, want, strict=True):
    np.testing.assert_allclose(got_BxV, want_BxV, rtol=0, atol=1e-5 * float(jnp.abs(want_BxV).max()))


CONFIGS = {  # tied head, remat'ed blocks; untied head with biases
  "llama": ModelConfig(V=83, D=48, H=4, L=2, T=32, init_std=0.2, remat=True, internal_norm="taper", final_norm="taper"),
  "gpt2": ModelConfig(
    family="gpt2",
    V=83,
    D=48,
    H=4,
    L=2,
    T=32,
    init_std=0.2,
    tie_embeddings=False,
    internal_norm="taper",
    final_norm="taper",
  ),
}


@needs_compiler
@pytest.mark.parametrize("family", ["llama", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_decode_with_the_kernel_matches_the_model_s_einsum(family):
  cfg = CONFIGS[family]
  variables = perturbed_variables(cfg)
  with_kernel, projection = few_rows.prepare(variables, cfg, rows=4)
  assert projection is few_rows.kernel_projection
  _assert_same_steps(_decode(with_kernel, cfg, 4, projection), _decode(variables, cfg, 4))
  # Every projection of a decode step goes through the kernel: 4 per block (llama: 5) and the head.
  step = jax.make_jaxpr(
    lambda v, c: decode.decode_step(v, cfg, jnp.zeros(4, jnp.int32), jnp.ones(4, jnp.int32), c, projection=projection)
  )(with_kernel, decode.init_cache(cfg, 4, 16))
  calls = str(step).count(matvec.TARGET)
  assert calls == cfg.L * (5 if family == "llama" else 4) + 1
  prefill = jax.make_jaxpr(
    lambda v, c: decode.prefill(v, cfg, jnp.zeros((4, 6), jnp.int32), jnp.full(4, 6), c, projection=projection)
  )(with_kernel, decode.init_cache(cfg, 4, 16))
  assert str(prefill).count(matvec.TARGET) == 1  # 24 rows go to XLA; only the head's 4 last positions
  # The model itself never calls the kernel: the same variables through its own projection run no custom call.
  plain_step = jax.make_jaxpr(
    lambda v, c: decode.decode_step(v, cfg, jnp.zeros(4, jnp.int32), jnp.ones(4, jnp.int32), c)
  )(with_kernel, decode.init_cache(cfg, 4, 16))
  assert matvec.TARGET not in str(plain_step)


@pytest.mark.parametrize("family", ["llama", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_row_by_row_decode_matches_the_model_s_einsum(family):
  cfg = CONFIGS[family]
  variables = perturbed_variables(cfg)
  _assert_same_steps(_decode(variables, cfg, 3, few_rows.rowwise_projection), _decode(variables, cfg, 3))


@needs_compiler
def test_the_copies_are_each_projection_as_output_by_input():
  cfg = CONFIGS["llama"]
  variables = perturbed_variables(cfg)
  copies = few_rows.with_matvec_weights(variables, cfg)[few_rows.MATVEC]
  params = variables["params"]
  qkv_3xHKxD = np.asarray(params["block_0"]["attn"]["qkv"]).reshape(48, 3, 48).transpose(1, 2, 0)
  np.testing.assert_array_equal(copies["block_0"]["attn"]["qkv"], qkv_3xHKxD)
  np.testing.assert_array_equal(
    copies["block_0"]["attn"]["out"], np.asarray(params["block_0"]["attn"]["out"]).reshape(48, 48).T
  )
  np.testing.assert_array_equal(copies["block_0"]["mlp"]["wi_0"], np.asarray(params["block_0"]["mlp"]["wi_0"]).T)
  np.testing.assert_array_equal(copies["embed"], params["embed"])  # the tied head's table, as it is


def test_without_the_kernel_a_few_rows_go_one_at_a_time(reload_kernels, monkeypatch):
  monkeypatch.setenv("TAPERNORM_MATVEC", "0")
  assert not matvec.available() and "TAPERNORM_MATVEC=0" in matvec.reason()
  variables = {"params": {}}
  assert few_rows.prepare(variables, CONFIGS["llama"], rows=4) == (variables, few_rows.rowwise_projection)
  assert few_rows.prepare(variables, CONFIGS["llama"], rows=9) == (variables, einsum)  # past 8 rows: XLA's GEMM
  with pytest.raises(RuntimeError, match="not available .*TAPERNORM_MATVEC=0"):
    matvec.rows(jnp.ones((2, 8)), jnp.ones((4, 8)))


def test_a_missing_compiler_is_a_reason_not_a_crash(reload_kernels, monkeypatch, tmp_path):
  monkeypatch.setenv("CXX", "no-such-compiler")
  monkeypatch.setenv("TAPERNORM_CACHE", str(tmp_path))
  with pytest.warns(
    RuntimeWarning,
    match=r"the CPU kernel matvec_rows.cc is off \(no C\+\+ compiler .*\); batched "
    "decoding reads the weights once per row instead, more slowly",
  ):
    assert not matvec.available()
  assert "no C++ compiler ('no-such-compiler' is not on PATH; set CXX)" in matvec.reason()


@needs_compiler
def test_bfloat16_models_do_not_use_the_float32_kernel():
  variables = {"params": {}}
  bf16 = CONFIGS["llama"].replace(dtype="bfloat16")
  assert few_rows.prepare(variables, bf16, rows=4) == (variables, few_rows.rowwise_projection)
