"""What a new user meets first: plain commands without warnings, ``dispatch.__version__``,
``explain`` by entry name, one-line summaries with the details behind ``verbose``, ``query``'s
ranking shown as the numbers it sorts, and a CLI built on argparse's public API only."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dispatch
from _api_cases import cudnn_args, paged, ragged
from dispatch import choice, cli, router

ROOT = Path(__file__).resolve().parents[1]
NO_NUMPY = "import sys, runpy; sys.modules['numpy'] = None; sys.argv[0] = 'attn-dispatch'; " \
           "runpy.run_module('dispatch', run_name='__main__')"


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["info"], ["matrix"], ["explain"],
                                  ["query", "--gpu", "h100", "--phase", "decode"]])
def test_plain_commands_print_nothing_on_stderr_without_numpy(argv):
    """torch warns "Failed to initialize NumPy" when numpy is absent; dispatch silences exactly that."""
    done = subprocess.run([sys.executable, "-c", NO_NUMPY, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and done.stdout


def test_the_main_job_prints_no_numpy_warning_without_numpy():
    """The README's main job (`attn-dispatch info && python tools/dropin_demo.py`) in a fresh interpreter
    without NumPy: the demo's call table, no warning (`info` is checked above)."""
    code = ("import sys, runpy; sys.modules['numpy'] = None; sys.path.insert(0, sys.argv[1]); "
            "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT), str(ROOT / "tools" / "dropin_demo.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "NumPy" not in done.stderr and "reference" in done.stdout, done.stderr


def test_the_suite_runs_torch_on_the_threads_it_was_given():
    """tests/conftest.py: one intra-op thread unless OMP_NUM_THREADS says otherwise (small tensors;
    a 2-core CI machine)."""
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])


def test_a_broken_numpy_still_warns():
    """Only the 'not installed' message is silenced: another NumPy failure is the user's to see."""
    code = ("import warnings, dispatch; "
            "warnings.warn('Failed to initialize NumPy: _ARRAY_API not found', UserWarning)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "_ARRAY_API not found" in done.stderr


def test_version_is_one_definition():
    from dispatch import _version

    assert dispatch.__version__ == _version.__version__ == cli.version() and dispatch.__version__[0].isdigit()
    assert 'attr = "dispatch._version.__version__"' in (ROOT / "pyproject.toml").read_text()


# -- explain ------------------------------------------------------------------------------------
def test_explain_takes_entry_names():
    c = ragged(q_lens=(4,), kv_lens=(7,))
    by_name = dispatch.explain("single_prefill_with_kv_cache", c["q"], c["k"], c["v"], causal=True)
    by_obj = dispatch.explain(dispatch.single_prefill_with_kv_cache, c["q"], c["k"], c["v"], causal=True)
    assert by_name is by_obj and by_name.chosen == "reference"
    lse = dispatch.explain("single_prefill_with_kv_cache_return_lse", c["q"], c["k"], c["v"])
    assert lse.problem.return_lse


@pytest.mark.parametrize("entry, says", [
    ("nope", "entry='nope': allowed an entry function or its name (cudnn_batch_prefill_with_kv_cache"),
    ("BatchPrefillWithPagedKVCacheWrapper", "explain(wrapper) or explain(wrapper, *run_args)"),
])
def test_explain_rejects_other_names_saying_what_is_allowed(entry, says):
    with pytest.raises(ValueError) as info:
        dispatch.explain(entry)
    assert says in str(info.value)


def _cpu_decision():
    c = ragged(q_lens=(4,), kv_lens=(7,))
    return dispatch.explain("single_prefill_with_kv_cache", c["q"], c["k"], c["v"], causal=True)


def test_a_decision_opens_with_one_line_and_fits_a_screen_on_the_cpu():
    d = _cpu_decision()
    text, full = d.explain(), d.explain(verbose=True)
    lines = text.splitlines()
    assert lines[0] == ("reference serves single_prefill_with_kv_cache on cpu "
                        "(the only ranked candidate that accepts it)")
    assert len(lines) <= 24 and str(d) == text and max(map(len, lines)) <= router.WIDTH
    assert "rejected cudnn          device_kind='cpu': allowed one of 'cuda' (+" in text
    assert "[cuDNN is a CUDA library]" not in text and "[cuDNN is a CUDA library]" in full
    assert len(full.splitlines()) > 2 * len(lines) and "verbose=True" in lines[-1]


def _no_doubled_words(text: str) -> bool:
    words = text.split()
    return not any(a == b and a.isalpha() for a, b in zip(words, words[1:])) and "on cpu on cpu" not in text


def test_a_refusal_opens_with_one_line_and_says_the_device_once():
    c = ragged(q_lens=(4,), kv_lens=(7,))
    with pytest.raises(dispatch.BackendRefusedError) as info:
        dispatch.single_prefill_with_kv_cache(c["q"], c["k"], c["v"], causal=True, backend="fa3")
    text = str(info.value)
    assert text.splitlines()[0] == ("backend 'fa3' (chosen by backend= argument) cannot serve this "
                                    "single_prefill_with_kv_cache call on cpu: device_kind='cpu': allowed one of "
                                    "'cuda' (+4 more)")
    assert "backends that would accept it: reference" in text
    assert _no_doubled_words(text) and _no_doubled_words(_cpu_decision().explain(verbose=True))


def test_cuda_graph_on_the_cpu_is_a_short_clear_error():
    c = paged()
    args, kw = cudnn_args(c, is_cuda_graph_compatible=True)
    with pytest.raises(dispatch.NoBackendError) as info:
        dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)
    lines = str(info.value).splitlines()
    assert "CUDA graphs need a CUDA device: is_cuda_graph_compatible / use_cuda_graph must be False" in lines[0]
    assert len(lines) <= 8 and _no_doubled_words(str(info.value))
    assert "[cuDNN is a CUDA library]" in info.value.details  # every backend's reasons, on request


# -- query / explain CLI ---------------------------------------------------------------------------
def _cli(capsys, *argv):
    rc = cli.main(list(argv))
    return rc, capsys.readouterr().out


def test_query_shows_what_it_ranks_by_and_sources_once(capsys):
    rc, out = _cli(capsys, "query", "--gpu", "h100", "--phase", "decode")
    assert rc == 0 and out.splitlines()[0].startswith("chosen: ")
    chosen = out.splitlines()[0].split()[1]
    expected, current = {}, None
    for line in out.splitlines():
        head = re.match(r"\s+(?:\d+\.|-)\s+(?:CHOSEN|ok|rejected)\s+(\S+)", line)
        current = head.group(1) if head else current
        if line.lstrip().startswith("= table: "):
            expected[current] = float(line.rsplit("=", 1)[1].split()[0])
    assert len(expected) > 1 and expected[chosen] <= min(expected.values()) * (1 + choice.TIE)
    # each source once, not once per candidate: the H100's compiled table
    sources = [line for line in out.splitlines() if line.startswith("estimates from:")]
    assert sources == ["estimates from: capability_db/tables/h100.json"]
    flat = " ".join(out.split())
    assert "ranked by: expected time (capability_db/tables/h100.json; the phase's anchor sizes" in flat
    assert "--sizes" in out


def test_query_json_has_the_estimates(capsys):
    rc, out = _cli(capsys, "query", "--gpu", "h100", "--phase", "decode", "--json")
    data = json.loads(out)
    ranked = [c for c in data["candidates"] if c["accepted"] and c["ranked"] and c["estimate_ms"]]
    assert data["ranking"].startswith("expected time (capability_db/tables/h100.json; ")
    assert len(ranked) > 1 and all(c["estimate_source"] == "capability_db/tables/h100.json" for c in ranked)
    best = min(c["estimate_ms"] for c in ranked)
    chosen = next(c for c in ranked if c["backend"] == data["chosen"])
    assert chosen["estimate_ms"] <= best * (1 + choice.TIE)
    rc, out = _cli(capsys, "query", "--gpu", "h100", "--phase", "decode", "--sizes", "64", "1", "4096", "--json")
    data = json.loads(out)
    ranked = [c for c in data["candidates"] if c["accepted"] and c["ranked"] and c["estimate_ms"]]
    # one decision serves the size class (33-64 x 1 x 2049-4096), read at its middle (the batch in 8 KV heads)
    assert ranked and all(c["score"] is None and c["estimate_sizes"] == [48, 1, 3072] for c in ranked)
    assert "the size class 33-64 x 1 x 2049-4096 read at 48 x 1 x 3072" in data["ranking"]


def test_explain_cli_is_short_unless_verbose(capsys):
    rc, out = _cli(capsys, "explain", "--gpu", "cpu")
    rc_v, out_v = _cli(capsys, "explain", "--gpu", "cpu", "--verbose")
    assert rc == rc_v == 0 and len(out.splitlines()) <= 16 < len(out_v.splitlines())
    rc, out = _cli(capsys, "explain", "--gpu", "cpu", "--cuda-graph", "--kv", "ragged")
    first = " ".join(out.split("\nproblem: ")[0].split())  # the refusal's one line, wrapped to 100 columns
    assert rc == 1 and len(out.splitlines()) <= 10 and max(map(len, out.splitlines())) <= cli.WIDTH
    assert "CUDA graphs need a CUDA device" in first


def test_cli_uses_only_public_argparse():
    source = (ROOT / "dispatch" / "cli.py").read_text()
    private = re.findall(r"\.(_[a-z]\w*)", source)  # a dunder (__name__, __version__) is public
    assert private == ["_version"], f"cli.py reaches into private attributes: {private}"
    with pytest.raises(SystemExit) as info:
        cli.main(["explain", "--backend", "nope"])
    assert info.value.code == 2


def test_torch_is_imported_first_by_dispatch():
    assert "torch" in sys.modules and torch.__version__
