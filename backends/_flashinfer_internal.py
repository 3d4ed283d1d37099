"""The only module that touches FlashInfer's private API, pinned to the versions it was read in.

What is private here: the underscored attributes a wrapper's plan() stores (``_plan_info``, the
index buffers, ``_cached_module``), FlashInfer's private ALiBi slopes cache
(``_get_cache_alibi_slopes_buf``) and its internal kernel entry points (``get_single_prefill_module``,
``get_xqa_module``, ``gen_xqa_module``, ``block_sparse_indices_to_vector_sparse_offsets``) with
the positional argument lists of their compiled ops. Why touch them at all: FlashInfer's public
run() rebuilds the compiled op's argument list on every call, which costs more host time than the
kernel launch of a small decode step; with the arguments plan() stored, a repeat costs the launch.

Every name below was read in the source of each version in ``CHECKED_VERSIONS`` (flashinfer/
prefill.py, utils.py, xqa.py, jit/xqa.py; the 0.5.x direct run and vector-sparse offsets in 0.5.3,
the recorded run and the 24-argument XQA entry in 0.7.2). With any other installed version the
callers take FlashInfer's public API, after one log line: ``checked(version)``.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import torch

log = logging.getLogger("attn_dispatch")

CHECKED_VERSIONS = ("0.5.3", "0.7.2")
# FlashInfer's wrappers' attributes read after plan() (flashinfer/prefill.py, both wrappers' plan/run)
WRAPPER_ATTRIBUTES = (
    "_backend", "_batch_size", "_block_tables", "_cached_module", "_causal", "_custom_mask_buf",
    "_fixed_batch_size", "_float_workspace_buffer", "_int_workspace_buffer", "_jit_module", "_kv_indptr_buf",
    "_kv_layout", "_kv_lens_buffer", "_logits_soft_cap", "_mask_indptr_buf", "_max_item_len_ptr", "_max_kv_len",
    "_max_q_len", "_num_kv_heads", "_num_qo_heads", "_paged_kv_indices_buf", "_paged_kv_indptr_buf",
    "_paged_kv_last_page_len_buf", "_plan_info", "_prefix_len_ptr", "_qo_indptr_buf", "_rope_scale", "_rope_theta",
    "_token_pos_in_items_len", "_token_pos_in_items_ptr", "_use_cuda_graph", "_vector_sparse_indices_buffer",
    "_vector_sparse_indptr_buffer", "_window_left", "_workspace_size")
# flashinfer.prefill's private module functions
MODULE_FUNCTIONS = ("_get_cache_alibi_slopes_buf",)
# the single-prefill op's scratch (flashinfer/utils.py SINGLE_KERNEL_TMP_SIZE in 0.7.2; 0.5.3 cached as much)
SINGLE_PREFILL_SCRATCH_BYTES = 32 * 1024 * 1024

_UNCHECKED_LOGGED: set = set()


def checked(version: Optional[str]) -> bool:
    """Whether FlashInfer ``version``'s private API was read (``CHECKED_VERSIONS``); another version
    logs one line (per version) and its callers use the public API."""
    if version in CHECKED_VERSIONS:
        return True
    if version not in _UNCHECKED_LOGGED:
        _UNCHECKED_LOGGED.add(version)
        log.info("flashinfer %s: its private fast paths were checked in %s only; the public API serves "
                 "(more host time per call)", version, ", ".join(CHECKED_VERSIONS))
    return False


# -- single prefill: the compiled op of get_single_prefill_module -------------------------------------
def single_prefill_op(prefill: Any, kind: str, problem: Any, q_dtype, kv_dtype, out_dtype, layout: str,
                      masked: bool, device) -> Callable:
    """``run(q, k, v, out, lse, packed_mask, sm_scale)``: the compiled single-prefill op with its
    fixed arguments bound (flashinfer/prefill.py run_single_prefill: 18 arguments in 0.5.3, two
    optional NVFP4 scale factors after them in 0.7.2). Raises AttributeError / KeyError /
    TypeError when a name is missing."""
    op = prefill.get_single_prefill_module(
        kind, q_dtype, kv_dtype, out_dtype, problem.head_dim_qk, problem.head_dim_vo,
        prefill.PosEncodingMode[problem.pos_encoding].value, problem.window_left >= 0,
        problem.logits_soft_cap > 0, False).run
    # FlashInfer's own call passes slopes for ALiBi only (a cached buffer is one more kept tensor)
    alibi = (prefill._get_cache_alibi_slopes_buf(problem.num_qo_heads, device) if problem.pos_encoding == "ALIBI"
             else None)
    mask = (prefill.MaskMode.CUSTOM if masked else
            prefill.MaskMode.CAUSAL if problem.causal else prefill.MaskMode.NON_CAUSAL).value
    layout_value = prefill.TensorLayout[layout].value
    window, cap, rope_scale, rope_theta = (problem.window_left, problem.logits_soft_cap, problem.rope_scale,
                                           problem.rope_theta)

    def run(q, k, v, out, lse, packed, sm_scale: float) -> None:
        # made per call, as FlashInfer 0.7.2's own call makes it: a buffer kept from a first call made
        # inside torch.compile's CUDA-graph warm-up would live in the graphs' pool, where it is refused
        tmp = torch.empty(SINGLE_PREFILL_SCRATCH_BYTES, dtype=torch.uint8, device=q.device)
        op(q, k, v, tmp, out, lse, mask, layout_value, window, packed, alibi, cap, sm_scale, None, None, None,
           rope_scale, rope_theta)

    return run


# -- batch wrappers: what plan() stored --------------------------------------------------------------
def plan_info(wrapper: Any) -> list:
    """The schedule plan() computed (a captured CUDA graph reads it)."""
    return list(wrapper._plan_info)


def graph_room(wrapper: Any) -> Optional[tuple]:
    """(fixed batch size, page ids, custom-mask bytes) a CUDA-graph wrapper's fixed buffers hold
    (None for a buffer it has not), or None for a wrapper not made with use_cuda_graph=True."""
    if not getattr(wrapper, "_use_cuda_graph", False):
        return None
    pages, mask = getattr(wrapper, "_paged_kv_indices_buf", None), getattr(wrapper, "_custom_mask_buf", None)
    return (wrapper._fixed_batch_size, pages.numel() if pages is not None else None,
            mask.numel() if mask is not None else None)


def recordable(wrapper: Any, kind: str) -> bool:
    """Whether the wrapper's public run() calls ``_cached_module``'s op once for fa2 / fa3 (no JIT
    variant, no multi-item scoring): its arguments can then be recorded (``record_run``)."""
    return (getattr(wrapper, "_jit_module", None) is None and getattr(wrapper, "_backend", None) == kind
            and getattr(wrapper, "_prefix_len_ptr", None) is None
            and getattr(wrapper, "_cached_module", None) is not None)


class _RecordingModule:
    """A wrapper's ``_cached_module`` for one public run: the op ``name`` records its arguments in
    ``calls`` and runs; every other attribute is the module's."""

    __slots__ = ("_module", "_name", "_calls")

    def __init__(self, module: Any, name: str, calls: list):
        self._module, self._name, self._calls = module, name, calls

    def __getattr__(self, attr: str) -> Any:
        fn = getattr(self._module, attr)
        if attr != self._name:
            return fn

        def record(*args):
            self._calls.append(args)
            return fn(*args)
        return record


def record_run(wrapper: Any, op: str, public_run: Callable[[], None]) -> tuple[Any, list]:
    """Run ``public_run()`` (the wrapper's run()) with its compiled module's ``op`` recording its
    argument lists: (the op, the recorded lists). The module is put back whatever happens."""
    module, calls = wrapper._cached_module, []
    wrapper._cached_module = _RecordingModule(module, op, calls)
    try:
        public_run()
    finally:
        wrapper._cached_module = module
    return getattr(module, op), calls


def plan_time_tensor_ids(prefill: Any, wrapper: Any, num_qo_heads: int, device) -> set:
    """The ids of every tensor plan() left on the wrapper, and of FlashInfer's cached ALiBi slopes
    for these heads: what a recorded op may keep for later calls."""
    ids = {id(t) for t in vars(wrapper).values() if isinstance(t, torch.Tensor)}
    alibi = getattr(prefill, "_get_cache_alibi_slopes_buf", None)
    if alibi is not None:
        ids.add(id(alibi(num_qo_heads, device)))
    return ids


_PAGED_SLOTS = (3, 4, 5, 10, 11, 23)  # 0.5.3 BatchPrefillWithPagedKVCacheWrapper.run -> paged_run
_RAGGED_SLOTS = (3, 4, 5, 8, 9, 21)  # 0.5.3 BatchPrefillWithRaggedKVCacheWrapper.run -> ragged_run


def direct_run_args(prefill: Any, wrapper: Any, kind: str, paged: bool, num_qo_heads: int,
                    page_size: int) -> Optional[tuple]:
    """FlashInfer 0.5.3's compiled ``paged_run`` / ``ragged_run`` with the argument list its wrapper's
    run() builds from what plan() stored: (op, args, slots of q, k, v, out, lse and the softmax scale,
    fa3 paged: ``sparse(k, middle)``, else None), or None for a JIT variant, multi-item scoring or
    no plan. Raises AttributeError / KeyError when a name is missing."""
    w = wrapper
    if getattr(w, "_jit_module", None) is not None or w._prefix_len_ptr is not None or w._backend != kind \
            or w._plan_info is None:
        return None
    if w._custom_mask_buf is not None:
        mask_mode = prefill.MaskMode.CUSTOM.value
    else:
        mask_mode = (prefill.MaskMode.CAUSAL if w._causal else prefill.MaskMode.NON_CAUSAL).value
    device = w._float_workspace_buffer.device
    head = (w._float_workspace_buffer, w._int_workspace_buffer, w._plan_info, None, None, None)
    common = (mask_mode, prefill.TensorLayout[w._kv_layout].value, w._window_left,
              torch.cuda.get_device_capability(device)[0] >= 9, w._custom_mask_buf, w._mask_indptr_buf,
              # the ragged wrapper keeps no head count (its run reads q.shape[1]): the plan's
              prefill._get_cache_alibi_slopes_buf(num_qo_heads, device), w._prefix_len_ptr,
              w._token_pos_in_items_ptr, w._max_item_len_ptr, w._logits_soft_cap or 0.0, None)
    rope = (w._rope_scale or 1.0, w._rope_theta or 1e4, w._token_pos_in_items_len)
    if not paged:
        args = head + (w._qo_indptr_buf, w._kv_indptr_buf, None, None) + common + rope
        return w._cached_module.ragged_run, args, _RAGGED_SLOTS, None
    # fa3: FlashInfer's run passes the vector-sparse indptr and (per call, ``sparse``) offsets
    indptr = w._vector_sparse_indptr_buffer if kind == "fa3" else w._paged_kv_indptr_buf
    args = (head + (w._qo_indptr_buf, indptr, w._paged_kv_indices_buf, w._paged_kv_last_page_len_buf, None, None)
            + common + (None, None, None) + rope
            + (w._workspace_size, w._num_qo_heads, w._num_kv_heads, w._block_tables, w._kv_lens_buffer, page_size,
               w._max_q_len, w._max_kv_len, w._batch_size, w._qo_indptr_buf, w._vector_sparse_indptr_buffer, None))
    return w._cached_module.paged_run, args, _PAGED_SLOTS, vector_sparse(prefill, w) if kind == "fa3" else None


def vector_sparse(prefill: Any, w: Any):
    """fa3's paged run: (k, middle) -> middle with the page indices as token offsets for k's
    strides, what FlashInfer 0.5.3's paged run() does before each fa3 launch
    (``block_sparse_indices_to_vector_sparse_offsets`` with ``stride_block // stride_n``, 1 and
    the page size; its output buffer, or the indices themselves for pages of one token)."""
    convert, nhd = prefill.block_sparse_indices_to_vector_sparse_offsets, w._kv_layout == "NHD"
    blocks, block_indptr, offsets, lens = (w._paged_kv_indices_buf, w._paged_kv_indptr_buf,
                                           w._vector_sparse_indices_buffer, w._kv_lens_buffer)
    offsets_indptr = w._vector_sparse_indptr_buffer

    def with_offsets(k, middle) -> tuple:
        token = 1 if nhd else 2
        indices = convert(blocks, block_indptr, offsets, offsets_indptr, lens, k.stride(0) // k.stride(token), 1,
                          k.shape[token])
        return (middle[0], middle[1], indices, middle[3])

    return with_offsets


# -- XQA: the kernel variant's entry ----------------------------------------------------------------
_XQA_MODULES: dict = {}  # 0.5.3: kernel variant -> FlashInfer's loaded JIT module (configuration only: a few)


def xqa_entry(key: tuple, abi: str) -> Callable:
    """The compiled XQA entry of a kernel variant ``key`` (q dtype, kv dtype, page size, head dim,
    group, sliding window, out dtype): abi "0.7", ``flashinfer.xqa.get_xqa_module(*key, 1,
    False).xqa`` (24 arguments, 0.7.2 xqa.py); "0.5", the JIT module's ``xqa_wrapper`` (21
    arguments, 0.5.3 jit/xqa.py ``gen_xqa_module``)."""
    if abi == "0.7":
        from flashinfer.xqa import get_xqa_module  # FlashInfer's cached kernel variant and its entry
        return get_xqa_module(*key, 1, False).xqa
    from flashinfer.jit.xqa import gen_xqa_module
    module = _XQA_MODULES.get(key)
    if module is None:
        module = _XQA_MODULES[key] = gen_xqa_module(*key).build_and_load()
    return module.xqa_wrapper
