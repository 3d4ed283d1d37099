"""``attn-dispatch tune``: offline tuning from a list of shapes or a recorded trace, and the cache
files' show, export and merge. No GPU here: the H100 is described, its timings faked."""
from __future__ import annotations

import functools
import json

import pytest

import capability_db
from dispatch import autotune, cli, router

H100 = capability_db.resolve_device("h100")
FAKE_MS = {"fa2": 0.5, "fa3": 0.2, "xqa": 0.3, "cudnn": 0.4, "native-triton": 0.6, "trtllm-gen": 0.7,
           "torch-flash": 0.8}
SHAPES = """\
# decode at two batch sizes (a comment line)
--phase decode --heads 32/8 --head-dim 128 --sizes 8 1 4096
--phase decode --heads 32/8 --head-dim 128 --sizes 64 1 1024   # a trailing comment
"""


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv(autotune.ENV_CACHE_DIR, str(tmp_path / "default"))
    monkeypatch.delenv(autotune.ENV_AUTOTUNE, raising=False)
    for name, value in (("_known", {}), ("_read_default", set()), ("_logged", set()), ("_contexts", [])):
        monkeypatch.setattr(autotune, name, value)
    router.clear_caches()
    yield
    router.clear_caches()


@pytest.fixture
def on_h100(monkeypatch):
    """This machine is an H100 (described: capability data only) whose timings are FAKE_MS; returns
    the names timed."""
    timed: list[str] = []
    monkeypatch.setattr(autotune, "current_device", lambda: H100)
    monkeypatch.setattr(router, "decide", functools.partial(router.decide, live=False))
    monkeypatch.setattr(autotune, "measure",
                        lambda problem, names, sizes, *_: timed.extend(names) or {n: FAKE_MS[n] for n in names})
    return timed


def tune(*argv) -> int:
    return cli.main(["tune", *argv])


def test_tune_shapes_times_each_bucket_and_keeps_them(on_h100, tmp_path, capsys):
    shapes, cache = tmp_path / "shapes.txt", tmp_path / "tuned.json"
    shapes.write_text(SHAPES)
    assert tune("--shapes", str(shapes), "--cache", str(cache), "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["shape"] for r in rows] == ["--phase decode --heads 32/8 --head-dim 128 --sizes 8 1 4096",
                                          "--phase decode --heads 32/8 --head-dim 128 --sizes 64 1 1024"]
    fastest = min(set(on_h100), key=FAKE_MS.get)
    assert {r["chosen"] for r in rows} == {fastest} and all(r["decided_by"].startswith("measured here (") for r in rows)
    data = json.loads(cache.read_text())
    assert len(data["buckets"]) == 2 and data["environment"]["gpu"] == "h100"
    timed = len(on_h100)
    assert tune("--shapes", str(shapes), "--cache", str(cache)) == 0  # known buckets: nothing timed again
    assert len(on_h100) == timed and "measured here" in capsys.readouterr().out


def test_a_bad_shapes_line_names_its_line(on_h100, tmp_path, capsys):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("--phase decode --sizes 8 1 4096\n--phase sideways\n")
    with pytest.raises(SystemExit) as exit_:
        tune("--shapes", str(shapes))
    assert exit_.value.code == 2 and "line 2: '--phase sideways' is not a list of query's options" in capsys.readouterr().err


def test_show_export_and_merge(on_h100, tmp_path, capsys):
    env = autotune.fingerprint(H100)
    mine, theirs, elsewhere = tmp_path / "mine.json", tmp_path / "theirs.json", tmp_path / "elsewhere.json"
    autotune.save(mine, {"k1": {"measured": "2026-01-01T00:00:00+00:00", "times": {"fa2": {"ms": 1.0}}},
                         "k2": {"measured": "2026-01-03T00:00:00+00:00", "times": {"xqa": {"ms": 2.0}}}}, env)
    autotune.save(theirs, {"k2": {"measured": "2026-01-02T00:00:00+00:00", "times": {"xqa": {"ms": 9.0}}},
                           "k3": {"measured": "2026-01-02T00:00:00+00:00", "times": {"fa3": {"ms": 3.0}}}}, env)
    autotune.save(elsewhere, {"k4": {"measured": autotune.now(), "times": {"fa3": {"ms": 3.0}}}},
                  {**env, "flashinfer": "0.1.0"})
    assert tune("show", "--cache", str(mine)) == 0
    out = capsys.readouterr().out
    assert "2 buckets; made here" in out and "xqa 2 ms" in out
    assert tune("merge", str(theirs), str(elsewhere), "--into", str(mine)) == 1  # one skipped: exit 1
    out = capsys.readouterr().out
    assert "elsewhere.json: skipped: made in another environment (flashinfer)" in out
    buckets = json.loads(mine.read_text())["buckets"]
    assert set(buckets) == {"k1", "k2", "k3"} and buckets["k2"]["times"]["xqa"]["ms"] == 2.0  # the newer kept
    shipped = tmp_path / "ship" / "tuned.json"
    assert tune("export", str(shipped), "--cache", str(mine)) == 0
    assert json.loads(shipped.read_text())["buckets"] == buckets
    assert tune("show", "--cache", str(tmp_path / "none.json")) == 1


def test_tune_trace_runs_a_recorded_trace_through_the_entry_points(tmp_path, capsys):
    """A trace file of bench --trace (its seed and configuration) is drawn again and run through our
    entry points inside the context: on the CPU the reference serves it (one candidate, nothing timed)."""
    from dispatch.benchmark import trace
    cfg = trace.Config(device="cpu", steps=20, warmup_steps=20, layers=4, max_batch=4, hq=4, hkv=2, head_dim=32,
                       page=16, dtype=trace.torch.float32, bounds=trace.BOUNDS["cpu"], check_steps=0)
    path = tmp_path / "trace-cpu-seed-7.json"
    path.write_text(json.dumps({"benchmark": "trace", "seed": 7, "config": cfg.to_json(),
                                "entries": {"single": {}, "paged": {}}}))
    assert tune("--trace", str(path), "--steps", "2", "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["shape"], r["chosen"]) for r in rows] == [("single: 2 steps", "reference"), ("paged: 2 steps", "reference")]
    (tmp_path / "not-a-trace.json").write_text("{}")
    with pytest.raises(SystemExit):
        tune("--trace", str(tmp_path / "not-a-trace.json"))
