"""The view cache of the entry points' hot paths (backends._device.kept_views): views kept only for a
tensor object that outlives a call, never keeping its memory alive, remade after an in-place change."""
from __future__ import annotations

import gc

import torch

from backends import _device
from dispatch.checks import cache_halves


def _halves(t: torch.Tensor) -> tuple:
    return tuple(t.unbind(1))


def test_first_sighting_gets_plain_views_and_a_repeat_gets_kept_ones():
    cache = torch.randn(6, 2, 4, 3, 8)
    first = _device.kept_views(cache, "t1", _halves)
    assert first[0]._base is cache  # a plain view: nothing kept yet
    second = _device.kept_views(cache, "t1", _halves)
    third = _device.kept_views(cache, "t1", _halves)
    assert second[0] is third[0] and second[1] is third[1]  # kept
    assert second[0]._base is None  # no view base: the cache is not kept alive through it
    for kept, plain in zip(third, _halves(cache)):
        assert torch.equal(kept, plain) and kept.stride() == plain.stride()
        assert kept.data_ptr() == plain.data_ptr()
    cache[2, 1].fill_(7.0)  # a write to the cache shows through the kept views (same memory)
    assert torch.all(third[1][2] == 7.0)


def test_a_dropped_cache_drops_its_kept_views_and_its_memory():
    cache = torch.randn(6, 2, 4, 3, 8)
    for _ in range(2):
        _device.kept_views(cache, "t2", _halves)
    key = (id(cache), "t2")
    assert key in _device._KEPT_VIEWS
    view_ref = _device.weakref.ref(_device._KEPT_VIEWS[key][2][0])
    del cache
    gc.collect()
    assert key not in _device._KEPT_VIEWS
    assert view_ref() is None  # the kept views are gone with it


def test_a_view_made_afresh_each_call_is_never_kept():
    cache = torch.randn(6, 2, 4, 3, 8)
    for _ in range(4):
        views = _device.kept_views(cache[:, :1].squeeze(1), "t3", lambda t: (t.permute(0, 2, 1, 3),))
        assert views[0]._base is not None
    assert not any(key[1] == "t3" for key in _device._KEPT_VIEWS)


def test_a_cache_changed_in_place_gets_new_views():
    cache = torch.randn(6, 2, 4, 3, 8)
    for _ in range(2):
        k, v = cache_halves(cache, "NHD")
    old = _device.weakref.ref(k)
    del k, v
    other = torch.randn(5, 2, 4, 3, 8)
    cache.set_(other)  # the same object, another memory and shape
    k2, v2 = cache_halves(cache, "NHD")
    gc.collect()
    assert old() is None  # the old views (and through them the old memory) are let go at once
    assert k2.shape[0] == 5 and torch.equal(k2, other[:, 0]) and torch.equal(v2, other[:, 1])
    hnd_k, _ = cache_halves(cache, "HND")
    assert torch.equal(hnd_k, other[:, 0].permute(0, 2, 1, 3))


def test_a_callers_store_checks_the_pointer_and_drops_with_the_cache():
    store: dict = {}  # a lane's: its key proves dtype, device, shape and strides on every call
    cache = torch.randn(6, 2, 4, 3, 8)
    for _ in range(3):
        k, v = cache_halves(cache, "NHD", store)
    assert k._base is None and len(store) == 1  # kept in the caller's store, and process-wide for new lanes
    assert _device._KEPT_VIEWS[(id(cache), "NHD")][2][0] is k
    lane = {}  # a new lane over the same cache: the views kept before, no new ones
    assert cache_halves(cache, "NHD", lane)[0] is k and len(lane) == 1
    other = torch.randn(6, 2, 4, 3, 8)
    cache.set_(other)  # the same object and shape, another memory
    k2, v2 = cache_halves(cache, "NHD", store)
    assert torch.equal(k2, other[:, 0]) and torch.equal(v2, other[:, 1])
    assert k2.data_ptr() == other.data_ptr() != k.data_ptr()
    key = (id(cache), "NHD")
    del k, v, k2, v2, cache
    gc.collect()
    assert not store and not lane  # the cache died: its kept views (and memory) with it, in every store
    assert key not in _device._KEPT_VIEWS
