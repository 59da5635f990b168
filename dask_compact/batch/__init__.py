"""The batch job behind ``dask compact``: input, where it runs, and the all-or-nothing output."""
