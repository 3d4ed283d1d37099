"""The only module that touches cudnn-frontend's private API, pinned to the versions it was read in.

Why: a graph's public ``execute`` walks a Python layer per call (about 15 us of host time on the
H100 host with 1.32); the private entries below take the operands' addresses in the graph's own
uid order and launch the same plan.

* ``POINTER_EXECUTE_VERSIONS``: ``Graph._execute_with_ptrs``, ``_get_variant_pack_uids_sorted`` and
  ``_prepare_variant_pack_template`` (python/pygraph/pygraph.cpp; what the frontend's own
  experimental SDPA op calls, python/cudnn/experimental/ops/sdpa.py);
* ``RAW_POINTER_VERSIONS``: ``Graph._lowered_graph._execute_with_raw_ptrs``, ``_variant_pack_uids``,
  ``_materialize_backend_plan``, ``_plans`` and ``_plan_index`` (cudnn/_pygraph.py: what ``execute``
  ends in for a graph the cuDNN backend runs).

With any other installed frontend the public ``execute`` serves, after one log line.
"""
from __future__ import annotations

import ctypes
import logging
from typing import Callable, Optional

import torch

log = logging.getLogger("attn_dispatch")

POINTER_EXECUTE_VERSIONS = ("1.22.0", "1.22.1", "1.23.0")
RAW_POINTER_VERSIONS = ("1.32.0",)
CHECKED_VERSIONS = POINTER_EXECUTE_VERSIONS + RAW_POINTER_VERSIONS
# a graph's private names read here (_execute_with_raw_ptrs: its lowered C++ graph's)
GRAPH_ATTRIBUTES = ("_execute_with_ptrs", "_execute_with_raw_ptrs", "_get_variant_pack_uids_sorted",
                    "_lowered_graph", "_materialize_backend_plan", "_plan_index", "_plans",
                    "_prepare_variant_pack_template", "_variant_pack_uids")

_UNCHECKED_LOGGED: set = set()


def checked(version: Optional[str], versions: tuple) -> bool:
    """Whether ``version`` is one of ``versions`` (a private path read in them); a frontend none of
    whose private paths was read logs one line (per version)."""
    if version in versions:
        return True
    if version not in CHECKED_VERSIONS and version not in _UNCHECKED_LOGGED:
        _UNCHECKED_LOGGED.add(version)
        log.info("cudnn-frontend %s: its private execute paths were checked in %s only; the public execute "
                 "serves (more host time per call)", version, ", ".join(CHECKED_VERSIONS))
    return False


def sorted_uids(graph, version: Optional[str]) -> Optional[tuple]:
    """The graph's user slots in the order ``_execute_with_ptrs`` takes pointers
    (include/cudnn_frontend/graph_interface.h get_variant_pack_uids_sorted), or None."""
    if not checked(version, POINTER_EXECUTE_VERSIONS):
        return None
    if not (hasattr(graph, "_execute_with_ptrs") and hasattr(graph, "_get_variant_pack_uids_sorted")):
        return None
    try:
        if hasattr(graph, "_prepare_variant_pack_template"):
            graph._prepare_variant_pack_template()
        return tuple(int(u) for u in graph._get_variant_pack_uids_sorted())
    except Exception:  # noqa: BLE001 - no template: the uid map serves
        return None


def pointer_execute(graph, workspace: torch.Tensor) -> Callable:
    """execute(buffers, handle) through ``_execute_with_ptrs``, buffers in ``sorted_uids`` order."""
    ws, run = workspace.data_ptr(), graph._execute_with_ptrs

    def execute_ptrs(buffers, handle) -> None:
        run([t.data_ptr() for t in buffers], ws, handle)

    return execute_ptrs


def raw_pointer_call(graph, uids: tuple, workspace: torch.Tensor, version: Optional[str]) -> Optional[Callable]:
    """execute(buffers, handle), buffers in ``uids`` order, through the lowered C++ graph's
    ``_execute_with_raw_ptrs`` on the operands' addresses in ascending uid order (1.32.0
    cudnn/_pygraph.py ``_execute``: the backend path hands ``VariantPack.address``, a ``void*[]``
    in that order, with the selected plan's C++ index). None (keep ``execute``) for another
    frontend version, a graph a Python engine serves, or any name this was read against missing."""
    if not checked(version, RAW_POINTER_VERSIONS):
        return None
    try:
        run = graph._lowered_graph._execute_with_raw_ptrs
        if graph.selected_engine is not None:
            return None
        order = tuple(int(u) for u in graph._variant_pack_uids())
        plan = graph._materialize_backend_plan(graph._plan_index) if graph._plans else None
    except (AttributeError, TypeError, ValueError, IndexError):
        return None
    if sorted(order) != sorted(uids):
        return None
    index = -1 if plan is None or plan.cpp_index is None else int(plan.cpp_index)
    slot_of = {uid: i for i, uid in enumerate(uids)}
    taken = tuple(slot_of[uid] for uid in order)
    pointers_type, ws = ctypes.c_void_p * len(order), workspace.data_ptr()

    def execute_raw(buffers, handle) -> None:
        pointers = pointers_type(*[buffers[i].data_ptr() for i in taken])
        run(ctypes.addressof(pointers), len(taken), ws, handle.backend_handle, index)  # 1.32's to_backend_handle

    return execute_raw
