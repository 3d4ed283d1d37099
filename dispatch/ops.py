"""The entry points as torch.library custom ops, so torch.compile traces through them.

Under ``torch.compile`` an entry point's body is one call of its op (``torch.ops.attn_dispatch.*``):
Python-level validation, routing and caching stay inside the op, which runs eagerly; the fake
(meta) implementations give the output shapes and dtypes without touching data. Outside
compilation nothing here is on the call path.

The op schemas take what a schema can type: a float *or* a tensor scale becomes two optional
arguments, a (k, v) cache tuple two tensors, a wrapper its integer handle. A caller's ``out`` /
``lse`` buffers are filled by a copy after the op (in the traced graph). Argument forms an op
cannot carry (per-head fp8 scales, NVFP4) fall back to the eager function, a graph break.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Optional

import torch

# The eager entry points, registered by their modules (ops imports no entry module: no cycle).
EAGER: dict[str, Any] = {}


def register_eager(name: str, fn: Any) -> Any:
    EAGER[name] = fn
    return fn


_F = Optional[float]
_T = Optional[torch.Tensor]
_LIB = "attn_dispatch"


def split_scale(value: Any) -> tuple[Optional[float], Optional[torch.Tensor]]:
    """A float-or-tensor scale as the two optional op arguments."""
    if isinstance(value, torch.Tensor):
        return None, value
    return (None if value is None else float(value)), None


def join_scale(value: Optional[float], tensor: Optional[torch.Tensor]) -> Any:
    return tensor if tensor is not None else value


def split_kv(kv_cache: Any) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    if isinstance(kv_cache, (tuple, list)):
        return kv_cache[0], kv_cache[1]
    return kv_cache, None


def join_kv(k: torch.Tensor, v: Optional[torch.Tensor]) -> Any:
    return k if v is None else (k, v)


def fill(result: torch.Tensor, buffer: Optional[torch.Tensor]) -> torch.Tensor:
    """Write an op's fresh output into the caller's buffer (traced as a copy)."""
    if buffer is None:
        return result
    buffer.copy_(result)
    return buffer


def _no_lse(q: torch.Tensor) -> torch.Tensor:
    return q.new_empty((0,), dtype=torch.float32)


def _out_dtype(q_dtype: torch.dtype, requested: Optional[torch.dtype]) -> torch.dtype:
    if requested is not None:
        return requested
    return torch.bfloat16 if q_dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else q_dtype


# -- single prefill ----------------------------------------------------------------------------
@torch.library.custom_op(f"{_LIB}::single_prefill", mutates_args=())
def single_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, custom_mask: _T, packed_custom_mask: _T,
                   causal: bool, kv_layout: str, pos_encoding_mode: str, sm_scale: _F, window_left: int,
                   logits_soft_cap: _F, rope_scale: _F, rope_theta: _F, return_lse: bool, backend: str,
                   k_scale: _F, k_scale_t: _T, v_scale: _F, v_scale_t: _T,
                   o_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor]:
    fn = EAGER["single_prefill_with_kv_cache"]
    res = fn(q, k, v, custom_mask, packed_custom_mask, causal, kv_layout, pos_encoding_mode, sm_scale=sm_scale,
             window_left=window_left, logits_soft_cap=logits_soft_cap, rope_scale=rope_scale, rope_theta=rope_theta,
             return_lse=return_lse, backend=backend, k_scale=join_scale(k_scale, k_scale_t),
             v_scale=join_scale(v_scale, v_scale_t), o_dtype=o_dtype)
    return res if return_lse else (res, _no_lse(q))


@single_prefill.register_fake
def _(q, k, v, custom_mask, packed_custom_mask, causal, kv_layout, pos_encoding_mode, sm_scale, window_left,
      logits_soft_cap, rope_scale, rope_theta, return_lse, backend, k_scale, k_scale_t, v_scale, v_scale_t, o_dtype):
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[-1]), dtype=_out_dtype(q.dtype, o_dtype))
    lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32) if return_lse else _no_lse(q)
    return out, lse


# -- trtllm context --------------------------------------------------------------------------
@torch.library.custom_op(f"{_LIB}::trtllm_context", mutates_args=())
def trtllm_context(query: torch.Tensor, k_cache: torch.Tensor, v_cache: _T, workspace_buffer: torch.Tensor,
                   block_tables: torch.Tensor, seq_lens: torch.Tensor, max_q_len: int, max_kv_len: int,
                   bmm1_scale: _F, bmm1_scale_t: _T, bmm2_scale: _F, bmm2_scale_t: _T, batch_size: int,
                   cum_seq_lens_q: torch.Tensor, window_left: int, out_dtype: Optional[torch.dtype], kv_layout: str,
                   sinks: _T, causal: bool, want_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    fn = EAGER["trtllm_batch_context_with_kv_cache"]
    res = fn(query, join_kv(k_cache, v_cache), workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len,
             join_scale(bmm1_scale, bmm1_scale_t), join_scale(bmm2_scale, bmm2_scale_t), batch_size, cum_seq_lens_q,
             None, window_left, out_dtype=out_dtype, kv_layout=kv_layout, sinks=sinks, causal=causal,
             return_lse=want_lse)
    return res if want_lse else (res, _no_lse(query))


@trtllm_context.register_fake
def _(query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale,
      bmm1_scale_t, bmm2_scale, bmm2_scale_t, batch_size, cum_seq_lens_q, window_left, out_dtype, kv_layout, sinks,
      causal, want_lse):
    dim = (v_cache if v_cache is not None else k_cache).shape[-1]
    out = query.new_empty((query.shape[0], query.shape[1], dim), dtype=_out_dtype(query.dtype, out_dtype))
    lse = query.new_empty((query.shape[0], query.shape[1]), dtype=torch.float32) if want_lse else _no_lse(query)
    return out, lse


# -- xqa decode --------------------------------------------------------------------------------
@torch.library.custom_op(f"{_LIB}::xqa_decode", mutates_args=())
def xqa_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: _T, workspace_buffer: torch.Tensor,
               block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int, bmm1_scale: _F, bmm1_scale_t: _T,
               bmm2_scale: _F, bmm2_scale_t: _T, window_left: int, sinks: _T, kv_layout: str, q_len_per_req: int,
               o_scale: _F, mask: _T, q_cu_seq_lens: _T) -> torch.Tensor:
    fn = EAGER["xqa_batch_decode_with_kv_cache"]
    return fn(query, join_kv(k_cache, v_cache), workspace_buffer, block_tables, seq_lens, max_seq_len,
              join_scale(bmm1_scale, bmm1_scale_t), join_scale(bmm2_scale, bmm2_scale_t), window_left, None, sinks,
              kv_layout, None, q_len_per_req, o_scale, mask, q_cu_seq_lens=q_cu_seq_lens)


@xqa_decode.register_fake
def _(query, k_cache, v_cache, *rest):
    return torch.empty_like(query)


# -- cuDNN -----------------------------------------------------------------------------------
@torch.library.custom_op(f"{_LIB}::cudnn_prefill", mutates_args=())
def cudnn_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: _F, scale_t: _T,
                  workspace_buffer: torch.Tensor, max_token_per_sequence: int, max_sequence_kv: int,
                  actual_seq_lens_q: torch.Tensor, actual_seq_lens_kv: torch.Tensor, block_tables: _T, causal: bool,
                  return_lse: bool, batch_offsets_q: _T, batch_offsets_o: _T, batch_offsets_k: _T,
                  batch_offsets_v: _T, is_cuda_graph_compatible: bool, backend: Optional[str],
                  batch_offsets_units: str, o_data_type: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor]:
    fn = EAGER["cudnn_batch_prefill_with_kv_cache"]
    out, lse = fn(q, k_cache, v_cache, join_scale(scale, scale_t), workspace_buffer,
                  max_token_per_sequence=max_token_per_sequence, max_sequence_kv=max_sequence_kv,
                  actual_seq_lens_q=actual_seq_lens_q, actual_seq_lens_kv=actual_seq_lens_kv,
                  block_tables=block_tables, causal=causal, return_lse=return_lse, batch_offsets_q=batch_offsets_q,
                  batch_offsets_o=batch_offsets_o, batch_offsets_k=batch_offsets_k, batch_offsets_v=batch_offsets_v,
                  is_cuda_graph_compatible=is_cuda_graph_compatible, backend=backend,
                  batch_offsets_units=batch_offsets_units, o_data_type=o_data_type)
    return out, (lse if lse is not None else _no_lse(q))


@cudnn_prefill.register_fake
def _(q, k_cache, v_cache, scale, scale_t, workspace_buffer, max_token_per_sequence, max_sequence_kv,
      actual_seq_lens_q, actual_seq_lens_kv, block_tables, causal, return_lse, *rest):
    o_data_type = rest[-1]
    out = q.new_empty((q.shape[0], q.shape[1], v_cache.shape[-1]), dtype=_out_dtype(q.dtype, o_data_type))
    if not return_lse:
        return out, _no_lse(q)
    return out, q.new_empty((actual_seq_lens_kv.shape[0], max_token_per_sequence, q.shape[1]), dtype=torch.float32)


# -- wrappers ----------------------------------------------------------------------------------
_HANDLES = itertools.count(1)
_WRAPPERS: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()  # live wrappers only


def register_wrapper(wrapper: Any) -> int:
    """The integer a compiled graph names the wrapper by (a constant the graph is guarded on)."""
    handle = next(_HANDLES)
    _WRAPPERS[handle] = wrapper
    return handle


def live_wrappers() -> list:
    """The wrappers alive now (each registered at construction)."""
    return list(_WRAPPERS.values())


def _wrapper(handle: int) -> Any:
    wrapper = _WRAPPERS.get(handle)
    if wrapper is None:
        raise RuntimeError(f"attn_dispatch wrapper handle {handle} is gone (the wrapper was freed)")
    return wrapper


@torch.library.custom_op(f"{_LIB}::paged_run", mutates_args=())
def paged_run(handle: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: _T, k_scale: _F, v_scale: _F,
              return_lse: bool, q_scale: _F, window_left: Optional[int],
              sinks: _T) -> tuple[torch.Tensor, torch.Tensor]:
    res = _wrapper(handle).run(q, join_kv(k_cache, v_cache), k_scale, v_scale, return_lse, q_scale=q_scale,
                               window_left=window_left, sinks=sinks)
    return res if return_lse else (res, _no_lse(q))


@torch.library.custom_op(f"{_LIB}::ragged_run", mutates_args=())
def ragged_run(handle: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_lse: bool, q_scale: _F,
               k_scale: _F, v_scale: _F, o_scale: _F) -> tuple[torch.Tensor, torch.Tensor]:
    res = _wrapper(handle).run(q, k, v, return_lse, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                               o_scale=o_scale)
    return res if return_lse else (res, _no_lse(q))


def _fake_run(handle: int, q: torch.Tensor, return_lse: bool):
    plan = _wrapper(handle)._plan
    out = q.new_empty((q.shape[0], plan.hq, plan.dvo), dtype=plan.out_dtype)
    lse = q.new_empty((q.shape[0], plan.hq), dtype=torch.float32) if return_lse else _no_lse(q)
    return out, lse


@paged_run.register_fake
def _(handle, q, k_cache, v_cache, k_scale, v_scale, return_lse, q_scale, window_left, sinks):
    return _fake_run(handle, q, return_lse)


@ragged_run.register_fake
def _(handle, q, k, v, return_lse, q_scale, k_scale, v_scale, o_scale):
    return _fake_run(handle, q, return_lse)
