"""The seven entry points keep FlashInfer's exact signatures (names, order, kinds, defaults).

Expected lists are written out literally from section 2 of flashinfer-calling-conventions.md.
"""
import functools
import inspect

import pytest

import dispatch

P, K = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
REQ = inspect.Parameter.empty

TRTLLM = [("query", P, REQ), ("kv_cache", P, REQ), ("workspace_buffer", P, REQ), ("block_tables", P, REQ),
          ("seq_lens", P, REQ), ("max_q_len", P, REQ), ("max_kv_len", P, REQ), ("bmm1_scale", P, REQ),
          ("bmm2_scale", P, REQ), ("batch_size", P, REQ), ("cum_seq_lens_q", P, REQ), ("cum_seq_lens_kv", P, REQ),
          ("window_left", P, -1), ("out", P, None), ("out_dtype", P, None), ("o_sf_scale", P, None),
          ("o_sf_vec_size", P, None), ("kv_layout", P, "HND"), ("enable_pdl", P, None), ("sinks", P, None),
          ("kv_cache_sf", P, None), ("skip_softmax_threshold_scale_factor", P, None),
          ("uses_shared_paged_kv_idx", P, True), ("causal", P, True), ("lse", P, None), ("return_lse", P, False),
          ("multi_ctas_kv_counter_buffer", P, None), ("use_fp16_softmax", P, None), ("uses_spcompress", P, None)]
XQA = [("query", P, REQ), ("kv_cache", P, REQ), ("workspace_buffer", P, REQ), ("block_tables", P, REQ),
       ("seq_lens", P, REQ), ("max_seq_len", P, REQ), ("bmm1_scale", P, 1.0), ("bmm2_scale", P, 1.0),
       ("window_left", P, -1), ("out", P, None), ("sinks", P, None), ("kv_layout", P, "NHD"),
       ("enable_pdl", P, None), ("q_len_per_req", P, 1), ("o_scale", P, 1.0), ("mask", P, None),
       ("kv_cache_sf", P, None), ("q_cu_seq_lens", P, None)]
CUDNN = [("q", P, REQ), ("k_cache", P, REQ), ("v_cache", P, REQ), ("scale", P, REQ), ("workspace_buffer", P, REQ),
         ("max_token_per_sequence", K, REQ), ("max_sequence_kv", K, REQ), ("actual_seq_lens_q", K, None),
         ("actual_seq_lens_kv", K, None), ("block_tables", K, None), ("causal", K, REQ), ("return_lse", K, REQ),
         ("q_scale", K, None), ("k_scale", K, None), ("v_scale", K, None), ("batch_offsets_q", K, None),
         ("batch_offsets_o", K, None), ("batch_offsets_k", K, None), ("batch_offsets_v", K, None),
         ("batch_offsets_stats", K, None), ("batch_offsets_units", K, "elements"), ("out", K, None),
         ("lse", K, None), ("is_cuda_graph_compatible", K, False), ("backend", K, None), ("o_data_type", K, None)]
SINGLE = [("q", P, REQ), ("k", P, REQ), ("v", P, REQ), ("scale_q", P, None), ("scale_k", P, None),
          ("scale_v", P, None), ("o_dtype", P, None), ("custom_mask", P, None), ("packed_custom_mask", P, None),
          ("causal", P, False), ("kv_layout", P, "NHD"), ("pos_encoding_mode", P, "NONE"),
          ("use_fp16_qk_reduction", P, False), ("sm_scale", P, None), ("window_left", P, -1),
          ("logits_soft_cap", P, None), ("rope_scale", P, None), ("rope_theta", P, None), ("backend", P, "auto"),
          ("return_lse", P, False), ("kv_cache_sf", P, None), ("k_scale", P, None), ("v_scale", P, None)]
PAGED_INIT = [("float_workspace_buffer", P, REQ), ("kv_layout", P, "NHD"), ("use_cuda_graph", P, False),
              ("qo_indptr_buf", P, None), ("paged_kv_indptr_buf", P, None), ("paged_kv_indices_buf", P, None),
              ("paged_kv_last_page_len_buf", P, None), ("custom_mask_buf", P, None), ("mask_indptr_buf", P, None),
              ("backend", P, "auto"), ("jit_args", P, None), ("jit_kwargs", P, None)]
RAGGED_INIT = [("float_workspace_buffer", P, REQ), ("kv_layout", P, "NHD"), ("use_cuda_graph", P, False),
               ("qo_indptr_buf", P, None), ("kv_indptr_buf", P, None), ("custom_mask_buf", P, None),
               ("mask_indptr_buf", P, None), ("backend", P, "auto"), ("jit_args", P, None), ("jit_kwargs", P, None)]
PAGED_PLAN = [("qo_indptr", P, REQ), ("paged_kv_indptr", P, REQ), ("paged_kv_indices", P, REQ),
              ("paged_kv_last_page_len", P, REQ), ("num_qo_heads", P, REQ), ("num_kv_heads", P, REQ),
              ("head_dim_qk", P, REQ), ("page_size", P, REQ), ("head_dim_vo", P, None), ("custom_mask", P, None),
              ("packed_custom_mask", P, None), ("causal", P, False), ("pos_encoding_mode", P, "NONE"),
              ("use_fp16_qk_reduction", P, False), ("sm_scale", P, None), ("window_left", P, -1),
              ("logits_soft_cap", P, None), ("rope_scale", P, None), ("rope_theta", P, None),
              ("q_data_type", P, "float16"), ("kv_data_type", P, None), ("o_data_type", P, None),
              ("non_blocking", P, True), ("prefix_len_ptr", P, None), ("token_pos_in_items_ptr", P, None),
              ("token_pos_in_items_len", P, 0), ("max_item_len_ptr", P, None), ("seq_lens", P, None),
              ("seq_lens_q", P, None), ("block_tables", P, None), ("max_token_per_sequence", P, None),
              ("max_sequence_kv", P, None), ("fixed_split_size", P, None), ("disable_split_kv", P, False)]
RAGGED_PLAN = [("qo_indptr", P, REQ), ("kv_indptr", P, REQ), ("num_qo_heads", P, REQ), ("num_kv_heads", P, REQ),
               ("head_dim_qk", P, REQ), ("head_dim_vo", P, None), ("custom_mask", P, None),
               ("packed_custom_mask", P, None), ("causal", P, False), ("pos_encoding_mode", P, "NONE"),
               ("use_fp16_qk_reduction", P, False), ("window_left", P, -1), ("logits_soft_cap", P, None),
               ("sm_scale", P, None), ("rope_scale", P, None), ("rope_theta", P, None),
               ("q_data_type", P, "float16"), ("kv_data_type", P, None), ("o_data_type", P, None),
               ("non_blocking", P, True), ("prefix_len_ptr", P, None), ("token_pos_in_items_ptr", P, None),
               ("token_pos_in_items_len", P, 0), ("max_item_len_ptr", P, None), ("fixed_split_size", P, None),
               ("disable_split_kv", P, False), ("seq_lens", P, None), ("seq_lens_q", P, None),
               ("max_token_per_sequence", P, None), ("max_sequence_kv", P, None), ("v_indptr", P, None),
               ("o_indptr", P, None)]
V = "VAR_POSITIONAL"
PAGED_RUN = [("q", P, REQ), ("paged_kv_cache", P, REQ), ("args", V, REQ), ("q_scale", K, None), ("k_scale", K, None),
             ("v_scale", K, None), ("out", K, None), ("lse", K, None), ("return_lse", K, False),
             ("enable_pdl", K, None), ("window_left", K, None), ("sinks", K, None), ("kv_cache_sf", K, None),
             ("skip_softmax_threshold_scale_factor", K, None), ("use_fp16_softmax", K, None),
             ("uses_spcompress", K, None)]
RAGGED_RUN = [("q", P, REQ), ("k", P, REQ), ("v", P, REQ), ("args", V, REQ), ("q_scale", K, None),
              ("k_scale", K, None), ("v_scale", K, None), ("o_scale", K, None), ("out", K, None), ("lse", K, None),
              ("return_lse", K, False), ("enable_pdl", K, None), ("kv_cache_sf", K, None)]


def params(fn, drop_self=False):
    ps = list(inspect.signature(fn).parameters.values())
    if drop_self:
        ps = ps[1:]
    return [(p.name, p.kind.name, p.default) for p in ps]


@pytest.mark.parametrize("fn, expected", [
    (dispatch.trtllm_batch_context_with_kv_cache, TRTLLM),
    (dispatch.xqa_batch_decode_with_kv_cache, XQA),
    (dispatch.cudnn_batch_prefill_with_kv_cache, CUDNN),
    (dispatch.single_prefill_with_kv_cache, SINGLE),
], ids=["trtllm", "xqa", "cudnn", "single"])
def test_function_signature(fn, expected):
    assert params(fn) == expected


@pytest.mark.parametrize("method, expected", [
    (dispatch.BatchPrefillWithPagedKVCacheWrapper.__init__, PAGED_INIT),
    (dispatch.BatchPrefillWithRaggedKVCacheWrapper.__init__, RAGGED_INIT),
    (dispatch.BatchPrefillWithPagedKVCacheWrapper.plan, PAGED_PLAN),
    (dispatch.BatchPrefillWithRaggedKVCacheWrapper.plan, RAGGED_PLAN),
    (dispatch.BatchPrefillWithPagedKVCacheWrapper.run, PAGED_RUN),
    (dispatch.BatchPrefillWithRaggedKVCacheWrapper.run, RAGGED_RUN),
], ids=["paged-init", "ragged-init", "paged-plan", "ragged-plan", "paged-run", "ragged-run"])
def test_wrapper_signature(method, expected):
    assert params(method, drop_self=True) == expected


@pytest.mark.parametrize("cls", [dispatch.BatchPrefillWithPagedKVCacheWrapper,
                                 dispatch.BatchPrefillWithRaggedKVCacheWrapper])
def test_wrapper_aliases(cls):
    assert cls.begin_forward is cls.plan
    for name in ("run_return_lse", "forward", "forward_return_lse"):
        assert callable(getattr(cls, name))


def test_return_lse_partial():
    part = dispatch.single_prefill_with_kv_cache_return_lse
    assert isinstance(part, functools.partial)
    assert part.func is dispatch.single_prefill_with_kv_cache and part.keywords == {"return_lse": True}
