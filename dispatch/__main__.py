"""``python -m dispatch`` = the ``attn-dispatch`` console script."""
from dispatch.cli import main

raise SystemExit(main())
