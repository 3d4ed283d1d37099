"""python -m tools.lab.host_cost --cudnn-launch (the cuDNN row path by path), smoke-run on the CPU: the
reference backend serves, so the launcher and FlashInfer columns say why they are missing."""
from __future__ import annotations

import torch

from tools.lab import host_cost


def test_cudnn_launch_paths_run_and_agree_on_the_cpu():
    threads = torch.get_num_threads()
    try:
        report = host_cost.cudnn_launch_costs(host_cost.Config(calls=3, repeats=2, warmup=1), device="cpu")
    finally:
        torch.set_num_threads(threads)
    rows = {r["path"]: r for r in report["rows"]}
    assert list(rows) == ["dispatch", "adapter run"]
    assert all(r["host_us"] > 0 and r["gpu_us"] is None for r in rows.values())
    assert rows["adapter run"]["max_abs_diff"] == 0.0  # the same kernel on the same inputs
    assert "no launcher" in report["missing"]["adapter launcher"] and "CUDA only" in report["missing"]["flashinfer"]
    table = host_cost.cudnn_launch_markdown(report)
    assert "| adapter run |" in table and "| flashinfer | - |" in table
