"""How often the compiled table's choice is the fit's, on random problems (no GPU needed).

    python -m tools.tables.agreement --gpu h200 --problems 400 [--seed S]

Draws bench problems (``dispatch.benchmark.randomgrid``, the sweeps' distribution), asks the router which
backends accept each on the described GPU, and ranks them twice: by the compiled table
(``dispatch.choice.rank``, what the router does) and by the fit it was compiled from
(``tools.tables.estimate.rank``). Each choice is judged by the fit's own estimate of its time:
the table's regret is its choice's fitted time over the fit's choice's, minus one.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

import capability_db
from dispatch import choice, router
from dispatch.benchmark import randomgrid
from dispatch.benchmark.problems import problem_of

from . import estimate, measured


def judge(problem, device, table) -> tuple[str, str, float]:
    """(table's choice, fit's choice, regret of the table's choice by the fit's estimates)."""
    ranked = [c for c in router.evaluate(problem, device, live=False) if c.ranked and c.accepted]
    accepted = [c.backend for c in ranked]
    if len(accepted) < 2:
        return accepted[0] if accepted else "", accepted[0] if accepted else "", 0.0
    ours = choice.rank(problem, device, accepted, problem.sizes)
    fits = estimate.rank(problem, device, accepted, problem.sizes)
    mine, theirs = ours.order[0], fits.order[0]
    times = fits.estimates
    regret = times[mine].ms / times[theirs].ms - 1 if mine in times and theirs in times else 0.0
    return mine, theirs, regret


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--problems", type=int, default=300)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    seed = randomgrid.new_seed() if args.seed is None else args.seed
    device = capability_db.resolve_device(args.gpu)
    table = measured.table_for(device)
    for graph in (False, True):
        regrets = []
        for bench in randomgrid.draw(args.problems, seed, "cuda"):
            problem = dataclasses.replace(problem_of(bench), cuda_graph=graph)
            try:
                regrets.append(judge(problem, device, table)[2])
            except router.NoBackendError:
                continue
        within = sum(r <= choice.TIE for r in regrets)
        print(f"{args.gpu} seed {seed} {'graph' if graph else 'eager'}: the table's choice within 3% of the "
              f"fit's on {within} of {len(regrets)} ({within / len(regrets):.1%}); over 10%: "
              f"{sum(r > 0.10 for r in regrets)}; median regret {statistics.median(regrets):.3f}, "
              f"max {max(regrets):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
