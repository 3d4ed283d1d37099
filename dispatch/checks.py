"""What every entry's spec shares: error text, argument forms, the ``Spec`` base and its checks.

A spec is the pydantic model of one entry's arguments (it lives in that entry's module). It
validates its fields' types (pydantic, strict) and then runs three groups of plain-Python checks:

* ``static_checks``: what the entry's call key captures (ranks, dtypes, devices, inner dims,
  enums, scalar arguments). Run once per call key (functions) or per plan (wrappers).
* ``size_checks``: cheap consistency of sizes that vary per call (batch size, token counts,
  out/lse buffers, scale values). Run on every call that is not an exact repeat.
* ``value_checks``: checks that read device data (page ids < pages, monotonic indptrs, lengths
  within capacity). Run always for CPU tensors, at wrapper plan time, and on the first call per
  key for CUDA tensors; ``ATTN_DISPATCH_VALIDATE=full`` makes them per call.

Pydantic's ``ValidationError`` never reaches users: ``validate`` turns it into the
ValueError/TypeError it carries, or builds one naming the argument, its value and what is
allowed. Nothing is written to caller tensors by any check. The helpers below turn FlashInfer's
calling conventions into the normalized one of ``dispatch.problem`` (logical NHD paged views,
block tables, token indptrs, packed base-2 LSE) without copying caller tensors; those that read
device data say so.
"""
from __future__ import annotations

import math
import os
from types import SimpleNamespace
from typing import Any, Literal, Optional, Sequence, Union

import torch
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, model_validator

from backends import BoundedCache, kept_views, made_to_keep

from .problem import dtype_name

ENV_VALIDATE = "ATTN_DISPATCH_VALIDATE"
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
INDEX_DTYPES = (torch.int32,)


# -- error text -----------------------------------------------------------------------------
SHOWN_CHARS = 120  # an error names a value, it does not print it: longer reprs are cut


def show(value: Any) -> str:
    """A short, readable rendering of an argument value for error messages: a tensor or any other
    array (numpy, cupy...) by its type, shape and dtype, never its elements."""
    if isinstance(value, torch.Tensor):
        return f"tensor(shape={tuple(value.shape)}, dtype={dtype_name(value.dtype)}, device={value.device})"
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if _array_like(value):
        kind = type(value)
        return f"{kind.__module__.split('.')[0]}.{kind.__qualname__}(shape={tuple(value.shape)}, dtype={value.dtype})"
    if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) or _array_like(v) for v in value):
        return "(" + ", ".join(show(v) for v in value) + ")"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS - 5]} ...{text[-1]}"


def _array_like(value: Any) -> bool:
    """An array of another library: it has a shape and a dtype (its repr would print its elements)."""
    return not isinstance(value, (torch.Tensor, type)) and hasattr(value, "shape") and hasattr(value, "dtype")


def bad(name: str, value: Any, allowed: str, exc: type = ValueError) -> Exception:
    """The one rejection format: ``name=value: allowed ...`` (raise the result)."""
    return exc(f"{name}={show(value)}: allowed {allowed}")


def dtypes_text(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


def full_validation() -> bool:
    """ATTN_DISPATCH_VALIDATE=full: device-data checks on every call, not once per key
    ('' or 'first', the default: CPU tensors every call, device tensors on a key's first call)."""
    value = os.environ.get(ENV_VALIDATE)
    if not value:  # empty: the default
        return False
    mode = value.strip().lower()
    if mode not in ("", "first", "full"):
        raise bad(ENV_VALIDATE, value, "'full' (check device data on every call), 'first' or unset")
    return mode == "full"


def parse_dtype(value: Any, name: str) -> torch.dtype:
    """A torch dtype or its FlashInfer string spelling ("float16", "torch.bfloat16")."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        found = getattr(torch, value.replace("torch.", ""), None)
        if isinstance(found, torch.dtype):
            return found
    raise bad(name, value, "a torch.dtype or its name, e.g. torch.float16 or 'bfloat16'", TypeError)


# -- KV caches --------------------------------------------------------------------------------
def split_kv(kv_cache: Any, name: str, allow_squeezed: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(k, v, squeezed) in the caller's layout. 5-D (pages, 2, ...) with dim 1 = K/V (size 1:
    K is V), or a (K, V) tuple of 4-D tensors; with ``allow_squeezed`` a 4-D single tensor or a
    tuple of 3-D tensors is page size 1 with the page dim squeezed (squeezed=True)."""
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2 or not all(isinstance(t, torch.Tensor) for t in kv_cache):
            raise bad(name, kv_cache, "a torch.Tensor or a (k_cache, v_cache) tuple of two torch.Tensors", TypeError)
        k, v = kv_cache
        ranks = (4, 3) if allow_squeezed else (4,)
        if k.dim() != v.dim() or k.dim() not in ranks:
            raise bad(name, kv_cache, f"a tuple of two tensors of rank {' or '.join(map(str, ranks))}")
        return k, v, k.dim() == 3
    if not isinstance(kv_cache, torch.Tensor):
        raise bad(name, kv_cache, "a torch.Tensor or a (k_cache, v_cache) tuple of two torch.Tensors", TypeError)
    ranks = (5, 4) if allow_squeezed else (5,)
    if kv_cache.dim() not in ranks or kv_cache.shape[1] not in (1, 2):
        raise bad(name, kv_cache, f"a {' or '.join(f'{r}-D' for r in ranks)} tensor (pages, 2, ...) "
                  "with K at [:, 0] and V at [:, 1] (dim 1 of size 1 or 2)")
    if kv_cache.shape[1] == 2:
        k, v = kv_cache.unbind(1)  # one call for both views (the hot path of every paged run)
    else:
        k = v = kv_cache.select(1, 0)
    return k, v, kv_cache.dim() == 4


def cache_halves(cache: torch.Tensor, layout: str, store: Optional[dict] = None) -> tuple:
    """The logical NHD (k, v) views of a 5-D (pages, 2, ...) cache in ``layout`` (kept_views; ``store``:
    a lane's own, whose key proves the cache's dtype, device, shape and strides)."""
    return kept_views(cache, layout, lambda c: tuple(paged_nhd(half, layout, False) for half in c.unbind(1)), store)


def paged_nhd(t: torch.Tensor, layout: str, squeezed: bool) -> torch.Tensor:
    """The logical NHD view (pages, P, Hkv, D) of one paged cache tensor (never a copy)."""
    if squeezed:
        return t.unsqueeze(1)  # (pages, Hkv, D) -> (pages, 1, Hkv, D) whatever the layout
    return t.permute(0, 2, 1, 3) if layout == "HND" else t


# -- indices ----------------------------------------------------------------------------------
def host_ints(t: torch.Tensor) -> list[int]:
    """Host copy of a small index tensor (synchronizes for CUDA tensors: plan time only)."""
    return [int(x) for x in t.reshape(-1).tolist()]


def block_table_from_pages(kv_indptr: list[int], kv_indices: torch.Tensor, device) -> torch.Tensor:
    """FlashInfer's (indptr, indices) page lists -> (B, max_pages) int32 block table: one masked
    write on the host (``kv_indices``: the ids from ``kv_indptr[0]`` on, best already on the host; the
    mask's row-major order is the lists' order), one copy to ``device``."""
    start = kv_indptr[0]
    counts = torch.tensor([b - a for a, b in zip(kv_indptr[:-1], kv_indptr[1:])], dtype=torch.int64)
    width = max(int(counts.max()) if len(counts) else 0, 1)
    table = torch.zeros(len(counts), width, dtype=torch.int32)
    total = kv_indptr[-1] - start
    if total:
        table[torch.arange(width) < counts[:, None]] = kv_indices.reshape(-1)[:total].to("cpu", torch.int32)
    return table.to(device)


def unpack_bits(packed: torch.Tensor, seg_bytes: list[int], seg_bits: list[int]) -> torch.Tensor:
    """Little-endian packbits segments (one per request, each padded to whole bytes) -> flat
    bool mask of sum(seg_bits) entries. Runs at plan time."""
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    bits = ((packed.reshape(-1).to(torch.uint8).unsqueeze(-1) >> shifts) & 1).bool().reshape(-1)
    parts, start = [], 0
    for nbytes, nbits in zip(seg_bytes, seg_bits):
        parts.append(bits[start * 8: start * 8 + nbits])
        start += nbytes
    return torch.cat(parts) if parts else bits[:0]


def cumsum0(lens: Sequence[int]) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + int(n))
    return out


# Keyed on per-call sizes, so bounded: a serving stream sees every length once.
_ARANGE_CACHE = BoundedCache(maxsize=256)


def uniform_indptr(batch: int, step: int, device) -> torch.Tensor:
    """arange(B+1)*step int32 on a device, cached (read-only by contract). One launch (an arange
    with that step) where step > 0: a serving stream's new lengths miss the cache on every call,
    and an H2D copy of host values could not run inside a CUDA-graph capture."""
    key = (batch, step, torch.device(device))
    t = _ARANGE_CACHE.get(key)
    if t is None:
        t = _ARANGE_CACHE.put(key, made_to_keep(lambda: _steps(batch, step, key[2]), key[2]))
    return t


def _steps(batch: int, step: int, device: torch.device) -> torch.Tensor:
    if step > 0:
        return torch.arange(0, (batch + 1) * step, step, dtype=torch.int32, device=device)
    return torch.zeros(batch + 1, dtype=torch.int32, device=device)


# -- scales -----------------------------------------------------------------------------------
def fold_scale(base, *factors):
    """Product of a float/0-dim tensor scale with optional float/tensor factors (None skipped).
    Floats stay floats (no allocation); any tensor makes a 0-dim/1-elem fp32 tensor."""
    out = base
    for f in factors:
        if f is None:
            continue
        if isinstance(out, torch.Tensor) or isinstance(f, torch.Tensor):
            out = out * f
        else:
            out = float(out) * float(f)
    return out


def check_scale(name: str, value, device, values: bool, nonzero: bool = False) -> None:
    """A scale is a finite number, or a 1-element float32 tensor on the inputs' device
    (``nonzero``: a divisor, so 0 is refused too; tensor values are read only with ``values``)."""
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype != torch.float32:
            raise bad(name, value, "a Python float or a 0-dim / 1-element float32 tensor")
        if value.device != device:
            raise bad(name, value, f"a tensor on {device}, the device of the inputs")
        if values:
            got = float(value.reshape(-1)[0])
            if not math.isfinite(got) or (nonzero and got == 0):
                raise bad(name, got, "a finite value" + (", not 0 (it divides the output)" if nonzero else ""))
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(name, value, "a Python float or a 0-dim / 1-element float32 tensor", TypeError)
    if not math.isfinite(value) or (nonzero and value == 0):
        raise bad(name, value, "a finite value" + (", not 0 (it divides the output)" if nonzero else ""))


# -- LSE ----------------------------------------------------------------------------------------
def scatter_padded_lse(packed: torch.Tensor, qo_indptr: torch.Tensor, padded: torch.Tensor) -> None:
    """Packed (total_q, Hq) -> padded (B, max_q, Hq) in place; rows past a request's length are
    -inf. No host synchronization: row -> (request, local index) is computed on the device. On a
    GPU one Triton launch (``backends.native.padded_lse``) where it serves, else PyTorch's ten."""
    if packed.is_cuda and _one_launch(packed, qo_indptr, padded):
        return
    batch, max_q, heads = padded.shape
    padded.fill_(float("-inf"))
    total = packed.shape[0]
    if total == 0:
        return
    rows = torch.arange(total, device=packed.device, dtype=torch.int64)
    indptr = qo_indptr.to(torch.int64)
    req = torch.searchsorted(indptr, rows, right=True) - 1
    dest = req * max_q + (rows - indptr[req])
    padded.view(batch * max_q, heads).index_copy_(0, dest, packed)


_PADDED_WRITE: list = []  # backends.native.padded_lse.write, or None without Triton (looked up once)


def _one_launch(packed: torch.Tensor, qo_indptr: torch.Tensor, padded: torch.Tensor) -> bool:
    if not _PADDED_WRITE:
        try:
            from backends.native import padded_lse
            _PADDED_WRITE.append(padded_lse.write)
        except ImportError:  # no Triton: PyTorch's ops scatter
            _PADDED_WRITE.append(None)
    write = _PADDED_WRITE[0]
    return write is not None and write(packed, qo_indptr, padded)


Layout = Literal["NHD", "HND"]
PosMode = Literal["NONE", "ROPE_LLAMA", "ALIBI"]
Scale = Union[float, torch.Tensor]
Q_DTYPES = FLOAT_DTYPES + FP8_DTYPES
OUT_DTYPES = FLOAT_DTYPES + FP8_DTYPES


# -- conversion of pydantic errors ----------------------------------------------------------
TYPE_NAMES = {"Tensor": "torch.Tensor", "dtype": "torch.dtype", "device": "torch.device"}


def validate(model: type["Spec"], args: dict) -> tuple["Spec", SimpleNamespace]:
    """Full validation -> (spec, derived values); raises ValueError/TypeError, never pydantic's
    ValidationError."""
    try:
        spec = model.model_validate(args)
    except ValidationError as exc:
        raise _user_error(exc) from None
    return spec, spec._derived


def _user_error(exc: ValidationError) -> Exception:
    err = exc.errors(include_url=False)[0]
    original = (err.get("ctx") or {}).get("error")
    if isinstance(original, (ValueError, TypeError)):
        return type(original)(str(original))
    name = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("is-instance", "function")))
    name = name.split(".")[0] if name else "argument"
    msg = err["msg"].replace("Input should be ", "")
    if err["type"] == "is_instance_of":  # pydantic says "an instance of Tensor": name the class users write
        msg = f"a {TYPE_NAMES.get(str((err.get('ctx') or {}).get('class')), msg.removeprefix('an instance of '))}"
    cls = ValueError if err["type"] in ("literal_error", "enum") else TypeError
    return cls(f"{name}={show(err.get('input'))}: allowed {msg}")


# -- shared checks ------------------------------------------------------------------------------
def need_tensor(name: str, t: Any, ranks=(), dtypes=(), device=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise bad(name, t, "a torch.Tensor", TypeError)
    if ranks and t.dim() not in ranks:
        raise bad(name, t, f"a tensor of rank {' or '.join(map(str, ranks))}")
    if dtypes and t.dtype not in dtypes:
        raise bad(f"{name}.dtype", t.dtype, dtypes_text(dtypes))
    if device is not None and t.device != device:
        raise bad(f"{name}.device", t.device, f"{device}, the device of the query (all tensors on one device)")


def need_index(name: str, t: Any, numel: Optional[int], device, shapes=None) -> None:
    """An int32 index tensor of ``numel`` elements, 1-D or one of the given shapes."""
    need_tensor(name, t, dtypes=(torch.int32,), device=device)
    ok_shapes = shapes or [(numel,)]
    if numel is not None and tuple(t.shape) not in [tuple(s) for s in ok_shapes]:
        raise bad(f"{name}.shape", tuple(t.shape), " or ".join(str(tuple(s)) for s in ok_shapes))


def need_int(name: str, value: Any, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(name, value, "a Python int", TypeError)
    if value < lo:
        raise bad(name, value, f">= {lo}")


# What kv_layout reads from a K/V tensor of each rank (FlashInfer's conventions): a tensor in the
# other layout gives a wrong num_kv_heads, so a heads error says which layout read it.
KV_LAYOUT_SHAPES = {
    3: {"NHD": "(kv_len, num_kv_heads, head_dim)", "HND": "(num_kv_heads, kv_len, head_dim)"},
    4: {"NHD": "(pages, page_size, num_kv_heads, head_dim)", "HND": "(pages, num_kv_heads, page_size, head_dim)"},
}


def layout_read(what: str, shape: Sequence[int], kv_layout: str) -> str:
    """Where num_kv_heads came from: ``what`` of ``shape`` read as ``kv_layout`` expects (for errors)."""
    shapes = KV_LAYOUT_SHAPES[len(shape)]
    other = "NHD" if kv_layout == "HND" else "HND"
    return (f"num_kv_heads is read from {what}={tuple(shape)} as kv_layout={kv_layout!r} expects: "
            f"{shapes[kv_layout]} ({other!r}: {shapes[other]})")


def need_heads(hq: int, hkv: int, hq_name="num_qo_heads", hkv_name="num_kv_heads", read_from: str = "") -> None:
    """``hq`` a multiple of ``hkv``; ``read_from`` (``layout_read``): how ``hkv`` was read from a tensor."""
    why = f"; {read_from}" if read_from else ""
    if hkv < 1 or hq < 1:
        raise bad(hkv_name if hkv < 1 else hq_name, hkv if hkv < 1 else hq, ">= 1" + why)
    if hq % hkv:
        raise bad(hq_name, hq, f"a multiple of {hkv_name}={hkv} (grouped-query attention){why}")


def need_window(window_left: Any) -> None:
    need_int("window_left", window_left, -1)


def need_out(out, shape, dtype, device, name="out", shape_text="") -> None:
    if out is None:
        return
    need_tensor(name, out, device=device)
    if tuple(out.shape) != tuple(shape):
        raise bad(f"{name}.shape", tuple(out.shape), f"{tuple(shape)}" + (f" = {shape_text}" if shape_text else ""))
    if out.dtype != dtype:
        raise bad(f"{name}.dtype", out.dtype, f"{dtype_name(dtype)}, the output dtype")


def need_sinks(sinks, hq: int, device) -> None:
    if sinks is None:
        return
    need_tensor("sinks", sinks, dtypes=(torch.float32,), device=device)
    if tuple(sinks.shape) != (hq,):
        raise bad("sinks.shape", tuple(sinks.shape), f"({hq},) = (num_qo_heads,)")


def need_soft_cap(cap) -> None:
    if cap is None:
        return
    if isinstance(cap, bool) or not isinstance(cap, (int, float)):
        raise bad("logits_soft_cap", cap, "None or a float >= 0", TypeError)
    if not math.isfinite(cap) or cap < 0:
        raise bad("logits_soft_cap", cap, "None or a finite float >= 0")


def need_finite(name: str, value, positive=False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(name, value, "a Python float", TypeError)
    if not math.isfinite(value) or (positive and value <= 0):
        raise bad(name, value, "a finite float" + (" > 0" if positive else ""))


def need_kv_dtype(name, kv: torch.Tensor, q_dtype: torch.dtype) -> None:
    if kv.dtype != q_dtype and kv.dtype not in FP8_DTYPES:
        raise bad(f"{name}.dtype", kv.dtype, f"{dtype_name(q_dtype)} (the query dtype) or an fp8 dtype")


def host_lists(*tensors: torch.Tensor) -> list[list[int]]:
    """The values of small integer tensors on the host, in one copy (one synchronization) when they
    share a CUDA device: a plan reads several, and each copy waits for the device's queued work."""
    devices = {t.device for t in tensors}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        return [host_ints(t) for t in tensors]
    same = len({t.dtype for t in tensors}) == 1  # an engine's int32 indices: one launch (the cat), no casts
    flat = torch.cat([t.reshape(-1) if same else t.reshape(-1).to(torch.int64) for t in tensors]).tolist()
    out, at = [], 0
    for t in tensors:
        out.append(flat[at: at + t.numel()])
        at += t.numel()
    return out


def check_indptr_values(name: str, indptr, total: int, total_name: str, start0=True) -> list[int]:
    """Non-decreasing, starting at 0, ending at ``total``: ``indptr`` a tensor (read on the host) or
    its values read already (``host_lists``). Returns the host list."""
    vals = indptr if isinstance(indptr, list) else [int(x) for x in indptr.reshape(-1).tolist()]
    if start0 and vals and vals[0] != 0:
        raise bad(f"{name}[0]", vals[0], "0")
    for i in range(1, len(vals)):
        if vals[i] < vals[i - 1]:
            raise bad(name, vals, f"a non-decreasing prefix sum ({name}[{i}]={vals[i]} < {name}[{i - 1}]={vals[i - 1]})")
    if total is not None and vals and vals[-1] != total:
        raise bad(f"{name}[-1]", vals[-1], f"{total} = {total_name}")
    return vals


def check_paged_values(table: torch.Tensor, kv_lens: torch.Tensor, page_size: int, num_pages: int,
                       table_name="block_tables", lens_name="seq_lens") -> None:
    """Device read: 0 <= lengths <= table capacity, and the page ids a length uses are < pages."""
    lens = kv_lens.reshape(-1).to("cpu", torch.int64)
    capacity = table.shape[-1] * page_size
    if lens.numel() and (int(lens.min()) < 0 or int(lens.max()) > capacity):
        worst = int(lens.min()) if int(lens.min()) < 0 else int(lens.max())
        raise bad(lens_name, lens.tolist(), f"lengths in [0, {capacity}] = {table_name}.shape[-1] * page_size "
                  f"(got {worst})")
    used = torch.arange(table.shape[-1]).unsqueeze(0) < ((lens + page_size - 1) // page_size).unsqueeze(1)
    ids = table.to("cpu", torch.int64)[used]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_pages):
        worst = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise bad(table_name, worst, f"page ids in [0, {num_pages}) (the cache has {num_pages} pages)")


def out_dtype_of(q_dtype: torch.dtype, requested) -> torch.dtype:
    """Default output dtype: the query's; bfloat16 for an fp8 query."""
    if requested is not None:
        return parse_dtype(requested, "out_dtype")
    return torch.bfloat16 if q_dtype in FP8_DTYPES else q_dtype


class SpecFields:
    """A spec's values, for the checks a known call key repeats: the fields are the call's arguments
    (``args``, every field given) and the methods the spec's own (``fields_class``). No pydantic model
    is built: its validation ran when the key was new."""

    __slots__ = ("__dict__",)

    def __init__(self, args: dict):
        self.__dict__ = args


_FIELDS_CLASSES: dict = {}  # spec class -> its SpecFields class (one per spec class: bounded by the code)


def fields_class(spec: type) -> type:
    """A plain class with the methods the spec classes define (not pydantic's), over SpecFields."""
    made = _FIELDS_CLASSES.get(spec)
    if made is None:
        methods: dict = {}
        for klass in reversed(spec.__mro__):
            if isinstance(klass, type) and issubclass(klass, Spec):
                methods.update((name, attr) for name, attr in vars(klass).items() if not name.startswith(("__", "model_"))
                               and (callable(attr) or isinstance(attr, (property, classmethod, staticmethod))))
        made = _FIELDS_CLASSES[spec] = type(f"{spec.__name__}Fields", (SpecFields,), methods)
    return made


class Spec(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, strict=True, extra="ignore")
    _derived: Any = PrivateAttr(None)

    def derive(self) -> SimpleNamespace:  # shapes and normalized views, raising on bad ranks
        raise NotImplementedError

    def static_checks(self, d) -> None: ...
    def size_checks(self, d) -> None: ...
    def value_checks(self, d) -> None: ...

    @model_validator(mode="after")
    def _check_all(self):
        d = self.derive()
        self.static_checks(d)
        self.size_checks(d)
        self.value_checks(d)
        self._derived = d
        return self

    @classmethod
    def fast(cls, args: dict, values: bool) -> tuple["SpecFields", SimpleNamespace]:
        """The per-call path once the signature was validated: sizes (and values if asked), run on
        the call's values without building the model (the full model already validated this
        signature; model_construct costs ~10 us per call, more than everything else here)."""
        spec = fields_class(cls)(args)
        d = spec.derive()
        spec.size_checks(d)
        if values:
            spec.value_checks(d)
        return spec, d

    @classmethod
    def plain(cls, args: dict) -> tuple["SpecFields", SimpleNamespace]:
        """Every check of the spec (derive, static, size, value) on the call's values, without
        pydantic's type validation: for a call whose key proves the types (each argument's type;
        each tensor's dtype, device and rank; each scalar's value) that a full validation accepted.
        ``args`` holds every field (``with_defaults``)."""
        spec = fields_class(cls)(args)
        d = spec.derive()
        spec.static_checks(d)
        spec.size_checks(d)
        spec.value_checks(d)
        return spec, d

    @classmethod
    def with_defaults(cls, args: dict) -> dict:
        """``args`` with the defaults of the fields it leaves out (as the model would fill them: a
        default factory makes a new value each time)."""
        fixed, factories = _defaults_of(cls)
        missing = {name: make() for name, make in factories.items() if name not in args}
        return {**fixed, **missing, **args}


_DEFAULTS: dict = {}  # spec class -> (field -> default, field -> default factory): one per class


def _defaults_of(spec: type) -> tuple[dict, dict]:
    made = _DEFAULTS.get(spec)
    if made is None:
        optional = {name: f for name, f in spec.model_fields.items() if not f.is_required()}
        made = _DEFAULTS[spec] = ({n: f.default for n, f in optional.items() if f.default_factory is None},
                                  {n: f.default_factory for n, f in optional.items() if f.default_factory is not None})
    return made


# -- shared by several specs ---------------------------------------------------------------------
def paged_kv_spec(kv_cache, layout, allow_squeezed, name="kv_cache") -> SimpleNamespace:
    if type(kv_cache) is torch.Tensor and kv_cache.dim() == 5 and kv_cache.shape[1] == 2:
        # the common cache, every call of every layer: its halves' kept views (one tensor's halves
        # share its dtype, device and shape)
        kn, vn = cache_halves(kv_cache, layout)
        k, squeezed = kn, False
    else:
        k, v, squeezed = split_kv(kv_cache, name, allow_squeezed)
        kn, vn = paged_nhd(k, layout, squeezed), paged_nhd(v, layout, squeezed)
        if kn.shape[:3] != vn.shape[:3]:
            raise bad(name, kv_cache, "K and V caches with the same (pages, page_size, num_kv_heads)")
        if k.dtype != v.dtype or k.device != v.device:
            raise bad(name, kv_cache, "K and V caches of one dtype on one device")
    pages, page_size, hkv, _ = kn.shape
    return SimpleNamespace(k=kn, v=vn, pages=pages, page_size=page_size, hkv=hkv, dqk=kn.shape[3],
                           dvo=vn.shape[3], kv_dtype=k.dtype, squeezed=squeezed, layout=layout)


def need_query(name, q, dtypes=Q_DTYPES):
    need_tensor(name, q, ranks=(3,), dtypes=dtypes)
    if q.stride(-1) != 1:
        raise bad(f"{name}.stride()", tuple(q.stride()), "a unit stride on the last (head_dim) dimension")


def need_unit_head_stride(d, name="kv_cache") -> None:
    """K's and V's last (head_dim) dims contiguous; the error shows the strides of the half at fault."""
    for half, t in (("k", d.k), ("v", d.v)):
        if t.stride(-1) != 1:
            raise bad(f"{name} ({half}).stride()", tuple(t.stride()), "a unit stride on the last (head_dim) dimension")


def need_kv_static(d, q, name="kv_cache"):
    if d.k.device != q.device:
        raise bad(f"{name}.device", d.k.device, f"{q.device}, the device of the query (all tensors on one device)")
    need_kv_dtype(name, d.k, q.dtype)
    need_unit_head_stride(d, name)
    if d.dqk != q.shape[2]:
        raise bad(f"{name} head_dim", d.dqk, f"{q.shape[2]} = query.shape[2]")
    read_from = "" if d.squeezed else layout_read(f"{name}'s K half of shape", _caller_shape(d), d.layout)
    need_heads(q.shape[1], d.hkv, "query.shape[1] (num_qo_heads)", "num_kv_heads", read_from)


def _caller_shape(d: SimpleNamespace) -> tuple:
    """The shape of the caller's K half (in its layout) behind the logical NHD view ``d.k``."""
    return tuple(paged_nhd(d.k, d.layout, False).shape)  # the HND permutation is its own inverse


Units = Any  # checked by hand so the message lists both spellings


def lens_shapes(b: int) -> list[tuple]:
    return [(b,), (b, 1, 1, 1)]


def offsets_shapes(b: int) -> list[tuple]:
    return [(b + 1,), (b + 1, 1, 1, 1)]


def token_offsets(name: str, t: torch.Tensor, mult: int) -> list[int]:
    """Device read: element offsets -> token offsets (each must be a multiple of ``mult``)."""
    vals = host_ints(t)
    for v in vals:
        if v % mult:
            raise bad(name, vals, f"element offsets, multiples of {mult} (= heads * head_dim); "
                      "pass batch_offsets_units='tokens' for token offsets")
    return [v // mult for v in vals]
