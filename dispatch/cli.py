"""``attn-dispatch``: info | query | explain | matrix | probe | bench | tune.

* ``info``    this machine: torch, CUDA, the GPU, and per backend installed / usable / why not.
* ``query``   which backend would serve a problem on any GPU (``--gpu h100``); never touches a
              GPU and never imports a vendor package (capability data only, ``live=False``).
* ``explain`` the same on this machine's device (or ``--gpu``), with availability (``live=True``).
* ``matrix``  the support matrix rendered from the capability data (``--markdown``: the
              README table; ``--update-readme``).
* ``probe``   the capability data against the live GPU, every output against the fp64 oracle
              (``dispatch.benchmark.probe``).
* ``bench``   the one benchmark runner (``dispatch.benchmark.bench``): every backend forced in turn and the
              automatic choice, checked against the fp64 oracle and timed.
* ``tune``    the warm-up autotune offline, from a list of shapes or a recorded trace, and its cache
              files: ``tune show``, ``tune export``, ``tune merge`` (``dispatch.tune``).

Every inspecting command takes ``--json``. Bad arguments exit with status 2 and a message
naming the option, its value and the allowed values. Human output fits 100 columns, and a
reader that stops early (``| head``) ends the command quietly.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, Optional, Sequence

import capability_db
from backends import REGISTRY, DeviceDesc, Reason

from ._version import version
from .problem_options import add_problem_options, build_problem

REPO_ROOT = Path(__file__).resolve().parent.parent
WIDTH = 100  # human output fits a 100-column terminal
DESCRIPTION = ("FlashInfer's attention API, dispatched to the fastest correct backend: what this machine "
               "and any GPU would run, the support matrix, the probe and the benchmark. "
               "'attn-dispatch COMMAND -h' for a command's options.")


def _wrapped(text: str, indent: int = 0, hang: int = 2) -> str:
    """``text`` wrapped to WIDTH columns; continuation lines indented ``hang`` further."""
    pad = " " * indent
    return "\n".join(textwrap.wrap(text, WIDTH, initial_indent=pad, subsequent_indent=pad + " " * hang,
                                   break_on_hyphens=False)) or pad


# -- the parser ------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attn-dispatch", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"attn-dispatch {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{info,query,explain,matrix,probe,bench,tune}")

    def add(name: str, **options: Any) -> argparse.ArgumentParser:
        command = sub.add_parser(name, **options)
        command.set_defaults(command_parser=command)  # its errors name the sub-command
        return command

    info = add("info", help="this machine: torch, CUDA, GPU, backends installed/usable")
    info.add_argument("--json", action="store_true")
    query = add("query", help="which backend would serve a problem on a given GPU (no GPU needed)")
    add_problem_options(query, gpu_required=True)
    explain = add("explain", help="the router's decision on this machine (availability included)")
    add_problem_options(explain, gpu_required=False)
    explain.add_argument("--backend", help="an explicit choice, as backend= would make it")
    matrix = add("matrix", help="the support matrix rendered from capability_db")
    form = matrix.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true")
    form.add_argument("--markdown", action="store_true", help="the Markdown table (wide: the README's form)")
    matrix.add_argument("--update-readme", action="store_true", help="rewrite the README's matrix block")
    matrix.add_argument("--readme", type=Path, default=None, help="README to update (default: the repo's)")
    for name, text in (("probe", "check the capability data against this GPU, outputs against fp64"),
                       ("bench", "the benchmark: every backend and the automatic choice, checked, timed"),
                       ("tune", "time the candidates of shapes or a trace into the autotune cache; show, export, merge")):
        hook = add(name, help=text, add_help=False)
        hook.add_argument("args", nargs=argparse.REMAINDER)
    return parser


# -- JSON forms ------------------------------------------------------------------------
def device_json(device: DeviceDesc) -> dict[str, Any]:
    return {"name": device.name, "arch": device.arch, "kind": device.kind, "sm": device.sm,
            "family": device.family, "fp8": device.fp8}


def reason_json(reason: Reason) -> dict[str, Any]:
    value = reason.value if isinstance(reason.value, (str, int, float, bool, type(None))) else str(reason.value)
    return {"field": reason.field, "value": value, "allowed": reason.allowed, "source": reason.source,
            "text": str(reason)}


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


# -- query / explain ------------------------------------------------------------------
def _ranked(problem, device: DeviceDesc) -> tuple[list, str]:
    """The candidates (capability data only) and what ordered the accepted ones."""
    from . import router

    try:
        decision = router.decide(problem, device, strict=False, live=False)
    except router.NoBackendError:
        return router.evaluate(problem, device, live=False), ""
    return decision.candidates, decision.ranking


def ranking_text(ranking: str, candidates: list, sizes_given: bool) -> str:
    """What the order sorts: one estimate per candidate, or a mean over sizes (then how to pick one)."""
    if not ranking:
        return "ranked by: the priority list"
    if any(c.score is not None for c in candidates):
        return (f"ranked by: {ranking}; each candidate's time over the fastest's, geometric mean over the "
                "measured sizes ('x the fastest'); the time shown is at one of them; --sizes BATCH MAX_Q "
                "MAX_KV ranks at the call's sizes")
    return f"ranked by: {ranking}" + ("" if sizes_given else "; --sizes BATCH MAX_Q MAX_KV ranks at the call's sizes")


def cmd_query(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Capability data only (live=False): no GPU, no vendor import."""
    from . import router

    device = args.gpu
    problem = build_problem(args, device, parser)
    candidates, ranking = _ranked(problem, device)
    chosen = next((c.backend for c in candidates if c.accepted and c.ranked), None)
    if args.json:
        _print_json({
            "chosen": chosen, "device": device_json(device), "ranking": ranking,
            "problem": {"description": problem.describe(), **problem.facts()},
            "candidates": [{**c.to_json(), "reasons": [reason_json(r) for r in c.reasons]} for c in candidates],
        })
        return 0 if chosen else 1
    print(f"chosen: {chosen or 'none: no backend in the priority list accepts this problem'}"
          f" (capability data only; installation not checked)")
    print(_wrapped(f"problem: {router.describe_on(problem, device)}"))
    print(f"device:  {device.name}" + ("" if device.kind == "cpu" else
                                        f" ({device.arch}, {device.family}{', fp8' if device.fp8 else ''})"))
    print(_wrapped(ranking_text(ranking, candidates, bool(args.sizes))))
    print(_wrapped("candidates: the priority list (those that accept it in the ranking's order), then the "
                   "backends outside it (never chosen automatically; one that accepts can be forced):"))
    rank = 0
    for c in candidates:
        rank += c.ranked
        for line in router.candidate_lines(c, chosen, prefix=f"  {rank}. " if c.ranked else "   - ",
                                           verbose=args.verbose):
            print(line)
    for line in router.sources_lines(candidates):
        print(line)
    if not args.verbose and any(c.reasons for c in candidates):
        print("every reason with its source: --verbose")
    return 0 if chosen else 1


def _this_device() -> DeviceDesc:
    from . import autotune

    return autotune.current_device()


def cmd_explain(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from . import policy, router

    device = args.gpu or _this_device()
    problem = build_problem(args, device, parser)
    try:
        explicit = policy.explicit_choice(args.backend)
    except ValueError as exc:
        parser.error(f"argument --backend: {exc}")
    try:
        decision = router.decide(problem, device, explicit=explicit, live=True)
    except (router.BackendRefusedError, router.NoBackendError) as exc:
        if args.json:
            _print_json({"chosen": None, "device": device_json(device), "error": str(exc), "details": exc.details})
        else:
            _print_summarized(str(exc.details if args.verbose else exc))
        return 1
    if args.json:
        _print_json({**decision.to_json(), "device": device_json(device)})
    else:
        _print_summarized(decision.explain(verbose=args.verbose))
    return 0


def _print_summarized(text: str) -> None:
    """A decision or a refusal as the router wrote it, each line over 100 columns wrapped at its own
    indent (the first names the entry point: a wrapper's name can take it past the width)."""
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        print(line if len(line) <= WIDTH else _wrapped(line.lstrip(), indent=indent))


# -- info ------------------------------------------------------------------------------
def device_reasons(name: str, device: DeviceDesc) -> list[Reason]:
    """Reasons from the constraints that depend on the device alone (no problem needed)."""
    from capability_db.schema import DEVICE_FACTS

    caps = capability_db.backend_caps(name)
    facts = {"sm": device.sm, "family": device.family, "device_fp8": device.fp8, "device_kind": device.kind}
    out = []
    for c in caps.constraints:
        device_only = c.fact in DEVICE_FACTS and all(k in DEVICE_FACTS for k in c.when)
        if device_only and c.applies(facts) and not c.accepts(facts[c.fact]):
            out.append(Reason(c.fact, facts[c.fact], c.allowed_text(), c.source))
    kind = [r for r in out if r.field == "device_kind"]
    return kind or out  # on the wrong kind of device, its SM limits add nothing


def backend_info(name: str, device: DeviceDesc) -> dict[str, Any]:
    from backends import get_backend

    caps = capability_db.backend_caps(name)
    row: dict[str, Any] = {"backend": name, "title": caps.title, "installed": False, "version": None,
                           "extra": caps.extra, "install": caps.install, "hardware": caps.hardware.model_dump()}
    try:  # an adapter that fails to import or to answer is reported, not fatal
        backend = get_backend(name)
        missing = backend.available()
        row["version"] = backend.version() if missing is None else None
        from backends import installed_defects  # known defects of the installed versions
        row["defects"] = [{"id": d.id, "text": d.summary(), "sources": d.sources or [d.report],
                           "guarded": backend.guards.get(d.id, "")}
                          for d in installed_defects(backend)] if missing is None else []
    except Exception as exc:  # noqa: BLE001 - shown to the user as the reason
        missing = Reason(f"adapter {name}", f"{type(exc).__name__}: {exc}", "an importable adapter")
    # a missing package is "not installed"; anything else (no CUDA device...) is about this machine
    row["installed"] = missing is None or not missing.field.startswith(("package ", "adapter "))
    reasons = ([missing] if missing is not None else []) + device_reasons(name, device)
    row["usable_here"] = not reasons
    row["why_not"] = [reason_json(r) for r in reasons]
    return row


def installed_version(module: str) -> Optional[str]:
    """The installed version of the distribution that provides top-level ``module``, from package
    metadata (nothing is imported: a vendor package may fail to import without a GPU), or None."""
    from importlib import metadata

    for dist in metadata.packages_distributions().get(module, []):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def known_defects_info() -> list[dict[str, Any]]:
    """Every known defect of a vendor version (capability_db/defects.json), with the version installed
    here and whether it is affected: data, shown on any machine, GPU or not."""
    out = []
    for d in capability_db.known_defects():
        installed = installed_version(d.provider)
        out.append({"id": d.id, "provider": d.provider, "versions": d.versions.text(), "fixed": d.versions.fixed,
                    "backends": list(d.backends), "text": d.summary(), "sources": d.sources or [d.report],
                    "installed": installed, "affected": installed is not None and d.versions.contains(installed)})
    return out


def summary_line(device: DeviceDesc, backends: list[dict[str, Any]]) -> str:
    """What runs here, in one line (the first of ``info``)."""
    usable = [b["backend"] for b in backends if b["usable_here"]]
    if device.kind != "cpu":
        return f"{device.name} ({device.arch}): {len(usable)} of {len(backends)} backends usable here: " + ", ".join(usable)
    others = [name for name in usable if name != "reference"]
    return ("CPU only: the PyTorch reference serves every entry point"
            + (f" ({', '.join(others)} too)" if others else "") + "; GPU backends need CUDA")


def machine_info() -> dict[str, Any]:
    import torch

    from capability_db import choice_table

    device = _this_device()
    cudnn = torch.backends.cudnn
    backends = [backend_info(name, device) for name in REGISTRY]
    return {
        "summary": summary_line(device, backends),
        "torch": torch.__version__, "cuda_available": torch.cuda.is_available(), "cuda": torch.version.cuda,
        "gpu": None if device.kind == "cpu" else device.name, "device": device_json(device),
        "cudnn": cudnn.version() if cudnn.is_available() else None,
        "backends": backends, "known_defects": known_defects_info(),
        "timing_table": choice_table.describe(device),
    }


def cmd_info(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    info = machine_info()
    if args.json:
        _print_json(info)
        return 0
    dev = info["device"]
    print(_wrapped(info["summary"]))
    print(f"torch {info['torch']}; CUDA available: {info['cuda_available']}"
          + (f" (CUDA {info['cuda']})" if info["cuda"] else ""))
    print(f"device: {dev['name']} ({dev['arch']}, {dev['family']})" + (f"; cuDNN {info['cudnn']}" if info["cudnn"] else ""))
    print(_wrapped(f"timing table: {info['timing_table']}", indent=0, hang=14))
    print("backends (registry order):")
    for b in info["backends"]:
        for line in _info_lines(b):
            print(line)
    print("known defects of vendor versions (capability_db/defects.json):")
    for d in info["known_defects"]:
        here = (f"{d['provider']} {d['installed']} installed: {'affected' if d['affected'] else 'not affected'}"
                if d["installed"] else f"{d['provider']} not installed")
        print(_wrapped(f"- {d['text']}; backends {', '.join(d['backends'])}; {here} [{d['sources'][0]}]", indent=2))
    return 0


def _info_lines(b: dict[str, Any]) -> list[str]:
    """One backend of ``info``: state, version, hardware evidence; why not usable and how to get it."""
    state = "usable here" if b["usable_here"] else ("installed, not usable here" if b["installed"] else "not installed")
    hw = b["hardware"]
    evidence = hw["status"] + (f" ({hw['where']})" if hw.get("where") else "")
    lines = [_wrapped(f"{b['backend']:14s} {state}" + (f" {b['version']}" if b["version"] else "")
                      + f"; hardware: {evidence}", indent=2, hang=15)]
    lines += [_wrapped(f"- {r['text']}", indent=17) for r in b["why_not"]]
    lines += [_wrapped(f"! known defect {d['text']} [{d['sources'][0]}]"
                       + (f"; guarded {d['guarded']}" if d.get("guarded") else ""), indent=17)
              for d in b.get("defects", [])]
    if not b["installed"]:
        lines.append(_wrapped(f"get it: {b['install']}", indent=17))
    return lines


# -- matrix ----------------------------------------------------------------------------
def cmd_matrix(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from capability_db import render

    if args.update_readme:
        path = args.readme or render.README_PATH
        try:
            changed = render.update_readme(path)
        except (OSError, ValueError) as exc:
            print(f"attn-dispatch matrix --update-readme: {path}: {exc}", file=sys.stderr)
            return 1
        print(f"{path}: matrix block {'updated' if changed else 'already up to date'}")
        return 0
    if args.json:
        _print_json(render.render_json())
    elif args.markdown:
        print(render.render_markdown())
    else:
        print(render.render_text(width=WIDTH))
    return 0


# -- probe / bench hooks ------------------------------------------------------------------
def cmd_probe(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .benchmark import probe

    return int(probe.main(args.args) or 0)


def cmd_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .benchmark import bench

    return int(bench.main(args.args) or 0)


def cmd_tune(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from . import tune

    return int(tune.main(args.args) or 0)


COMMANDS = {"info": cmd_info, "query": cmd_query, "explain": cmd_explain, "matrix": cmd_matrix,
            "probe": cmd_probe, "bench": cmd_bench, "tune": cmd_tune}


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
        return code
    except BrokenPipeError:
        # the reader stopped early (`attn-dispatch matrix | head -1`): not an error. Point
        # stdout at /dev/null so the interpreter's final flush cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: Optional[Sequence[str]]) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("probe", "bench", "tune"):
        # everything after the hook's name is its own (argparse REMAINDER stops at options)
        return COMMANDS[argv[0]](argparse.Namespace(command=argv[0], args=argv[1:]), parser)
    args = parser.parse_args(argv)
    return COMMANDS[args.command](args, args.command_parser)
