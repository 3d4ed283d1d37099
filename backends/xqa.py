"""TensorRT-LLM XQA decode through ``flashinfer.decode.xqa_batch_decode_with_kv_cache``.

Translation (the function's signature and docstring, flashinfer/decode.py):
* paged only; our logical NHD page views go over in the caller's physical layout;
* ``seq_lens`` = our kv_lens (they include the new/draft tokens), block_table as is;
* window_left and sinks (Hq,) fp32 have our meaning already (window_left+1 keys; raw logits);
* scales: bmm1_scale = sm_scale, and bmm2_scale is passed as 1 with the output multiplied
  by out_scale afterwards. Why: the kernel applies its kv_scale only to a quantized
  (fp8/int8) cache (csrc/xqa/mha.cu ``isKVCacheQuantized ? kvCacheScaleValue : 1``), while
  FlashInfer 0.5.3 folds bmm2 into kv_scale and divides q_scale by it: with a 16-bit cache
  a bmm2_scale != 1 scales the logits by 1/bmm2 and leaves the output unscaled.
  With bmm2 = 1 every version computes softmax(bmm1 * q.k) v exactly. An fp8 output (served
  with an fp8 cache only, FlashInfer >= 0.7: capability_db/backends/xqa.json) is stored by the
  kernel already rounded, so out_scale goes in as the kernel's kv_scale (q_scale divided by it),
  as FlashInfer's decode function passes bmm2_scale with o_scale = 1;
* no LSE (rejected by the data when return_lse);
* workspace: one zeroed 128 MiB buffer per GPU (first 8 MiB = semaphores, which the
  kernel leaves zeroed), allocated and zeroed once: _vendor.workspace, keyed on (tag,
  device with its index): a buffer of cuda:0 handed to a launch on cuda:1 was the
  "illegal memory access"; launches run under the tensors' GPU;
* a float sm_scale < 0 is refused before any launch (_vendor.refuse_negative_scale);
* known defect xqa-nonfinite-at-extreme-logits (capability_db/defects.json: a row whose logits all lie
  at or below about -1e5, XQA's initial row max, comes out wrong): on decode every XQA launch is
  followed by native-triton's fix-up (triton_backend.fixup_refusal, the kernel's FIXUP), which bounds
  each row's logit at its own position and recomputes the row blocks it cannot bound within 1e4 (the
  row max is then far above XQA's floor). Safe rows cost one small launch that returns at once.
Spec decode needs a FlashInfer whose function takes ``mask``/``q_len_per_req`` (>= 0.6);
older ones are refused at plan time (BackendRejected), so the router falls back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from backends import _flashinfer_internal as fi_internal, _vendor
from backends._device import device_key, on_device, on_device_launch
from backends.native.triton_backend import NativeTritonBackend, fixup_refusal

WORKSPACE_BYTES = 128 * 1024 * 1024
NONFINITE = "xqa-nonfinite-at-extreme-logits"  # the known defect the fix-up keeps from the caller
SRC = "flashinfer 0.5.3 / 0.7.2 flashinfer/decode.py xqa_batch_decode_with_kv_cache, flashinfer/xqa.py, flashinfer/jit/xqa.py"


@dataclass
class XqaPlan:
    problem: Any
    fn: Any
    spec: dict = field(default_factory=dict)  # q_len_per_req, mask[, q_cu_seq_lens]
    direct: Optional["DirectXqa"] = None  # FlashInfer 0.5.3's / 0.7.2's kernel entry, when usable
    fixup: Any = None  # native-triton's fix-up plan, launched after XQA (XqaBackend.guards), or None


@dataclass(frozen=True)
class DirectXqa:
    """FlashInfer's XQA kernel entry and the arguments that do not change per call, prepared at
    plan time: what ``flashinfer.xqa.xqa`` derives on every call (SM count, PDL support, the
    workspace split) is derived once, so a call pays no FlashInfer Python layer. ``abi``: "0.5",
    the compiled ``xqa_wrapper`` (21 arguments); "0.7", the kernel variant's ``xqa`` function of
    ``flashinfer.xqa.get_xqa_module`` (24 arguments: FlashInfer 0.7.2 xqa.py), which takes q, out
    and the lengths as FlashInfer's decode function passes them, with a unit query axis."""

    run: Any
    fp8_sm90: bool
    sm_count: int
    num_kv_heads: int
    sliding_window: int
    page_size: int
    sqrt_head_dim: float
    semaphores: torch.Tensor
    scratch: torch.Tensor
    pdl: bool
    abi: str = "0.5"

    def __call__(self, q_scale, out, q, sinks, k, v, table, kv_capacity: int, lens, rows: int,
                 kv_scale=1.0) -> None:
        """One launch; ``q_scale`` (and on 0.7.x ``kv_scale``) a float, or a 0-dim device tensor."""
        tensor = isinstance(q_scale, torch.Tensor)
        if self.abi == "0.7":
            self.run(self.fp8_sm90, self.sm_count, self.num_kv_heads, self.sliding_window, q_scale,
                     out.unsqueeze(1), 1.0, q.unsqueeze(1), sinks, k, v, None, None, table, kv_capacity,
                     lens.unsqueeze(1), rows, kv_scale, self.semaphores, self.scratch, self.pdl, 1, None, None)
            return
        self.run(self.fp8_sm90, self.sm_count, self.num_kv_heads, self.sliding_window, 1.0 if tensor else q_scale,
                 q_scale if tensor else None, out, 1.0, q, sinks, k, v, table, kv_capacity, lens, rows, 1.0, None,
                 self.semaphores, self.scratch, self.pdl)


def draft_mask(qo_indptr: torch.Tensor, max_q: int, causal: bool, device) -> torch.Tensor:
    """XQA's uint16 draft mask, one row per query token: bit j of row i (uint32 words,
    little-endian, viewed as uint16 pairs) = draft i sees draft j of its own request."""
    q_lens = (qo_indptr[1:] - qo_indptr[:-1]).to(device=device, dtype=torch.int64)
    req = torch.repeat_interleave(torch.arange(q_lens.numel(), device=device), q_lens)
    row = torch.arange(req.numel(), device=device) - qo_indptr[:-1].to(device=device, dtype=torch.int64)[req]
    words = (max_q + 31) // 32
    col = torch.arange(words * 32, device=device)
    keep = col[None, :] < q_lens[req][:, None]
    if causal:
        keep &= col[None, :] <= row[:, None]
    weights = (2 ** torch.arange(32, device=device, dtype=torch.int64))
    packed = (keep.view(-1, words, 32).to(torch.int64) * weights).sum(-1)  # (rows, words) < 2^32
    packed = torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)
    return packed.view(torch.uint16)


class XqaBackend(_vendor.FlashInferModuleBackend):
    name = "xqa"
    vendor_module = "flashinfer.decode"

    # FlashInfer 0.5.3's XQA launch fails with cudaErrorInvalidValue on a second GPU of the process
    # (seen on two H200s in one process), so XQA serves the first GPU it
    # planned on and refuses the others before any launch: the router hands them to the next backend.
    _first_gpu: "torch.device | None" = None

    def _refuse_second_gpu(self, device) -> None:
        if device.type != "cuda":
            return
        device = device_key(device)
        if XqaBackend._first_gpu is None:
            XqaBackend._first_gpu = device
        elif device != XqaBackend._first_gpu:
            raise _vendor.rejected(self.name, "device", str(device),
                                   f"{XqaBackend._first_gpu}, the first GPU XQA ran on in this process",
                                   "flashinfer 0.5.3 xqa.py xqa(): cudaErrorInvalidValue on a second GPU (H200 x2)")

    guards = {NONFINITE:
              "on decode: native-triton's fix-up after each XQA launch recomputes the row blocks whose "
              "logit at their own position it cannot bound within 1e4 (backends/xqa.py)"}

    def guarded(self, defect_id: str, problem) -> bool:
        return defect_id in self.guards and not fixup_refusal(problem) and _NATIVE.available() is None

    def plan_reusable(self, problem) -> bool:
        return problem.phase != "spec_decode"  # decode: the function alone; run reads the rest

    def plan(self, problem, batch) -> XqaPlan:
        _vendor.refuse_negative_scale(self.name, batch.sm_scale, "xqa (bmm1_scale)")
        self._refuse_second_gpu(batch.q.device)
        fn = self._loaded().module.xqa_batch_decode_with_kv_cache
        ws = _vendor.workspace("xqa", batch.q.device, WORKSPACE_BYTES, zeroed=True)
        if problem.phase != "spec_decode":
            fixup = _NATIVE.plan(problem, batch, fixup=True) if self.guarded(NONFINITE, problem) else None
            return XqaPlan(problem, fn, direct=self._direct(problem, batch, ws), fixup=fixup)
        with on_device(batch.q.device):
            return XqaPlan(problem, fn, self._spec_kwargs(problem, batch, fn))

    def _direct(self, problem, batch, ws: torch.Tensor) -> Optional[DirectXqa]:
        """The kernel entry of FlashInfer 0.5.3 (21 positional arguments) or 0.7.2 (24), through
        backends/_flashinfer_internal.py, or None: another version (fi_internal.checked), or any
        lookup failure, keeps the public function."""
        version = self.version() or ""
        if batch.q.device.type != "cuda" or not fi_internal.checked(version):
            return None
        try:
            return self.bind_direct(problem, batch.q.dtype, batch.k.dtype, batch.out.dtype, batch.q.device, ws,
                                    "0.7" if version.startswith("0.7.") else "0.5")
        except (ImportError, AttributeError, TypeError, RuntimeError, OSError):
            return None

    @staticmethod
    def bind_direct(problem, q_dtype, kv_dtype, out_dtype, device, ws: torch.Tensor, abi: str) -> DirectXqa:
        """What FlashInfer's ``xqa_batch_decode_with_kv_cache`` and ``xqa.xqa`` derive per call for
        one query per request, bmm2_scale = o_scale = 1 (0.7.2: the SM90 fp8 kernel up to head dim
        256 only; 0.5.3: every head dim it serves)."""
        group = problem.num_qo_heads // problem.num_kv_heads
        sliding = problem.window_left >= 0
        key = (q_dtype, kv_dtype, problem.page_size, problem.head_dim_qk, group, sliding, out_dtype)
        run = fi_internal.xqa_entry(key, abi)
        major = torch.cuda.get_device_capability(device)[0]
        fp8_sm90 = kv_dtype == torch.float8_e4m3fn and major == 9 and (abi == "0.5" or problem.head_dim_qk <= 256)
        return DirectXqa(run, fp8_sm90, torch.cuda.get_device_properties(device).multi_processor_count,
                         problem.num_kv_heads, problem.window_left + 1 if sliding else 0, problem.page_size,
                         float(problem.head_dim_qk) ** 0.5, ws[:SEMAPHORE_BYTES], ws[SEMAPHORE_BYTES:], major >= 9, abi)

    def _spec_kwargs(self, problem, batch, fn) -> dict:
        if not (_vendor.has_param(fn, "mask") and _vendor.has_param(fn, "q_len_per_req")):
            raise _vendor.rejected(self.name, "flashinfer version", self.version(),
                                   ">= 0.6 (xqa_batch_decode_with_kv_cache takes mask=; 0.5.3 asserts q_len_per_req == 1)",
                                   "flashinfer 0.5.3 decode.py xqa_batch_decode_with_kv_cache")
        ragged = problem.q_len_per_req == 0
        if ragged and not _vendor.has_param(fn, "q_cu_seq_lens"):
            raise _vendor.rejected(self.name, "q_len_per_req", 0, "a fixed draft length with this flashinfer "
                                   "(q_cu_seq_lens needs >= 0.6.17)",
                                   "flashinfer 0.6.17 flashinfer/decode.py xqa_batch_decode_with_kv_cache(q_cu_seq_lens=)")
        if problem.mask == "spec_bits":
            mask = batch.spec_mask
        else:
            mask = draft_mask(batch.qo_indptr, batch.max_q_len, problem.causal, batch.q.device)
        q_len = batch.max_q_len if ragged else problem.q_len_per_req
        if not ragged:
            mask = mask.reshape(batch.batch_size, q_len, -1)
        kwargs = {"q_len_per_req": q_len, "mask": mask}
        if ragged:
            kwargs["q_cu_seq_lens"] = batch.qo_indptr
        return kwargs

    def run(self, plan: XqaPlan, batch) -> None:
        _vendor.refuse_negative_scale(self.name, batch.sm_scale, "xqa (bmm1_scale)")  # before launch
        with on_device(batch.q.device):
            self._launch(plan, batch)
            if plan.fixup is not None:
                _NATIVE.run(plan.fixup, batch)

    def _launch(self, plan: XqaPlan, batch) -> None:
        if plan.direct is not None:
            return self._launch_direct(plan.direct, batch)
        problem = plan.problem
        k, v, layout = _vendor.physical_kv(problem, batch.k, batch.v)
        out = _vendor.writable(batch.out)
        scaled_store = out.dtype == torch.float8_e4m3fn  # the kernel scales before it rounds (module docstring)
        plan.fn(
            batch.q.contiguous(), (k, v),
            _vendor.workspace("xqa", batch.q.device, WORKSPACE_BYTES, zeroed=True),
            _contiguous(batch.block_table), _contiguous(batch.kv_lens), batch.max_kv_len,
            _vendor.device_scalar(batch.sm_scale, batch.q.device),  # bmm1_scale
            _vendor.device_scalar(batch.out_scale, batch.q.device) if scaled_store else 1.0,  # bmm2_scale
            problem.window_left,
            out=out, sinks=batch.sinks, kv_layout=layout, **plan.spec,
        )
        _vendor.write_back(batch.out, out)
        if not scaled_store:
            _vendor.apply_out_scale(batch.out, batch.out_scale)

    @staticmethod
    def _launch_direct(x: DirectXqa, batch) -> None:
        """What flashinfer.decode.xqa_batch_decode_with_kv_cache then flashinfer.xqa.xqa do per
        call with bmm2_scale = o_scale = 1 (q_scale = bmm1 * sqrt(d), kv_scale = 1), straight into
        the compiled entry. Our K/V are the logical NHD views whatever the physical layout: the
        kernel reads them by stride, as it reads FlashInfer's own transposed HND views. On 0.5.x
        ``out``, ``q`` and the lengths go without FlashInfer's ``unsqueeze(1)``: 0.5.3's entry reads
        only their data pointers (csrc/xqa/xqa_wrapper.cu), and each view costs about 1 us of host
        time; 0.7.x's entry takes them as FlashInfer passes them (``DirectXqa.__call__``)."""
        out = _vendor.writable(batch.out)
        q = batch.q if batch.q.is_contiguous() else batch.q.contiguous()
        q_scale = _vendor.device_scalar(batch.sm_scale, q.device) * x.sqrt_head_dim  # 0.7.x takes it 0-dim
        if isinstance(q_scale, torch.Tensor) and x.abi == "0.5":
            q_scale = q_scale.reshape(-1)
        kv_scale = 1.0
        if out.dtype == torch.float8_e4m3fn:  # 0.7.x only; the kernel scales before it rounds (module docstring)
            kv_scale = _vendor.device_scalar(batch.out_scale, q.device)
            q_scale = q_scale / kv_scale
        table = _contiguous(batch.block_table)
        sinks = batch.sinks.reshape(x.num_kv_heads, -1) if batch.sinks is not None else None
        x(q_scale, out, q, sinks, batch.k, batch.v, table, table.shape[-1] * x.page_size, _contiguous(batch.kv_lens),
          table.shape[0], kv_scale)
        _vendor.write_back(batch.out, out)
        if out.dtype != torch.float8_e4m3fn:
            _vendor.apply_out_scale(batch.out, batch.out_scale)

    def launcher(self, plan: XqaPlan, batch):
        """The kernel entry with everything but the call's tensors bound (``_launch_direct`` for
        a float scale, no output scale, caller buffers the kernel can write); else None."""
        x = plan.direct
        if (x is None or isinstance(batch.sm_scale, torch.Tensor) or float(batch.sm_scale) < 0
                or not _vendor.is_unit(batch.out_scale) or not batch.out.is_contiguous()
                or not batch.q.is_contiguous() or not batch.block_table.is_contiguous()
                or not batch.kv_lens.is_contiguous()):
            return None  # the lane key proves a repeat's strides: contiguous now is contiguous then
        q_scale = float(batch.sm_scale) * x.sqrt_head_dim
        rows, kv_capacity = batch.block_table.shape[0], batch.block_table.shape[-1] * x.page_size
        head = (x.fp8_sm90, x.sm_count, x.num_kv_heads, x.sliding_window, q_scale, None)
        tail = (1.0, None, x.semaphores, x.scratch, x.pdl)
        run, heads = x.run, x.num_kv_heads
        if x.abi != "0.5":
            def launch_xqa(b) -> None:
                x(q_scale, b.out, b.q, b.sinks.reshape(heads, -1) if b.sinks is not None else None, b.k, b.v,
                  b.block_table, kv_capacity, b.kv_lens, rows)
        else:
            def launch_xqa(b) -> None:
                sinks = b.sinks.reshape(heads, -1) if b.sinks is not None else None
                run(*head, b.out, 1.0, b.q, sinks, b.k, b.v, b.block_table, kv_capacity, b.kv_lens, rows, *tail)

        return on_device_launch(batch.q.device, _then_fixup(launch_xqa, plan.fixup, batch))


def _then_fixup(launch_xqa, fixup, batch):
    """``launch_xqa`` followed by the fix-up's launch for exact repeats of ``batch`` (its launcher, or
    its run where the launcher declines), or ``launch_xqa`` alone without a fix-up plan."""
    if fixup is None:
        return launch_xqa
    fix = _NATIVE.launcher(fixup, batch)
    if fix is None:
        def fix(b) -> None:
            _NATIVE.run(fixup, b)

    def launch_and_fix(b) -> None:
        launch_xqa(b)
        fix(b)

    return launch_and_fix


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    """An index tensor the kernel may read row-major: the kernel takes only its data pointer, so a
    strided one (a slice of a wider page table, every other length) would read the wrong entries."""
    return t if t.is_contiguous() else t.contiguous()


SEMAPHORE_BYTES = 8 * 1024 * 1024  # FlashInfer's xqa_batch_decode_with_kv_cache: the workspace's first 8 MiB
_NATIVE = NativeTritonBackend()  # the fix-up's kernels (no state but its availability, cached per class)
