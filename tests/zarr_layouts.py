"""Zarr array layouts shared by the batch reader tests."""

# Layouts the job's chunk-file reader (and so the early decode) leaves to zarr, as keyword
# arguments of zarr.create_array for a (12, 5) array.
REFUSED_LAYOUTS = {
    "trailing split": dict(chunks=(4, 2)),
    "not zstd": dict(chunks=(4, 5), compressors=None),
    "zarr v2": dict(chunks=(4, 5), zarr_format=2),
}
