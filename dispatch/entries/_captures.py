"""What a wrapper's runs captured in a CUDA graph keep reading, and plan() after such a capture.

A graph replays the launches it captured with their arguments as they were: the addresses of the
plan's index tensors, the backend plan's buffers and launch shapes. So a wrapper keeps every plan
whose runs a graph captured (its tensors are never freed under the graph), and each backend is
told (``Backend.captured``) so that no other plan writes what the captured launches read.

With ``use_cuda_graph=True`` (FlashInfer's CUDA-graph mode) a graph also follows ``plan()``: the
engine plans the next step and replays. Then plan() writes the new index values into the captured
plan's own tensors and each backend re-plans in place (``Backend.follow``). What the captured
launches cannot do is refused before anything changes, naming the argument: another batch size
(FlashInfer's rule for the wrapper's life), other query rows than the captured ``q``, another
problem, more pages per request than the captured table holds, or what a backend's fixed grid
cannot cover (``Backend.follow_refusal``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from backends import get_backend

from ..checks import bad


@dataclasses.dataclass
class Captured:
    """A plan (``setup``, the wrapper's Setup) whose runs a CUDA graph captured, its call cache, and
    each backend plan that served under capture with one batch it served (for its sizes and dtypes)."""

    setup: Any
    calls: Any
    launches: dict = dataclasses.field(default_factory=dict)  # id(router.Planned) -> (Planned, batch)

    def add(self, planned, batch) -> None:
        if id(planned) not in self.launches:
            self.launches[id(planned)] = (planned, batch)
            get_backend(planned.backend).captured(planned.plan)

    def follow(self, new) -> None:
        """Make the captured launches do ``new``'s work (a Setup from plan()), or raise before
        anything changed."""
        old = self.setup
        changes = fixed_changes(old, new, [b for _, b in self.launches.values()])
        if changes:
            argument, value, allowed = changes[0]
            raise bad(argument, value, allowed + "; a CUDA graph captured run() on this wrapper "
                      "(use_cuda_graph=True) and replays with what it captured: capture again on another wrapper")
        refusals = []
        for planned, batch in self.launches.values():
            why = get_backend(planned.backend).follow_refusal(planned.plan, with_indices(batch, new))
            if why:
                refusals.append(why)
        if refusals:
            raise RuntimeError("plan() after a CUDA graph captured run() (use_cuda_graph=True): the captured "
                               "launches cannot do the new plan's work: " + "; ".join(refusals)
                               + ". Capture the graph again on another wrapper, or plan the capture with the "
                               "longest lengths it will replay")
        write_indices(old, new)
        for planned, batch in self.launches.values():
            get_backend(planned.backend).follow(planned.plan, with_indices(batch, old))


def fixed_changes(old, new, batches: list) -> list[tuple[str, Any, str]]:
    """(argument, value, what is allowed) for each way ``new`` leaves what the captured launches
    of ``old`` can serve; empty when it fits."""
    out = []
    if new.batch_size != old.batch_size:
        out.append(("qo_indptr.shape", (new.batch_size + 1,), f"({old.batch_size + 1},), the captured batch size"))
    if new.total_q != old.total_q:
        out.append(("qo_indptr[-1]", new.total_q, f"{old.total_q}, the rows of the captured q"))
    # not sizes nor replay_kv: lengths, checked below against what the captured launches hold
    changed = [f.name for f in dataclasses.fields(old.problem) if f.name not in ("sizes", "replay_kv")
               and getattr(old.problem, f.name) != getattr(new.problem, f.name)]
    for name in changed:
        out.append((name, getattr(new.problem, name), f"{getattr(old.problem, name)!r}, the captured plan's"))
    if old.block_table is not None and new.block_table is not None \
            and new.block_table.shape[1] > old.block_table.shape[1]:
        out.append(("paged_kv_indptr", f"{new.block_table.shape[1]} pages for one request",
                    f"at most {old.block_table.shape[1]}, the widest request of the captured plan "
                    "(plan(max_sequence_kv=...) before the capture, or a paged_kv_indices_buf of that many pages, "
                    "sets how far it reaches)"))
    pages = min((b.k.shape[0] for b in batches), default=None)
    if old.block_table is not None and pages is not None and new.max_page_id >= pages:
        out.append(("paged_kv_indices", new.max_page_id, f"page ids below {pages}, the pages of the captured cache"))
    if old.kv_indptr is not None and new.total_kv != old.total_kv:
        out.append(("kv_indptr[-1]", new.total_kv, f"{old.total_kv}, the rows of the captured k and v"))
    if (old.custom_mask is None) != (new.custom_mask is None) or (
            new.custom_mask is not None and new.custom_mask.numel() > old.custom_mask.numel()):
        size = None if new.custom_mask is None else new.custom_mask.numel()
        room = None if old.custom_mask is None else old.custom_mask.numel()
        out.append(("custom_mask", f"{size} mask bits", f"{room} at most, the captured plan's"))
    return out


def with_indices(batch, setup):
    """``batch`` reading ``setup``'s index tensors and sizes."""
    return dataclasses.replace(batch, qo_indptr=setup.qo_indptr, kv_lens=setup.kv_lens, block_table=setup.block_table,
                               kv_indptr=setup.kv_indptr, custom_mask=setup.custom_mask,
                               mask_indptr=setup.mask_indptr, max_q_len=setup.max_q, max_kv_len=setup.max_kv)


def write_indices(old, new) -> None:
    """``new``'s index values into ``old``'s tensors (the addresses the graph reads) and sizes."""
    old.qo_indptr.copy_(new.qo_indptr)
    old.kv_lens.copy_(new.kv_lens)
    if old.block_table is not None:
        old.block_table[:, : new.block_table.shape[1]].copy_(new.block_table)
    if old.kv_indptr is not None:
        old.kv_indptr.copy_(new.kv_indptr)
    if old.custom_mask is not None:
        old.custom_mask[: new.custom_mask.numel()].copy_(new.custom_mask)
        old.mask_indptr.copy_(new.mask_indptr)
    old.max_q, old.max_kv, old.max_page_id = new.max_q, new.max_kv, new.max_page_id
