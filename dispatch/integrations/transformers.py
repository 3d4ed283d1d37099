"""transformers models on ``dispatch`` attention, in one line::

    from dispatch.integrations.transformers import register
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=register())

``register()`` adds an attention function named "dispatch" to transformers' ``AttentionInterface``
(and sdpa's mask builder under the same name, so a batch without padding passes no mask at all).
Prefill and ``generate`` then run every attention layer through
``dispatch.single_prefill_with_kv_cache``, one call per sequence of the batch: causal (bottom-right
aligned, so a decode step's single query sees the whole cache) when the mask can be skipped, the
mask itself (``custom_mask``) when the batch is padded. transformers is imported only here.
"""
from __future__ import annotations

from typing import Optional

import torch

import dispatch

NAME = "dispatch"
_REFUSED_KWARGS = ("s_aux", "sinks", "position_bias")  # features this function cannot express


def register(name: str = NAME) -> str:
    """Register the dispatch attention (and sdpa's mask builder) under ``name``; returns ``name``,
    to pass as ``attn_implementation``. Calling it again is harmless."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, dispatch_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def dispatch_attention_forward(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
    sliding_window: Optional[int] = None, softcap: Optional[float] = None, is_causal: Optional[bool] = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (B, Hq, Sq, D), key/value (B, Hkv, Skv, D)
    (the cache already appended), a mask that is None or (B, 1, Sq, Skv) with True = attend.
    Returns (attn_output (B, Sq, Hq, D), None)."""
    if dropout and module.training:
        raise ValueError(f"dispatch attention: dropout={dropout} in training is not supported (inference only)")
    for name in _REFUSED_KWARGS:
        if kwargs.get(name) is not None:
            raise ValueError(f"dispatch attention: {name}= is not supported; use attn_implementation='eager'")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    keep = _keep_mask(attention_mask, query.shape[0])
    q_len, kv_len = query.shape[2], key.shape[2]
    if keep is None and causal and 1 < q_len < kv_len:
        # No mask with more keys than queries only happens on a prefill into an empty static cache:
        # the keys past the prompt are unwritten slots (sdpa crops them the same way).
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    window_left = sliding_window - 1 if sliding_window and keep is None else -1
    outs = []
    for i in range(query.shape[0]):
        outs.append(dispatch.single_prefill_with_kv_cache(
            query[i].transpose(0, 1), key[i], value[i], custom_mask=None if keep is None else keep[i],
            causal=bool(causal) and keep is None, kv_layout="HND", sm_scale=scaling, window_left=window_left,
            logits_soft_cap=softcap))
    return torch.stack(outs), None


def _keep_mask(attention_mask: Optional[torch.Tensor], batch: int) -> Optional[torch.Tensor]:
    """The mask as bool (B, Sq, Skv), True = attend; None when there is none."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4 or attention_mask.shape[1] != 1:
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
        raise ValueError(f"dispatch attention: attention_mask of shape {shape} is not supported; "
                         "expected (batch, 1, q_len, kv_len), one mask shared by all heads")
    if attention_mask.dtype == torch.bool:
        keep = attention_mask[:, 0]
    else:  # an additive float mask: 0 keeps, the dtype's minimum (or -inf) masks; any other value is a bias
        keep = attention_mask[:, 0] > torch.finfo(attention_mask.dtype).min / 2
        if bool((attention_mask[:, 0][keep] != 0).any()):
            raise ValueError("dispatch attention: an additive attention_mask with biases other than 0 and -inf "
                             "is not supported; pass a bool mask")
    return keep.expand(batch, -1, -1)
