"""Device facts every backend cache is keyed on, the launch guard, and the bounded cache.

Why: a tensor's ``.device`` carries the CUDA index, but ``torch.device('cuda')`` and
``torch.cuda.current_device()`` do not say which GPU the *tensors* live on. A buffer or
plan cached under a bare 'cuda' key and reused for cuda:1 is a pointer into another GPU
(Triton: "Pointer argument cannot be accessed", vendors: illegal memory access); a
launch on the current device instead of the tensors' device fails the same way.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Hashable, Iterator, Optional, Union

import torch

DeviceLike = Union[torch.device, str, int]


def device_key(device: DeviceLike) -> torch.device:
    """A device with its index made explicit (a bare 'cuda' means the current device)."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def on_device(device: DeviceLike) -> contextlib.AbstractContextManager:
    """Make the tensors' GPU current for a launch (cheap; nothing for CPU)."""
    device = torch.device(device) if not isinstance(device, torch.device) else device
    if device.type != "cuda":
        return _NO_SWITCH
    index = device.index
    if index is None or (_CURRENT_GPU is not None and index == _CURRENT_GPU()):  # already current (hot path)
        return _NO_SWITCH
    return torch.cuda.device(index)


def on_device_launch(device: DeviceLike, launch: Callable[[Any], None]) -> Callable[[Any], None]:
    """``launch`` made to run under the tensors' GPU; a call that finds it current pays one
    integer read (the launchers' hot path), not a context manager."""
    device = torch.device(device) if not isinstance(device, torch.device) else device
    if device.type != "cuda" or device.index is None or _CURRENT_GPU is None:
        return launch
    index = device.index

    def launch_on_device(batch) -> None:
        if _CURRENT_GPU() == index:
            launch(batch)
            return
        with torch.cuda.device(index):
            launch(batch)

    return launch_on_device


_KEPT_VIEWS: dict = {}  # (id(tensor), what) -> (the tensor's facts, its weak reference, the views)
_SEEN: dict = {}  # (id(tensor), what) -> a weak reference to the tensor met there once (nothing kept)
_SEEN_MAX = 1024


def kept_views(t: torch.Tensor, what: Any, make: Callable[[torch.Tensor], tuple],
               store: Optional[dict] = None) -> tuple:
    """``make(t)``'s views of ``t`` (``what`` names them), kept for a tensor object that outlives
    a call. Why: a view costs about 1 us of host time, and a KV cache is the same object on
    every call of every layer. Kept views sit on ``t``'s storage without a view base, so they do
    not keep the tensor alive, and a weak reference drops them when it dies (its memory is freed
    as before). A tensor changed in place (``set_``, ``resize_``, ``.data =``) gets new views:
    the entry holds its data pointer, dtype, device, shape and strides. A tensor met for the first
    time gets plain views: one made afresh for each call (``cache[:, 0]`` in the call) would
    pay for keeping on every call. ``store``: a caller's own dict whose owner proves, on every
    call that passes it, the tensor's dtype, device, shape and strides (a lane: its key holds them),
    so an entry there checks the data pointer alone (a view's storage stays alive with the view,
    so the same pointer on the same live object is the same memory)."""
    key = (id(t), what)
    if store is None:
        store, facts = _KEPT_VIEWS, (t.data_ptr(), t.dtype, t.device, t.shape, t.stride())
    else:
        facts = t.data_ptr()
    entry = store.get(key)
    if entry is not None:
        if entry[0] == facts:
            return entry[2]
        store.pop(key, None)  # changed in place: its old views must not keep the old memory alive
    if store is not _KEPT_VIEWS:
        # a new lane's store: the views kept process-wide for this tensor (every fact checked there:
        # a wrapper's plan makes new lanes every step over the same cache), kept in the lane's too
        shared = _KEPT_VIEWS.get(key)
        if shared is not None and shared[0] == (facts, t.dtype, t.device, t.shape, t.stride()):
            _keep(store, key, facts, t, shared[2])
            return shared[2]
    views = make(t)
    seen = _SEEN.pop(key, None)
    if seen is None or seen() is not t:
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        _SEEN[key] = weakref.ref(t)
        return views
    views = tuple(map(_without_base, views))
    _keep(store, key, facts, t, views)
    if store is not _KEPT_VIEWS:  # and process-wide, for the next lanes over this tensor
        _keep(_KEPT_VIEWS, key, (facts, t.dtype, t.device, t.shape, t.stride()), t, views)
    return views


def _keep(store: dict, key: tuple, facts: Any, t: torch.Tensor, views: tuple) -> None:
    """Keep ``views`` of ``t`` in ``store`` until ``t`` dies (its weak reference drops the entry)."""
    def forget(ref, key=key, store=store) -> None:
        if store.get(key, (None, None))[1] is ref:
            store.pop(key, None)  # pop: another thread may have replaced or dropped it meanwhile
    store[key] = (facts, weakref.ref(t, forget), views)


def _without_base(view: torch.Tensor) -> torch.Tensor:
    """A tensor on ``view``'s memory that does not reference the tensor it was viewed from."""
    return torch.empty(0, dtype=view.dtype, device=view.device).set_(
        view.untyped_storage(), view.storage_offset(), view.shape, view.stride())


def made_to_keep(make: Callable[[], Any], device: DeviceLike) -> Any:
    """``make()``, whose device tensors a cache keeps past the call, made where no CUDA-graph pool
    claims them. Why: torch.compile's CUDA graphs (mode="reduce-overhead") warm up on a side stream
    with every allocation of the warming thread routed into their pool; a tensor kept from there is
    refused after the warm-up ("not tracked as outputs"), and a later replay would write over it.
    The routing is per thread, so on a side stream outside a capture ``make`` runs on a helper
    thread (on the device's default stream, finished before it returns; a later free waits for the
    side stream). On the default stream, inside a capture (where an allocation must stay in the
    capturing graph's pool) and on the CPU it runs here. ``make`` passes its device explicitly and
    reads no context variable (another thread runs it)."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_initialized():  # nothing on a GPU yet: no graph either
        return make()
    side = torch.cuda.current_stream(device)
    if side == torch.cuda.default_stream(device) or torch.cuda.is_current_stream_capturing():
        return make()
    made = _helper().submit(_made_and_finished, make, device).result()
    for t in (made if isinstance(made, tuple) else (made,)):
        if isinstance(t, torch.Tensor) and t.is_cuda:
            t.record_stream(side)
    return made


def _made_and_finished(make: Callable[[], Any], device: torch.device) -> Any:
    made = make()
    torch.cuda.default_stream(device).synchronize()  # what ``make`` launched is done before the side stream reads it
    return made


_HELPER: list = []
_HELPER_LOCK = threading.Lock()


def _helper():
    """The one thread ``made_to_keep`` hands its work to (made on first use)."""
    with _HELPER_LOCK:
        if not _HELPER:
            _HELPER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="attn-dispatch-keep"))
        return _HELPER[0]


_NO_SWITCH = contextlib.nullcontext()  # reusable: nullcontext keeps no state
_CURRENT_GPU = getattr(torch._C, "_cuda_getDevice", None)  # absent from CPU-only builds


class BoundedCache:
    """A thread-safe dict that keeps the ``maxsize`` most recently used entries (an LRU): the one
    cache class of the house (backends and dispatch alike).

    For caches keyed on per-call sizes (lengths, batch sizes, float scales): without a
    bound a serving loop with varying lengths grows them without limit. Evicting only
    drops the cache's reference: a plan that holds an entry keeps it alive.
    """

    def __init__(self, maxsize: int, refresh: bool = True):
        """``refresh=False``: a hit does not move its key to the end, so the oldest insertion is
        evicted first (a lookup that costs one dict read, for the hottest caches)."""
        if maxsize < 1:
            raise ValueError(f"maxsize={maxsize}: allowed >= 1")
        self.maxsize = maxsize
        self.refresh = refresh
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        if not refresh:
            self.get = self._data.get  # type: ignore[method-assign]  # a hit is one C-level dict read

    def get(self, key: Hashable, default: Any = None) -> Any:
        value = self._data.get(key, default)
        if value is not default:
            try:
                self._data.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile: still a valid answer
                pass
        return value

    def put(self, key: Hashable, value: Any) -> Any:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def drop_value(self, value: Any) -> None:
        """Forget every key whose entry is ``value`` (the object itself); who holds it keeps it."""
        with self._lock:
            for key in [k for k, v in self._data.items() if v is value]:
                del self._data[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator:
        return iter(list(self._data))
