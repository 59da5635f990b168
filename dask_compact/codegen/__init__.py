"""Code generators: a typed predicate tree becomes a numba loop (CPU) or a CUDA functor (GPU)."""
