"""What the two batch prefill wrappers share: plan once, run per layer.

``plan`` copies the index tensors to the host (it may synchronize), converts them once (block
table + kv_lens, token indptrs, unpacked masks) and decides. The chosen vendor plans on the
first ``run``, against the caller's real tensors (so run once outside a CUDA-graph capture
first, as with FlashInfer). ``run`` checks what its key does not prove, builds the batch and
launches: no host synchronization, no allocation but ``out``/``lse`` when they are not given.
A run-time argument that changes the problem (sinks, an LSE, a window override, the deprecated
``forward``'s plan-time options) is decided and planned once per variant of the plan.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from types import SimpleNamespace

import torch

from backends import BoundedCache, get_backend

from .. import autotune, checks, choice, devices, nvfp4, ops, policy, router
from ..checks import (FP8_DTYPES, OUT_DTYPES, PosMode, Q_DTYPES, Scale, Spec, bad, block_table_from_pages,
                      check_indptr_values, check_scale, cumsum0, fold_scale, need_finite, need_heads, need_index,
                      need_int, need_out, need_query, need_sinks, need_soft_cap, need_tensor, need_window,
                      out_dtype_of, parse_dtype, unpack_bits)
from ..problem import AttentionBatch, AttentionProblem, dtype_name, size_class
from . import _base as B
from . import _lse
from ._base import is_dry
from ._captures import Captured

_CUDA = torch.cuda.is_available()  # a CPU-only torch cannot ask whether a stream captures


@dataclasses.dataclass
class Setup:
    """What plan() fixed: sizes, dtypes, index tensors on the device, the problem."""

    hq: int
    hkv: int
    dqk: int
    dvo: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    out_dtype: torch.dtype
    layout: str
    backend: Optional[str]
    cudnn: bool
    window_left: int
    total_q: int
    sm_scale: float
    qo_indptr: torch.Tensor
    kv_lens: torch.Tensor
    max_q: int
    max_kv: int
    custom_mask: Optional[torch.Tensor]
    mask_indptr: Optional[torch.Tensor]
    problem: AttentionProblem
    batch_size: int
    page_size: int = 0
    max_page_id: int = -1
    block_table: Optional[torch.Tensor] = None  # read through table(): made from ``pages`` on first use
    pages: Optional[tuple] = None  # (kv_indptr on the host, the page ids it covers on the host)
    # the caller's page lists as FlashInfer's plan takes them (indptr from 0 and last page lengths on
    # the host, ids on the device), so a vendor planned from them needs no conversion back from the table
    paged_csr: Optional[tuple] = None
    # the index values plan() read, on the host (qo_indptr, kv_lens, kv_indptr): a vendor whose plan
    # reads them on the host (FlashInfer's) takes these, not a device copy it would synchronize on
    host_indices: Optional[dict] = None
    kv_indptr: Optional[torch.Tensor] = None
    total_kv: int = 0
    device: Any = None  # the workspace's: where the plan lives and every run must be

    def table(self) -> Optional[torch.Tensor]:
        """The block table; a paged plan's is made from its page lists the first time a backend
        reads it (another thread making it too makes an equal one)."""
        if self.block_table is None and self.pages is not None:
            self.block_table = block_table_from_pages(*self.pages, self.device)
        return self.block_table


class TableOnRead(AttentionBatch):
    """A paged plan's batch: its ``block_table`` is the plan's ``Setup.table()``, made when a backend
    first reads it, unless a value was set."""

    @property  # type: ignore[override]
    def block_table(self) -> Optional[torch.Tensor]:
        table = self.__dict__.get("_block_table")
        setup = self.__dict__.get("_setup")
        return setup.table() if table is None and setup is not None else table

    @block_table.setter
    def block_table(self, value: Optional[torch.Tensor]) -> None:
        self.__dict__["_block_table"] = value


def batch_of(setup: Setup, **fields: Any) -> AttentionBatch:
    """An AttentionBatch of ``setup``'s plan: one whose block table waits for its first reader where
    the plan has page lists to make it from."""
    if setup.block_table is not None or setup.pages is None:
        return AttentionBatch(block_table=setup.block_table, **fields)
    batch = TableOnRead(block_table=None, **fields)
    batch.__dict__["_setup"] = setup
    return batch


class PrefillWrapper:
    """Base of the paged and ragged wrappers (constructor checks, plan finish, run launch)."""

    _entry = ""
    _storage = ""

    def _init(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs,
              variant_owns_mask=False) -> None:
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise bad("float_workspace_buffer", float_workspace_buffer, "a torch.Tensor", TypeError)
        if kv_layout not in ("NHD", "HND"):
            raise bad("kv_layout", kv_layout, "'NHD' or 'HND'")
        if jit_args is not None or jit_kwargs is not None:
            raise bad("jit_args" if jit_args is not None else "jit_kwargs", jit_args if jit_args is not None
                      else jit_kwargs, "None (JIT variants are not supported)")
        if variant_owns_mask:  # FlashInfer: True hands the whole mask to a custom variant's LogitsMask hook
            raise bad("variant_owns_mask", variant_owns_mask, "False (True needs a custom attention variant "
                      "through jit_args with backend='fa2', as FlashInfer 0.7 requires; JIT variants are not "
                      "supported)")
        self._backend = policy.normalize_backend_name(backend)  # unknown names fail here, with the options
        self._float_workspace = float_workspace_buffer
        self._int_workspace: Optional[torch.Tensor] = None
        self._device = float_workspace_buffer.device
        self._desc = None  # the router's description of that device (``_device_desc``)
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._graph_pages = 0  # the page capacity of a graph-mode wrapper's indices buffer (paged)
        self._plan: Optional[Setup] = None
        self._calls: Optional[B.Calls] = None  # the plan's call cache (plan() makes it)
        # the plans whose runs a CUDA graph captured (kept: the graph reads their tensors); the
        # latest's, with use_cuda_graph=True, follows plan() (dispatch.entries._captures)
        self._captures: list[Captured] = []
        self._last: Optional[router.Planned] = None
        self._handle = ops.register_wrapper(self)  # how a torch.compile graph names this wrapper

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor,
                               int_workspace_buffer: torch.Tensor) -> None:
        """Replace the workspace buffers (kept for the caller; our backends allocate their own
        scratch per plan, so nothing planned depends on them)."""
        for name, buf in (("float_workspace_buffer", float_workspace_buffer),
                          ("int_workspace_buffer", int_workspace_buffer)):
            if not isinstance(buf, torch.Tensor):
                raise bad(name, buf, "a torch.Tensor", TypeError)
            if buf.device != self._device:
                raise bad(f"{name}.device", buf.device, f"{self._device}, the device of the wrapper's workspace")
        self._float_workspace, self._int_workspace = float_workspace_buffer, int_workspace_buffer

    def _forget_decisions(self) -> None:
        """Decide each variant again on its next run (autotune was switched)."""
        if self._calls is not None:
            self._calls.clear()

    def end_forward(self) -> None:
        """Deprecated FlashInfer no-op (plans are released with the wrapper)."""

    # -- plan -------------------------------------------------------------------------------------
    def _finish_plan(self, spec, d, **storage: Any) -> None:
        """The plan's problem and Setup from the checked arguments: a captured graph follows it in
        place (or refuses it unchanged); else it becomes the wrapper's plan (``_take_plan``)."""
        dev = self._device
        q_lens = [b - a for a, b in zip(d.qo[:-1], d.qo[1:])]
        custom = self._plan_mask(spec, q_lens, d.kv_lens)
        sizes = [a * b for a, b in zip(q_lens, d.kv_lens)]
        # a graph runs its one backend at every kv length it replays: decided for them all, once;
        # how far they reach: plan(max_sequence_kv=...), else the indices buffer the wrapper was given
        graph_kv = spec.max_sequence_kv or self._graph_pages * storage.get("page_size", 0)
        replay_kv = choice.replay_bound(max([*d.kv_lens, graph_kv, 1])) if self._use_cuda_graph else 0
        problem = AttentionProblem(
            entry=self._entry, phase="decode" if q_lens and all(n == 1 for n in q_lens) else "prefill",
            kv_storage=self._storage, kv_layout="HND" if d.cudnn else self._kv_layout, num_qo_heads=d.hq,
            num_kv_heads=d.hkv, head_dim_qk=d.dqk, head_dim_vo=d.dvo, q_dtype=dtype_name(d.q_dtype),
            kv_dtype=dtype_name(d.kv_dtype), out_dtype=dtype_name(d.out_dtype), page_size=storage.get("page_size", 0),
            causal=spec.causal, window_left=spec.window_left, mask="custom" if custom is not None else "none",
            logits_soft_cap=float(spec.logits_soft_cap or 0.0), pos_encoding=spec.pos_encoding_mode,
            rope_scale=float(spec.rope_scale or 1.0), rope_theta=float(spec.rope_theta or 1e4),
            device_type="cpu" if dev.type == "cpu" else "cuda", cuda_graph=self._use_cuda_graph, replay_kv=replay_kv,
            sizes=size_class(len(q_lens), max(q_lens), replay_kv or max(d.kv_lens, default=1)) if q_lens else ())
        max_kv = max(d.kv_lens, default=0)
        if self._use_cuda_graph:  # room for the lengths a captured graph will replay (native's splits)
            max_kv = max(max_kv, graph_kv)
            custom, storage = graph_owned(custom, storage, graph_kv)
            storage.pop("paged_csr", None)  # a captured graph reads the table it was planned with
        else:
            storage["host_indices"] = host_indices(d, ragged=self._storage == "ragged")
        # qo_indptr and kv_lens reach the device in one copy (two views of it)
        index = torch.tensor([*d.qo, *d.kv_lens], dtype=torch.int32, device=dev)
        plan = Setup(
            hq=d.hq, hkv=d.hkv, dqk=d.dqk, dvo=d.dvo, q_dtype=d.q_dtype, kv_dtype=d.kv_dtype, out_dtype=d.out_dtype,
            layout=self._kv_layout, backend=self._backend, cudnn=d.cudnn, window_left=spec.window_left,
            total_q=d.qo[-1] - d.qo[0], sm_scale=spec.sm_scale if spec.sm_scale is not None else 1.0 / math.sqrt(d.dqk),
            qo_indptr=index[:len(d.qo)], kv_lens=index[len(d.qo):], max_q=max(q_lens, default=0),
            max_kv=max_kv, custom_mask=custom,
            mask_indptr=torch.tensor(cumsum0(sizes), dtype=torch.int32, device=dev) if custom is not None else None,
            problem=problem, batch_size=len(d.kv_lens), device=dev, **storage)
        if self._captures and self._use_cuda_graph and self._captures[-1].setup is self._plan:
            self._captures[-1].follow(plan)  # the graph follows: written in place, or refused unchanged
            if self._storage == "paged":
                self._extras["pages_used"] = self._plan.max_page_id + 1
            return
        self._take_plan(plan, problem)

    def _take_plan(self, plan: Setup, problem: AttentionProblem) -> None:
        """Make ``plan`` the wrapper's: its call cache, its extras, and its decision made now."""
        self._plan = plan
        self._explicit = policy.explicit_choice(self._backend)
        # static_indices: the batch's index tensors are this plan's own, never written (a backend
        # may keep what it derives from them); pages_used: the page ids the plan reads are below it.
        self._extras = {"static_indices": True}
        if self._storage == "paged":
            self._extras["pages_used"] = self._plan.max_page_id + 1
        if self._plan.paged_csr is not None:
            self._extras["paged_csr"] = self._plan.paged_csr
        if self._plan.host_indices is not None:
            self._extras["host_indices"] = self._plan.host_indices
        # The plan's call cache: its runs' lanes and proofs, one proof (decisions, backend plan) per
        # variant of the plan's problem (sinks, an LSE, a window, forward()'s options); dropped with the plan.
        self._variants = BoundedCache(maxsize=64)
        self._calls = B.Calls(BoundedCache(maxsize=64, refresh=False), BoundedCache(maxsize=64),
                              {"planned": self._plan}, self._variants, type(self).__name__)
        # Decide now (refusals show at plan time) and plan the chosen backend now where its plan reads
        # only what plan() knows, as FlashInfer's plan() does; one whose plan reads the run's tensors
        # (cuDNN bakes their strides) plans on the first run.
        decision = router.decide(problem, self._device_desc(), self._explicit, lengths=self._plan_lengths)
        self._last = router.Planned(decision, decision.chosen, None)
        if not is_dry() and get_backend(decision.chosen).plans_before_run(problem):  # explain() only decides
            self._last = self._calls.proof(problem).keep(router.plan(decision, self._plan_batch()))
        if not is_dry() and self._plan.pages is not None and get_backend(self._last.backend).reads_block_table(problem):
            self._plan.table()  # made now, not on a first read that could fall inside a CUDA-graph capture

    def _plan_lengths(self) -> autotune.Lengths:
        """The plan's per-request query and key lengths (what a decision that times is timed on)."""
        p = self._plan
        host = p.host_indices or {"qo_indptr": p.qo_indptr, "kv_lens": p.kv_lens}
        return router.lengths_of(host["qo_indptr"], host["kv_lens"])

    def _plan_batch(self) -> AttentionBatch:
        """The batch a backend plans from in plan(): the plan's index tensors and sizes, and
        stand-ins for q, k, v and out of the planned dtypes and shapes that hold no memory."""
        p = self._plan

        def stand_in(shape, dtype):
            return _stand_in_base(dtype, p.device).expand(*shape)
        kv_shape = (1, p.page_size, p.hkv, p.dqk) if self._storage == "paged" else (p.total_kv, p.hkv, p.dqk)
        q, out = stand_in((p.total_q, p.hq, p.dqk), p.q_dtype), stand_in((p.total_q, p.hq, p.dvo), p.out_dtype)
        return batch_of(p, q=q, k=stand_in(kv_shape, p.kv_dtype), v=stand_in(kv_shape[:-1] + (p.dvo,), p.kv_dtype),
                        qo_indptr=p.qo_indptr, kv_lens=p.kv_lens, out=out, batch_size=p.batch_size,
                        max_q_len=p.max_q, max_kv_len=p.max_kv, sm_scale=p.sm_scale, kv_indptr=p.kv_indptr,
                        custom_mask=p.custom_mask, mask_indptr=p.mask_indptr, extras=self._extras)

    def _plan_mask(self, spec, q_lens, kv_lens) -> Optional[torch.Tensor]:
        sizes = [a * b for a, b in zip(q_lens, kv_lens)]
        if spec.packed_custom_mask is not None:  # documented: wins over custom_mask
            return unpack_bits(spec.packed_custom_mask.to(self._device), [(n + 7) // 8 for n in sizes], sizes)
        if spec.custom_mask is not None:
            return spec.custom_mask.reshape(-1).to(self._device)
        return None

    def _device_desc(self):
        if self._desc is None:  # the workspace's device, fixed for the wrapper's life
            self._desc = devices.live_device(torch.empty(0, device=self._device))  # it reads a tensor's device
        return self._desc

    def _kv_shape(self) -> tuple:
        raise NotImplementedError

    # -- run --------------------------------------------------------------------------------------
    def _unplanned(self) -> RuntimeError:
        return RuntimeError(f"{type(self).__name__}.run() before plan(): call plan(...) first")

    def _launch(self, lane: B.Lane, q, k, v, out, lse, return_lse, sinks, q_scale, k_scale, v_scale, o_scale,
                kv_sf=None):
        """Fold the per-call scales (a tensor's value is not in the key), allocate what the caller
        did not give, build the batch, launch through the lane."""
        base = lane.sizes.sm_scale
        sm_scale = base if q_scale is None and k_scale is None else fold_scale(base, q_scale, k_scale)
        if o_scale is None:
            out_scale = 1.0 if v_scale is None else fold_scale(1.0, v_scale)
        else:
            out_scale = fold_scale(1.0, v_scale, inverse("o_scale", o_scale))
        p = self._plan  # p.device: q's (the checks, proven by the key); made once (q.device is a new object)
        if out is None:
            out = (torch.empty_like(q) if lane.sizes.out_like_q
                   else torch.empty(p.total_q, p.hq, p.dvo, dtype=p.out_dtype, device=p.device))
        if return_lse and lse is None:
            lse = torch.empty(p.total_q, p.hq, dtype=torch.float32, device=p.device)
        if lane.fast is None and (isinstance(sm_scale, torch.Tensor) or isinstance(out_scale, torch.Tensor)):
            lane.asked = True  # a device scale folded per call: its launcher would keep this call's tensor
        batch = batch_of(p, q=q, k=k, v=v, qo_indptr=p.qo_indptr, kv_lens=p.kv_lens, out=out,
                         batch_size=p.batch_size, max_q_len=p.max_q, max_kv_len=p.max_kv, sm_scale=sm_scale,
                         out_scale=out_scale, kv_indptr=p.kv_indptr, lse=lse, sinks=sinks,
                         custom_mask=p.custom_mask, mask_indptr=p.mask_indptr, extras=self._extras)
        if kv_sf is not None:  # NVFP4: the scale factors' logical NHD views
            batch.k_sf, batch.v_sf = kv_sf
        planned = lane.launch(batch)
        if _CUDA and p.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            self._captured(planned, batch)
        if not is_dry():  # explain: the decision is the context's, the wrapper's own stays as it was
            self._last = planned
        return (out, lse) if return_lse else out

    def _captured(self, planned: router.Planned, batch: AttentionBatch) -> None:
        """A CUDA graph captured this run: keep its plan (the graph reads its tensors) and tell the
        backend (nothing else may re-plan what the launch reads)."""
        if not self._captures or self._captures[-1].setup is not self._plan:
            self._captures.append(Captured(self._plan, self._calls))
        self._captures[-1].add(planned, batch)

    def _forward_options(self, causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale,
                         rope_theta) -> tuple:
        """(overrides of the planned problem, softmax scale) from the deprecated forward()'s
        plan-time options (FlashInfer's forward() sets them on the wrapper before running)."""
        if self._plan is None:
            raise RuntimeError(f"{type(self).__name__}.forward() before plan(): call plan(...) first")
        checks.need_finite("sm_scale", sm_scale)
        scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(self._plan.dqk)
        return self._forward_overrides(causal, pos_encoding_mode, window_left, logits_soft_cap, rope_scale,
                                       rope_theta), scale

    def _forward_overrides(self, causal, pos_encoding_mode, window_left, logits_soft_cap, rope_scale,
                           rope_theta) -> tuple:
        if not isinstance(causal, bool):
            raise bad("causal", causal, "True or False", TypeError)
        if pos_encoding_mode not in ("NONE", "ROPE_LLAMA", "ALIBI"):
            raise bad("pos_encoding_mode", pos_encoding_mode, "'NONE', 'ROPE_LLAMA' or 'ALIBI'")
        checks.need_window(window_left)
        checks.need_soft_cap(logits_soft_cap)
        checks.need_finite("rope_scale", rope_scale, positive=True)
        checks.need_finite("rope_theta", rope_theta, positive=True)
        return (("causal", bool(causal)), ("pos_encoding", pos_encoding_mode), ("window_left", window_left),
                ("logits_soft_cap", float(logits_soft_cap or 0.0)), ("rope_scale", float(rope_scale or 1.0)),
                ("rope_theta", float(rope_theta or 1e4)))

    @staticmethod
    def _lse_option_checks(lse_base, lse_layout, lse, q) -> None:
        """The options' values and, for ``lse_layout='HN'``, the caller's ``lse`` against q's tokens
        and heads: before anything runs (a compiled call's op included)."""
        _lse.need_lse_options(lse_base, lse_layout)
        if isinstance(q, torch.Tensor) and q.dim() == 3:
            _lse.stage(lse, lse_layout, q.shape[0], q.shape[1], q.device)

    def _with_lse_options(self, run, lse, return_lse, lse_base, lse_layout):
        """A run with FlashInfer's ``lse_base``/``lse_layout`` (checked by the caller): ``run(lse,
        return_lse)`` is the wrapper's run with the seeds' LSE (base 2, (tokens, Hq)); its LSE is
        then given in the asked base and layout (dispatch.entries._lse), for every backend."""
        if not (return_lse or lse is not None):
            return run(None, False)  # no LSE written: the options change nothing
        if self._plan is None:
            raise self._unplanned()
        p = self._plan
        written, dest = _lse.stage(lse, lse_layout, p.total_q, p.hq, p.device)
        out, base2 = run(written, True)
        if is_dry():  # explain(): nothing ran, and nothing of the caller's is written
            return (out, base2) if return_lse else out
        result = _lse.finish(base2, lse_base, lse_layout, dest)
        return (out, result) if return_lse else out

    @staticmethod
    def _compiled_result(res, res_lse, out, lse, return_lse, lse_base="log2", lse_layout="NH"):
        """Under torch.compile: the caller's out/lse buffers filled from the op's results."""
        if (return_lse or lse is not None) and (lse_base != "log2" or lse_layout != "NH"):
            res_lse = _lse.traced(res_lse, lse_base, lse_layout)
        res = ops.fill(res, out)
        if lse is not None:
            ops.fill(res_lse, lse)
        return (res, res_lse if lse is None else lse) if return_lse else res

    @property
    def decision(self) -> Optional[router.Decision]:
        """The router's decision for the latest plan/run (chosen, rejected with reasons, fallbacks)."""
        return self._last.decision if self._last is not None else None


_STAND_INS: dict = {}  # (dtype, device) -> a one-element tensor (a few dtypes per GPU: unbounded)


def _stand_in_base(dtype: torch.dtype, device) -> torch.Tensor:
    """One element of ``dtype`` on ``device`` that a plan's stand-ins expand (never written: a plan
    reads shapes and dtypes only), made once, not per plan."""
    key = (dtype, device)
    base = _STAND_INS.get(key)
    if base is None:
        base = _STAND_INS[key] = torch.empty(1, dtype=dtype, device=device)
    return base


def host_indices(d, ragged: bool) -> dict:
    """What plan() read of the index tensors, as host int32 tensors (no device involved); the
    ragged wrapper's kv_indptr too (the paged wrapper's is a page count, kept with its page lists)."""
    out = {"qo_indptr": torch.tensor(d.qo, dtype=torch.int32), "kv_lens": torch.tensor(d.kv_lens, dtype=torch.int32)}
    if ragged:
        out["kv_indptr"] = torch.tensor(d.kv_indptr, dtype=torch.int32)
    return out


def graph_owned(custom: Optional[torch.Tensor], storage: dict, max_sequence_kv: Optional[int]) -> tuple:
    """A graph-mode plan's own copies of what may be the caller's tensors (a later plan writes its
    values into them when a graph follows), the block table wide enough for ``max_sequence_kv``."""
    table = storage.get("block_table")
    if table is not None:
        width = max(table.shape[1], -(-(max_sequence_kv or 0) // storage["page_size"]))
        wide = table.new_zeros(table.shape[0], width)
        wide[:, : table.shape[1]] = table
        storage = {**storage, "block_table": wide}
    return (None if custom is None else custom.clone()), storage


def inverse(name: str, scale):
    """1 / ``scale`` (a divisor: a float or a device tensor); a zero float is refused."""
    if isinstance(scale, torch.Tensor):
        return scale.reciprocal()
    if isinstance(scale, (int, float)) and scale == 0:
        raise bad(name, scale, "a non-zero finite float (the output is divided by it)")
    return 1.0 / scale


def run_problem(spec, d, size: tuple) -> AttentionProblem:
    """The plan's problem with what this run changes: a variant (sinks, an LSE, another window,
    the deprecated forward()'s plan-time options)."""
    p = spec.planned
    changes = dict(spec.overrides or ())
    window = getattr(spec, "window_left", None)
    if window is not None and window != p.window_left:
        changes["window_left"] = window
    if spec.sinks is not None:
        changes["has_sinks"] = True
    if spec.return_lse or spec.lse is not None:
        changes["return_lse"] = True
    return dataclasses.replace(p.problem, **changes) if changes else p.problem


def run_sizes(args: dict, d) -> SimpleNamespace:
    """What a repeat needs beyond the plan: the softmax scale before the per-call scales fold in,
    and whether ``out`` is made like q (``torch.empty_like``, ~0.3 us less than ``torch.empty``
    with a dtype and a device): q a plain tensor of the output's dtype, head dim and canonical
    strides (the lane key proves its dtype, device, shape and strides on every repeat)."""
    scale, p, q = args["sm_scale"], args["planned"], args["q"]
    like = type(q) is torch.Tensor and q.dtype == p.out_dtype and p.dvo == p.dqk and q.stride() == dense_strides(q)
    return SimpleNamespace(sm_scale=p.sm_scale if scale is None else scale, out_like_q=like)


def dense_strides(t: torch.Tensor) -> tuple:
    """The strides of a new contiguous tensor of t's shape."""
    strides, step = [], 1
    for n in reversed(t.shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _forget_wrapper_decisions() -> None:
    for wrapper in ops.live_wrappers():
        wrapper._forget_decisions()


autotune.on_switch(_forget_wrapper_decisions)  # a wrapper's variants hold decisions too


# -- the spec: what a call must satisfy (dispatch.checks: the three check groups) ---------------
class PlanSpecBase(Spec):
    """Plan arguments shared by both wrappers (checked once per plan, device reads allowed)."""

    qo_indptr: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_vo: Optional[int] = None
    custom_mask: Optional[torch.Tensor] = None
    packed_custom_mask: Optional[torch.Tensor] = None
    causal: bool = False
    pos_encoding_mode: PosMode = "NONE"
    window_left: int = -1
    logits_soft_cap: Optional[float] = None
    sm_scale: Optional[float] = None
    rope_scale: Optional[float] = None
    rope_theta: Optional[float] = None
    q_data_type: Any = "float16"
    kv_data_type: Any = None
    o_data_type: Any = None
    seq_lens: Optional[torch.Tensor] = None
    seq_lens_q: Optional[torch.Tensor] = None
    max_token_per_sequence: Optional[int] = None
    max_sequence_kv: Optional[int] = None
    backend: str = "auto"

    def static_checks(self, d):  # shared by the paged and ragged plans
        q_lens = [b - a for a, b in zip(d.qo[:-1], d.qo[1:])]
        self.mask_checks(d, q_lens, d.kv_lens)

    def common(self) -> SimpleNamespace:
        for name in ("num_qo_heads", "num_kv_heads", "head_dim_qk"):
            need_int(name, getattr(self, name), 1)
        if self.head_dim_vo is not None:
            need_int("head_dim_vo", self.head_dim_vo, 1)
        need_heads(self.num_qo_heads, self.num_kv_heads)
        need_window(self.window_left)
        need_soft_cap(self.logits_soft_cap)
        need_finite("sm_scale", self.sm_scale)
        need_finite("rope_scale", self.rope_scale, positive=True)
        need_finite("rope_theta", self.rope_theta, positive=True)
        q_dtype = parse_dtype(self.q_data_type, "q_data_type")
        if q_dtype not in Q_DTYPES:
            raise bad("q_data_type", q_dtype, "float16, bfloat16, float32 or an fp8 dtype")
        kv_dtype = parse_dtype(self.kv_data_type, "kv_data_type") if self.kv_data_type is not None else q_dtype
        if kv_dtype == torch.uint8:  # NVFP4: packed fp4 values with fp8 scale factors (dispatch/nvfp4.py)
            nvfp4.need_query_dtype("q_data_type", q_dtype)
            nvfp4.need_head_dim("head_dim_qk", self.head_dim_qk)
            nvfp4.need_head_dim("head_dim_vo", self.head_dim_vo or self.head_dim_qk)
        elif kv_dtype != q_dtype and kv_dtype not in FP8_DTYPES:
            raise bad("kv_data_type", kv_dtype, f"{q_dtype} (q_data_type), an fp8 dtype or torch.uint8 (NVFP4)")
        out_dtype = out_dtype_of(q_dtype, self.o_data_type)
        if out_dtype not in OUT_DTYPES:
            raise bad("o_data_type", out_dtype, "float16, bfloat16, float32 or an fp8 dtype")
        need_index("qo_indptr", self.qo_indptr, None, None)
        need_tensor("qo_indptr", self.qo_indptr, ranks=(1,))
        if self.qo_indptr.numel() < 2:
            raise bad("qo_indptr", self.qo_indptr, "a (batch_size + 1,) prefix sum with batch_size >= 1")
        return SimpleNamespace(hq=self.num_qo_heads, hkv=self.num_kv_heads, dqk=self.head_dim_qk,
                               dvo=self.head_dim_vo or self.head_dim_qk, q_dtype=q_dtype, kv_dtype=kv_dtype,
                               out_dtype=out_dtype, batch=self.qo_indptr.numel() - 1, cudnn=self.backend == "cudnn")

    def qo_host(self, d, values: Optional[list] = None) -> list[int]:
        """Token prefix sums of the queries (element units / (Hq*Dqk) for backend='cudnn'); ``values``:
        qo_indptr's values, read already."""
        vals = check_indptr_values("qo_indptr", self.qo_indptr if values is None else values, None, "")
        if d.cudnn:
            mult = d.hq * d.dqk
            if any(v % mult for v in vals):
                raise bad("qo_indptr", vals, f"element offsets (multiples of num_qo_heads*head_dim_qk={mult}) "
                          "with backend='cudnn'")
            vals = [v // mult for v in vals]
        return vals

    def mask_checks(self, d, q_lens, kv_lens) -> None:
        sizes = [a * b for a, b in zip(q_lens, kv_lens)]
        if self.custom_mask is not None:
            need_tensor("custom_mask", self.custom_mask, ranks=(1,), dtypes=(torch.bool,))
            if self.custom_mask.numel() != sum(sizes):
                raise bad("custom_mask.shape", tuple(self.custom_mask.shape),
                          f"({sum(sizes)},) = sum over requests of q_len * kv_len")
        if self.packed_custom_mask is not None:
            need_tensor("packed_custom_mask", self.packed_custom_mask, ranks=(1,), dtypes=(torch.uint8,))
            nbytes = sum((n + 7) // 8 for n in sizes)
            if self.packed_custom_mask.numel() != nbytes:
                raise bad("packed_custom_mask.shape", tuple(self.packed_custom_mask.shape),
                          f"({nbytes},) = per-request packbits of q_len * kv_len bits")


class RunSpecBase(Spec):
    q: torch.Tensor
    planned: Any  # the wrapper's plan-time SimpleNamespace
    q_scale: Optional[Scale] = None
    k_scale: Optional[Scale] = None
    v_scale: Optional[Scale] = None
    out: Optional[torch.Tensor] = None
    lse: Optional[torch.Tensor] = None
    return_lse: bool = False
    sinks: Optional[torch.Tensor] = None
    kv_cache_sf: Any = None
    extra_args: tuple = ()
    overrides: Optional[tuple] = None  # forward()'s plan-time options: (problem field, value) pairs
    sm_scale: Optional[float] = None  # forward()'s softmax scale (None: the plan's)

    def q_checks(self, d):
        p = self.planned
        need_query("q", self.q)
        if self.q.device != p.device:  # the plan lives on that device
            raise bad("q.device", self.q.device, f"{p.device}, the device of the workspace this wrapper plans on")
        if self.q.dtype != p.q_dtype:
            raise bad("q.dtype", self.q.dtype, f"{p.q_dtype} (plan's q_data_type; plan(q_data_type=...) to change it)")
        if tuple(self.q.shape[1:]) != (p.hq, p.dqk):
            raise bad("q.shape", tuple(self.q.shape), f"(n, {p.hq}, {p.dqk}) = (tokens, num_qo_heads, head_dim_qk)")
        if self.extra_args:
            raise bad("*args", self.extra_args, "none (JIT-variant arguments are not supported)", TypeError)
        if self.kv_cache_sf is not None and p.kv_dtype != torch.uint8:
            raise bad("kv_cache_sf", self.kv_cache_sf, f"None with a {dtype_name(p.kv_dtype)} cache (NVFP4 scale "
                      "factors go with plan(kv_data_type=torch.uint8))")
        need_sinks(self.sinks, p.hq, self.q.device)

    def io_checks(self, d):
        p, dev = self.planned, self.q.device
        if self.q.shape[0] != p.total_q:
            raise bad("q.shape", tuple(self.q.shape), f"({p.total_q}, {p.hq}, {p.dqk}): plan's qo_indptr[-1] tokens")
        for name in ("q_scale", "k_scale", "v_scale", "o_scale"):
            check_scale(name, getattr(self, name, None), dev, values=False, nonzero=name == "o_scale")
        need_out(self.out, (p.total_q, p.hq, p.dvo), p.out_dtype, dev)
        need_out(self.lse, (p.total_q, p.hq), torch.float32, dev, name="lse")

    def value_checks(self, d):
        for name in ("q_scale", "k_scale", "v_scale", "o_scale"):
            check_scale(name, getattr(self, name, None), self.q.device, values=True, nonzero=name == "o_scale")
