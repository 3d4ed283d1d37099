"""A pytest run on the GPU host as committed results: JUnit XML -> JSON + Markdown.

    python -m tools.gpu_tests_report RUN.xml --title "..." --command "pytest ..." --gpu "..." \
        --versions torch=2.11.0 flashinfer=0.5.3 --out DIR/NAME

writes NAME.json (date, GPU, versions, command, one record per test: status, seconds, the
skip/failure text) and NAME.md (the counts, then every test that did not pass, with its text).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Optional


def cases(xml_path: Path) -> list[dict]:
    """One record per <testcase>: passed, failed, error or skipped, with the message."""
    records = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        status, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                status = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                detail = (node.get("message") or node.text or "").strip()[:2000]
                break
        records.append({"file": case.get("classname", ""), "test": case.get("name", ""), "status": status,
                        "seconds": round(float(case.get("time") or 0.0), 3), "detail": detail})
    return records


def markdown(report: dict, title: str) -> str:
    counts = Counter(c["status"] for c in report["cases"])
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    lines = [f"# {title}, {report['date']}", "", f"{report['gpu']}; {versions}. `{report['command']}` "
             "(JSON beside this file).", "",
             f"**{counts['passed']} passed, {counts['failed'] + counts['error']} failed, "
             f"{counts['skipped']} skipped.**", ""]
    others = [c for c in report["cases"] if c["status"] != "passed"]
    if others:
        lines += ["| test | status | detail |", "|---|---|---|"]
        lines += [f"| `{c['test']}` | {c['status']} | {c['detail'].splitlines()[0][:200] if c['detail'] else ''} |"
                  for c in others]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", type=Path)
    parser.add_argument("--title", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--versions", nargs="*", default=[], metavar="NAME=VERSION")
    parser.add_argument("--out", type=Path, required=True, help="path without suffix")
    args = parser.parse_args(argv)
    report = {"date": datetime.date.today().isoformat(), "gpu": args.gpu,
              "versions": dict(v.split("=", 1) for v in args.versions), "command": args.command,
              "cases": cases(args.xml)}
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report, args.title))
    print(markdown(report, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
