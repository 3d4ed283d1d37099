"""Measurement and research around attn-dispatch, outside the installed package: timing-table fits,
replays of the router's choice against measured sweeps, host-cost studies, sweep analysis, and
preparing a machine without network (tools/offline). Each imports ``dispatch``, ``backends`` and
``capability_db`` as any user does; run them from the repository root as ``python -m tools.<name>``."""
