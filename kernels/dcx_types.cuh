// Storage types of NumPy dtypes on the device, and NumPy's casts between them.
//
// Self-contained on purpose (no #include of CUDA or CCCL headers): the same text compiles with
// NVRTC through cupy.RawModule, whose include paths differ between CuPy builds, and with nvcc in
// CI. float16 and complex are plain structs with NumPy's layout (itemsize == alignment, as CuPy
// packs its scalar kernel arguments), so a pointer to a CuPy array of that dtype or a NumPy
// scalar argument of that dtype can be passed as is.
//
// CuPy compiles every module with -ftz=true (flush float32 subnormals to zero) and NumPy does
// not; float32 operations whose result differs on subnormals are therefore written as inline
// PTX without the .ftz modifier (the flag does not reach inside asm), so compiled predicates
// compare and convert subnormal values exactly as NumPy does.
#pragma once

namespace dcx {

typedef signed char i8;
typedef short i16;
typedef int i32;
typedef long long i64;
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// NumPy float16: the IEEE binary16 bits. Arithmetic happens in float32 and is rounded back
// per operation, as NumPy's half loops do (npy_half_to_float, op, npy_float_to_half).
struct __align__(2) half_t {
  u16 bits;
};
// NumPy complex64 / complex128: (real, imag), aligned to their itemsize.
struct __align__(8) cfloat {
  float re, im;
};
struct __align__(16) cdouble {
  double re, im;
};

// ---- exact float32 primitives (no flush to zero, never contracted into an FMA) ----------------
__device__ __forceinline__ float f32_add(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float f32_sub(float a, float b) {
  float r;
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float f32_mul(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float f32_div(float a, float b) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float f32_sqrt(float a) {
  float r;
  asm("sqrt.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}
// Comparisons with setp without .ftz: a subnormal is not zero. Ordered (false on NaN) except ne.
#define DCX_F32_CMP(NAME, OP)                                                         \
  __device__ __forceinline__ bool NAME(float a, float b) {                          \
    unsigned r;                                                                     \
    asm("{ .reg .pred p; setp." OP ".f32 p, %1, %2; selp.u32 %0, 1, 0, p; }"        \
        : "=r"(r)                                                                   \
        : "f"(a), "f"(b));                                                          \
    return r != 0;                                                                  \
  }
DCX_F32_CMP(f32_lt, "lt")
DCX_F32_CMP(f32_le, "le")
DCX_F32_CMP(f32_gt, "gt")
DCX_F32_CMP(f32_ge, "ge")
DCX_F32_CMP(f32_eq, "eq")
DCX_F32_CMP(f32_ne, "neu")
#undef DCX_F32_CMP

__device__ __forceinline__ u32 f32_bits(float a) { return __float_as_uint(a); }
__device__ __forceinline__ float f32_from_bits(u32 b) { return __uint_as_float(b); }
__device__ __forceinline__ bool f32_isnan(float a) { return (f32_bits(a) & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ bool f32_isinf(float a) { return (f32_bits(a) & 0x7fffffffu) == 0x7f800000u; }
__device__ __forceinline__ bool f32_isfinite(float a) { return (f32_bits(a) & 0x7f800000u) != 0x7f800000u; }
__device__ __forceinline__ float f32_neg(float a) { return f32_from_bits(f32_bits(a) ^ 0x80000000u); }
__device__ __forceinline__ float f32_abs(float a) { return f32_from_bits(f32_bits(a) & 0x7fffffffu); }

__device__ __forceinline__ bool f64_isnan(double a) { return a != a; }
// On the bits, as IEEE 754 defines negate and abs (NaNs included) and NumPy's loops compute
// them: nvcc's -a and fabs(a) of a float64 NaN left its sign bit as it was (the GPU probe of
// 2026-11-30, fifth session: signbit(-x) of NaN differed from NumPy's; float32 was right).
__device__ __forceinline__ double f64_neg(double a) {
  return __longlong_as_double(__double_as_longlong(a) ^ (long long)0x8000000000000000ull);
}
__device__ __forceinline__ double f64_abs(double a) {
  return __longlong_as_double(__double_as_longlong(a) & 0x7fffffffffffffffll);
}
__device__ __forceinline__ bool f64_isinf(double a) {
  return (__double_as_longlong(a) & 0x7fffffffffffffffll) == 0x7ff0000000000000ll;
}
__device__ __forceinline__ bool f64_isfinite(double a) {
  return (__double_as_longlong(a) & 0x7ff0000000000000ll) != 0x7ff0000000000000ll;
}

// ---- conversions between the float formats (round to nearest even, subnormals kept) ----------
__device__ __forceinline__ float half_to_float(half_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
__device__ __forceinline__ half_t float_to_half(float f) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
__device__ __forceinline__ half_t double_to_half(double d) {
  // Direct rounding, as NumPy's npy_double_to_half (no double rounding through float32).
  half_t h;
  asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.bits) : "d"(d));
  return h;
}
__device__ __forceinline__ double float_to_double(float f) {
  double d;
  asm("cvt.f64.f32 %0, %1;" : "=d"(d) : "f"(f));
  return d;
}
__device__ __forceinline__ float double_to_float(double d) {
  float f;
  asm("cvt.rn.f32.f64 %0, %1;" : "=f"(f) : "d"(d));
  return f;
}

template <class A, class B>
struct is_same {
  static constexpr bool value = false;
};
template <class A>
struct is_same<A, A> {
  static constexpr bool value = true;
};

// ---- NumPy casts: cast<To>(from) -------------------------------------------------------------
// Only the casts a ufunc loop performs on its inputs are needed (NumPy's "safe" casts plus the
// where() result type), but every pair compiles: integer -> integer wraps as NumPy's astype,
// float -> integer truncates as C (NumPy's unsafe cast), anything -> bool is "!= 0".
template <class T>
struct kind {
  static constexpr int v = 0;  // 0 integer/bool, 1 half, 2 float, 3 double, 4 cfloat, 5 cdouble
};
template <>
struct kind<half_t> {
  static constexpr int v = 1;
};
template <>
struct kind<float> {
  static constexpr int v = 2;
};
template <>
struct kind<double> {
  static constexpr int v = 3;
};
template <>
struct kind<cfloat> {
  static constexpr int v = 4;
};
template <>
struct kind<cdouble> {
  static constexpr int v = 5;
};

// Any value as a double / float / bool (building blocks of cast).
template <class F>
__device__ __forceinline__ double as_double(F x) {
  if constexpr (kind<F>::v == 0) return (double)x;
  else if constexpr (kind<F>::v == 1) return float_to_double(half_to_float(x));
  else if constexpr (kind<F>::v == 2) return float_to_double(x);
  else if constexpr (kind<F>::v == 3) return x;
  else if constexpr (kind<F>::v == 4) return float_to_double(x.re);
  else return x.re;
}
template <class F>
__device__ __forceinline__ float as_float(F x) {
  if constexpr (kind<F>::v == 0) return (float)x;
  else if constexpr (kind<F>::v == 1) return half_to_float(x);
  else if constexpr (kind<F>::v == 2) return x;
  else if constexpr (kind<F>::v == 3) return double_to_float(x);
  else if constexpr (kind<F>::v == 4) return x.re;
  else return double_to_float(x.re);
}
template <class F>
__device__ __forceinline__ bool truth(F x) {
  if constexpr (kind<F>::v == 0) return x != 0;
  else if constexpr (kind<F>::v == 1) return (x.bits & 0x7fffu) != 0;  // NaN is true
  else if constexpr (kind<F>::v == 2) return (f32_bits(x) & 0x7fffffffu) != 0;
  else if constexpr (kind<F>::v == 3) return x != 0.0 || x != x;
  else return truth(x.re) || truth(x.im);
}

template <class To, class F>
__device__ __forceinline__ To cast(F x) {
  if constexpr (is_same<To, F>::value) {
    return x;
  } else if constexpr (is_same<To, bool>::value) {
    return truth(x);
  } else if constexpr (kind<To>::v == 0) {
    // to an integer type
    if constexpr (kind<F>::v == 0) return (To)x;
    else if constexpr (kind<F>::v == 1 || kind<F>::v == 2) return (To)as_float(x);
    else return (To)as_double(x);
  } else if constexpr (kind<To>::v == 1) {
    // Integers go through float32 as NumPy's casts do (exact below 2^24, inf above 65504).
    if constexpr (kind<F>::v == 3 || kind<F>::v == 5) return double_to_half(as_double(x));
    else return float_to_half(as_float(x));
  } else if constexpr (kind<To>::v == 2) {
    // int -> float32 is one correctly rounded cvt (never subnormal, so -ftz cannot matter).
    if constexpr (kind<F>::v == 3 || kind<F>::v == 5) return double_to_float(as_double(x));
    else return as_float(x);
  } else if constexpr (kind<To>::v == 3) {
    return as_double(x);
  } else if constexpr (kind<To>::v == 4) {
    if constexpr (kind<F>::v == 4) return x;
    else if constexpr (kind<F>::v == 5) return cfloat{double_to_float(x.re), double_to_float(x.im)};
    else return cfloat{cast<float>(x), 0.0f};
  } else {
    if constexpr (kind<F>::v == 4) return cdouble{float_to_double(x.re), float_to_double(x.im)};
    else if constexpr (kind<F>::v == 5) return x;
    else return cdouble{as_double(x), 0.0};
  }
}

}  // namespace dcx
