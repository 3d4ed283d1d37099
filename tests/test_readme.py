"""README.md and docs/*.md run as written, on the CPU.

Every ```python block is executed (the blocks of one file share a namespace, in order, as a reader
runs them one after the other); a block fenced ```python gpu needs a GPU and is skipped, and there
may be few of those. Every `attn-dispatch ...` line of a ```bash block goes through the CLI's own
parsers: cheap commands (--version, info, query, explain, matrix) run in full and must exit 0;
the others (bench, probe, matrix --update-readme) are parsed only, so an option that does not
exist or a bad value fails here. The README's test command is the one `.ci/run` runs.
The README stays a summary (its length, its "Measured" table's rows, plan() with keywords); no
document, and none of the product's code and data, reads as a diary; every relative link and its
anchor exist.
(examples/README.md's code is tested by tests/test_examples.py.)
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
README_MAX_LINES = 150
MEASURED_MAX_ROWS, ROW_MAX_CHARS = 8, 200
# A document says what the product does and measured, not the history of the work: no numbered
# sessions, rounds or issues, no sweep letters or ranges ("A-Q"), no result files, dumps or diaries, no
# development machine's paths or private notes (git keeps the history; a capability fact's provenance
# goes into its data's ``source``).
DIARY = re.compile(r"\b[Ss]essions? \d|\b[Rr]ounds? \d|\b[Ii]ssues? \d|\b[Ss]weeps? [A-Z]\b|\bA-[B-Z]\b"
                   r"|tools/results|RESULTS\.md|NOTES-|-r\d+\.md|-s\d+\.(?:md|json)\b|/work/|vendor-constraints\.md")
# The product: the installed packages' code and data.
PRODUCT = [p for d in ("dispatch", "backends", "capability_db") for p in sorted((ROOT / d).rglob("*"))
           if p.suffix in (".py", ".json") and "__pycache__" not in p.parts]
LINK = re.compile(r"\]\(([^)\s]+)\)")


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


def measured_rows(text: str) -> list[str]:
    """The body rows of the README's "Measured" table."""
    section = text.split("\n## Measured\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return rows[2:]  # header and separator


def test_readme_is_short_and_its_measured_table_a_summary():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    rows = measured_rows(text)
    assert 0 < len(rows) <= MEASURED_MAX_ROWS, rows
    too_long = [row for row in rows if len(row) >= ROW_MAX_CHARS]
    assert not too_long, too_long
    assert "](docs/benchmarks.md" in rows[0], "the headline row links to the benchmarks"
    assert any("trace" in row and "docs/benchmarks.md#trace" in row for row in rows)


def test_readme_plans_with_keyword_arguments():
    """The quick start's plan() names its arguments as FlashInfer's documentation does."""
    code = "\n".join(body for _, body in blocks(ROOT / "README.md", "python"))
    call = re.search(r"\.plan\((.*?)\)\n", code, re.S).group(1)
    for name in ("qo_indptr=", "paged_kv_indptr=", "paged_kv_indices=", "paged_kv_last_page_len=",
                 "num_qo_heads=", "num_kv_heads=", "head_dim=", "page_size="):
        assert name in call, name


@pytest.mark.parametrize("path", [*DOCS, ROOT / "examples" / "README.md"], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_are_no_diary(path):
    found = [line for line in path.read_text().splitlines() if DIARY.search(line)]
    assert not found, found


def test_product_code_and_data_are_no_diary():
    """Comments, docstrings, messages and the capability data speak of the product: the measured fact
    (figure, GPU, shape) stays, the history of the work does not."""
    assert len(PRODUCT) > 50, [p.name for p in PRODUCT]  # the walk found the packages
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:160]}" for path in PRODUCT
             for n, line in enumerate(path.read_text().splitlines(), 1) if DIARY.search(line)]
    assert not found, "\n".join(found)


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", path.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("path", [*DOCS, ROOT / "examples" / "README.md"], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_and_their_anchors_exist(path):
    for target in LINK.findall(path.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{path.name}: {target}"
        if anchor and linked.suffix == ".md":
            assert anchor in heading_anchors(linked), f"{path.name}: {target}"
