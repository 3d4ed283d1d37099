"""``attn-dispatch bench --random N`` on the CPU (CI runs it): the seed drawn at run time is
printed and recorded, every backend's output of every drawn problem is checked against the fp64
oracle, ``--seed`` draws the same problems again and ``--start`` resumes them; the distribution
reaches every entry point and every cache form and feature it documents, within its caps."""
from __future__ import annotations

import json

import pytest

from dispatch import cli
from dispatch.benchmark import randomgrid
from dispatch.benchmark.oracle import band
from dispatch.benchmark.problems import ENTRY_NAMES, check_entry


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("random")
    return out, cli.main(["bench", "--device", "cpu", "--random", "6", "--out", str(out)])


def test_random_sweep_records_its_seed_and_checks_every_output(fresh_run):
    out, rc = fresh_run
    assert rc == 0
    [path] = out.glob("bench-random-6-seed-*-cpu.json")
    rep = json.loads(path.read_text())
    seed = rep["seed"]
    assert isinstance(seed, int) and path.name == f"bench-random-6-seed-{seed}-cpu.json"
    assert "entry point: uniform over the seven" in rep["distribution"]
    assert f"random-6-seed-{seed}" in (out / path.name.replace(".json", ".md")).read_text()
    drawn = randomgrid.draw(6, seed, "cpu")
    assert [r["name"] for r in rep["results"]] == [p.name for p in drawn]  # the recorded seed redraws them
    for r in rep["results"]:
        rows = {b["backend"]: b for b in r["backends"]}
        tol = band(r["problem"]["dtype"], r["problem"]["kv_dtype"] or r["problem"]["dtype"])
        assert rows["reference"]["status"] == rows["auto"]["status"] == "ok", r["name"]
        for b in (b for name, b in rows.items() if name != "flashinfer"):
            assert b["status"] in ("ok", "refused", "skipped"), (r["name"], b)  # a refusal names its reason
            if b["status"] == "skipped":  # not usable here: the row says how to enable it
                assert "to enable" in b["note"], b
                continue
            if b["status"] == "refused":
                assert "allowed" in b["note"] or "not" in b["note"], b
                continue
            assert 0 < b["rel_err"] <= tol, (r["name"], b)
            assert b["lse_rel_err"] is None or b["lse_rel_err"] <= tol
            assert b["eager_ms"] > 0


def test_seed_and_start_redraw_and_resume(tmp_path, capsys):
    seed = randomgrid.new_seed()
    assert cli.main(["bench", "--device", "cpu", "--random", "5", "--seed", str(seed), "--start", "3",
                     "--out", str(tmp_path), "--json"]) == 0
    assert f"seed {seed}" in capsys.readouterr().err
    rep = json.loads((tmp_path / f"bench-random-5-seed-{seed}-cpu-from-3.json").read_text())
    assert rep["seed"] == seed and rep["start"] == 3
    assert [r["name"] for r in rep["results"]] == [p.name for p in randomgrid.draw(5, seed, "cpu")[3:]]


def test_seed_without_random_is_refused(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--device", "cpu", "--seed", "3"])
    assert "--seed goes with --random" in capsys.readouterr().err


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_distribution_covers_every_entry_form_and_feature_within_its_caps(device):
    seed = randomgrid.new_seed()
    drawn = randomgrid.draw(400, seed, device)
    assert drawn == randomgrid.draw(400, seed, device)  # a seed is the whole sweep
    assert all(check_entry(p) is None for p in drawn), seed
    assert {p.entry for p in drawn} == set(ENTRY_NAMES), seed
    assert all(not randomgrid._over(p, randomgrid.CAPS[device]) for p in drawn), seed
    r = randomgrid.RANGES[device]
    assert {p.num_qo_heads // p.num_kv_heads for p in drawn} == set(r.groups), seed
    assert {p.head_dim for p in drawn} == set(r.head_dims), seed
    assert {p.page_size for p in drawn if p.paged} == set(r.pages), seed
    assert any(p.q_len == 1 for p in drawn) and any(p.q_len > 1 for p in drawn)
    for flag in (lambda p: p.kv_layout == "HND", lambda p: p.kv_pair, lambda p: p.custom_mask, lambda p: p.causal,
                 lambda p: p.window_left >= 0, lambda p: p.soft_cap > 0, lambda p: p.sinks, lambda p: p.lse,
                 lambda p: p.kv_type.startswith("float8")):
        assert 0 < sum(map(flag, drawn)) < len(drawn), seed
    if device == "cuda":
        assert max(p.batch for p in drawn) >= 128 and max(p.kv_len for p in drawn) >= 32768
        assert max(p.q_len for p in drawn) >= 4096


def test_warm_only_warms_every_problem_and_times_none(tmp_path, capsys):
    rc = cli.main(["bench", "--device", "cpu", "--random", "2", "--seed", "5", "--warm-workers", "2", "--warm-only",
                   "--out", str(tmp_path)])
    assert rc == 0 and "warm-only: 2 of 2 problems warm" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())  # nothing timed, nothing written
    with pytest.raises(SystemExit):
        cli.main(["bench", "--device", "cpu", "--random", "2", "--warm-only"])
    assert "--warm-only: allowed with --warm-workers J" in capsys.readouterr().err
