"""README.md and docs/*.md run as written, on the CPU.

Every ```python block is executed (the blocks of one file share a namespace, in order, as a reader
runs them one after the other); a block fenced ```python gpu needs a GPU and is skipped, and there
may be few of those. Every `attn-dispatch ...` line of a ```bash block goes through the CLI's own
parsers: cheap commands (--version, info, query, explain, matrix) run in full and must exit 0;
the others (bench, probe, matrix --update-readme) are parsed only, so an option that does not
exist or a bad value fails here. The README's test command is the one `.ci/run` runs.
(examples/README.md is tested by tests/test_examples.py.)
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from dispatch import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)
RUN_IN_FULL = ("info", "query", "explain", "matrix")
MAX_GPU_BLOCKS = 2


def blocks(path: Path, language: str) -> list[tuple[str, str]]:
    """(fence info after the language, body) of every block of that language."""
    return [(info.strip(), body) for lang, info, body in FENCE.findall(path.read_text()) if lang == language]


def cli_lines(path: Path) -> list[list[str]]:
    """Each `attn-dispatch ...` line of the bash blocks, comment dropped, as argv (without the name)."""
    lines = []
    for _, body in blocks(path, "bash"):
        for line in body.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["attn-dispatch"]:
                lines.append(words[1:])
    return lines


def test_every_doc_has_runnable_code_and_few_gpu_only_blocks():
    readme = ROOT / "README.md"
    assert blocks(readme, "python") and cli_lines(readme)
    gpu_only = [b for p in DOCS for info, b in blocks(p, "python") if info == "gpu"]
    assert len(gpu_only) <= MAX_GPU_BLOCKS, f"{len(gpu_only)} GPU-only python blocks: run them on the CPU instead"


@pytest.mark.parametrize("path", [p for p in DOCS if blocks(p, "python")], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_python_blocks_run(path):
    namespace: dict = {"__name__": "__readme__"}
    for n, (info, body) in enumerate(blocks(path, "python")):
        if info == "gpu":
            continue
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            exec(compile(body, f"{path.name} python block {n}", "exec"), namespace)
        if path.name == "README.md" and n == 0:
            check_quick_start(shown.getvalue(), namespace)


def check_quick_start(printed: str, ns: dict) -> None:
    """The quick start's printed error is small, its LSE base 2 and fp32, and a backend was chosen."""
    import torch

    error = float(re.search(r"relative error vs torch: ([\d.e+-]+)", printed).group(1))
    assert error < 1e-5, printed
    q, k = ns["q"].double(), ns["k"].double().repeat_interleave(4, 1)
    logits = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    logits = logits.masked_fill(torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).triu(1), float("-inf"))
    lse2 = torch.logsumexp(logits, -1).T / torch.log(torch.tensor(2.0, dtype=torch.float64))
    assert ns["lse"].dtype == torch.float32 and torch.allclose(ns["lse"].double(), lse2, atol=1e-4), printed
    assert re.search(r"chosen: [\w-]+", printed), printed


class Parsed(Exception):
    """Raised in place of running a command once its arguments parsed."""


@pytest.mark.parametrize("argv", [line for p in DOCS for line in cli_lines(p)], ids=" ".join)
def test_cli_lines_parse_or_run(argv, monkeypatch, capsys):
    repo_files = [a for a in argv if a.startswith(("tools/", "capability_db/"))]
    assert all((ROOT / a).exists() for a in repo_files), repo_files
    if argv and argv[0] in RUN_IN_FULL and "--update-readme" not in argv:
        assert cli.main(argv) == 0, capsys.readouterr()
        return
    real_parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(real_parse(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    try:
        cli.main(argv)
    except Parsed:
        return
    except SystemExit as stop:  # --version, --help: argparse exits, 0 when it parsed
        assert stop.code == 0, capsys.readouterr().err
        return
    pytest.fail(f"attn-dispatch {' '.join(argv)}: ran without parsing its options")


def test_readme_test_command_is_what_ci_runs():
    """The README's two set-up commands: the test one is `.ci/run`'s last line, word for word."""
    commands = [body.strip() for _, body in blocks(ROOT / "README.md", "bash") if body.startswith("python3 -m venv")]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert len(commands) == 2 and ci in commands, (commands, ci)
    assert (ROOT / "tools" / "dropin_demo.py").exists()
