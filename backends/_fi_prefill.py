"""FlashInfer's own fa2 / fa3 kernels as a provider (BatchPrefillWith{Paged,Ragged}KVCacheWrapper).

Translation (FlashInfer's documented signatures and docstrings, flashinfer/prefill.py):
* paged: our block_table + kv_lens -> (kv_indptr, kv_indices, last_page_len), the
  caller's physical layout is handed over as is (NHD or HND views, no copy);
* ragged/dense: kv_indptr as given;
* sm_scale is a plan-time float for FlashInfer (a device tensor is read once at plan);
  out_scale is applied after the kernel (FlashInfer itself does ``out *= v_scale``);
* LSE is already (total_q, Hq) base 2: written in place.

Caches: ``_wrappers``: (problem, device with its index, paged) -> a wrapper and its last plan
(``HeldWrapper``), an LRU of ``MAX_WRAPPERS`` per provider (each wrapper holds its own int workspace);
``_statics``: problem -> the same problem without its size class, an LRU of 256; the float workspace
is _vendor.workspace's, one per GPU. A plan remembers its arguments and re-plans the wrapper when
another plan used it in between, or when a run brings another float sm_scale (FlashInfer bakes
sm_scale into its plan; ours is a per-call value).

FlashInfer's private API (the compiled ops behind the public run, what plan() stored) is touched
only through backends/_flashinfer_internal.py, for the versions it was read in.
"""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Any, Optional

import torch

from backends import _flashinfer_internal as fi_internal, _vendor
from backends._device import BoundedCache, device_key
from backends._providers import Provider
from backends.base import Reason

SRC_CAUSAL = "flashinfer include/flashinfer/attention/prefill.cuh (SinglePrefillWithKVCacheDispatched)"

# FlashInfer 0.7.2's wrappers' run() builds the compiled op's arguments from plan-time attributes
# and the call's q, k, v, out, lse, and launches nothing else first for fa2 / fa3 without a JIT
# variant (flashinfer/prefill.py: BatchPrefillWithPagedKVCacheWrapper.run's run_args and paged_run,
# BatchPrefillWithRaggedKVCacheWrapper.run's and ragged_run): the first run after a plan records
# them (``recorded_run``), later runs call the op. 0.5.3's are built (``_direct_run``): its fa3
# paged run converts the page indices per call, which a recording would skip.
RECORDED_RUN_VERSIONS = ("0.7.",)
FLOAT_WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's examples use 128 MiB
MAX_WRAPPERS = 32
FA3_HEAD_DIMS = (64, 128, 256)  # FI utils.py fa3 (qk, vo) pairs with qk == vo
# DeepSeek's MLA prefill pair, which FlashInfer's own tests run through fa2's and fa3's ragged wrappers
# (tests/attention/test_hopper.py test_deepseek_prefill); fa2's is provider data (capability_db fa2.json)
DEEPSEEK_HEAD_DIMS = (192, 128)
SRC_DEEPSEEK = "flashinfer tests/attention/test_hopper.py test_deepseek_prefill (ragged, fa2 and fa3, 192/128)"
# FlashInfer's fa2 head dims are provider data by version (capability_db/backends/fa2.json): d=16 fails
# its dispatch ("Invalid configuration: NUM_MMA_D_QK=1", H200, 0.5.3); 512 arrived in 0.6.14 (#3576).
SRC_FI = "flashinfer flashinfer/utils.py (is_fa3_backend_supported, determine_attention_backend)"


class HeldWrapper:
    """A FlashInfer wrapper and the plan (FiState) that planned it last: a plan that finds another
    there plans again before its run."""

    __slots__ = ("wrapper", "last")

    def __init__(self, wrapper: Any):
        self.wrapper, self.last = wrapper, None


@dataclass
class FiState:
    wrapper: Any
    plan_args: tuple
    plan_kwargs: dict
    paged: bool
    direct: Optional["DirectRun"] = None  # fa2 / fa3: the compiled run (_direct_run, or recorded by run())
    record: bool = False  # the next run() records the compiled run's arguments (RECORDED_RUN_VERSIONS)
    held: Optional[HeldWrapper] = None  # shared by the plans of one wrapper (its own when not given)

    def __post_init__(self):
        if self.held is None and self.wrapper is not None:
            self.held = HeldWrapper(self.wrapper)


class DirectRun:
    """FlashInfer fa2's / fa3's compiled run (built for 0.5.3, ``_direct_run``; recorded for 0.7.2,
    ``recorded_run``) with the arguments its wrapper's run() would build from what plan() stored (flashinfer/prefill.py, run_args of each wrapper's run), split
    around the per-call tensors: ``fn(*head, q, k, v, *middle, out, lse, *tail)``; the softmax
    scale (a plan-time value) is in ``tail``. ``sparse``: fa3's paged run, whose page indices
    FlashInfer's run() turns into token offsets for the call's K strides on every call
    (``middle`` then comes from ``sparse(k, middle)``)."""

    __slots__ = ("fn", "head", "middle", "tail", "sparse")

    def __init__(self, fn: Any, args: tuple, slots: tuple, sm_scale: Optional[float], sparse: Any = None):
        q, k, v, out, lse, scale = slots
        if (k, v, lse) != (q + 1, q + 2, out + 1) or not q < out or (scale is not None and not out < scale):
            raise IndexError(f"slots {slots}: q, k, v and out, lse must be adjacent, in that order")
        args = list(args)
        if scale is not None:  # None: the recorded arguments hold the plan's scale already
            args[scale] = sm_scale
        self.fn, self.head, self.middle, self.tail = fn, tuple(args[:q]), tuple(args[v + 1:out]), tuple(args[lse + 1:])
        self.sparse = sparse

    def __call__(self, q, k, v, out, lse) -> None:
        middle = self.middle if self.sparse is None else self.sparse(k, self.middle)
        self.fn(*self.head, q, k, v, *middle, out, lse, *self.tail)


def recorded_run(fn: Any, args: tuple, tensors: tuple, plan_time: set) -> Optional[DirectRun]:
    """The DirectRun of an op called with ``args`` by a public run of ``tensors`` (q, k, v, out,
    lse), or None unless: q, k, v are the call's own tensors at adjacent places, out and lse
    (or None) likewise, and every other tensor is a plan-time one (its id in ``plan_time``: the
    wrapper's buffers, FlashInfer's cached ALiBi slopes). A tensor FlashInfer made or converted for
    this call (a cast q, a fresh buffer) would be stale at the next call: then public runs stay."""
    q, k, v, out, lse = tensors
    places = [next((i for i, a in enumerate(args) if a is t), None) for t in (q, k, v, out)]
    if None in places:
        return None
    at_q, at_out = places[0], places[3]
    at_lse = at_out + 1
    if places[1:3] != [at_q + 1, at_q + 2] or not at_q < at_out or at_lse >= len(args) or args[at_lse] is not lse:
        return None
    call_places = {at_q, at_q + 1, at_q + 2, at_out, at_lse}
    if any(isinstance(a, torch.Tensor) and i not in call_places and id(a) not in plan_time
           for i, a in enumerate(args)):
        return None
    return DirectRun(fn, args, (at_q, at_q + 1, at_q + 2, at_out, at_lse, None), None)


def _packed_mask_bytes(batch) -> int:
    """Bytes of FlashInfer's packed custom mask for the batch (its plan packs per request)."""
    sizes = batch.mask_indptr.diff().tolist()
    return max(1, sum((n + 7) // 8 for n in sizes))


class FlashInferPrefill(Provider):
    module = "flashinfer.prefill"
    extra = "flashinfer"

    def __init__(self, kind: str):
        self.kind = kind  # "fa2" | "fa3": FlashInfer's backend= string
        self.label = f"flashinfer {kind}"
        self._wrappers = BoundedCache(MAX_WRAPPERS)
        self._statics = BoundedCache(256)  # problem -> the problem without its size class

    def limits(self, problem) -> list[Reason]:
        out = []
        if self.kind == "fa2":  # head dims by installed version: capability_db/backends/fa2.json's provider data
            out.extend(self.data_limits("fa2", problem))
        if self.kind == "fa3":
            out.extend(self._fa3_head_dims(problem))
            if problem.mask == "custom":
                out.append(Reason("mask", problem.mask, "'none' (fa3 has no custom mask)", SRC_FI))
            if problem.pos_encoding != "NONE":
                out.append(Reason("pos_encoding", problem.pos_encoding, "'NONE' for fa3", SRC_FI))
            if problem.q_dtype.startswith("float8") or problem.kv_fp8:
                out.append(Reason("kv_dtype", problem.kv_dtype, "16-bit (FI paged fa3 run passes no fp8 scales)",
                                  "flashinfer 0.5.3 prefill.py run(): scale_q/k/v 'not supported yet'"))
        return out

    @staticmethod
    def _fa3_head_dims(problem) -> list[Reason]:
        dims = (problem.head_dim_qk, problem.head_dim_vo)
        if dims == DEEPSEEK_HEAD_DIMS:
            if problem.kv_storage != "ragged":
                return [Reason("kv_storage", problem.kv_storage, "'ragged' with head dims 192/128", SRC_DEEPSEEK)]
            return []
        if problem.head_dim_qk not in FA3_HEAD_DIMS:
            return [Reason("head_dim_qk", problem.head_dim_qk, f"one of {FA3_HEAD_DIMS} (or 192 with head_dim_vo 128, "
                           "ragged)", SRC_FI)]
        if problem.head_dim_vo != problem.head_dim_qk:
            return [Reason("head_dim_vo", problem.head_dim_vo, f"equal to head_dim_qk {problem.head_dim_qk}", SRC_FI)]
        return []

    # -- plan ------------------------------------------------------------------------------
    def _wrapper(self, problem, device, paged: bool):
        device = device_key(device)
        # one wrapper per problem whatever its size class: a new FlashInfer wrapper allocates its int
        # workspace and a pinned host buffer (milliseconds), and a serving loop meets a new class often
        key = (self._static(problem), device, paged)
        held = self._wrappers.get(key)
        if held is None:
            prefill = self.loaded().module
            ws = _vendor.workspace("flashinfer-float", device, FLOAT_WORKSPACE_BYTES, zeroed=False)
            if paged:
                w = prefill.BatchPrefillWithPagedKVCacheWrapper(ws, problem.kv_layout, backend=self.kind)
            else:
                w = prefill.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=self.kind)
            held = HeldWrapper(w)
            self._wrappers.put(key, held)
        return held

    def _static(self, problem):
        """The problem without its size class (a replace costs ~30 us; a plan per step pays it once per class)."""
        static = self._statics.get(problem)
        if static is None:
            static = dataclasses.replace(problem, sizes=())
            self._statics.put(problem, static)
        return static

    def _graph_wrapper(self, problem, batch, paged: bool):
        """A FlashInfer wrapper in its CUDA-graph mode, owned by one plan (never shared: another
        plan would overwrite the schedule a captured graph reads), with fixed index buffers sized
        by this batch: its batch size, and room for the page ids of the block table's width. Its
        plan() writes a later batch into them in place (``follow``)."""
        prefill, device = self.loaded().module, batch.q.device
        ws = _vendor.workspace("flashinfer-float", device, FLOAT_WORKSPACE_BYTES, zeroed=False)
        n = batch.batch_size
        buffers = dict(use_cuda_graph=True, qo_indptr_buf=torch.empty(n + 1, dtype=torch.int32, device=device))
        if problem.mask == "custom":
            buffers.update(custom_mask_buf=torch.empty(_packed_mask_bytes(batch), dtype=torch.uint8, device=device),
                           mask_indptr_buf=torch.empty(n + 1, dtype=torch.int32, device=device))
        if not paged:
            return prefill.BatchPrefillWithRaggedKVCacheWrapper(
                ws, "NHD", kv_indptr_buf=torch.empty(n + 1, dtype=torch.int32, device=device), backend=self.kind,
                **buffers)
        return prefill.BatchPrefillWithPagedKVCacheWrapper(
            ws, problem.kv_layout, paged_kv_indptr_buf=torch.empty(n + 1, dtype=torch.int32, device=device),
            paged_kv_indices_buf=torch.empty(max(1, batch.block_table.numel()), dtype=torch.int32, device=device),
            paged_kv_last_page_len_buf=torch.empty(n, dtype=torch.int32, device=device), backend=self.kind,
            **buffers)

    def _common_kwargs(self, problem, batch) -> dict:
        scale = self._host_scale(batch.sm_scale)
        kwargs = dict(
            head_dim_vo=problem.head_dim_vo,
            causal=problem.causal,
            pos_encoding_mode=problem.pos_encoding,
            sm_scale=scale,
            window_left=problem.window_left,
            logits_soft_cap=problem.logits_soft_cap,
            q_data_type=batch.q.dtype,
            kv_data_type=batch.k.dtype,
        )
        if problem.pos_encoding == "ROPE_LLAMA":
            kwargs.update(rope_scale=problem.rope_scale, rope_theta=problem.rope_theta)
        if problem.mask == "custom":
            kwargs["custom_mask"] = batch.custom_mask
        return kwargs

    def plan_reusable(self, problem) -> bool:
        # One request: the compiled op and its fixed arguments depend on dtypes and the device
        # only; run() reads the scale, the tensors and the mask of each call.
        return problem.kv_storage == "dense"

    def plans_before_run(self, problem) -> bool:
        # a batch plan reads the index tensors, dtypes, device and scale; one request plans its op
        # from the tensors of the call
        return problem.kv_storage != "dense"

    def reads_block_table(self, problem) -> bool:
        # a wrapper's paged plan hands FlashInfer the caller's page lists (extras["paged_csr"]); a
        # CUDA-graph plan sizes its index buffers by the block table
        return problem.cuda_graph

    def plan(self, problem, batch) -> FiState:
        if problem.kv_storage == "dense":  # one request: FlashInfer's single-request kernel, no batch plan
            op = self._single_op(problem, batch)
            return FiState(None, op or (), self._common_kwargs(problem, batch), False)
        paged = problem.kv_storage == "paged"
        # graph mode (use_cuda_graph=True): a wrapper of the plan's own
        held = (HeldWrapper(self._graph_wrapper(problem, batch, paged)) if problem.cuda_graph
                else self._wrapper(problem, batch.q.device, paged))
        kwargs = self._common_kwargs(problem, batch)
        state = FiState(held.wrapper, self._index_args(problem, batch, kwargs), kwargs, paged, held=held)
        self._apply_plan(state)
        return state

    @staticmethod
    def _index_args(problem, batch, kwargs: dict) -> tuple:
        """plan()'s positional arguments for the batch's index tensors (``kwargs`` takes seq_lens)."""
        # FlashInfer's plan reads the indptrs and lengths on the host: the wrapper's host copies, when
        # it kept them, spare it a synchronizing copy of each from the device
        host = batch.extras.get("host_indices") or {}
        qo_indptr = host.get("qo_indptr", batch.qo_indptr)
        if problem.kv_storage != "paged":
            return (qo_indptr, host.get("kv_indptr", batch.kv_indptr), problem.num_qo_heads, problem.num_kv_heads,
                    problem.head_dim_qk)
        csr = batch.extras.get("paged_csr")  # the caller's page lists, kept by the wrapper's plan
        indptr, indices, last = csr or _vendor.paged_csr(batch.block_table, batch.kv_lens, problem.page_size)
        kwargs["seq_lens"] = host.get("kv_lens", batch.kv_lens)
        return (qo_indptr, indptr, indices, last, problem.num_qo_heads, problem.num_kv_heads,
                problem.head_dim_qk, problem.page_size)

    def captured(self, problem, state: FiState) -> None:
        """A graph captured this plan's launches: its FlashInfer wrapper leaves the shared cache, so
        no other plan re-plans it (its schedule, in the wrapper's int workspace, is what they read)."""
        if state.held is not None:
            self._wrappers.drop_value(state.held)

    # -- follow (a captured graph's plan, re-planned in place: Backend.follow_refusal) ----------
    def follow_refusal(self, problem, state: FiState, batch) -> Optional[str]:
        room = fi_internal.graph_room(state.wrapper) if state.wrapper is not None else None
        if room is None:
            return f"{self.label}: the plan was not made for a CUDA graph (use_cuda_graph=False)"
        if not fi_internal.checked(self.version()):
            return (f"{self.label}: flashinfer {self.version()}; its graph re-plan (the wrapper's fixed buffers) was "
                    f"read in {', '.join(fi_internal.CHECKED_VERSIONS)} only")
        fixed_batch, page_ids, mask_bytes = room
        if batch.batch_size != fixed_batch:
            return f"{self.label}: batch size {batch.batch_size}, the graph's is {fixed_batch}"
        if state.paged and batch.block_table.numel() > page_ids:
            return f"{self.label}: {batch.block_table.numel()} block-table entries, room for {page_ids} page ids"
        if problem.mask == "custom" and _packed_mask_bytes(batch) > mask_bytes:
            return f"{self.label}: a custom mask of {_packed_mask_bytes(batch)} bytes, room for {mask_bytes}"
        return None

    def follow(self, problem, state: FiState, batch) -> None:
        """FlashInfer's own CUDA-graph re-plan: the new indices into the wrapper's fixed buffers and
        a schedule of the same shape (FlashInfer keeps it for a fixed batch size and at most the
        first plan's rows), which the captured launches read."""
        captured = fi_internal.plan_info(state.wrapper)
        kwargs = dict(state.plan_kwargs)
        if problem.mask == "custom":
            kwargs["custom_mask"] = batch.custom_mask
        state.plan_args, state.plan_kwargs = self._index_args(problem, batch, kwargs), kwargs
        self._apply_plan(state)
        replanned = fi_internal.plan_info(state.wrapper)
        if replanned != captured:  # FlashInfer's graph mode promises it does not
            raise RuntimeError(f"{self.label}: the re-plan changed the schedule a captured CUDA graph reads "
                               f"({captured} -> {replanned}); capture the graph again")

    def _single_layout(self, problem, batch) -> tuple:
        """(k, v, layout) for the single-request kernel: the caller's physical layout, except that
        flashinfer 0.5.3's fa3 binding (csrc/single_prefill_sm90.cu) reads kv_len/num_kv_heads as
        k.size(0)/(1) whatever the layout (HND crashed with SIGFPE on the H100): fa3 gets the NHD
        view, whose strides it honours."""
        if problem.kv_layout == "HND" and self.kind != "fa3":
            return batch.k.transpose(0, 1), batch.v.transpose(0, 1), "HND"
        return batch.k, batch.v, "NHD"

    def _single_op(self, problem, batch) -> Any:
        """FlashInfer's compiled single-prefill op and its fixed arguments, prepared once per
        problem (not paying FlashInfer's Python layer and an out copy per call), or None to use
        the public function (fp8, NVFP4, or a FlashInfer version whose op takes other arguments). A
        custom mask is packed per call with FlashInfer's own ``packbits``, as its public function
        does (H200, single 1 x 31 x 203 with a mask: 67 us of host time through that function
        against FlashInfer's own 37.5, bench-random-150-seed-2591390485-cuda-from-48). The module
        is loaded here either way: a first use compiles it, and a compile that fails is then a
        plan-time refusal the router hands over, not an error in mid-call."""
        prefill = self.loaded().module
        if problem.q_dtype.startswith("float8") or problem.kv_nvfp4 or not fi_internal.checked(self.version()):
            return None
        masked = problem.mask == "custom"
        try:
            run = fi_internal.single_prefill_op(prefill, self.kind, problem, batch.q.dtype, batch.k.dtype,
                                                batch.out.dtype, self._single_layout(problem, batch)[2], masked,
                                                batch.q.device)
        except (AttributeError, KeyError, TypeError):
            return None
        return run, prefill.packbits if masked else None

    def _run_single(self, problem, state: FiState, batch) -> None:
        """One request on FlashInfer's single-request kernel, written straight into batch.out."""
        scale = self._host_scale(batch.sm_scale)  # per call: never baked
        _vendor.refuse_causal_overhang(self.label, problem.causal, batch.q.shape[0], batch.k.shape[0], SRC_CAUSAL)
        k, v, layout = self._single_layout(problem, batch)
        if state.plan_args:
            run, pack = state.plan_args
            run(batch.q, k, v, batch.out, batch.lse, pack(batch.custom_mask, bitorder="little") if pack else None,
                scale)
        else:
            self._run_single_public(problem, state, batch, k, v, layout, scale)
        _vendor.apply_out_scale(batch.out, batch.out_scale)

    def _run_single_public(self, problem, state, batch, k, v, layout, scale) -> None:
        kw = {n: x for n, x in state.plan_kwargs.items() if n not in ("head_dim_vo", "q_data_type", "kv_data_type")}
        kw["sm_scale"] = scale
        if problem.mask == "custom":
            kw["custom_mask"] = batch.custom_mask.view(batch.q.shape[0], batch.k.shape[0])
        if problem.kv_nvfp4:  # the scale factors in K's physical layout, as the bytes FlashInfer's tests pass
            kw["kv_cache_sf"] = tuple((sf.transpose(0, 1) if layout == "HND" else sf).view(torch.uint8)
                                      for sf in (batch.k_sf, batch.v_sf))
        res = self.loaded().module.single_prefill_with_kv_cache(
            batch.q, k, v, kv_layout=layout, backend=self.kind, return_lse=batch.lse is not None, **kw)
        out, lse = res if batch.lse is not None else (res, None)
        batch.out.copy_(out)
        if lse is not None:
            batch.lse.copy_(lse)

    def _apply_plan(self, state: FiState) -> None:
        state.wrapper.plan(*state.plan_args, **state.plan_kwargs)
        state.held.last = state
        state.direct = self._direct_run(state)
        state.record = state.direct is None and self._recordable(state.wrapper)

    def _recordable(self, w: Any) -> bool:
        version = self.version() or ""
        return (self.kind in ("fa2", "fa3") and version.startswith(RECORDED_RUN_VERSIONS)
                and fi_internal.checked(version) and fi_internal.recordable(w, self.kind))

    @staticmethod
    def _scale_factors(problem, state: FiState, batch) -> Optional[tuple]:
        """An NVFP4 cache's (k_sf, v_sf) as FlashInfer's run() takes them: the scale bytes in the
        cache's physical layout (its tests pass uint8); None for any other cache."""
        if batch.k_sf is None:
            return None
        k_sf, v_sf = _vendor.physical_kv(problem, batch.k_sf, batch.v_sf)[:2] if state.paged else (batch.k_sf,
                                                                                                   batch.v_sf)
        return k_sf.view(torch.uint8), v_sf.view(torch.uint8)

    def _public_run(self, state: FiState, q, k, v, out, lse, kv_sf: Optional[tuple] = None) -> None:
        """FlashInfer's own run(); the first after a plan of a RECORDED_RUN_VERSIONS wrapper
        records its op's arguments, and later runs call the op (``state.direct``). An NVFP4 cache's
        scale factors go with every call (``recorded_run`` keeps no op that took them)."""
        w = state.wrapper
        kv = ((k, v),) if state.paged else (k, v)
        kw = dict(out=out, lse=lse, return_lse=lse is not None)
        if kv_sf is not None:
            kw["kv_cache_sf"] = kv_sf
        if not state.record:
            w.run(q, *kv, **kw)
            return
        state.record = False
        op, calls = fi_internal.record_run(w, "paged_run" if state.paged else "ragged_run", lambda: w.run(q, *kv, **kw))
        if len(calls) == 1:
            plan_time = fi_internal.plan_time_tensor_ids(self.loaded().module, w, q.shape[1], q.device)
            state.direct = recorded_run(op, calls[0], (q, k, v, out, lse), plan_time)

    def _direct_run(self, state: FiState) -> Optional[DirectRun]:
        """FlashInfer 0.5.3 fa2's / fa3's compiled ``paged_run`` / ``ragged_run`` (the module's
        op, which takes one argument list for both kinds and drops what fa3 does not read) with
        its arguments as the wrapper's run() builds them from what plan() stored, so a run pays
        no FlashInfer Python layer; None (the public run) for another version or kind, a JIT
        variant, or anything missing."""
        version = self.version() or ""
        if self.kind not in ("fa2", "fa3") or not version.startswith("0.5.") or not fi_internal.checked(version):
            return None
        try:
            found = fi_internal.direct_run_args(self.loaded().module, state.wrapper, self.kind, state.paged,
                                                state.plan_args[4 if state.paged else 2],
                                                state.plan_args[7] if state.paged else 0)
            if found is None:
                return None
            fn, args, slots, sparse = found
            return DirectRun(fn, args, slots, state.plan_kwargs["sm_scale"], sparse)
        except (AttributeError, KeyError, TypeError, IndexError):
            return None

    # -- run -------------------------------------------------------------------------------
    def run(self, problem, state: FiState, batch) -> None:
        if state.wrapper is None:
            return self._run_single(problem, state, batch)
        scale = self._host_scale(batch.sm_scale)
        if scale != state.plan_kwargs["sm_scale"]:
            state.plan_kwargs = {**state.plan_kwargs, "sm_scale": scale}  # a plan must not bake it
            state.held.last = None
        if state.held.last is not state:
            self._apply_plan(state)  # another plan used the wrapper meanwhile, or the scale changed
        out = _vendor.writable(batch.out)
        lse = _vendor.writable(batch.lse)
        k, v = _vendor.physical_kv(problem, batch.k, batch.v)[:2] if state.paged else (batch.k, batch.v)
        if state.direct is not None:
            state.direct(batch.q, k, v, out, lse)
        else:
            self._public_run(state, batch.q, k, v, out, lse, self._scale_factors(problem, state, batch))
        _vendor.write_back(batch.out, out)
        _vendor.write_back(batch.lse, lse)
        _vendor.apply_out_scale(batch.out, batch.out_scale)

    def _host_scale(self, scale) -> float:
        """The softmax scale as the float FlashInfer's ops take, refused when negative (before any
        launch). A device scale (a tensor q_scale / k_scale folded in) is read on the host: a sync,
        outside a CUDA-graph capture only (a read there would break the capture: the router hands
        the call on)."""
        if isinstance(scale, torch.Tensor):
            if scale.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise _vendor.rejected(self.kind, "sm_scale", "a device tensor inside a CUDA-graph capture",
                                       "a float: FlashInfer's wrappers take the softmax scale on the host",
                                       "flashinfer flashinfer/prefill.py (run: sm_scale *= q_scale, k_scale)")
            scale = _vendor.host_float(scale)
        value = float(scale)
        _vendor.refuse_negative_scale(self.label, value, self.label)
        return value

    # -- launch (exact repeats: Backend.launcher) ----------------------------------------------
    def launcher(self, problem, state: FiState, batch):
        """The compiled op with everything but the call's tensors bound, for repeats of a call
        that wrote straight into the caller's buffers with a float scale and no output scale."""
        if (isinstance(batch.sm_scale, torch.Tensor) or not _vendor.is_unit(batch.out_scale)
                or not batch.out.is_contiguous() or (batch.lse is not None and not batch.lse.is_contiguous())):
            return None
        if state.wrapper is None:
            return self._single_launcher(problem, state, batch) if state.plan_args else None
        if state.direct is None or float(batch.sm_scale) != state.plan_kwargs["sm_scale"]:
            return None
        hnd = state.paged and problem.kv_layout == "HND"
        held, scale = state.held, state.plan_kwargs["sm_scale"]

        def launch_batch(b) -> None:
            # The state is shared by the lanes of one plan: another lane's scale re-plans it (run), and
            # another of our plans may have used the shared FlashInfer wrapper: then run re-plans for b.
            fresh = held.last is state and state.plan_kwargs["sm_scale"] == scale
            d = state.direct if fresh else None
            if d is None:
                self.run(problem, state, b)
            elif hnd:
                d(b.q, b.k.permute(0, 2, 1, 3), b.v.permute(0, 2, 1, 3), b.out, b.lse)
            elif d.sparse is not None:  # fa3 paged: the page offsets for this call's K first
                d(b.q, b.k, b.v, b.out, b.lse)
            else:  # DirectRun.__call__ inlined: one Python frame less on the hottest path
                d.fn(*d.head, b.q, b.k, b.v, *d.middle, b.out, b.lse, *d.tail)

        return launch_batch

    def _single_launcher(self, problem, state: FiState, batch):
        run, pack = state.plan_args
        scale = float(batch.sm_scale)
        if scale < 0:
            return None
        transposed = self._single_layout(problem, batch)[2] == "HND"

        # No causal-overhang check here: a launcher serves one lane, whose key holds q's and k's
        # shapes, and is made only after run() (which checks) served that lane.
        def launch_single(b) -> None:
            k, v = (b.k.transpose(0, 1), b.v.transpose(0, 1)) if transposed else (b.k, b.v)
            run(b.q, k, v, b.out, b.lse, pack(b.custom_mask, bitorder="little") if pack else None, scale)

        return launch_single
