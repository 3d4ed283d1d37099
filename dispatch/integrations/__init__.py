"""Glue for frameworks that call attention through a plug-in point (``dispatch.integrations.transformers``).

Nothing here is imported by ``import dispatch``: each module imports its framework lazily, so the
framework stays an optional extra (``pip install attn-dispatch[transformers]``).
"""
