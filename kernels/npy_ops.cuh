// NumPy's elementwise semantics on the device: what generated predicate functors call.
//
// The code generator (dask_compact/codegen/cuda_functor.py) casts every argument to the loop
// dtype NumPy picks (ufunc.resolve_dtypes, NEP 50) before calling one of these, so each function
// sees its loop's types only. What NumPy does, we do:
//  - integer arithmetic wraps (computed in unsigned, so no C undefined behaviour); division and
//    remainder by zero give 0; floor_divide rounds to -inf, remainder takes the divisor's sign;
//    shifts by the bit width or more give 0 (or -1 for a right shift of a negative number);
//  - bool add/multiply/maximum/minimum are or/and;
//  - float16 is computed in float32 and rounded to float16 after every operation;
//  - minimum/maximum propagate NaN, fmin/fmax ignore it; ordered comparisons are false on NaN;
//  - complex numbers order lexicographically (NumPy's CLT/CLE... macros).
// Transcendentals of float32/float16 are evaluated in float64 and rounded once, which is the
// correctly rounded value in all but astronomically rare cases; NumPy's own float32 SIMD
// versions are within 1-4 ulp of that, so such predicates can differ from NumPy only for inputs
// whose function value lies within a few ulp of the threshold.
#pragma once
#include "dcx_types.cuh"

namespace dcx {
namespace np {

// ---------------------------------------------------------------- float building blocks ------
__device__ __forceinline__ float fadd(float a, float b) { return f32_add(a, b); }
__device__ __forceinline__ double fadd(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float fsub(float a, float b) { return f32_sub(a, b); }
__device__ __forceinline__ double fsub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float fmul(float a, float b) { return f32_mul(a, b); }
__device__ __forceinline__ double fmul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float fdiv(float a, float b) { return f32_div(a, b); }
__device__ __forceinline__ double fdiv(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ bool flt(float a, float b) { return f32_lt(a, b); }
__device__ __forceinline__ bool flt(double a, double b) { return a < b; }
__device__ __forceinline__ bool fle(float a, float b) { return f32_le(a, b); }
__device__ __forceinline__ bool fle(double a, double b) { return a <= b; }
__device__ __forceinline__ bool fgt(float a, float b) { return f32_gt(a, b); }
__device__ __forceinline__ bool fgt(double a, double b) { return a > b; }
__device__ __forceinline__ bool fge(float a, float b) { return f32_ge(a, b); }
__device__ __forceinline__ bool fge(double a, double b) { return a >= b; }
__device__ __forceinline__ bool feq(float a, float b) { return f32_eq(a, b); }
__device__ __forceinline__ bool feq(double a, double b) { return a == b; }
__device__ __forceinline__ bool fne(float a, float b) { return f32_ne(a, b); }
__device__ __forceinline__ bool fne(double a, double b) { return a != b; }
__device__ __forceinline__ bool fisnan(float a) { return f32_isnan(a); }
__device__ __forceinline__ bool fisnan(double a) { return f64_isnan(a); }
__device__ __forceinline__ bool fisinf(float a) { return f32_isinf(a); }
__device__ __forceinline__ bool fisinf(double a) { return f64_isinf(a); }
__device__ __forceinline__ bool fisfinite(float a) { return f32_isfinite(a); }
__device__ __forceinline__ bool fisfinite(double a) { return f64_isfinite(a); }
__device__ __forceinline__ float fneg(float a) { return f32_neg(a); }
__device__ __forceinline__ double fneg(double a) { return f64_neg(a); }
__device__ __forceinline__ float fabs_(float a) { return f32_abs(a); }
__device__ __forceinline__ double fabs_(double a) { return f64_abs(a); }
__device__ __forceinline__ float fzero(float) { return 0.0f; }
__device__ __forceinline__ double fzero(double) { return 0.0; }
__device__ __forceinline__ float fcopysign(float a, float b) {
  return f32_from_bits((f32_bits(a) & 0x7fffffffu) | (f32_bits(b) & 0x80000000u));
}
__device__ __forceinline__ double fcopysign(double a, double b) { return copysign(a, b); }
#define DCX_F32_ROUND(NAME, MODE)                                  \
  __device__ __forceinline__ float NAME(float a) {                 \
    float r;                                                       \
    asm("cvt." MODE ".f32.f32 %0, %1;" : "=f"(r) : "f"(a));        \
    return r;                                                      \
  }
DCX_F32_ROUND(ffloor, "rmi")
DCX_F32_ROUND(fceil, "rpi")
DCX_F32_ROUND(ftrunc, "rzi")
DCX_F32_ROUND(frint, "rni")
#undef DCX_F32_ROUND
__device__ __forceinline__ double ffloor(double a) { return floor(a); }
__device__ __forceinline__ double fceil(double a) { return ceil(a); }
__device__ __forceinline__ double ftrunc(double a) { return trunc(a); }
__device__ __forceinline__ double frint(double a) { return rint(a); }
// fmod is one out-of-line function: CUDA's exact fmod is a long loop, and inlined into each of
// a tile's unrolled items it made a module with `%` or `//` 13x larger and 12-20x slower to
// compile (nvcc -cubin, sm_90, a single-pass values module: 22-33 s against 1.5-2 s).
// float32 (and float16, through float) has its own: fmod is exact, so fmodf of two floats is
// bit for bit the double fmod of them rounded back, but its loop runs over float's exponent
// range, not double's: `x % 5 == 1` on 2^26 float32 took 0.83 ms through dmod, against 0.23 ms
// for `x < 0.5` and 0.46 ms for PyTorch's `x[x % 5 == 1]` (one H200, 2026-12-04).
__device__ __noinline__ double dmod(double a, double b) { return fmod(a, b); }
// CuPy compiles with -ftz=true, under which fmodf flushes subnormals (3e-39 % 3 gave 0 on an
// H200, 2026-12-04), so fmodf takes only operands of magnitude 2^-100 or more (and inf, NaN):
// with both there, a non-zero remainder is a multiple of an ulp of at least 2^-123, never
// subnormal. Anything smaller goes through dmod, in double, where no float is subnormal.
// The test sits in the inlined ffmod and smod stays a leaf around fmodf: with the test and
// the dmod call inside smod, float32 `x % 5 == 1` on 2^26 took 0.63-0.74 ms, as a leaf
// 0.46-0.49 ms (one H200, same machine, three rounds each, 2026-12-04).
__device__ __noinline__ float smod(float a, float b) { return fmodf(a, b); }
__device__ __forceinline__ float ffmod(float a, float b) {
  const unsigned int min_bits = 0x0d800000u;  // 2^-100: biased exponent 27, mantissa 0
  if ((__float_as_uint(a) & 0x7fffffffu) >= min_bits && (__float_as_uint(b) & 0x7fffffffu) >= min_bits)
    return smod(a, b);
  return double_to_float(dmod(float_to_double(a), float_to_double(b)));
}
__device__ __forceinline__ double ffmod(double a, double b) { return dmod(a, b); }

// NumPy's npy_divmod: floor division and remainder of floats, with its corner cases. Out of
// line for the same reason as dmod (with it inlined per item, `//` modules compiled 2x slower
// than `%` ones even with dmod apart); the pair is returned by value, not through a pointer,
// which an out-of-line callee would make a local-memory store.
template <class F>
struct divmod_pair {
  F div, mod;
};
template <class F>
__device__ __noinline__ divmod_pair<F> fdivmod_pair(F a, F b) {
  F mod = ffmod(a, b);
  if (feq(b, F(0))) return {fdiv(a, b), mod};  // exact compare: a subnormal divisor is not zero
  F div = fdiv(fsub(a, mod), b);
  if (fne(mod, F(0))) {
    if (flt(b, F(0)) != flt(mod, F(0))) {
      mod = fadd(mod, b);
      div = fsub(div, F(1));
    }
  } else {
    mod = fcopysign(F(0), b);
  }
  F floordiv;
  if (fne(div, F(0))) {
    floordiv = ffloor(div);
    if (fgt(fsub(div, floordiv), F(0.5))) floordiv = fadd(floordiv, F(1));
  } else {
    floordiv = fcopysign(F(0), fdiv(a, b));
  }
  return {floordiv, mod};
}
template <class F>
__device__ __forceinline__ F fdivmod(F a, F b, F* mod_out) {
  divmod_pair<F> r = fdivmod_pair(a, b);
  *mod_out = r.mod;
  return r.div;
}

// float32 transcendentals through float64, rounded once.
#define DCX_UNARY_VIA_DOUBLE(NAME, FN)                                                  \
  __device__ __forceinline__ float NAME(float a) { return double_to_float(FN(float_to_double(a))); } \
  __device__ __forceinline__ double NAME(double a) { return FN(a); }
DCX_UNARY_VIA_DOUBLE(fexp, exp)
DCX_UNARY_VIA_DOUBLE(flog, log)
DCX_UNARY_VIA_DOUBLE(flog2, log2)
DCX_UNARY_VIA_DOUBLE(flog10, log10)
DCX_UNARY_VIA_DOUBLE(fsin, sin)
DCX_UNARY_VIA_DOUBLE(fcos, cos)
DCX_UNARY_VIA_DOUBLE(ftan, tan)
#undef DCX_UNARY_VIA_DOUBLE
__device__ __forceinline__ float fsqrt(float a) { return f32_sqrt(a); }
__device__ __forceinline__ double fsqrt(double a) { return __dsqrt_rn(a); }
// np.reciprocal of floats is 1/x rounded once (float16 through float, as its loop does)
__device__ __forceinline__ float frecip(float a) { return fdiv(1.0f, a); }
__device__ __forceinline__ double frecip(double a) { return fdiv(1.0, a); }
// pow is out of line, as dmod is: inlined into every unrolled item it made a predicate's first
// call on an empty cache wait 2.2-2.5 s (float32 `x ** 1.5 < 3`) or 3.9-4.4 s (float64) for
// NVRTC, against 0.48-0.55 s out of line, which costs up to 7% per call (2^26 float32
// 0.77 -> 0.81-0.83 ms; one H200, 2026-12-04). exp/log/sin stay inline: out of line their
// first calls took 0.2-1.0 s less, but calls ran slower (float32 sin 1.5x, float64
// exp/log/sin 7-12%). 64-bit integer division: see ifloordiv_wide below.
__device__ __noinline__ double dpow(double a, double b) { return pow(a, b); }
__device__ __forceinline__ float fpow(float a, float b) {
  return double_to_float(dpow(float_to_double(a), float_to_double(b)));
}
__device__ __forceinline__ double fpow(double a, double b) { return dpow(a, b); }

// ---------------------------------------------------------------- type plumbing ---------------
template <class T>
struct is_int {
  static constexpr bool v = kind<T>::v == 0;
};
template <class T>
struct is_bool {
  static constexpr bool v = is_same<T, bool>::value;
};
template <class T>
struct unsigned_of {
  typedef T type;
};
template <>
struct unsigned_of<signed char> {
  typedef unsigned char type;
};
template <>
struct unsigned_of<char> {
  typedef unsigned char type;
};
template <>
struct unsigned_of<short> {
  typedef unsigned short type;
};
template <>
struct unsigned_of<int> {
  typedef unsigned int type;
};
template <>
struct unsigned_of<long long> {
  typedef unsigned long long type;
};
template <>
struct unsigned_of<long> {
  typedef unsigned long type;
};
// Integer arithmetic wraps as NumPy's does, so it is done in an unsigned type at least as wide
// as int: unsigned char and short promote to *signed* int, where a product can overflow
// (undefined behaviour: 65535 * 65535).
template <class U, bool NARROW = (sizeof(U) < sizeof(unsigned int))>
struct wide_unsigned {
  typedef U type;
};
template <class U>
struct wide_unsigned<U, true> {
  typedef unsigned int type;
};
// A 32-bit result cut to T. For 16-bit T by an explicit cvt that the compiler cannot fold:
// ptxas (CUDA 13.0, measured on an H200) miscompiles a 16-bit negation followed by a 16-bit
// compare, -(short)-32768 compared as +32768 (a probe: `-v > 0` selected int16 -32768). LLVM
// folds every C++ spelling of 0 - a (a literal 0, an opaque 0 from asm, a * 0xFFFF, a
// truncation from unsigned int) into neg.s16; the negation done in 32 bits and cut by
// cvt.s16.s32 compared right.
template <class T, class W>
__device__ __forceinline__ T narrow(W x) {
  if constexpr (sizeof(T) == 2 && T(-1) < T(0)) {
    short r;
    asm("cvt.s16.s32 %0, %1;" : "=h"(r) : "r"((int)x));
    return (T)r;
  } else if constexpr (sizeof(T) == 2) {
    unsigned short r;
    asm("cvt.u16.u32 %0, %1;" : "=h"(r) : "r"((unsigned)x));
    return (T)r;
  } else {
    return (T)(typename unsigned_of<T>::type)x;
  }
}
// a + b, a - b, a * b of integers of type T modulo 2^bits(T): computed in W, never promoted
template <class T>
struct wrap {
  typedef typename unsigned_of<T>::type U;
  typedef typename wide_unsigned<U>::type W;
  static __device__ __forceinline__ T add(T a, T b) { return narrow<T>((W)(U)a + (W)(U)b); }
  static __device__ __forceinline__ T sub(T a, T b) { return narrow<T>((W)(U)a - (W)(U)b); }
  static __device__ __forceinline__ T mul(T a, T b) { return narrow<T>((W)(U)a * (W)(U)b); }
};
template <class T>
__device__ __forceinline__ bool is_negative(T x) {
  return x < T(0);
}

// Apply a float function to float16 through float32 and round back (NumPy's half loops).
#define DCX_HALF1(EXPR) float_to_half(EXPR)
__device__ __forceinline__ float hf(half_t h) { return half_to_float(h); }

// ---------------------------------------------------------------- comparisons ------------------
// Complex ordering of NumPy (loops.c.src CLT/CLE/CGT/CGE/CEQ/CNE).
template <class C>
__device__ __forceinline__ bool c_lt(C x, C y) {
  return (flt(x.re, y.re) && !fisnan(x.im) && !fisnan(y.im)) || (feq(x.re, y.re) && flt(x.im, y.im));
}
template <class C>
__device__ __forceinline__ bool c_le(C x, C y) {
  return (flt(x.re, y.re) && !fisnan(x.im) && !fisnan(y.im)) || (feq(x.re, y.re) && fle(x.im, y.im));
}
template <class C>
__device__ __forceinline__ bool c_gt(C x, C y) {
  return (fgt(x.re, y.re) && !fisnan(x.im) && !fisnan(y.im)) || (feq(x.re, y.re) && fgt(x.im, y.im));
}
template <class C>
__device__ __forceinline__ bool c_ge(C x, C y) {
  return (fgt(x.re, y.re) && !fisnan(x.im) && !fisnan(y.im)) || (feq(x.re, y.re) && fge(x.im, y.im));
}

#define DCX_CMP(NAME, OP, FOP, COP)                                             \
  template <class T>                                                            \
  __device__ __forceinline__ bool NAME(T a, T b) {                              \
    if constexpr (kind<T>::v == 0) return a OP b;                               \
    else if constexpr (kind<T>::v == 1) return FOP(hf(a), hf(b));               \
    else if constexpr (kind<T>::v <= 3) return FOP(a, b);                       \
    else return COP;                                                            \
  }
DCX_CMP(less, <, flt, c_lt(a, b))
DCX_CMP(less_equal, <=, fle, c_le(a, b))
DCX_CMP(greater, >, fgt, c_gt(a, b))
DCX_CMP(greater_equal, >=, fge, c_ge(a, b))
DCX_CMP(equal, ==, feq, feq(a.re, b.re) && feq(a.im, b.im))
DCX_CMP(not_equal, !=, fne, fne(a.re, b.re) || fne(a.im, b.im))
#undef DCX_CMP

// int64 against uint64 (NumPy's exact loops for the pair, e.g. a uint64 array against an
// np.int64 constant): a negative int64 is below every uint64, any other compares as uint64.
// The typed predicate hands each operand in its own type, which the templates above cannot
// take (they want one T), so these overloads are the pair's.
#define DCX_CMP_MIXED(NAME, OP, NEG_LEFT, NEG_RIGHT)                                 \
  __device__ __forceinline__ bool NAME(i64 a, u64 b) {                               \
    return a < 0 ? NEG_LEFT : ((u64)a OP b);                                         \
  }                                                                                  \
  __device__ __forceinline__ bool NAME(u64 a, i64 b) {                               \
    return b < 0 ? NEG_RIGHT : (a OP (u64)b);                                        \
  }
DCX_CMP_MIXED(less, <, true, false)
DCX_CMP_MIXED(less_equal, <=, true, false)
DCX_CMP_MIXED(greater, >, false, true)
DCX_CMP_MIXED(greater_equal, >=, false, true)
DCX_CMP_MIXED(equal, ==, false, false)
DCX_CMP_MIXED(not_equal, !=, true, true)
#undef DCX_CMP_MIXED

// ---------------------------------------------------------------- logic and bits ---------------
template <class T>
__device__ __forceinline__ bool logical_and(T a, T b) { return truth(a) && truth(b); }
template <class T>
__device__ __forceinline__ bool logical_or(T a, T b) { return truth(a) || truth(b); }
template <class T>
__device__ __forceinline__ bool logical_xor(T a, T b) { return truth(a) != truth(b); }
template <class T>
__device__ __forceinline__ bool logical_not(T a) { return !truth(a); }

template <class T>
__device__ __forceinline__ T bitwise_and(T a, T b) { return (T)(a & b); }
template <class T>
__device__ __forceinline__ T bitwise_or(T a, T b) { return (T)(a | b); }
template <class T>
__device__ __forceinline__ T bitwise_xor(T a, T b) { return (T)(a ^ b); }
template <class T>
__device__ __forceinline__ T invert(T a) {
  if constexpr (is_bool<T>::v) return !a;
  else return (T)(~a);
}
// npy_lshift / npy_rshift: the shift count is taken as unsigned, so a negative one is "too big".
template <class T>
__device__ __forceinline__ T left_shift(T a, T b) {
  typedef typename unsigned_of<T>::type U;
  typedef typename wide_unsigned<U>::type W;  // a short shifted in int can overflow it
  if ((unsigned long long)(long long)b < sizeof(T) * 8) return narrow<T>((W)(U)a << (W)(U)b);
  return T(0);
}
template <class T>
__device__ __forceinline__ T right_shift(T a, T b) {
  if ((unsigned long long)(long long)b < sizeof(T) * 8) return (T)(a >> b);
  return is_negative(a) ? T(-1) : T(0);
}

// ---------------------------------------------------------------- arithmetic -------------------
template <class T>
__device__ __forceinline__ T add(T a, T b) {
  if constexpr (is_bool<T>::v) return a || b;
  else if constexpr (kind<T>::v == 0) {
    return wrap<T>::add(a, b);
  } else if constexpr (kind<T>::v == 1) return DCX_HALF1(fadd(hf(a), hf(b)));
  else if constexpr (kind<T>::v <= 3) return fadd(a, b);
  else return T{fadd(a.re, b.re), fadd(a.im, b.im)};
}
template <class T>
__device__ __forceinline__ T subtract(T a, T b) {
  if constexpr (kind<T>::v == 0) {
    return wrap<T>::sub(a, b);
  } else if constexpr (kind<T>::v == 1) return DCX_HALF1(fsub(hf(a), hf(b)));
  else if constexpr (kind<T>::v <= 3) return fsub(a, b);
  else return T{fsub(a.re, b.re), fsub(a.im, b.im)};
}
template <class T>
__device__ __forceinline__ T multiply(T a, T b) {
  if constexpr (is_bool<T>::v) return a && b;
  else if constexpr (kind<T>::v == 0) {
    return wrap<T>::mul(a, b);
  } else if constexpr (kind<T>::v == 1) return DCX_HALF1(fmul(hf(a), hf(b)));
  else if constexpr (kind<T>::v <= 3) return fmul(a, b);
  else return T{fsub(fmul(a.re, b.re), fmul(a.im, b.im)), fadd(fmul(a.re, b.im), fmul(a.im, b.re))};
}
template <class T>
__device__ __forceinline__ T true_divide(T a, T b) {
  // Integer inputs never get here: NumPy's loop for them is float64 (the caller casts).
  if constexpr (kind<T>::v == 1) return DCX_HALF1(fdiv(hf(a), hf(b)));
  else if constexpr (kind<T>::v <= 3) return fdiv(a, b);
  else {
    // NumPy's complex division (Smith's method, loops.c.src).
    auto in1r = a.re, in1i = a.im, in2r = b.re, in2i = b.im;
    auto ar = fabs_(in2r), ai = fabs_(in2i);
    if (fge(ar, ai)) {
      if (feq(ar, decltype(ar)(0)) && feq(ai, decltype(ai)(0))) return T{fdiv(in1r, ar), fdiv(in1i, ai)};
      auto rat = fdiv(in2i, in2r);
      auto scl = fdiv(decltype(rat)(1), fadd(in2r, fmul(in2i, rat)));
      return T{fmul(fadd(in1r, fmul(in1i, rat)), scl), fmul(fsub(in1i, fmul(in1r, rat)), scl)};
    }
    auto rat = fdiv(in2r, in2i);
    auto scl = fdiv(decltype(rat)(1), fadd(in2i, fmul(in2r, rat)));
    return T{fmul(fadd(fmul(in1r, rat), in1i), scl), fmul(fsub(fmul(in1i, rat), in1r), scl)};
  }
}
// Floor division and remainder of integers as NumPy's loops: b is neither 0 nor (signed) -1.
template <class T>
__device__ __forceinline__ T ifloordiv(T a, T b) {
  T q = a / b;
  if constexpr (T(-1) < T(0)) {
    if ((a % b != 0) && ((a < 0) != (b < 0))) q = q - 1;
  }
  return q;
}
template <class T>
__device__ __forceinline__ T iremainder(T a, T b) {
  T r = a % b;
  if constexpr (T(-1) < T(0)) {
    if (r != 0 && ((r < 0) != (b < 0))) r = r + b;
  }
  return r;
}
template <class T>
struct half_width;  // the 32-bit (type) and 64-bit (full) integers of a 64-bit one's signedness
template <>
struct half_width<long long> {
  typedef int type;
  typedef long long full;
};
template <>
struct half_width<long> {
  typedef int type;
  typedef long long full;
};
template <>
struct half_width<unsigned long long> {
  typedef unsigned int type;
  typedef unsigned long long full;
};
template <>
struct half_width<unsigned long> {
  typedef unsigned int type;
  typedef unsigned long long full;
};
// 64-bit integer division is a long software routine on the GPU; 32-bit division is a few
// multiplies by the divisor's reciprocal, which the compiler hoists out of a tile's unrolled
// items. Operands that both fit in 32 bits (counts, labels, small values stored as int64) are
// divided in 32 bits, exactly. One H200, public compact_array on 2^26 int64 (ms, two rounds):
// `x // 7 == 2` 0.66-0.72 -> 0.35-0.39, `x % 7 == 2` 0.63-0.74 -> 0.37-0.41
// (benchmarks/results/2026-12-04_h200_int64_division_and_2byte_schedule_ab.md).
//
// The rest (hashes, ids, products past 32 bits) is divided without an integer division, by
// the double reciprocal rb of b and two correction steps (divmod64):
//   q0 = trunc(a * rb): relative error under 4 * 2^-53, so r1 = a - q0 * b, exact in wrapping
//        64-bit arithmetic, is under 2^13 + |b| in magnitude (|a| < 2^64);
//   q1 = floor(r1 * rb): r1 / b is under 2^13 / |b| + 1, its error far under one, so
//        q0 + q1 is floor(a / b) or one off it (k * b * rb can round below k: b = 49);
//   a select moves q by one where r = a - q * b is not of b's sign or reaches |b|.
// The conversions saturate (PTX cvt), so a * rb rounded up to 2^63 (a = MAX, b = 1) or 2^64
// gives a q0 one or a thousand off, which the steps correct alike. Every divisor but 0 and
// the signed -1 (handled before); unsigned divisors from 2^63 give a quotient of 0 or 1.
// A NumPy model of the steps matched exact integers on 3 million edge, random and
// near-multiple pairs with divisors of every magnitude; tests/gpu/test_out_of_line_math.py
// checks every bit of the device's quotients and remainders.
// rb is computed beside the 32-bit test, not in the out-of-line function, so that a thread's
// unrolled items share it where b is the call's constant (one division per thread, not one
// per item); the steps stay out of line (inlined they doubled the module and the first call:
// int64 2.1-2.8 -> 4.7-6.6 s). One H200, 2^26, public compact_array, three rounds each:
// int64 `(x * 100000000000) // 7 == 2` 0.67-0.72 (the software routine) -> 0.50-0.57 (the
// steps, rb in them) -> 0.435-0.437 (rb shared), int64 hashes `% 1000` 0.64-0.71 -> 0.48-0.59
// -> 0.46, uint64 hashes `% 16` 0.57 -> 0.52-0.53 -> 0.41-0.42; within 32 bits level
// (benchmarks/results/2026-12-04_h200_int64_division_past_32_bits_ab.md).
__device__ __forceinline__ long long divmod64(long long a, long long b, double rb, long long* rem) {
  typedef unsigned long long U;
  const long long q0 = __double2ll_rz(__ll2double_rn(a) * rb);
  const long long r1 = (long long)((U)a - (U)q0 * (U)b);
  const long long q1 = __double2ll_rd(__ll2double_rn(r1) * rb);
  long long q = (long long)((U)q0 + (U)q1), r = (long long)((U)r1 - (U)q1 * (U)b);
  const bool low = r != 0 && ((r < 0) != (b < 0));
  const bool high = b > 0 ? r >= b : r <= b;
  if (low) { q = (long long)((U)q - 1); r = (long long)((U)r + (U)b); }
  if (high) { q = (long long)((U)q + 1); r = (long long)((U)r - (U)b); }
  *rem = r;
  return q;
}
__device__ __forceinline__ unsigned long long divmod64(unsigned long long a, unsigned long long b,
                                                       double rb, unsigned long long* rem) {
  typedef unsigned long long U;
  if ((long long)b < 0) {  // b >= 2^63: the residual below would not fit a signed 64-bit int
    const U q = a >= b;
    *rem = a - q * b;
    return q;
  }
  const U q0 = __double2ull_rz(__ull2double_rn(a) * rb);
  const long long r1 = (long long)(a - q0 * b);
  const long long q1 = __double2ll_rd(__ll2double_rn(r1) * rb);
  U q = q0 + (U)q1;
  long long r = (long long)((U)r1 - (U)q1 * b);
  if (r < 0) { q -= 1; r = (long long)((U)r + b); }
  else if (r >= (long long)b) { q += 1; r = (long long)((U)r - b); }
  *rem = (U)r;
  return q;
}
template <class T>
__device__ __noinline__ T ifloordiv_wide(T a, T b, double rb) {
  typedef typename half_width<T>::full L;
  L r;
  return (T)divmod64((L)a, (L)b, rb, &r);
}
template <class T>
__device__ __noinline__ T iremainder_wide(T a, T b, double rb) {
  typedef typename half_width<T>::full L;
  L r;
  divmod64((L)a, (L)b, rb, &r);
  return (T)r;
}
template <class T>
__device__ __forceinline__ bool fits_half(T a, T b) {
  typedef typename half_width<T>::type N;
  return (T)(N)a == a && (T)(N)b == b;
}
template <class T>
__device__ __forceinline__ T floor_divide(T a, T b) {
  if constexpr (kind<T>::v == 0) {
    if (b == T(0)) return T(0);
    if constexpr (T(-1) < T(0)) {
      // most negative // -1 overflows: NumPy returns the most negative value (two's complement)
      if (b == T(-1)) return wrap<T>::sub(T(0), a);
    }
    if constexpr (sizeof(T) == 8) {
      typedef typename half_width<T>::type N;
      const double rb = 1.0 / (double)b;  // b's alone: shared by a thread's items
      if (fits_half(a, b)) return (T)ifloordiv((N)a, (N)b);
      return ifloordiv_wide(a, b, rb);
    } else {
      return ifloordiv(a, b);
    }
  } else if constexpr (kind<T>::v == 1) {
    float m;
    return float_to_half(fdivmod(hf(a), hf(b), &m));
  } else {
    T m;
    return fdivmod(a, b, &m);
  }
}
template <class T>
__device__ __forceinline__ T remainder(T a, T b) {
  if constexpr (kind<T>::v == 0) {
    if (b == T(0)) return T(0);
    if constexpr (T(-1) < T(0)) {
      if (b == T(-1)) return T(0);
    }
    if constexpr (sizeof(T) == 8) {
      typedef typename half_width<T>::type N;
      const double rb = 1.0 / (double)b;  // b's alone: shared by a thread's items
      if (fits_half(a, b)) return (T)iremainder((N)a, (N)b);
      return iremainder_wide(a, b, rb);
    } else {
      return iremainder(a, b);
    }
  } else if constexpr (kind<T>::v == 1) {
    float m, fa = hf(a), fb = hf(b);
    if (feq(fb, 0.0f)) return float_to_half(ffmod(fa, fb));
    fdivmod(fa, fb, &m);
    return float_to_half(m);
  } else {
    if (feq(b, T(0))) return ffmod(a, b);
    T m;
    fdivmod(a, b, &m);
    return m;
  }
}
template <class T>
__device__ __forceinline__ T negative(T a) {
  if constexpr (kind<T>::v == 0) {
    return wrap<T>::sub(T(0), a);
  } else if constexpr (kind<T>::v == 1) return half_t{(u16)(a.bits ^ 0x8000u)};
  else if constexpr (kind<T>::v <= 3) return fneg(a);
  else return T{fneg(a.re), fneg(a.im)};
}
template <class T>
__device__ __forceinline__ T positive(T a) { return a; }
template <class T>
__device__ __forceinline__ auto absolute(T a) {
  if constexpr (is_bool<T>::v) return a;
  else if constexpr (kind<T>::v == 0) return is_negative(a) ? negative(a) : a;
  else if constexpr (kind<T>::v == 1) return half_t{(u16)(a.bits & 0x7fffu)};
  else if constexpr (kind<T>::v <= 3) return fabs_(a);
  else if constexpr (kind<T>::v == 4)
    return double_to_float(hypot(float_to_double(a.re), float_to_double(a.im)));
  else return hypot(a.re, a.im);
}
template <class T>
__device__ __forceinline__ T square(T a) { return multiply(a, a); }
template <class T>
__device__ __forceinline__ T power(T a, T b) {
  if constexpr (kind<T>::v == 0) {
    // NumPy raises for a negative integer exponent; a kernel cannot, so it gives 0 as CuPy does.
    if (is_negative(b)) return T(0);
    typedef typename unsigned_of<T>::type U;
    typedef typename wide_unsigned<U>::type W;  // products in W: see wrap
    U base = (U)a, e = (U)b, r = 1;
    while (e) {
      if (e & 1) r = (U)((W)r * (W)base);
      base = (U)((W)base * (W)base);
      e >>= 1;
    }
    return (T)r;
  } else if constexpr (kind<T>::v == 1) return DCX_HALF1(fpow(hf(a), hf(b)));
  else return fpow(a, b);
}

// minimum/maximum propagate NaN; fmin/fmax ignore it. A tie (+0.0 against -0.0) gives the
// second operand for float32/64, as x86 NumPy's loops do (scalar_min_f is SSE's minss, and
// the SIMD npyv_minn: `a < b ? a : b`, a NaN in `a` kept) and as the CPU loop
// (codegen/numba_loop.minmax) does; float16's loops (loops.c.src: npy_half_le(a, b) ||
// isnan(a) ? a : b) give the first, and so does complex's CLE. NumPy is not the same
// everywhere there: aarch64's fmin/fmax instructions order -0.0 below +0.0, and x86's
// np.fmin/np.fmax ties change with the array's length and strides (docs/design.md).
template <class T>
__device__ __forceinline__ T minimum(T a, T b) {
  if constexpr (is_bool<T>::v) return a && b;
  else if constexpr (kind<T>::v == 0) return a < b ? a : b;
  else if constexpr (kind<T>::v == 1) return (fle(hf(a), hf(b)) || fisnan(hf(a))) ? a : b;
  else if constexpr (kind<T>::v <= 3) return (flt(a, b) || fisnan(a)) ? a : b;
  else return (fisnan(a.re) || fisnan(a.im) || c_le(a, b)) ? a : b;
}
template <class T>
__device__ __forceinline__ T maximum(T a, T b) {
  if constexpr (is_bool<T>::v) return a || b;
  else if constexpr (kind<T>::v == 0) return a > b ? a : b;
  else if constexpr (kind<T>::v == 1) return (fge(hf(a), hf(b)) || fisnan(hf(a))) ? a : b;
  else if constexpr (kind<T>::v <= 3) return (fgt(a, b) || fisnan(a)) ? a : b;
  else return (fisnan(a.re) || fisnan(a.im) || c_ge(a, b)) ? a : b;
}
template <class T>
__device__ __forceinline__ T fmin(T a, T b) {
  if constexpr (kind<T>::v == 0) return minimum(a, b);
  else if constexpr (kind<T>::v == 1) return (fle(hf(a), hf(b)) || fisnan(hf(b))) ? a : b;
  else if constexpr (kind<T>::v <= 3) return (flt(a, b) || fisnan(b)) ? a : b;
  else return (fisnan(b.re) || fisnan(b.im) || c_le(a, b)) ? a : b;
}
template <class T>
__device__ __forceinline__ T fmax(T a, T b) {
  if constexpr (kind<T>::v == 0) return maximum(a, b);
  else if constexpr (kind<T>::v == 1) return (fge(hf(a), hf(b)) || fisnan(hf(b))) ? a : b;
  else if constexpr (kind<T>::v <= 3) return (fgt(a, b) || fisnan(b)) ? a : b;
  else return (fisnan(b.re) || fisnan(b.im) || c_ge(a, b)) ? a : b;
}

// ---------------------------------------------------------------- floating point ---------------
#define DCX_FLOAT_UNARY(NAME, FN, INT_RESULT)                                 \
  template <class T>                                                          \
  __device__ __forceinline__ T NAME(T a) {                                    \
    if constexpr (kind<T>::v == 0) return INT_RESULT;                         \
    else if constexpr (kind<T>::v == 1) return DCX_HALF1(FN(hf(a)));          \
    else return FN(a);                                                        \
  }
// Integer floor/ceil/trunc are the identity (NumPy >= 2.1 has integer loops for them); the
// others have float loops only, so integers never reach them.
DCX_FLOAT_UNARY(floor, ffloor, a)
DCX_FLOAT_UNARY(ceil, fceil, a)
DCX_FLOAT_UNARY(trunc, ftrunc, a)
DCX_FLOAT_UNARY(rint, frint, a)
DCX_FLOAT_UNARY(sqrt, fsqrt, a)
DCX_FLOAT_UNARY(reciprocal, frecip, a)  // floats only: see expr.resolve_scalar_powers
DCX_FLOAT_UNARY(exp, fexp, a)
DCX_FLOAT_UNARY(log, flog, a)
DCX_FLOAT_UNARY(log2, flog2, a)
DCX_FLOAT_UNARY(log10, flog10, a)
DCX_FLOAT_UNARY(sin, fsin, a)
DCX_FLOAT_UNARY(cos, fcos, a)
DCX_FLOAT_UNARY(tan, ftan, a)
#undef DCX_FLOAT_UNARY

template <class T>
__device__ __forceinline__ T sign(T a) {
  if constexpr (kind<T>::v == 0) {
    if constexpr (T(-1) < T(0)) return (T)((a > 0) - (a < 0));
    else return (T)(a > 0);
  } else if constexpr (kind<T>::v == 1) {
    float f = hf(a);
    return fisnan(f) ? a : float_to_half(fgt(f, 0.0f) ? 1.0f : (flt(f, 0.0f) ? -1.0f : 0.0f));
  } else {
    return fisnan(a) ? a : (fgt(a, T(0)) ? T(1) : (flt(a, T(0)) ? T(-1) : T(0)));
  }
}
template <class T>
__device__ __forceinline__ bool isnan(T a) {
  if constexpr (kind<T>::v == 0) return false;
  else if constexpr (kind<T>::v == 1) return (a.bits & 0x7fffu) > 0x7c00u;
  else if constexpr (kind<T>::v <= 3) return fisnan(a);
  else return fisnan(a.re) || fisnan(a.im);
}
template <class T>
__device__ __forceinline__ bool isinf(T a) {
  if constexpr (kind<T>::v == 0) return false;
  else if constexpr (kind<T>::v == 1) return (a.bits & 0x7fffu) == 0x7c00u;
  else if constexpr (kind<T>::v <= 3) return fisinf(a);
  else return fisinf(a.re) || fisinf(a.im);
}
template <class T>
__device__ __forceinline__ bool isfinite(T a) {
  if constexpr (kind<T>::v == 0) return true;
  else if constexpr (kind<T>::v == 1) return (a.bits & 0x7c00u) != 0x7c00u;
  else if constexpr (kind<T>::v <= 3) return fisfinite(a);
  else return fisfinite(a.re) && fisfinite(a.im);
}
template <class T>
__device__ __forceinline__ bool signbit(T a) {
  if constexpr (kind<T>::v == 1) return (a.bits & 0x8000u) != 0;
  else if constexpr (kind<T>::v == 2) return (f32_bits(a) & 0x80000000u) != 0;
  else return __double_as_longlong(a) < 0;
}

// ---------------------------------------------------------------- special ----------------------
template <class T>
__device__ __forceinline__ T where(bool c, T a, T b) { return c ? a : b; }
template <class T>
__device__ __forceinline__ auto real(T a) {
  if constexpr (kind<T>::v >= 4) return a.re;
  else return a;
}
template <class T>
__device__ __forceinline__ auto imag(T a) {
  if constexpr (kind<T>::v >= 4) return a.im;
  else if constexpr (kind<T>::v == 1) return half_t{0};
  else return T(0);
}

#undef DCX_HALF1
}  // namespace np
}  // namespace dcx
