"""Optional modules used only where the caller has imported them already."""

from __future__ import annotations

import sys
from types import ModuleType


def distributed_if_imported() -> ModuleType | None:
    """``distributed`` where something has imported it (a cluster can exist), else None,
    without importing it otherwise.

    Not ``sys.modules.get("distributed")``: while one thread imports it (``dask.persist``
    does, looking for a default client), another finds the module there half made (``no
    attribute 'Future'``, seen with four threads' first calls at once). The import statement
    waits until the importing thread is done."""
    if "distributed" not in sys.modules:
        return None
    import distributed

    return distributed
