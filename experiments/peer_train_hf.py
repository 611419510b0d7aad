"""The peer's train step: Hugging Face LlamaForCausalLM + torch AdamW, as this project's Trainer steps, for one worker
of the peer benchmark's train mode (experiments/peer_train_worker.py; tapernorm_jax/benchmarks/pytorch/training.py).

The model loads the baseline's initial weights (its Llama checkpoint) with SDPA attention and the baseline's weight
dtype; compute runs in the baseline's compute dtype (float32 on a CPU; on accelerators bf16 under `torch.autocast`
over float32 weights, as the Trainer's mixed precision). One step is the Trainer's: gradients of the mean next-token
cross-entropy (in float32), global-norm clipping, AdamW with weight decay on matrices only, at the baseline's learning
rate. Two contenders, each trying its forms in order and recording which ran and why the others did not:

    hf_eager     eager, AdamW fused=True (one kernel for all parameters, on CPU too); foreach if fused fails
    hf_compiled  torch.compile of the whole step: setting gradients to None, forward, loss, backward, clipping and
                 AdamW in one function. PyTorch breaks its graph at `loss.backward()` (the backward is the forward
                 graph's, compiled by AOT autograd) and around `optimizer.step()` (on purpose: torch.optim's _use_grad),
                 so dynamo compiles it as a few graphs; AdamW is foreach, traced and fused by inductor (fused=True
                 would be a call dynamo does not trace). Else: the loss and optimizer.step compiled apart; else the
                 loss only.

A failed form starts the next from the initial weights and a new optimiser. No jax is imported here.

Held to an instruction set (`ATEN_CPU_CAPABILITY=avx2`), inductor gets a cache directory of its own: with torch
2.13 its cache key leaves ATen's capability out, and a step compiled under AVX-512 and reused under AVX2 gave a first
loss of 8.53 where the baseline's and a freshly compiled step's were 9.22 (1M, on this project's EPYC).
"""

import getpass
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

if os.environ.get("ATEN_CPU_CAPABILITY"):  # before torch is imported: inductor reads it then
  os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR",
    os.path.join(
      tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_{os.environ['ATEN_CPU_CAPABILITY'].lower()}"
    ),
  )

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from torch._inductor import cpu_vec_isa  # noqa: E402

from tapernorm_jax.benchmarks.pytorch.workers import reason  # noqa: E402

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
Step = Callable[[], torch.Tensor]


def load_llama(directory: str, device: str, dtype: torch.dtype = torch.float32) -> Any:
  """LlamaForCausalLM with SDPA attention from a checkpoint directory, its weights in `dtype`, on `device`."""
  transformers.utils.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()
  model = transformers.LlamaForCausalLM.from_pretrained(directory, attn_implementation="sdpa", dtype=dtype)
  return model.to(device)


def synchronize(device: str) -> None:
  """Returns once `device` is done (CPU calls are synchronous anyway)."""
  if device == "cuda":
    torch.cuda.synchronize()


class HuggingFaceStep:
  """LlamaForCausalLM and torch AdamW on the baseline's initial weights and batch (`workers.Contender`)."""

  def __init__(self, spec: dict[str, Any]):
    self.name, directory = spec["contender"], spec["directory"]
    torch.set_num_threads(spec.get("threads") or os.cpu_count())
    self.device = "cuda" if spec["device"] == "cuda" and torch.cuda.is_available() else "cpu"
    self.param_dtype, self.compute_dtype = (TORCH_DTYPES[spec["dtypes"][k]] for k in ("param", "compute"))
    self.opt = spec["optimizer"]
    self.model = load_llama(os.path.join(directory, "llama"), self.device, self.param_dtype).train()
    self.initial = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
    ids_BxT1 = torch.from_numpy(np.load(os.path.join(directory, "batch.npy")).astype(np.int64)).to(self.device)
    self.inputs_BxT, self.targets_BxT = ids_BxT1[:, :-1], ids_BxT1[:, 1:]
    self.params_path = os.path.join(directory, f"{self.name}.npz")
    self.fn: Step | None = None

  def describe(self) -> dict[str, Any]:
    """Dtypes (what the run checks against ours), device, threads, versions and the instruction set ATen runs."""
    name = lambda dtype: str(dtype).removeprefix("torch.")
    return {
      "dtypes": {"param": name(self.param_dtype), "compute": name(self.compute_dtype)},
      "autocast": self.compute_dtype != self.param_dtype,
      "device": self.device,
      "threads": torch.get_num_threads(),
      "torch": torch.__version__,
      "transformers": transformers.__version__,
      "attention": "sdpa",
      "jax_imported": "jax" in sys.modules,
      "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # ATen's kernels: AVX512, or AVX2 where held
      "inductor_isa": str(cpu_vec_isa.pick_vec_isa()),
    }  # what inductor's C++ is compiled for

  def loss(self) -> torch.Tensor:
    """Mean next-token cross-entropy, in float32, of the batch; the model under autocast where compute ≠ weights."""
    with torch.autocast(self.device, dtype=self.compute_dtype, enabled=self.compute_dtype != self.param_dtype):
      logits_BxTxV = self.model(self.inputs_BxT, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits_BxTxV.flatten(0, 1).float(), self.targets_BxT.flatten())

  def fresh(self, **adamw: Any) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    """The initial weights back in the model, and a new AdamW over them (decay on matrices only)."""
    self.model.load_state_dict(self.initial)
    params = list(self.model.parameters())
    groups = [
      {"params": [p for p in params if p.ndim >= 2], "weight_decay": self.opt["weight_decay"]},
      {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(
      groups, lr=self.opt["lr"], betas=(self.opt["b1"], self.opt["b2"]), eps=self.opt["eps"], **adamw
    )
    return params, optimizer

  def step_fn(
    self,
    loss: Callable[[], torch.Tensor],
    params: list[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    optimizer_step: Callable[[], Any] | None = None,
  ) -> Step:
    """One optimiser step as one function: gradients to None, loss, backward, clipping, AdamW."""

    def step() -> torch.Tensor:
      for p in params:
        p.grad = None
      value = loss()
      value.backward()
      torch.nn.utils.clip_grad_norm_(params, self.opt["clip"])
      (optimizer_step or optimizer.step)()
      return value.detach()

    return step

  def forms(self) -> list[tuple[str, Callable[[], Step]]]:
    """(what runs, how to build it) in the order tried."""

    def eager(**adamw: Any) -> Step:
      return self.step_fn(self.loss, *self.fresh(**adamw))

    def whole() -> Step:
      return torch.compile(eager(foreach=True), dynamic=False)

    def parts() -> Step:
      params, optimizer = self.fresh(foreach=True)
      return self.step_fn(
        torch.compile(self.loss, dynamic=False), params, optimizer, torch.compile(optimizer.step, dynamic=False)
      )

    def loss_only() -> Step:
      return self.step_fn(torch.compile(self.loss, dynamic=False), *self.fresh(fused=True))

    if self.name == "hf_eager":
      return [
        ("eager; AdamW fused=True", lambda: eager(fused=True)),
        ("eager; AdamW foreach (fused=True failed)", lambda: eager(foreach=True)),
      ]
    return [
      (
        "torch.compile of the whole step (grads to None, forward, loss, backward, clipping, AdamW foreach) as "
        "one function",
        whole,
      ),
      ("torch.compile of the loss (forward and backward) and of optimizer.step (AdamW foreach); clipping eager", parts),
      ("torch.compile of the loss (forward and backward); clipping and AdamW fused=True eager", loss_only),
    ]

  def check(self) -> dict[str, Any]:
    """The first step of the first form that runs (compiling it): its loss, and the parameters after it written as
    float32 numpy under their state_dict names; {"na": every form's failure} if none runs."""
    failures = []
    for ran, build in self.forms():
      torch._dynamo.reset()
      torch._dynamo.utils.counters.clear()
      try:
        fn = build()
        loss = float(fn())
      except Exception as e:  # noqa: BLE001 (torch.compile and fused kernels fail in many ways; the table says why)
        print(f"{self.name}: {ran}: failed: {reason(e)}", file=sys.stderr, flush=True)
        failures.append(f"{ran}: {reason(e)}")
        continue
      self.fn = fn
      np.savez(self.params_path, **{k: v.detach().float().cpu().numpy() for k, v in self.model.state_dict().items()})
      out = {"loss": loss, "params": self.params_path, "ran": ran, "failed_before": failures}
      if self.name == "hf_compiled":
        counters = torch._dynamo.utils.counters
        out.update(
          graphs=counters["stats"]["unique_graphs"],
          graph_breaks=sorted({k.strip().splitlines()[0] for k in counters["graph_break"]}),
        )
      return out
    return {"na": "; ".join(failures)}

  def step(self) -> torch.Tensor:
    """One step."""
    return self.fn()

  def wait(self, out: torch.Tensor) -> None:
    """Until the device is done (CPU calls are synchronous anyway)."""
    synchronize(self.device)
