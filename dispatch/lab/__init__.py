"""Measurement, kept out of the product path: the entry points never import this package (the
CLI imports it lazily). The one fp64 oracle (``oracle``), input cases (``cases``), ``attn-dispatch
bench`` (``bench``, ``runner``, ``build``, ``grids``, ``problems``, ``report``, ``replay``,
``table``), host cost per call (``host_cost``), ``attn-dispatch probe`` (``probe``) and the
backend labs (``native``, ``vendors``) — shared by tests/ and tools/."""
