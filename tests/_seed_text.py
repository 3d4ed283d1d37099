"""Signatures parsed from the seed documents (tests/seed_docs/*.txt), not copied by hand.

``seed_signatures()`` maps a target name ("cudnn", "trtllm", "xqa", "single_return_lse",
"paged.__init__", "paged.plan", "paged.run", "paged.reset_workspace_buffer", "ragged.*", ...)
to a list of ``(name, kind, default)`` with kind "P" (positional-or-keyword) or "K"
(keyword-only, after a bare ``*``) and default ``REQUIRED`` when the page shows none.
``seed_examples()`` returns the doctest-style examples of the pages as Python source.
"""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

SEED_DIR = Path(__file__).parent / "seed_docs"
REQUIRED = inspect.Parameter.empty
FILES = {"cudnn": "000_482ad404dfaf4ef7.txt", "trtllm": "001_f3928b48024058a9.txt",
         "prefill": "002_39713a37e348626a.txt", "xqa": "003_6e851eab59e17265.txt",
         "single_return_lse": "004_0137897dda950493.txt"}
_HEAD = re.compile(r"^(?:- )?(class )?(flashinfer\.\w+\.)?(\w+)\(")
_METHODS = ("__init__", "plan", "run", "reset_workspace_buffer")
_CLASS_SHORT = {"BatchPrefillWithPagedKVCacheWrapper": "paged", "BatchPrefillWithRaggedKVCacheWrapper": "ragged"}


def read(key: str) -> str:
    return (SEED_DIR / FILES[key]).read_text()


def _inside(line: str, start: int) -> str:
    """The text between the parenthesis at ``start`` and its matching one."""
    depth = 0
    for i in range(start, len(line)):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(line[i], 0)
        if depth == 0:
            return line[start + 1:i]
    raise ValueError(f"unbalanced signature: {line[:80]}...")


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + ([cur.strip()] if cur.strip() else [])


def parse_params(text: str) -> list[tuple]:
    out, kind = [], "P"
    for piece in _split_top(text):
        if piece == "*":
            kind = "K"
            continue
        head, _, default = piece.partition(" = ")
        name = head.split(":")[0].strip()
        out.append((name, kind, ast.literal_eval(default) if default else REQUIRED))
    return out


def _signatures_in(text: str) -> list[tuple[bool, str, list]]:
    found = []
    for line in text.splitlines():
        m = _HEAD.match(line)
        if not m or not (m.group(2) or m.group(3) in _METHODS):
            continue
        inner = _inside(line, m.end() - 1)
        if ":" not in inner and inner.strip() not in ("float_workspace_buffer, int_workspace_buffer",):
            continue  # a summary line such as ``single_prefill_with_kv_cache_return_lse(q, k, v)``
        found.append((bool(m.group(1)), m.group(3), parse_params(inner)))
    return found


def seed_signatures() -> dict[str, list]:
    sigs: dict[str, list] = {}
    for key in ("cudnn", "trtllm", "xqa", "single_return_lse"):
        [(_, _, params)] = _signatures_in(read(key))
        sigs[key] = params
    owner = None
    for is_class, name, params in _signatures_in(read("prefill")):
        if is_class:
            owner = _CLASS_SHORT[name]
            sigs[f"{owner}.class"] = params
        elif f"{owner}.{name}" not in sigs:  # run() is shown twice (overloads): the first one
            sigs[f"{owner}.{name}"] = params
    return sigs


def seed_examples() -> dict[str, list]:
    """Example steps per page section: "paged", "ragged" (002) and "single" (004)."""
    prefill = read("prefill")
    paged_part, ragged_part = prefill.split("class flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper")
    return {"paged": doctest_steps(paged_part), "ragged": doctest_steps(ragged_part),
            "single": doctest_steps(read("single_return_lse"))}


def doctest_steps(text: str) -> list[tuple[str, str]]:
    """The ``>>>``/``...`` statements of a page as ``(source, expected output)`` pairs.

    A ``>>>`` line that continues an open bracket (the 004 page writes ``>>>`` instead of
    ``...`` inside ``torch.tril(``) is a continuation, and so is an indented unprefixed line
    inside an open bracket (``        allow_fp16_qk_reduction=True)``). Other unprefixed lines
    after a statement are its expected output, up to a blank line or the next prompt."""
    steps: list[list[str]] = []
    depth, in_output = 0, False
    for raw in text.splitlines():
        prompt = raw.startswith((">>> ", "... ")) or raw in (">>>", "...")
        if prompt or (depth > 0 and raw.startswith(" ")):
            code = raw[4:] if prompt else raw.strip()
            starts_new = depth == 0 and (raw.startswith(">>>") or not steps) and not code.startswith((" ", "#"))
            if starts_new and not (steps and steps[-1][0].rstrip().endswith(":")):
                steps.append(["", ""])
            if steps:
                steps[-1][0] += code + "\n"
            depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
            in_output = depth == 0
        elif in_output and steps and raw.strip():
            steps[-1][1] += raw.strip() + "\n"
        else:
            in_output = False
    return [(src, out.strip()) for src, out in steps if src.strip()]
