// The keys of a float argsort on the GPU (dask_compact/backends/cupy_sort.py, `_keys`): each
// value's bits, with -0.0 as +0.0 and every NaN as one quiet NaN, so that a sort over the
// float's bits (Thrust's radix sort, which cupy.argsort may take) keeps equal values in index
// order as NumPy's stable argsort does. One read and one write: the same keys by CuPy's
// elementwise calls (a compare, a where, isnan and a where) moved 28 bytes a float32 against 8.
// By the bits, not by float arithmetic: CuPy's kernels flush subnormals to zero, under which a
// subnormal compares equal to 0.0 and would be folded with it.
//
// U: the unsigned integer of the float's width (unsigned short, unsigned int, unsigned long
// long). inf: the bits of +inf (a NaN's magnitude is above them); nan: the one NaN's bits.
// n may exceed 2^31 (a grid-stride loop over 64-bit indices).
template <typename U>
__global__ void dcx_sort_keys(const U* __restrict__ bits, U* __restrict__ keys, long long n,
                              U inf, U nan) {
  const U sign = U(U(1) << (sizeof(U) * 8 - 1));
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const U b = bits[i];
    const U magnitude = U(b & U(~sign));
    keys[i] = magnitude > inf ? nan : (b == sign ? U(0) : b);
  }
}
