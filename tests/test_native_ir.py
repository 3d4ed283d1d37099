"""native-triton's kernels built by Triton's real compiler frontend (no interpreter, no GPU), for an
H100 (sm_90): every scenario of tests/test_native_triton.py and tests/test_native_rope.py is planned
as on a GPU (TRITON_INTERPRET off: DOT_F32 only for fp32 inputs), its launches are captured instead
of run, and each captured kernel is specialized as Triton's launcher would (its binder) and lowered
to Triton IR (``ASTSource.make_ir``, the stage that type-checks the kernel and its helpers).

Why: the interpreter executes Python, so it never reaches code a compiled kernel still generates,
e.g. the statements after a ``return`` nested in a constexpr ``if`` (the fused-RoPE kernel passed
every interpreter test and failed to compile on the H100: a half-width q dotted with full-width K).
Each kernel's MASKED=True and MASKED=False tiles are both built (the kernel's three key loops).

A session under the interpreter (tests/conftest.py on a CPU) cannot build IR in its own process:
Triton's own @jit library functions (tl.max, tl.sum, ...) were made interpreted when triton was
imported. There, ``test_ir_builds_in_a_fresh_process`` runs this file again in a child pytest with
TRITON_INTERPRET=0 (a few seconds), and the IR tests themselves run in that child (or directly in a
session that compiles, e.g. on a GPU machine).

Checked against Triton 3.9 (local) and 3.6 (the H100's); both also compile these kernels on to a
cubin without a GPU (``triton.compile(..., target=GPUTarget("cuda", 90, 32))``), which is too slow
for a unit test (seconds per variant), so only the IR stage runs here. The helpers used are
Triton's own (private) launch path; a Triton without them skips with the reason.
"""
from __future__ import annotations

import ast
import importlib.util
import linecache
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from backends.native import triton_backend as tb
from backends.native.triton_backend import TileConfig
from dispatch.benchmark.native import BACKEND, Case, build, problem_of
from dispatch.problem import NAME_DTYPES, AttentionBatch
from test_native_rope import CASES as ROPE_CASES
from test_native_triton import SCENARIOS
from test_native_wide import WIDE_SCENARIOS

pytestmark = pytest.mark.native_triton

KERNELS = Path(tb.__file__).with_name("triton_kernels.py")
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"  # as triton was imported (tests/conftest.py)
compiles = pytest.mark.skipif(INTERPRETING, reason="Triton imported as the interpreter: these run in a "
                              "fresh process (test_ir_builds_in_a_fresh_process)")


@pytest.mark.skipif(not INTERPRETING, reason="this session compiles: the IR tests run in it")
def test_ir_builds_in_a_fresh_process():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                         cwd=root, env=env, capture_output=True, text=True, timeout=300)
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, tail
    lines = tail.strip().splitlines()
    if " passed" not in lines[-1]:  # only skips: this Triton cannot build IR without a GPU here
        pytest.skip("; ".join(line for line in lines if line.startswith("SKIPPED")) or lines[-1])


def test_jit_helpers_return_a_value_only_at_their_end():
    """The rule the IR tests enforce, read off the source (no Triton needed): in a @triton.jit function
    a ``return`` with a value is its last top-level statement, so no variant's code follows a return
    (a compiled kernel generates it anyway). A bare ``return`` (a kernel's runtime early exit) is fine."""
    tree = ast.parse(KERNELS.read_text())
    jitted = [f for f in tree.body if isinstance(f, ast.FunctionDef)
              and any("jit" in ast.unparse(d) for d in f.decorator_list)]
    assert {"_qk", "_tile", "_load_q", "_attn_fwd", "_merge_splits"} <= {f.name for f in jitted}
    for f in jitted:
        valued = [r for r in ast.walk(f) if isinstance(r, ast.Return) and r.value is not None]
        assert all(r is f.body[-1] for r in valued), (
            f"{f.name}: return at line(s) {[r.lineno for r in valued if r is not f.body[-1]]} is not the "
            "function's last statement: put each constexpr variant in its own if/elif/else branch")


class _Frontend:
    """Triton's specialization and IR builder for one target, on the kernels compiled (not interpreted)."""

    def __init__(self):
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.jit import JITFunction, create_function_from_signature
        from triton._C.libtriton import ir

        self.module = compiled_module(KERNELS.read_text())
        if not isinstance(self.module._attn_fwd, JITFunction):
            pytest.skip(f"triton {triton.__version__}: @triton.jit did not give a JITFunction with "
                        "TRITON_INTERPRET=0")
        self.version = triton.__version__
        self.target = GPUTarget("cuda", 90, 32)
        self.backend = make_backend(self.target)
        self._ast_source, self._binder_of, self._ir = ASTSource, create_function_from_signature, ir
        for name in ("signature", "params", "_pack_args"):
            if not hasattr(self.module._attn_fwd, name):
                pytest.skip(f"triton {self.version}: JITFunction has no {name} (the launch path changed)")

    def make_ir(self, kernel_name: str, args: tuple, options: dict, module=None):
        """Bind args as a launch does, then build the Triton IR module (raises CompilationError)."""
        kernel = getattr(module or self.module, kernel_name)
        binder = self._binder_of(kernel.signature, kernel.params, self.backend)
        bound, specialization, opts = binder(*args, **options)
        opts, signature, constexprs, attrs = kernel._pack_args(self.backend, options, bound, specialization, opts)
        src = self._ast_source(kernel, signature, constexprs, attrs)
        ctx = self._ir.context()
        self._ir.load_dialects(ctx)
        self.backend.load_dialects(ctx)
        return src.make_ir(self.target, opts, self.backend.get_codegen_implementation(opts),
                           self.backend.get_module_map(), ctx)


def compiled_module(source: str, name: str = "_native_kernels_compiled"):
    """The kernels' source executed as a fresh module with @triton.jit compiling (not interpreting)."""
    filename = f"<{name}: {KERNELS}>"  # triton.jit reads each function's source through linecache
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    with pytest.MonkeyPatch.context() as mp:  # triton.jit reads the variable at decoration
        mp.setenv("TRITON_INTERPRET", "0")
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
        exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - our kernels' source
    return module


@pytest.fixture(scope="module")
def frontend():
    if INTERPRETING:
        pytest.skip("Triton imported as the interpreter")
    try:
        return _Frontend()
    except (ImportError, AttributeError, TypeError) as exc:  # Triton's private API moved
        pytest.skip(f"this Triton cannot build IR without a GPU here: {exc!r}")


class _Capture:
    """Stands in for KernelLaunch: records each launch's arguments in the kernel's parameter order."""

    calls: list = []

    def __init__(self, kernel, grid, constexprs, options, device, direct):
        self.name = getattr(kernel, "fn", kernel).__name__
        self.constexprs, self.options = constexprs, options

    def __call__(self, head, ints, flags, grid=None):
        self.calls.append((self.name, (*head, *ints, *self.constexprs, *flags), self.options))


def _launches(monkeypatch, c: Case, **plan_kw) -> tuple:
    """(plan, [(kernel name, args, options)]) of one run of c, planned as on a GPU."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the GPU's constexprs (DOT_F32 only for fp32)
    monkeypatch.setattr(tb, "KernelLaunch", _Capture)
    monkeypatch.setattr(_Capture, "calls", [])
    kw, _, _ = build(c)
    total_q = sum(c.q_lens)
    out = torch.empty((total_q, c.hq, c.dvo), dtype=NAME_DTYPES[c.out_dtype or c.dtype], device=kw["q"].device)
    lse = torch.empty((total_q, c.hq), device=kw["q"].device) if c.lse else None
    scale = torch.tensor(0.1, device=kw["q"].device) if c.tensor_scales else 0.1
    sinks = torch.rand(c.hq, device=kw["q"].device) if c.sinks else None
    extras = {}
    if c.mask == "custom":
        extras["custom_mask"] = torch.ones(sum(q * k for q, k in zip(c.q_lens, c.kv_lens)), dtype=torch.bool,
                                           device=kw["q"].device)
        extras["mask_indptr"] = torch.zeros(len(c.q_lens) + 1, dtype=torch.int32, device=kw["q"].device)
    if c.mask == "spec_bits":
        rows = (total_q,) if c.spec_ragged else (len(c.q_lens), max(c.q_lens))
        extras["spec_mask"] = torch.zeros((*rows, 2), dtype=torch.uint16, device=kw["q"].device)
    batch = AttentionBatch(out=out, lse=lse, sinks=sinks, sm_scale=scale, out_scale=scale, **kw, **extras)
    plan = BACKEND.plan(problem_of(c), batch, **plan_kw)
    BACKEND.run(plan, batch)
    return plan, list(_Capture.calls)


def _check(frontend, monkeypatch, c: Case, flip_dot_f32: bool = False, module=None, **plan_kw):
    plan, calls = _launches(monkeypatch, c, **plan_kw)
    assert calls and calls[0][0] == "_attn_fwd"
    if flip_dot_f32:  # the other DOT_F32 (e.g. the interpreter's bf16-with-fp32-dots configuration)
        names = list(plan.constexprs)
        i = len(calls[0][1]) - 3 - len(names) + names.index("DOT_F32")
        args = list(calls[0][1])
        args[i] = not args[i]
        calls[0] = (calls[0][0], tuple(args), calls[0][2])
    for name, args, options in calls:
        ir_module = frontend.make_ir(name, args, options, module)
        assert "tt.func" in str(ir_module), name
    return plan, calls


@compiles
@pytest.mark.parametrize("name", list(SCENARIOS) + [f"rope:{n}" for n in ROPE_CASES]
                         + [f"wide:{n}" for n in WIDE_SCENARIOS])
def test_kernel_builds_ir_for_sm90(frontend, monkeypatch, name):
    kind, _, short = name.rpartition(":")
    c = {"rope": ROPE_CASES, "wide": WIDE_SCENARIOS, "": SCENARIOS}[kind][short]
    plan, _ = _check(frontend, monkeypatch, c)
    assert plan.constexprs["DOT_F32"] == (c.dtype == "float32")  # planned as on the GPU


@compiles
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("dot_f32", ["as_planned", "flipped"])
@pytest.mark.parametrize("pos", ["ROPE_LLAMA", "NONE"])
def test_rope_and_plain_variants_build_ir(frontend, monkeypatch, dtype, dot_f32, pos):
    """RoPE and plain, each dtype with DOT_F32 on and off, split-KV (prefill: the merge kernel; decode:
    the merge fused into the attention kernel, TileConfig.fused_merge), on the H100's prefill and decode
    tile shapes."""
    long = replace(Case(dtype=dtype, pos=pos), q_lens=(3, 2), kv_lens=(300, 40))
    _, calls = _check(frontend, monkeypatch, long, flip_dot_f32=dot_f32 == "flipped", num_splits=2,
                      config=TileConfig(256, 64, 1, num_warps=8, num_stages=3))
    assert [n for n, _, _ in calls] == ["_attn_fwd", "_merge_splits"]
    decode = replace(long, phase="decode", q_lens=(1, 1), hq=8, hkv=2, dqk=96, dvo=96)
    _, calls = _check(frontend, monkeypatch, decode, flip_dot_f32=dot_f32 == "flipped", num_splits=2,
                      config=TileConfig(16, 128, 4, num_warps=4, num_stages=3, fused_merge=True))
    assert [n for n, _, _ in calls] == ["_attn_fwd"]


@compiles
def test_ir_check_catches_the_pre_fix_rope_compile_error(frontend, monkeypatch):
    """The check is live: _qk as it was (the RoPE dots returned inside ``if ROPE:``, the plain path
    after it) fails to build for a RoPE kernel, as it did on the H100, and builds without RoPE."""
    import triton

    source = KERNELS.read_text()
    edits = {"            s = tl.dot(q2, r2, tl.dot(": "            return tl.dot(q2, r2, tl.dot(",
             "            s = tl.dot(q2, r2.to(": "            return tl.dot(q2, r2.to(",
             # "if True:" stands for the old unindented plain path after the ROPE branch
             "    else:\n        dk = tl.arange(0, BLOCK_DQK)\n        k_ptr":
             "    if True:\n        dk = tl.arange(0, BLOCK_DQK)\n        k_ptr"}
    for old, new in edits.items():
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    broken = compiled_module(source, "_native_kernels_broken")
    _check(frontend, monkeypatch, Case(dtype="bfloat16"), module=broken)
    with pytest.raises(triton.CompilationError) as err:
        _check(frontend, monkeypatch, Case(dtype="bfloat16", pos="ROPE_LLAMA"), module=broken)
    chain, exc = [], err.value
    while exc is not None:
        chain.append(str(exc))
        exc = exc.__cause__
    assert any("equal reduction dimensions" in s for s in chain), chain[-1][-500:]


@compiles
@pytest.mark.parametrize("storage,switches,pos", [("paged", {}, "NONE"), ("paged", dict(persistent=True), "NONE"),
                                                  ("ragged", dict(kv_tma=True), "NONE"),
                                                  ("ragged", dict(kv_tma=True, persistent=True), "NONE"),
                                                  ("dense", {}, "NONE"), ("paged", {}, "ROPE_LLAMA"),
                                                  ("ragged", {}, "ROPE_LLAMA")])
def test_plain_kernel_builds_ir_for_sm90(frontend, monkeypatch, storage, switches, pos):
    """The plain-path kernel (backends/native/triton_plain.py) on the H100's prefill tile, each switch and
    RoPE; its module is imported compiled here (this test runs in a session that compiles)."""
    from backends.native import triton_plain

    c = Case(storage=storage, dtype="bfloat16", hq=8, hkv=2, dqk=128, dvo=128, page_size=16, q_lens=(300, 40),
             kv_lens=(300, 40), pos=pos)
    _, calls = _launches(monkeypatch, c, config=TileConfig(256, 64, 4, 8, 3, "plain", **switches))
    assert [n for n, _, _ in calls] == ["_attn_fwd_plain"]
    for name, args, options in calls:
        assert "tt.func" in str(frontend.make_ir(name, args, options, triton_plain))


H100_SHARED_PER_BLOCK = 232448  # bytes a block may opt into on sm_90 (227 KB)


def _resources(cubin: bytes) -> dict:
    """Registers and spill (local-memory) bytes of a cubin per cuobjdump -res-usage (Triton's own), or {}."""
    import re
    import shutil
    import tempfile

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    tool = str(tool) if tool.exists() else shutil.which("cuobjdump")
    if tool is None:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    return {"registers": int(found[1]), "stack": int(found[2])} if found else {}


@compiles
@pytest.mark.parametrize("name,case", [
    ("prefill M32", Case(storage="ragged", dtype="bfloat16", dqk=512, dvo=512, hq=2, hkv=2, q_lens=(40, 9),
                         kv_lens=(75, 20))),
    ("decode M16 paged", Case(dtype="bfloat16", dqk=512, dvo=512, hq=8, hkv=2, page_size=16, phase="decode",
                              q_lens=(1, 1), kv_lens=(70, 9))),
    ("RoPE fp8 K/V prefill M16", Case(dtype="bfloat16", kv_dtype="float8_e4m3fn", pos="ROPE_LLAMA", dqk=512, dvo=512,
                                      hq=2, hkv=2, page_size=16, q_lens=(40, 9), kv_lens=(75, 20))),
])
def test_wide_head_tiles_compile_for_sm90_within_its_resources(frontend, monkeypatch, name, case):
    """The 512/512 tiles (triton_backend._wide_head_config) compiled on to a cubin for sm_90a (ptxas, no GPU;
    5-15 s each; RoPE with fp8 K/V is the tile with the most registers): shared memory within the 227 KB a block may use and, where cuobjdump is at hand,
    no spills (Triton reports running out of shared memory only at launch, on a GPU; spills never)."""
    import triton

    _, calls = _launches(monkeypatch, case)
    kernel_name, args, options = calls[0]
    assert kernel_name == "_attn_fwd"
    kernel = getattr(frontend.module, kernel_name)
    binder = frontend._binder_of(kernel.signature, kernel.params, frontend.backend)
    bound, specialization, opts = binder(*args, **options)
    opts, signature, constexprs, attrs = kernel._pack_args(frontend.backend, options, bound, specialization, opts)
    try:
        compiled = triton.compile(frontend._ast_source(kernel, signature, constexprs, attrs), target=frontend.target,
                                  options=opts.__dict__)
    except RuntimeError as exc:  # no ptxas for this target in this Triton
        pytest.skip(f"triton {frontend.version} cannot compile a cubin for sm_90 here: {exc!r}"[:300])
    assert 0 < compiled.metadata.shared <= H100_SHARED_PER_BLOCK, compiled.metadata.shared
    used = _resources(compiled.asm["cubin"])
    if used:
        assert used["stack"] == 0, f"{name}: {used}"


@compiles
@pytest.mark.parametrize("kv_dtype", ["", "float8_e4m3fn"])
@pytest.mark.parametrize("storage", ["paged", "ragged"])
def test_fixup_variant_builds_ir(frontend, monkeypatch, kv_dtype, storage):
    """The fix-up (FIXUP: bound, then return or compute) on the decode tiles XQA's calls plan."""
    c = Case(phase="decode", storage=storage, q_lens=(1, 1), kv_lens=(40, 9), hq=8, hkv=2, dtype="bfloat16",
             kv_dtype=kv_dtype, window_left=7, sinks=True, lse=False)
    plan, calls = _check(frontend, monkeypatch, c, fixup=True)
    assert [n for n, _, _ in calls] == ["_attn_fwd"] and plan.constexprs["FIXUP"] and plan.num_splits == 1
