"""User overrides: an explicit backend (argument > context manager > environment) and strict mode.

* ``backend=`` where the seed has it ("auto" means no choice);
* ``with dispatch.use_backend("cudnn"): ...`` (restored on exit, per thread/task);
* ``ATTN_DISPATCH_BACKEND=native-triton``;
* ``ATTN_DISPATCH_STRICT=1`` or ``with dispatch.strict(): ...``: any fallback is an error
  (1/true/yes/on turn it on, 0/false/no/off/empty leave it off, any case; anything else
  is a ValueError rather than a guess).

An explicit choice is honoured or refused with that backend's reasons: never
silently replaced. The variables are read on every call (os.environ.get), so a change
between calls counts on the next call.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Iterator, Optional

from capability_db import BACKEND_NAMES, backend_aliases

ENV_BACKEND = "ATTN_DISPATCH_BACKEND"
ENV_STRICT = "ATTN_DISPATCH_STRICT"

_scoped_backend: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("attn_dispatch_backend", default=None)
_scoped_strict: contextvars.ContextVar[Optional[bool]] = contextvars.ContextVar("attn_dispatch_strict", default=None)

# Other spellings accepted where the seed has a ``backend=`` argument (FlashInfer's among
# them), declared in each backend's data file ("aliases").
_ALIASES = backend_aliases()

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


def env_flag(variable: str, default: bool = False) -> bool:
    """A boolean environment variable, read now (a change between calls counts on the next call);
    a value that is neither on nor off is an error, not a guess."""
    raw = os.environ.get(variable)
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ValueError(f"{variable}={raw!r} is not allowed; valid options are: {', '.join(TRUE_WORDS)} (on) "
                     f"or {', '.join(w or repr(w) for w in FALSE_WORDS)} (off), in any case")


def normalize_backend_name(name: str, argument: str = "backend") -> Optional[str]:
    """'auto'/None -> None; a known name or alias -> the name; anything else -> ValueError."""
    if name is None or name == "auto":
        return None
    canonical = _ALIASES.get(name, name)
    if canonical not in BACKEND_NAMES:
        aliases = ", ".join(f"{a} = {n}" for a, n in _ALIASES.items())
        raise ValueError(f"{argument}={name!r} is not a backend; valid options are: auto, {', '.join(BACKEND_NAMES)}"
                         + (f" (aliases: {aliases})" if aliases else ""))
    return canonical


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force a backend inside the block (an explicit choice: honoured or refused)."""
    token = _scoped_backend.set(normalize_backend_name(name, "use_backend"))
    try:
        yield
    finally:
        _scoped_backend.reset(token)


@contextlib.contextmanager
def strict(enabled: bool = True) -> Iterator[None]:
    """Inside the block, any fallback (a candidate rejected before the chosen one) is an error."""
    token = _scoped_strict.set(enabled)
    try:
        yield
    finally:
        _scoped_strict.reset(token)


def explicit_choice(argument: Optional[str] = None) -> Optional[tuple[str, str]]:
    """(backend, where the choice came from), or None for automatic choice."""
    name = None if argument is None or argument == "auto" else normalize_backend_name(argument)
    if name is not None:
        return name, "backend= argument"
    scoped = _scoped_backend.get()
    if scoped is not None:
        return scoped, "dispatch.use_backend()"
    env = os.environ.get(ENV_BACKEND)
    if env:
        name = normalize_backend_name(env, ENV_BACKEND)
        if name is not None:
            return name, ENV_BACKEND
    return None


def strict_mode() -> bool:
    """strict() inside its block, else ATTN_DISPATCH_STRICT as it is now."""
    scoped = _scoped_strict.get()
    if scoped is not None:
        return scoped
    return env_flag(ENV_STRICT)
