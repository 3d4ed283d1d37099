"""``attn-dispatch bench --host-cost`` from a source tree: host cost per call of every entry point
(dispatch/lab/host_cost.py; the same options)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: dispatch, backends

from dispatch.lab.host_cost import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
