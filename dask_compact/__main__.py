"""``python -m dask_compact INPUT OUTPUT --where EXPR``: the batch job of ``dask compact``."""

from .cli import script

if __name__ == "__main__":  # guard: LocalCluster's spawned workers re-import the main module
    script(prog_name="python -m dask_compact")
