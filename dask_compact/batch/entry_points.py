"""One scan of the installed packages' entry points per command.

zarr (``zarr.registry``) and numcodecs (``numcodecs.registry``) each call
``importlib.metadata.entry_points()`` as they are imported, and each call reads the entry
points of every installed distribution again. In a large environment that is most of their
import time: on the H100 host (the PyTorch image, several hundred distributions) the two scans
took 0.27 and 0.20 s of a command's start-up (``python -X importtime``). While
:func:`shared_scan` is active the first call scans and later calls select from its result:
what each caller gets is what it would have got, as long as nothing is installed or removed
meanwhile (nothing is, during a command).
"""

from __future__ import annotations

import contextlib
import importlib.metadata as metadata
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def shared_scan() -> Iterator[None]:
    """``importlib.metadata.entry_points`` scanning once for the duration (for modules
    imported meanwhile: they bind the function as they are imported)."""
    original = metadata.entry_points
    scanned: list[Any] = []

    def entry_points(**params: Any) -> Any:
        if not scanned:
            scanned.append(original())
        # No parameters: every entry point (EntryPoints; before Python 3.12 SelectableGroups,
        # whose select() with parameters returns EntryPoints as entry_points(**params) does).
        return scanned[0].select(**params) if params else scanned[0]

    metadata.entry_points = entry_points
    try:
        yield
    finally:
        if metadata.entry_points is entry_points:
            metadata.entry_points = original
