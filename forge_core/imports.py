"""Import user components by path (`module.path:Name`), with errors that name the config key and the fix."""

from __future__ import annotations

import importlib


def import_object(path: str, what: str):
    """Import `module.path:attr`; raise ValueError naming the path and the problem."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{what} {path!r} must be a registered name or 'module.path:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what} {path!r}: cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ValueError(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}") from exc
