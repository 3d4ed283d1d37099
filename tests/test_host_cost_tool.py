"""tools/host_cost.py end to end on the CPU: every entry point measured through dispatch and
through its adapter, FlashInfer's column a reason. No speed is asserted (times only > 0)."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "host_cost.py"


@pytest.fixture(scope="module")
def host_cost():
    spec = importlib.util.spec_from_file_location("host_cost_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)  # the tool puts tools/ on sys.path: keep that out of the session
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def report(host_cost, tmp_path_factory):
    out = tmp_path_factory.mktemp("host-cost")
    assert host_cost.main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    return json.loads((out / "host-cost-cpu.json").read_text()), (out / "host-cost-cpu.md").read_text()


def test_every_entry_point_has_one_row(host_cost, report):
    data, _ = report
    assert [r["entry"] for r in data["rows"]] == list(host_cost.ENTRIES)
    assert len(host_cost.ENTRIES) == 7


def test_dispatch_and_adapter_measured(report):
    data, _ = report
    for row in data["rows"]:
        assert "error" not in row, row
        assert row["chosen"] == "reference", row  # the backend that serves CPU tensors
        assert row["dispatch_us"] > 0 and row["adapter_us"] > 0, row
        assert row["dispatch_layer_us"] == pytest.approx(row["dispatch_us"] - row["adapter_us"], abs=0.02)


def test_flashinfer_column_says_why_not(report):
    data, _ = report
    for row in data["rows"]:
        assert "flashinfer_us" not in row, row
        assert row["flashinfer"].startswith(("not installed", "not measured")), row


def test_environment_and_markdown(host_cost, report):
    data, md = report
    env = data["environment"]
    assert env["device"] == "cpu" and env["torch"] and env["date"]
    for key in ("triton", "flashinfer", "cudnn", "problem"):
        assert env[key], key
    for name in host_cost.ENTRIES:
        assert f"| {name} | reference |" in md
