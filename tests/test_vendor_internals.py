"""A vendor's private API is touched in one module per vendor (backends/_flashinfer_internal.py,
backends/_cudnn_internal.py), pinned to the versions it was read in: another installed version
takes the public API with one log line, and no other module of backends/ or dispatch/ reaches a
private name of FlashInfer or cudnn-frontend."""
from __future__ import annotations

import ast
import importlib.metadata
import logging
import sys
from pathlib import Path

import pytest

import _fake_vendors as fv
from backends import _cudnn_internal as cudnn_internal, _flashinfer_internal as fi_internal, _vendor
from backends.fa2 import FA2Backend
from dispatch.benchmark.vendors import make_problem
from test_vendor_contracts import make_batch

ROOT = Path(__file__).resolve().parents[1]
INTERNAL = {ROOT / "backends" / "_flashinfer_internal.py", ROOT / "backends" / "_cudnn_internal.py"}
PRIVATE_NAMES = (set(fi_internal.WRAPPER_ATTRIBUTES) | set(fi_internal.MODULE_FUNCTIONS)
                 | set(cudnn_internal.GRAPH_ATTRIBUTES))
# FlashInfer's internal entry points (no underscore, not its documented API)
ENTRY_POINTS = {"get_single_prefill_module", "get_xqa_module", "gen_xqa_module",
                "block_sparse_indices_to_vector_sparse_offsets"}
# what a vendor object is called in backends/: a private attribute on one of these is a vendor's
VENDOR_RECEIVERS = {"w", "wrapper", "prefill", "decode", "module", "graph", "lowered", "fi", "flashinfer", "cudnn"}


def _distribution_version(name: str):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.parametrize("distribution, checked", [("flashinfer-python", fi_internal.CHECKED_VERSIONS),
                                                    ("nvidia-cudnn-frontend", cudnn_internal.CHECKED_VERSIONS)])
def test_the_installed_vendor_is_a_checked_version(distribution, checked):
    """Another version: read its source for every name of the internal module, then add it."""
    version = _distribution_version(distribution)
    if version is None:
        pytest.skip(f"{distribution} is not installed")
    assert version in checked, f"{distribution} {version}: the private API was read in {checked} only"


def test_an_unchecked_flashinfer_logs_once_and_takes_the_public_api(caplog):
    assert fi_internal.checked("0.7.2") and fi_internal.checked("0.5.3")
    with caplog.at_level(logging.INFO, logger="attn_dispatch"):
        assert not fi_internal.checked("0.7.99-test")
        assert not fi_internal.checked("0.7.99-test")
    lines = [r.getMessage() for r in caplog.records if "0.7.99-test" in r.getMessage()]
    assert len(lines) == 1 and "0.5.3, 0.7.2" in lines[0] and "public API" in lines[0]


def test_an_unchecked_cudnn_frontend_logs_once_and_keeps_execute(caplog):
    assert cudnn_internal.checked("1.32.0", cudnn_internal.RAW_POINTER_VERSIONS)
    with caplog.at_level(logging.INFO, logger="attn_dispatch"):
        assert cudnn_internal.sorted_uids(object(), "1.99.0-test") is None
        assert cudnn_internal.raw_pointer_call(object(), (), None, "1.99.0-test") is None
    assert len([r for r in caplog.records if "1.99.0-test" in r.getMessage()]) == 1


@pytest.mark.parametrize("version, private", [("0.5.3", True), ("0.5.4", False), ("0.9.0", False)])
def test_single_prefill_takes_the_compiled_op_only_on_a_checked_flashinfer(monkeypatch, version, private):
    """FlashInfer's single-request op (private) on a checked version; FlashInfer's public function on
    another, with the same result."""
    rec = fv.Recorder()
    mods = fv.make_flashinfer(rec, version=version)
    for name in ("flashinfer", "flashinfer.decode", "flashinfer.prefill"):
        monkeypatch.setitem(sys.modules, name, mods[name])
    _vendor.forget_imports()
    try:
        problem = make_problem(kv_storage="dense", causal=True, return_lse=True)
        batch, _ = make_batch(problem, [5], [9], lse=True)
        backend = FA2Backend()
        backend.run(backend.plan(problem, batch), batch)
    finally:
        _vendor.forget_imports()
    names = [name for name, _ in rec.calls]
    assert ("single_prefill_op" in names) is private and ("single_prefill" in names) is not private


def _python_files():
    for folder in ("backends", "dispatch"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path not in INTERNAL:
                yield path


def _private_touches(tree: ast.AST, receivers: set = VENDOR_RECEIVERS) -> list:
    """(line, what) for each vendor private name or entry point reached in ``tree``, and each
    private attribute of an object named like a vendor's (``receivers``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            receiver = ast.unparse(node.value)
            if receiver in ("self", "cls"):  # our own objects' attributes (our wrappers have a _backend too)
                continue
            on_vendor = (receiver.split(".")[-1] in receivers and node.attr.startswith("_")
                         and not node.attr.startswith("__"))
            if node.attr in PRIVATE_NAMES | ENTRY_POINTS or on_vendor:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1 and \
                isinstance(node.args[1], ast.Constant) and node.args[1].value in PRIVATE_NAMES:
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            if any(n in ENTRY_POINTS or n.startswith(("flashinfer.jit", "flashinfer.xqa")) for n in names):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_other_module_touches_a_vendor_private_name():
    # dispatch/'s wrappers are ours (dispatch.BatchPrefillWith...): there only the names themselves count
    touches = {}
    for path in _python_files():
        name = path.relative_to(ROOT)
        found = _private_touches(ast.parse(path.read_text()), VENDOR_RECEIVERS if name.parts[0] == "backends" else set())
        if found:
            touches[str(name)] = found
    assert touches == {}, "vendor private API outside backends/_<vendor>_internal.py"


def test_the_scan_sees_a_private_touch():
    source = ("w._plan_info\nstate.wrapper._cached_module = m\nprefill._get_cache_buf('x', 1, d)\n"
              "getattr(w, '_jit_module', None)\nfrom flashinfer.xqa import get_xqa_module\n")
    assert len(_private_touches(ast.parse(source))) == 5


def test_the_internal_modules_declare_every_private_name_they_read():
    """What the pinned list claims was read in the vendor's source is every name the module uses."""
    for path in INTERNAL:
        used = {node.attr for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and ast.unparse(node.value) not in ("self",)}
        used |= {node.args[1].value for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                 and node.func.id in ("getattr", "hasattr") and isinstance(node.args[1], ast.Constant)}
        assert used <= PRIVATE_NAMES, (path.name, sorted(used - PRIVATE_NAMES))
