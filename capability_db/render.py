"""The support matrix, rendered from the capability data (never written by hand).

One row per backend. Every cell is derived from the backend's constraints: a
fact no constraint names reads "any" (value columns) or "yes" (feature
columns); a constraint that only applies under a ``when`` condition is shown
with that condition ("no if phase=decode"). A dtype rule relative to Q's dtype
(``kv_dtype_is_q_dtype``, ``out_dtype_is_q_dtype``) reads "= q_dtype" in its dtype
column. The same rows feed the Markdown table (``attn-dispatch matrix``, the README
block) and ``--json``.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any, Iterable, Optional

from . import all_backend_caps
from .schema import RELATIONS, BackendCaps, Constraint

README_BEGIN = "<!-- matrix:begin -->"
README_END = "<!-- matrix:end -->"
# The document that holds the matrix block (the README links to it: the table is too wide for it).
README_PATH = Path(__file__).resolve().parent.parent / "docs" / "USAGE.md"

DTYPE_SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32",
               "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
DTYPE_FACTS = ("q_dtype", "kv_dtype", "out_dtype")

# (fact, values that mean "the feature is on"): a feature is "no" when an
# unconditional constraint on one of its facts refuses every "on" value.
FEATURES: dict[str, list[tuple[str, list[Any]]]] = {
    "causal": [("causal", [True])],
    "window": [("has_window", [True]), ("window_left", [0, 127, 4095])],
    "soft_cap": [("has_soft_cap", [True]), ("logits_soft_cap", [30.0])],
    "alibi": [("pos_encoding", ["ALIBI"])],
    "rope": [("pos_encoding", ["ROPE_LLAMA"])],
    "sinks": [("has_sinks", [True])],
    "custom_mask": [("mask", ["custom"])],
    "lse": [("return_lse", [True])],
    "spec_decode": [("phase", ["spec_decode"]), ("q_len_per_req", [2, 4, 8])],
}
# Value columns: the facts whose constraints the cell lists (the first one names the column).
VALUES: dict[str, tuple[str, ...]] = {
    "phases": ("phase",),
    "q_dtype": ("q_dtype",),
    "kv_dtype": ("kv_dtype", "kv_dtype_is_q_dtype"),
    "out_dtype": ("out_dtype", "out_dtype_is_q_dtype"),
    "kv_storage": ("kv_storage",),
    "layouts": ("kv_layout",),
    "page_sizes": ("page_size",),
}
COLUMNS: list[tuple[str, str]] = [
    ("backend", "Backend"), ("archs", "Archs"), ("phases", "Phases"), ("q_dtype", "Q dtype"),
    ("kv_dtype", "KV dtype"), ("out_dtype", "Out dtype"), ("head_dims", "Head dims"),
    ("kv_storage", "KV storage"), ("layouts", "Layouts"), ("page_sizes", "Page sizes"),
    ("causal", "Causal"), ("window", "Window"), ("soft_cap", "Soft cap"), ("alibi", "ALiBi"),
    ("rope", "RoPE"), ("sinks", "Sinks"), ("custom_mask", "Custom mask"), ("lse", "LSE"),
    ("spec_decode", "Spec decode"), ("other", "Other limits"), ("cuda_graph", "CUDA graph"),
    ("hardware", "Hardware"),
]
DEVICE_COLUMN_FACTS = ("device_kind", "sm", "family", "device_fp8")
HEAD_DIM_FACTS = ("head_dim_qk", "head_dim_vo", "same_head_dims")


def _consumed_facts() -> set[str]:
    facts = set(DEVICE_COLUMN_FACTS) | set(HEAD_DIM_FACTS) | {"cuda_graph"}
    for pairs in FEATURES.values():
        facts.update(fact for fact, _ in pairs)
    for names in VALUES.values():
        facts.update(names)
    return facts


# -- text of one constraint -------------------------------------------------
def fmt_value(fact: str, value: Any) -> str:
    if fact == "sm":
        return f"sm_{value}"
    if fact in DTYPE_FACTS:
        return DTYPE_SHORT.get(value, str(value))
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def when_text(when: dict[str, list[Any]], hide: Iterable[str] = ()) -> str:
    shown = [(k, v) for k, v in when.items() if k not in set(hide)]
    return ", ".join(f"{k}={'/'.join(fmt_value(k, x) for x in v)}" for k, v in shown)


def constraint_text(c: Constraint, hide_when: Iterable[str] = ()) -> str:
    """Short text of what one constraint allows, e.g. 'sm_80+', 'bf16, fp16', 'power of 2', '= q_dtype'."""
    parts = []
    if c.fact in RELATIONS:  # the schema allows only [true] here: "equal to the other dtype"
        parts.append(f"= {RELATIONS[c.fact][1]}")
    elif c.allowed is not None:
        parts.append(", ".join(fmt_value(c.fact, v) for v in c.allowed) or "nothing")
    lo = fmt_value(c.fact, int(c.min) if c.min is not None and float(c.min).is_integer() else c.min)
    hi = fmt_value(c.fact, int(c.max) if c.max is not None and float(c.max).is_integer() else c.max)
    if c.min is not None and c.max is not None:
        parts.append(f"{lo}..{hi}")
    elif c.min is not None:
        parts.append(f"{lo}+" if c.fact == "sm" else f">= {lo}")
    elif c.max is not None:
        parts.append(f"<= {hi}")
    if c.multiple_of:
        parts.append(f"multiple of {c.multiple_of}")
    if c.power_of_two:
        parts.append("power of 2")
    text = ", ".join(parts)
    cond = when_text(c.when, hide_when)
    return f"{text} (if {cond})" if cond else text


def _join(texts: list[str]) -> str:
    unique = list(dict.fromkeys(t for t in texts if t))
    return "; ".join(unique)


def _ordered(constraints: list[Constraint]) -> list[Constraint]:
    """Unconditional constraints first, then the conditional ones (stable)."""
    return sorted(constraints, key=lambda c: bool(c.when))


# -- cells --------------------------------------------------------------------
def value_cell(caps: BackendCaps, facts: tuple[str, ...], hide_when: Iterable[str] = ()) -> str:
    cons = _ordered([c for c in caps.constraints if c.fact in facts])
    if not cons:
        return "any"
    labelled = [c for c in cons if c.fact != facts[0] and c.fact not in RELATIONS]  # none today
    return _join([(f"{c.fact}: " if c in labelled else "") + constraint_text(c, hide_when) for c in cons])


def archs_cell(caps: BackendCaps) -> str:
    cons = _ordered([c for c in caps.constraints if c.fact in DEVICE_COLUMN_FACTS])
    if not cons:
        return "any (CPU too)"
    texts = []
    for c in cons:
        if c.fact == "device_kind" and not c.when and c.allowed:  # a note states a kind's condition
            texts.append(c.note or ", ".join(str(kind).upper() for kind in c.allowed))
        elif c.fact == "sm":  # an SM limit can only concern CUDA devices: no need to say so
            texts.append(constraint_text(c, hide_when=("device_kind",)))
        else:
            texts.append(f"{c.fact}: {constraint_text(c)}")
    return _join(texts)


def head_dims_cell(caps: BackendCaps) -> str:
    qk = [c for c in caps.constraints if c.fact == "head_dim_qk"]
    vo = [c for c in caps.constraints if c.fact == "head_dim_vo"]
    texts = []
    shared = [c for c in qk if any(_same_rule(c, d) for d in vo)]
    texts += [f"qk, vo: {constraint_text(c)}" for c in _ordered(shared)]
    texts += [f"qk: {constraint_text(c)}" for c in _ordered(qk) if c not in shared]
    texts += [f"vo: {constraint_text(d)}" for d in _ordered(vo) if not any(_same_rule(c, d) for c in shared)]
    for c in _ordered([c for c in caps.constraints if c.fact == "same_head_dims"]):
        if c.allowed == [True]:
            cond = when_text(c.when)
            texts.append("qk = vo" + (f" (if {cond})" if cond else ""))
        else:
            texts.append(f"same_head_dims: {constraint_text(c)}")
    return _join(texts) or "any"


def _same_rule(a: Constraint, b: Constraint) -> bool:
    keys = ("allowed", "min", "max", "multiple_of", "power_of_two", "when")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def feature_cell(caps: BackendCaps, pairs: list[tuple[str, list[Any]]]) -> str:
    """'yes', 'no', or 'yes' qualified by the conditions under which it is refused or limited."""
    notes: list[str] = []
    for fact, on in pairs:
        for c in _ordered([c for c in caps.constraints if c.fact == fact]):
            accepted = [v for v in on if c.accepts(v)]
            if not c.when and not accepted:
                return "no"
            if c.when and not accepted:
                notes.append(f"no if {when_text(c.when)}")
            elif len(accepted) < len(on) or (c.min is not None or c.max is not None or c.multiple_of):
                notes.append(f"{fact} {constraint_text(c)}")
    notes += _requirements(caps, pairs)
    return "yes" + (f" ({_join(notes)})" if notes else "")


def _requirements(caps: BackendCaps, pairs: list[tuple[str, list[Any]]]) -> list[str]:
    """Constraints on other facts that apply when this feature is on, e.g. 'needs causal yes'."""
    facts = {fact: on for fact, on in pairs}
    out = []
    for c in caps.constraints:
        if c.fact in facts:
            continue
        hit = [k for k in c.when if k in facts and any(v in c.when[k] for v in facts[k])]
        if hit:
            out.append(f"needs {c.fact} {constraint_text(c, hide_when=hit)}")
    return out


def other_cell(caps: BackendCaps) -> str:
    consumed = _consumed_facts()
    cons = _ordered([c for c in caps.constraints if c.fact not in consumed])
    return _join([f"{c.fact}: {constraint_text(c)}" for c in cons]) or "-"


def cuda_graph_cell(caps: BackendCaps) -> str:
    refused = [c for c in caps.constraints if c.fact == "cuda_graph" and not c.when and not c.accepts(True)]
    return "never" if refused else caps.cuda_graph


def hardware_cell(caps: BackendCaps) -> str:
    hw = caps.hardware
    return f"{hw.status} ({hw.where})" if hw.where else hw.status


def matrix_row(caps: BackendCaps) -> dict[str, str]:
    row = {"backend": caps.name, "archs": archs_cell(caps), "head_dims": head_dims_cell(caps),
           "other": other_cell(caps), "cuda_graph": cuda_graph_cell(caps), "hardware": hardware_cell(caps)}
    for key, facts in VALUES.items():
        row[key] = value_cell(caps, facts, hide_when=("kv_storage",) if key == "page_sizes" else ())
    for key, pairs in FEATURES.items():
        row[key] = feature_cell(caps, pairs)
    return {key: row[key] for key, _ in COLUMNS}


def matrix_rows(caps_list: Optional[list[BackendCaps]] = None) -> list[dict[str, str]]:
    return [matrix_row(c) for c in (caps_list if caps_list is not None else all_backend_caps())]


# -- output forms -----------------------------------------------------------------
def render_markdown(rows: Optional[list[dict[str, str]]] = None) -> str:
    rows = matrix_rows() if rows is None else rows
    cell = lambda text: str(text).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r[k]) for k, _ in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def render_text(rows: Optional[list[dict[str, str]]] = None, width: int = 100) -> str:
    """The matrix for a terminal: one block per backend, every line within ``width`` columns.

    The table form is too wide for any terminal; here plain "yes"/"no" feature cells are
    gathered on one line each and every other cell gets its own wrapped line.
    """
    rows = matrix_rows() if rows is None else rows
    blocks = []
    for row in rows:
        plain = {"yes": [], "no": []}
        lines = [row["backend"]]
        for key, header in COLUMNS[1:]:
            if key in FEATURES and row[key] in plain:
                plain[row[key]].append(header)
            else:
                lines.append(f"{header}: {row[key]}")
        lines[1:1] = [f"{label}: {', '.join(names)}" for label, names in
                      (("Features", plain["yes"]), ("Not supported", plain["no"])) if names]
        blocks.append("\n".join([lines[0]] + [textwrap.fill(line, width, initial_indent="  ", subsequent_indent="      ",
                                                            break_on_hyphens=False) for line in lines[1:]]))
    return "\n\n".join(blocks)


def render_json(caps_list: Optional[list[BackendCaps]] = None) -> dict[str, Any]:
    caps_list = caps_list if caps_list is not None else all_backend_caps()
    rows = []
    for caps, row in zip(caps_list, matrix_rows(caps_list)):
        rows.append({**row, "title": caps.title,
                     "hardware_report": caps.hardware.report, "cuda_graph_source": caps.cuda_graph_source})
    return {"columns": [{"key": k, "header": h} for k, h in COLUMNS], "rows": rows}


def readme_block(text: str) -> str:
    """The text between the matrix markers of a README (ValueError when they are missing)."""
    match = re.search(re.escape(README_BEGIN) + r"\n?(.*?)" + re.escape(README_END), text, re.S)
    if match is None:
        raise ValueError(f"README has no matrix block: expected lines {README_BEGIN!r} ... {README_END!r}")
    return match.group(1)


def update_readme(path: Path = README_PATH, table: Optional[str] = None) -> bool:
    """Rewrite the README's matrix block with the rendered table; True when it changed."""
    text = path.read_text()
    readme_block(text)  # raises with the marker names when absent
    table = render_markdown() if table is None else table
    new = re.sub(re.escape(README_BEGIN) + r".*?" + re.escape(README_END),
                 lambda _: f"{README_BEGIN}\n{table}\n{README_END}", text, count=1, flags=re.S)
    if new != text:
        path.write_text(new)
    return new != text
