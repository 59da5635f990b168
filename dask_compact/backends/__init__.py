"""Chunk backends, one module per array type; chosen by dask_compact.dispatch."""
