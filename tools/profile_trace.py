"""Where our host time goes on an engine-shaped trace: ``bench --trace`` under cProfile.

    python -m tools.profile_trace --top 40 -- --device cuda --entries xqa single --steps 100

Prints the functions of dispatch/ and backends/ by cumulative time (FlashInfer's own side runs too:
its frames are left out unless called from ours) and writes the whole profile to --stats.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats

from dispatch.benchmark import trace


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--stats", default=None, help="write the raw profile here")
    parser.add_argument("trace_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.trace_args[1:] if args.trace_args[:1] == ["--"] else args.trace_args
    profile = cProfile.Profile()
    profile.enable()
    code = trace.main(rest)
    profile.disable()
    if args.stats:
        profile.dump_stats(args.stats)
    stats = pstats.Stats(profile).sort_stats("cumulative")
    stats.print_stats(r"(dispatch|backends)/", args.top)
    return int(code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
