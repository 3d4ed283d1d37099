"""User overrides: an explicit backend (argument > context manager > environment) and strict mode.

* ``backend=`` where the seed has it ("auto" means no choice);
* ``with dispatch.use_backend("cudnn"): ...`` (restored on exit, per thread/task);
* ``ATTN_DISPATCH_BACKEND=native-triton``;
* ``ATTN_DISPATCH_STRICT=1`` or ``with dispatch.strict(): ...``: any fallback is an error
  (1/true/yes/on turn it on, 0/false/no/off/empty leave it off, any case; anything else
  is a ValueError rather than a guess).

An explicit choice is honoured or refused with that backend's reasons: never
silently replaced.
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

# os.environ.get encodes the name and decodes the value on every call (~0.7 us); every call of an
# entry point reads three variables, so on POSIX the raw bytes mapping behind os.environ is read
# (os.environ's own writes keep it current, monkeypatch.setenv included).
RAW_ENVIRON = getattr(os.environ, "_data", None) if os.name == "posix" else None
_ENCODED: dict[str, bytes] = {}


def getenv(variable: str):
    """os.environ.get(variable), without its per-call encoding where the platform allows."""
    if RAW_ENVIRON is None:
        return os.environ.get(variable)
    name = _ENCODED.get(variable)
    if name is None:
        name = _ENCODED[variable] = variable.encode()
    raw = RAW_ENVIRON.get(name)
    return None if raw is None else raw.decode()
FALSE_WORDS = ("0", "false", "no", "off", "")


def env_flag(variable: str, default: bool = False) -> bool:
    """A boolean environment variable; a value that is neither on nor off is an error, not a guess."""
    raw = getenv(variable)
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
    name = normalize_backend_name(argument) if argument is not None else None
    if name is not None:
        return name, "backend= argument"
    scoped = _scoped_backend.get()
    if scoped is not None:
        return scoped, "dispatch.use_backend()"
    if RAW_ENVIRON is not None and _ENV_BACKEND_RAW not in RAW_ENVIRON:  # unset: the hot path
        return None
    env = getenv(ENV_BACKEND)
    if env:
        name = normalize_backend_name(env, ENV_BACKEND)
        if name is not None:
            return name, ENV_BACKEND
    return None


def strict_mode() -> bool:
    scoped = _scoped_strict.get()
    if scoped is not None:
        return scoped
    if RAW_ENVIRON is not None and _ENV_STRICT_RAW not in RAW_ENVIRON:  # unset: the hot path
        return False
    return env_flag(ENV_STRICT)


_ENV_BACKEND_RAW, _ENV_STRICT_RAW = ENV_BACKEND.encode(), ENV_STRICT.encode()  # names as os.environ._data keys
