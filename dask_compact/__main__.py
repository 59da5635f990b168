"""``python -m dask_compact INPUT OUTPUT --where EXPR``: the batch job of ``dask compact``."""

from .cli import main

if __name__ == "__main__":  # guard: LocalCluster's spawned workers re-import the main module
    main(prog_name="python -m dask_compact")
