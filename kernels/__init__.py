# CUDA C++ sources of the compaction kernels. Installed as the package `dask_compact.kernels`
# (see pyproject.toml) so the sources ship inside the wheel and are found with
# importlib.resources, never by walking up from __file__.
