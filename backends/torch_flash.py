"""PyTorch's bundled FlashAttention-2: ``torch.ops.aten._flash_attention_forward``.

Translation (always the varlen form, so one path serves ragged and dense KV):

* ``query`` (total_q, Hq, D), ``key``/``value`` (total_kv, Hkv, D) as given (last
  dim stride 1), ``cum_seq_q = qo_indptr``, ``cum_seq_k = kv_indptr`` (int32),
  ``max_q``/``max_k`` = the batch's upper bounds; GQA is native.
* causal = bottom-right (FA2's own alignment); ``window_left = W`` ->
  ``window_size_left=W, window_size_right=0`` with causal, ``-1`` (unbounded)
  without; no window -> both None.
* a float ``sm_scale`` goes to ``scale=``; a device-tensor scale is folded into q
  (one elementwise pass; no host sync) and ``scale=1``.
* the op allocates its output: ``out`` receives ``output * out_scale``.
* LSE: natural log, head-major ``(Hq, total_q)`` (or padded ``(B, Hq, max_q)`` on
  builds that return it) -> base 2, token-major ``(total_q, Hq)``; FA2 marks rows
  with no key ``+inf``, our convention is ``-inf`` (backends/_numerics.py).
* a float ``sm_scale`` < 0 is refused before any launch (_vendor.refuse_negative_scale:
  FA2's softmax keeps the row max of unscaled scores).

Caches: ``available`` (lru_cache on the singleton: one entry); no buffers. Launches run
under the tensors' GPU.

Not served: paged KV (the op's ``block_table`` needs pages of 256 and is absent on
older builds), soft cap, sinks, custom masks, ALiBi (FlashInfer's signed bias vs
FA2's |distance| bias is unverified), fp8.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from backends import _numerics, _vendor
from backends._device import on_device
from backends.base import Backend, BackendRejected, Reason

SRC_PT = "pytorch/pytorch @03b7c19 aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp"


def flash_op():
    """The aten op (a function so tests can substitute a fake)."""
    return torch.ops.aten._flash_attention_forward


@dataclass
class TorchFlashPlan:
    causal: bool
    window: tuple
    lse_rows: Optional[tuple]  # (request index, row in request) per token, for a padded LSE


class TorchFlashBackend(Backend):
    name = "torch-flash"
    packages = ("torch",)

    @functools.lru_cache(maxsize=None)
    def available(self) -> Reason | None:
        if not hasattr(torch.ops.aten, "_flash_attention_forward"):
            return Reason("torch", torch.__version__, "a build with aten._flash_attention_forward", SRC_PT)
        if not torch.cuda.is_available():
            return Reason("device", "no CUDA device", "a CUDA GPU (SM80+)")
        flash_built = getattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)()
        if not flash_built:
            return Reason("torch", torch.__version__, "a CUDA build with flash attention compiled in", SRC_PT)
        return None

    def version(self) -> str | None:
        return f"torch {torch.__version__}"

    def plan(self, problem, batch) -> TorchFlashPlan:
        if problem.kv_storage == "paged" or batch.kv_indptr is None:
            raise BackendRejected(self.name, [Reason("kv_storage", problem.kv_storage, "ragged or dense (kv_indptr)", SRC_PT)])
        bad = [Reason(f"{n}.stride(-1)", t.stride(-1), "1", SRC_PT)
               for n, t in (("q", batch.q), ("k", batch.k), ("v", batch.v)) if t.stride(-1) != 1]
        if bad:
            raise BackendRejected(self.name, bad)
        _vendor.refuse_negative_scale(self.name, batch.sm_scale, "torch-flash (PyTorch's FA2)")
        with on_device(batch.q.device):
            rows = _numerics.token_rows(batch.qo_indptr, batch.total_q) if batch.lse is not None else None
        return TorchFlashPlan(problem.causal, _numerics.torch_flash_window(problem.window_left, problem.causal),
                              rows)

    def run(self, plan: TorchFlashPlan, batch) -> None:
        _vendor.refuse_negative_scale(self.name, batch.sm_scale, "torch-flash (PyTorch's FA2)")  # before launch
        with on_device(batch.q.device):
            self._launch(plan, batch)

    def _launch(self, plan: TorchFlashPlan, batch) -> None:
        q, scale = batch.q, batch.sm_scale
        if isinstance(scale, torch.Tensor):
            q, scale = (q * scale.reshape(())).to(q.dtype), 1.0
        left, right = plan.window
        result = flash_op()(
            q, batch.k, batch.v, batch.qo_indptr, batch.kv_indptr, batch.max_q_len, batch.max_kv_len,
            0.0, plan.causal, False, scale=float(scale), window_size_left=left, window_size_right=right)
        output, lse_nat = result[0], result[1]
        batch.out.copy_(output)
        if isinstance(batch.out_scale, torch.Tensor) or float(batch.out_scale) != 1.0:
            batch.out.mul_(batch.out_scale)
        if batch.lse is not None:
            _numerics.write_lse_base2(batch.lse, lse_nat, plan.lse_rows)
