// The C++ backend's preamble and helpers (codegen/cpp.py): a translation unit gets the
// helpers its kernels call, by name.  Each section runs from its `//! section NAME` line
// to the next.
// float16 and bfloat16 are stored as uint16_t and computed in float.
//! section preamble
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(MC_LIBMVEC)
// glibc's vector math library (libmvec) has SIMD versions of these: declaring them lets
// the compiler vectorise loops that call them (the runtime links -lmvec and defines
// MC_LIBMVEC where glibc >= 2.35 provides them).
#define MC_SIMD __attribute__((simd("notinbranch")))
extern "C" {
MC_SIMD_DECLARATIONS
}
#endif
//! section low_precision
static inline float mc_bf16_to_float(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t mc_float_to_bf16(float f) {  // round to nearest even
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}
#if defined(__FLT16_MANT_DIG__)
static inline float mc_half_to_float(uint16_t h) {
    _Float16 v;
    std::memcpy(&v, &h, 2);
    return static_cast<float>(v);
}
static inline uint16_t mc_float_to_half(float f) {
    _Float16 v = static_cast<_Float16>(f);
    uint16_t h;
    std::memcpy(&h, &v, 2);
    return h;
}
#else
static inline float mc_half_to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (exp == 0) {
        float f = std::ldexp(static_cast<float>(mant), -24);
        return sign ? -f : f;
    }
    u = exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp + 112) << 23) | (mant << 13));
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t mc_float_to_half(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    uint32_t mag = u & 0x7fffffffu;
    if (mag >= 0x7f800000u) return sign | (mag > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (mag >= 0x477ff000u) return sign | 0x7c00u;
    if (mag < 0x38800000u) return sign | static_cast<uint16_t>(std::nearbyint(std::fabs(f) * 16777216.0f));
    mag += 0xfffu + ((mag >> 13) & 1u);
    return sign | static_cast<uint16_t>((mag - 0x38000000u) >> 13);
}
#endif
static inline float mc_round_half(float f) { return mc_half_to_float(mc_float_to_half(f)); }
static inline float mc_round_bf16(float f) { return mc_bf16_to_float(mc_float_to_bf16(f)); }
//! section mc_erf
// erf(x) of a float in arithmetic and one exp, so that a loop calling it vectorises on
// libmvec's exp: below |x| = 0.5 its Taylor series to x^15 (truncated at 5e-10, exact
// at tiny x), from there Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7,
// against erf(0.5) = 0.52); 1.8e-7 at most from torch.erf over [-6, 6].  With glibc's
// erff (vectorised too) GELU kernels ran at half eager's speed: 0.25 ms against 0.12-0.17
// for 1024 x 256 floats forward, 0.42-0.52 against 0.30-0.32 backward with its column sum
// (one thread).  Doubles keep std::erf.
static inline float mc_erf(float x) {
    float s = x * x;
    float p = -1.492565036e-05f;
    p = p * s + 1.205533298e-04f;
    p = p * s + -8.548327023e-04f;
    p = p * s + 5.223977625e-03f;
    p = p * s + -2.686617065e-02f;
    p = p * s + 1.128379167e-01f;
    p = p * s + -3.761263890e-01f;
    p = p * s + 1.128379167e+00f;
    float t = 1.0f / (0.3275911f * std::fabs(x) + 1.0f);
    float r = (((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t
              + 0.254829592f;
    float tail = std::copysign(1.0f - r * t * std::exp(-s), x);
    return std::fabs(x) < 0.5f ? x * p : tail;
}
static inline double mc_erf(double x) { return std::erf(x); }
//! section mc_maximum
template <typename T> static inline T mc_maximum(T a, T b) { return (a > b || a != a) ? a : b; }
//! section mc_minimum
template <typename T> static inline T mc_minimum(T a, T b) { return (a < b || a != a) ? a : b; }
//! section mc_remainder
template <typename T> static inline T mc_remainder(T a, T b) {
    T r = std::fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
//! section mc_remainder_int
template <typename T> static inline T mc_remainder_int(T a, T b) {
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? static_cast<T>(r + b) : r;
}
//! section mc_floordiv
template <typename T> static inline T mc_floordiv(T a, T b) {
    if (b == 0) return a / b;
    T r = std::fmod(a, b);
    T q = (a - r) / b;
    if (r != 0 && ((b < 0) != (r < 0))) q -= 1;
    if (q == 0) return std::copysign(T(0), a / b);
    T f = std::floor(q);
    return (q - f > T(0.5)) ? f + 1 : f;
}
//! section mc_pow_int
template <typename T> static inline T mc_pow_int(T a, T b) {
    if (b < 0) return a == 1 ? T(1) : (a == -1 ? ((b & 1) ? T(-1) : T(1)) : T(0));
    T result = 1;
    while (b) {  // square and multiply, wrapping like torch's integer pow
        if (b & 1) result = static_cast<T>(result * a);
        a = static_cast<T>(a * a);
        b = static_cast<T>(b >> 1);
    }
    return result;
}
//! section mc_floordiv_int
template <typename T> static inline T mc_floordiv_int(T a, T b) {
    T q = a / b;
    return ((a % b) != 0 && ((a < 0) != (b < 0))) ? static_cast<T>(q - 1) : q;
}
