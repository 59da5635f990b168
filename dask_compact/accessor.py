"""Registers ``dask.array.Array.map_compact`` (an accessor-style method, like xarray's).

:func:`register_when_imported` adds the method at once if ``dask.array`` is imported, and
otherwise as soon as it is: a finder on ``sys.meta_path`` wraps the loading of
``dask.array`` and registers right after the module has run. ``import dask_compact`` thus
costs no import of ``dask.array`` (see the package docstring), and the method is there for
every dask array all the same, whichever of the two imports comes first.

xarray's ``compact`` accessor (``ds.compact.where``, :mod:`.xarray_accessor`) is registered
the same way when xarray is imported (``dask.array`` imports it too, where it is installed).
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from types import FrameType, ModuleType
from typing import Any

TARGET = "dask.array"
XARRAY = "xarray"


def _map_compact(self: Any, pred: Any, **kwargs: Any) -> Any:
    from . import api

    return api.map_compact(self, pred, **kwargs)


setattr(_map_compact, "_dask_compact", True)  # noqa: B010 - mark of our own method
_map_compact.__name__ = _map_compact.__qualname__ = "map_compact"


def adopt_docs(fn: Any) -> None:
    """Give the method the docstring and signature of :func:`dask_compact.map_compact`; called
    by :mod:`.api` once it is imported (the registration itself may run in the middle of an
    import of ``dask.array`` made by :mod:`.api`'s own imports, when it cannot import it)."""
    functools.update_wrapper(_map_compact, fn)
    _map_compact.__name__ = _map_compact.__qualname__ = "map_compact"


def register() -> None:
    """Add ``map_compact`` to dask arrays; warn and leave it if something else defined it."""
    import dask.array as da

    api = sys.modules.get("dask_compact.api")
    if api is None and not _in_our_import():
        # dask.array was imported from outside this package: the docs can be had now. (From
        # inside, by a module of ours being imported, api.py adopts them when it has run.)
        from . import api
    if api is not None and hasattr(api, "map_compact"):
        adopt_docs(api.map_compact)
    existing = getattr(da.Array, "map_compact", None)
    if existing is not None and not getattr(existing, "_dask_compact", False):
        warnings.warn(
            "dask.array.Array.map_compact is already defined by another package; dask_compact "
            "leaves it as it is: call dask_compact.map_compact(x, pred) instead",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    setattr(da.Array, "map_compact", _map_compact)  # noqa: B010 - a new attribute of a class


def _in_our_import() -> bool:
    """Whether a module of this package (not the package itself) is being imported: its code
    is on the stack. Until 2026-12-01 (thirteenth session) only ``graph.py`` was taken for
    one: ``joined_chunks.py`` imports ``dask.array`` too, and imported first (a worker process
    that had not imported ``dask.array``, unpickling a task of a sort that joins small chunks,
    whose first name was in it; or ``import dask_compact.joined_chunks``), this hook imported
    ``api.py``, which imports ``joined_chunks`` half made: the ImportError closed the worker,
    its nanny did not restart it, and the call waited for ever."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if (frame.f_code.co_name == "<module>"
                and str(frame.f_globals.get("__name__", "")).startswith(f"{__package__}.")):
            return True
        frame = frame.f_back
    return False


def register_xarray() -> None:
    """Add the ``compact`` accessor to xarray's Dataset and DataArray (importing
    :mod:`.xarray_accessor` registers it). A failure warns: it runs inside ``import xarray``
    (and ``import dask.array``), which must not fail because of it."""
    try:
        importlib.import_module("dask_compact.xarray_accessor")
    except Exception as e:  # noqa: BLE001 - any failure: the imports go on without the accessor
        warnings.warn(
            f"dask_compact could not register the xarray accessor ds.compact: {e!r}",
            RuntimeWarning,
            stacklevel=2,
        )


# module imported -> what registers on it
HOOKS: dict[str, Callable[[], None]] = {TARGET: register, XARRAY: register_xarray}


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it for a module of :data:`HOOKS` not yet
    imported and wraps the spec's loader so that its hook runs once the module has been
    executed."""

    def __init__(self, pending: Sequence[str]) -> None:
        self.pending = set(pending)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.pending:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader, self, fullname)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, finder: _RegisterOnImport, name: str) -> None:
        self.inner, self.finder, self.name = inner, finder, name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # the module's own loader, as if we had never been there (pickle, inspect, reload)
        module.__loader__ = self.inner
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        self.inner.exec_module(module)
        _done(self.finder, self.name)
        HOOKS[self.name]()

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self.inner, name)


def _done(finder: _RegisterOnImport, name: str) -> None:
    """``name`` is imported: the finder stops looking for it, and leaves once it has none."""
    finder.pending.discard(name)
    if finder.pending:
        return
    try:
        sys.meta_path.remove(finder)
    except ValueError:
        pass


def register_when_imported() -> None:
    """Run each hook now if its module is imported, else when it is (once)."""
    pending = []
    for name, hook in HOOKS.items():
        if name in sys.modules:
            hook()
        else:
            pending.append(name)
    if pending and not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport(pending))
