"""Pydantic specs of the seven entry points: argument types, shapes, dtypes, devices, ranges.

One model per entry point (and per wrapper method). Each model validates its fields' types
(pydantic, strict) and then runs three groups of plain-Python checks:

* ``static_checks``: what the entry's signature tuple captures (ranks, dtypes, devices, inner
  dims, enums, scalar arguments). Run once per signature (functions) or per plan (wrappers).
* ``size_checks``: cheap consistency of sizes that vary per call (batch size, token counts,
  out/lse buffers, scale values). Run on every call.
* ``value_checks``: checks that read device data (page ids < pages, monotonic indptrs, lengths
  within capacity). Run always for CPU tensors, at wrapper plan time, and on the first call per
  key for CUDA tensors; ``ATTN_DISPATCH_VALIDATE=full`` makes them per call.

Pydantic's ``ValidationError`` never reaches users: ``validate`` turns it into the
ValueError/TypeError it carries, or builds one naming the argument, its value and what is
allowed. Nothing is written to caller tensors by any check.
"""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Literal, Optional, Union

import torch
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, model_validator

from ._normalize import FLOAT_DTYPES, FP8_DTYPES, bad, dtypes_text, parse_dtype, show
from .problem import dtype_name

Layout = Literal["NHD", "HND"]
PosMode = Literal["NONE", "ROPE_LLAMA", "ALIBI"]
Scale = Union[float, torch.Tensor]
Q_DTYPES = FLOAT_DTYPES + FP8_DTYPES
OUT_DTYPES = FLOAT_DTYPES + FP8_DTYPES


# -- conversion of pydantic errors ----------------------------------------------------------
def validate(model: type["_Spec"], args: dict) -> tuple["_Spec", SimpleNamespace]:
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


def need_heads(hq: int, hkv: int, hq_name="num_qo_heads", hkv_name="num_kv_heads") -> None:
    if hkv < 1 or hq < 1:
        raise bad(hkv_name if hkv < 1 else hq_name, hkv if hkv < 1 else hq, ">= 1")
    if hq % hkv:
        raise bad(hq_name, hq, f"a multiple of {hkv_name}={hkv} (grouped-query attention)")


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


def check_indptr_values(name: str, indptr: torch.Tensor, total: int, total_name: str, start0=True) -> list[int]:
    """Device read: non-decreasing, starting at 0, ending at ``total``. Returns the host list."""
    vals = [int(x) for x in indptr.reshape(-1).tolist()]
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


class _Spec(BaseModel):
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
    def fast(cls, args: dict, values: bool) -> tuple["_Spec", SimpleNamespace]:
        """The per-call path once the signature was validated: sizes (and values if asked)."""
        # Fields only, no pydantic machinery: the full model already validated this signature
        # (model_construct costs ~10 us per call, more than everything else here).
        spec = object.__new__(cls)
        object.__setattr__(spec, "__dict__", args)
        object.__setattr__(spec, "__pydantic_private__", {"_derived": None})
        d = spec.derive()
        spec.size_checks(d)
        if values:
            spec.value_checks(d)
        return spec, d
