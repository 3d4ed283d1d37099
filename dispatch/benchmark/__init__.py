"""What ``attn-dispatch bench`` (``bench --trace`` too) and ``attn-dispatch probe`` run, kept out of the
product path: the entry points never import this package (the CLI imports it lazily). The one fp64
oracle (``oracle``), input cases (``cases``), the bench (``bench``, ``problems``, ``grids``,
``randomgrid``, ``build``, ``runner``, ``report``, ``warm``), the engine-shaped trace (``trace``), the
probe (``probe``) and the backend scenarios the tests share (``native``, ``vendors``). Turning bench
results into timing tables and choice tables, replays and host-cost studies are tools of the source
tree (tools/), outside the wheel."""
