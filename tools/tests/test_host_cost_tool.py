"""``python -m tools.lab.host_cost`` end to end on the CPU: every entry point measured through
dispatch and through its adapter, FlashInfer's column a reason. No speed is asserted (times only > 0)."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import dispatch
from dispatch.benchmark import bench
from tools.lab import host_cost as host_cost_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def host_cost():
    return host_cost_module


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


# -- the kernel-bound table (GPU time per call; on the CPU at tiny sizes, wall time) ---------------
def test_kernel_bound_is_off_on_the_cpu_by_default(report):
    data, md = report
    assert "kernel_bound" not in data
    assert "kernel-bound" not in md


def test_work_formulas(host_cost):
    s = host_cost.Shape(32, 8, 128, 16, 0, torch.bfloat16)
    decode = host_cost.Case("d", host_cost.ENTRIES[4], (1,) * 64, (4096,) * 64)
    assert host_cost.work(decode, s) == (2.0 * 64 * 4096 * 8 * 128 * 2, "TB/s")  # K and V, 1 GiB
    causal = host_cost.Case("p", host_cost.ENTRIES[5], (2048,) * 8, (2048,) * 8, causal=True)
    assert host_cost.work(causal, s) == (4.0 * 32 * 128 * 8 * 2048 * 2049 / 2, "TFLOP/s")
    append = host_cost.Case("a", host_cost.ENTRIES[0], (2,), (5,), causal=True)  # rows see 4 and 5 keys
    assert host_cost.work(append, s)[0] == 4.0 * 32 * 128 * 9
    assert host_cost.work(host_cost.Case("n", host_cost.ENTRIES[0], (2,), (5,)), s)[0] == 4.0 * 32 * 128 * 10


def test_same_kernel_column(host_cost):
    fi_fa3 = SimpleNamespace(backend="fa3", plan=SimpleNamespace(provider=SimpleNamespace(label="flashinfer fa3",
                                                                                          kind="fa3")))
    single = host_cost.KERNEL_CASES["cpu"][0]
    assert host_cost.same_kernel_column(single, fi_fa3, {"flashinfer fa3": 1, "flashinfer fa2": 2}) == "flashinfer fa3"
    assert host_cost.same_kernel_column(single, fi_fa3, {"flashinfer fa2": 2}) is None
    dao = SimpleNamespace(backend="fa3", plan=SimpleNamespace(provider=SimpleNamespace(label="flash_attn_interface")))
    assert host_cost.same_kernel_column(single, dao, {"flashinfer fa3": 1}) is None
    xqa = host_cost.KERNEL_CASES["cpu"][2]
    ran = {name: SimpleNamespace(backend=name, plan=None) for name in ("xqa", "cudnn")}
    assert host_cost.same_kernel_column(xqa, ran["xqa"], {"flashinfer": 1}) == "flashinfer"
    assert host_cost.same_kernel_column(xqa, ran["cudnn"], {"flashinfer": 1}) is None


@pytest.fixture(scope="module")
def kernel_rows(host_cost):
    """The kernel-bound rows at tiny sizes, with dispatch standing in for FlashInfer (so the vendor
    columns, their refusals and the ratios are built too) and a tiny L2 (so K/V copies rotate)."""
    real = host_cost.flashinfer_api
    host_cost.flashinfer_api = lambda device: (host_cost.kernel_api(dispatch, dispatch), "")
    try:
        cases = host_cost.kernel_cases(8, 24, 24, 2, 20, 2, 6)
        return cases, host_cost.kernel_bound_rows("cpu", host_cost.KERNEL_CONFIGS["quick"], cases, l2_bytes=8192)
    finally:
        host_cost.flashinfer_api = real


def test_kernel_bound_rows_on_a_tiny_cpu_problem(host_cost, kernel_rows):
    cases, rows = kernel_rows
    assert [r["case"] for r in rows] == [c.name for c in cases] and len(rows) == 7
    for case, row in zip(cases, rows):
        assert "error" not in row, row
        assert row["chosen"] == "reference", row
        assert row["us"]["ours"] > 0 and row["us"]["adapter"] > 0, row
        assert row["ours_over_adapter"] == pytest.approx(row["us"]["ours"] / row["us"]["adapter"], rel=0.01)
        assert row["unit"] == ("TB/s" if case.decode else "TFLOP/s") and set(row["rate"]) == set(row["us"])
    assert rows[0]["kv_sets"] > 1  # 8 KiB of "L2": the K/V copies rotate
    xqa = rows[3]
    assert xqa["flashinfer"] == {"flashinfer": "ok"} and xqa["best_flashinfer"] == "flashinfer"
    assert xqa["ours_over_flashinfer_best"] == pytest.approx(xqa["us"]["ours"] / xqa["us"]["flashinfer"], rel=0.01)
    assert rows[0]["flashinfer"]["flashinfer fa3"].startswith("failed: BackendRefusedError")  # a reason, no crash
    assert rows[5]["flashinfer"]["flashinfer fa2"].startswith("failed: BackendRefusedError")  # wrapper refused at plan
    assert rows[6]["flashinfer"].startswith("needs Blackwell")


def test_kernel_bound_markdown(host_cost, kernel_rows):
    _, rows = kernel_rows
    lines = host_cost.kernel_markdown("method", rows)
    table = [line for line in lines if line.startswith("| ")]
    assert len(table) == 1 + len(rows)
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert "needs Blackwell" in table[-1] and "own call" in table[4]


def test_main_writes_the_kernel_bound_table_when_asked(host_cost, tmp_path):
    assert host_cost.main(["--device", "cpu", "--quick", "--kernel-bound", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "host-cost-cpu.json").read_text())
    section = data["kernel_bound"]
    assert [r["case"] for r in section["rows"]] == [c.name for c in host_cost.KERNEL_CASES["cpu"]]
    assert "TB/s" in section["method"] and "TFLOP/s" in section["method"]
    assert "## GPU time per call on kernel-bound sizes" in (tmp_path / "host-cost-cpu.md").read_text()


def test_it_runs_as_a_module_of_the_source_tree_and_not_through_the_installed_bench():
    """A research tool of the source tree: ``python -m tools.lab.host_cost`` from the repository root;
    the installed ``attn-dispatch bench`` has no such option."""
    run = subprocess.run([sys.executable, "-m", "tools.lab.host_cost", "--help"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert run.stdout.startswith("usage: python -m tools.lab.host_cost") and "--matrix" in run.stdout
    options = {o for action in bench._parser()._actions for o in action.option_strings}
    assert not options & {"--host-cost", "--to-table", "--replay"}
