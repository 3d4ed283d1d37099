"""What the research tools share: bench JSONs -> the router's timing table and its fit (``table``),
today's choice replayed against measured times (``replay``), the host cost per call of every entry
point (``host_cost``), and the figures and command line of tools reading bench JSONs (``figures``)."""
