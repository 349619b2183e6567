// adjointgen runtime: first divided differences of scalar-program primitives, for CUDA kernels and
// host harnesses (__host__ __device__).  The same algorithms as adjointgen/runtime/divided/primitives.py:
// identities that turn g(p) - g(q) into a product of well-conditioned factors, the logarithm of that
// product where a factor over- or underflows, and the quotient or the midpoint series (by estimated
// error) for primitives without an identity.  Generated kernels compose them by the chain and Leibniz
// rules (adjointgen.codegen.printers.program_cuda).
#pragma once
#include <cmath>
#include <cfloat>

#ifdef __CUDACC__
#define AG_FN __host__ __device__ inline
#else
#define AG_FN inline
#endif

namespace ag {

template <typename T> AG_FN T eps();
template <> AG_FN float eps<float>() { return FLT_EPSILON; }
template <> AG_FN double eps<double>() { return DBL_EPSILON; }
template <typename T> AG_FN T tiny();
template <> AG_FN float tiny<float>() { return FLT_MIN; }
template <> AG_FN double tiny<double>() { return DBL_MIN; }
template <typename T> AG_FN T inf() { return T(INFINITY); }

template <typename T> AG_FN T safe(T d) { return d == T(0) ? T(1) : d; }
template <typename T> AG_FN T mn(T a, T b) { return a < b ? a : b; }
template <typename T> AG_FN T mx(T a, T b) { return a > b ? a : b; }
template <typename T> AG_FN T sinc(T z) { return z == T(0) ? T(1) : sin(z) / z; }
template <typename T> AG_FN T sinhc(T z) { return z == T(0) ? T(1) : sinh(z) / z; }
// (1 - e^-d)/d, d >= 0
template <typename T> AG_FN T phi1(T d) { return d == T(0) ? T(1) : -expm1(-d) / d; }
// e^a * f (f > 0) without the overflow of e^a where the product is finite
template <typename T> AG_FN T times_exp(T a, T f) {
    const T direct = exp(a) * f;
    if (isfinite(direct) && (direct != T(0) || f == T(0))) return direct;
    return exp(a + log(f));
}
// log(lo/hi), 0 <= lo <= hi, also where lo/hi underflows
template <typename T> AG_FN T log_ratio(T lo, T hi) {
    const T t = lo / (hi == T(0) ? T(1) : hi);
    return t >= T(4) * tiny<T>() ? log(t) : log(lo) - log(hi);
}
template <typename T> AG_FN T logabs_expm1(T z) {
    return z > T(0) ? z + log1p(-exp(-fabs(z))) : log(-expm1(z < T(0) ? z : T(0)));
}

// ------------------------------------------------------------------ identities
template <typename T> AG_FN T exp_dd(T p, T q) { return times_exp(mx(p, q), phi1(fabs(p - q))); }
template <typename T> AG_FN T expm1_dd(T p, T q) { return exp_dd(p, q); }
template <typename T> AG_FN T log_dd(T p, T q) {
    const T lo = mn(p, q), hi = mx(p, q), d = lo - hi;
    if (d == T(0)) return T(1) / hi;
    if (lo >= T(0.5) * hi) return log1p(d / hi) / d;
    return log_ratio(lo, hi) / d;
}
template <typename T> AG_FN T log1p_dd(T p, T q) {
    const T lo = mn(p, q), hi = mx(p, q), d = lo - hi;
    if (d == T(0)) return T(1) / (T(1) + hi);
    if (T(1) + lo >= T(0.5) * (T(1) + hi)) return log1p(d / (T(1) + hi)) / d;
    return (log1p(lo) - log1p(hi)) / d;
}
template <typename T> AG_FN T sin_dd(T p, T q) { return cos(T(0.5) * (p + q)) * sinc(T(0.5) * (p - q)); }
template <typename T> AG_FN T cos_dd(T p, T q) { return -sin(T(0.5) * (p + q)) * sinc(T(0.5) * (p - q)); }
template <typename T> AG_FN T tan_dd(T p, T q) { return sinc(p - q) / (cos(p) * cos(q)); }
template <typename T> AG_FN T sinh_dd(T p, T q) { return T(0.5) * (exp_dd(p, q) + exp_dd(-p, -q)); }
template <typename T> AG_FN T cosh_dd(T p, T q) {
    if (mx(fabs(p), fabs(q)) > T(0.5) * log(T(1) / tiny<T>())) return T(0.5) * (exp_dd(p, q) - exp_dd(-p, -q));
    return sinh(T(0.5) * (p + q)) * sinhc(T(0.5) * (p - q));
}
template <typename T> AG_FN T tanh_dd(T p, T q) {
    if ((p >= T(0)) != (q >= T(0))) return (tanh(p) - tanh(q)) / safe(p - q);
    const T lo = mn(fabs(p), fabs(q)), hi = mx(fabs(p), fabs(q)), d = hi - lo;
    const T e_lo = exp(T(-2) * lo), e_hi = exp(T(-2) * hi);
    return T(2) * e_lo * (T(2) * phi1(T(2) * d)) / ((T(1) + e_hi) * (T(1) + e_lo));
}
template <typename T> AG_FN T sigmoid_dd(T p, T q) { return T(0.25) * tanh_dd(T(0.5) * p, T(0.5) * q); }
template <typename T> AG_FN T softplus_value(T u) { return mx(u, T(0)) + log1p(exp(-fabs(u))); }
template <typename T> AG_FN T softplus_dd_small(T p, T q) {
    const T e = exp_dd(p, q), z = e * (p - q) / (T(1) + exp(q));
    return (z == T(0) ? T(1) : log1p(z) / z) * e / (T(1) + exp(q));
}
template <typename T> AG_FN T softplus_dd(T p, T q) {
    const T lo = mn(p, q), hi = mx(p, q);
    if (hi <= T(30)) return softplus_dd_small(p, q);
    if (lo >= T(0)) return T(1) - softplus_dd_small(-p, -q);
    return (softplus_value(p) - softplus_value(q)) / safe(p - q);
}
template <typename T> AG_FN T atan_dd(T p, T q) {
    const T s = T(1) + p * q;
    if (s > T(0)) { const T z = (p - q) / s; return (z == T(0) ? T(1) : atan(z) / z) / s; }
    return (atan(p) - atan(q)) / safe(p - q);
}
template <typename T> AG_FN T atanh_dd(T p, T q) {
    const T s = T(1) - p * q, z = (p - q) / s;
    return (z == T(0) ? T(1) : atanh(z) / z) / s;
}
template <typename T> AG_FN T asinh_dd(T p, T q) {
    if ((p >= T(0)) != (q >= T(0))) return (asinh(p) - asinh(q)) / safe(p - q);
    const T ap = fabs(p), aq = fabs(q);
    if (ap == aq) return T(1) / hypot(T(1), ap);
    if (mn(ap, aq) > T(1e8)) return log_dd(ap, aq);
    const T den = ap * hypot(T(1), aq) + aq * hypot(T(1), ap);
    const T z = (ap - aq) * (ap + aq) / den;
    return (z == T(0) ? T(1) : asinh(z) / z) * (ap + aq) / den;
}
template <typename T> AG_FN T xlogx_value(T u) { return u == T(0) ? T(0) : u * log(u); }
template <typename T> AG_FN T xlogx_dd(T p, T q) {
    const T lo = mn(p, q), hi = mx(p, q);
    if (lo > T(0)) return T(0.5) * (log(lo) + log(hi)) + (T(0.5) * lo + T(0.5) * hi) * log_dd(lo, hi);
    return hi > T(0) ? log(hi) : -inf<T>();
}
template <typename T> AG_FN T abs_dd(T p, T q) {
    if (p >= T(0) && q >= T(0)) return T(1);
    if (p <= T(0) && q <= T(0)) return T(-1);
    return (fabs(p) - fabs(q)) / safe(p - q);
}
// piecewise constant g: 0 on one step, the quotient across
template <typename T> AG_FN T step_dd(T gp, T gq, T p, T q) { return gp == gq ? T(0) : (gp - gq) / safe(p - q); }
template <typename T> AG_FN T sign_value(T u) { return u > T(0) ? T(1) : (u < T(0) ? T(-1) : T(0)); }
template <typename T> AG_FN T heaviside_value(T u, T h0) { return u > T(0) ? T(1) : (u < T(0) ? T(0) : h0); }

// ------------------------------------------------------------------ powers u^c
template <typename T> AG_FN T pow_value(T u, T c) { return c == T(0.5) ? sqrt(u) : pow(u, c); }
// (y^c)[lo, hi] for 0 <= lo <= hi
template <typename T> AG_FN T pow_core(T lo, T hi, T c) {
    if (hi == T(0)) return c > T(1) ? T(0) : inf<T>();
    const T t = lo / hi, log_t = log_ratio(lo, hi);
    const bool close = t > T(0.5);
    const T r = (lo - hi) / hi;
    T rho;
    if (close) rho = r == T(0) ? c : expm1(c * log1p(r)) / r;
    else rho = expm1(c * log_t) / (t - T(1));
    const T direct = pow(hi, c - T(1)) * rho;
    if (isfinite(direct) && direct != T(0)) return direct;
    const T log_rho = close ? log(fabs(rho)) : logabs_expm1(c * log_t) - log1p(-t);
    return copysign(T(1), c) * exp((c - T(1)) * log(hi) + log_rho);
}
template <typename T> AG_FN T pow_dd(T p, T q, T c) {
    if (c == T(0)) return T(0);
    if (c == T(1)) return T(1);
    if (c == T(0.5)) return T(1) / (sqrt(p) + sqrt(q));
    if (c == T(2)) return p + q;
    if (c == T(-1)) return -(T(1) / p) * (T(1) / q);
    const T core = pow_core(mn(fabs(p), fabs(q)), mx(fabs(p), fabs(q)), c);
    if (c != round(c)) return core;
    const bool odd = fmod(fabs(c), T(2)) == T(1);
    if (p >= T(0) && q >= T(0)) return core;
    if (p <= T(0) && q <= T(0)) return odd ? core : -core;
    if (odd) return (pow(p, c) - pow(q, c)) / safe(p - q);
    return core * (-(p + q)) / safe(p - q);
}

// ------------------------------------------------------------------ no identity: quotient or series
// D(k, m) returns the k-th derivative of g at m (a functor the generated code provides)
template <typename T, typename G, typename D>
AG_FN T generic_dd(T p, T q, G g, D deriv, int terms) {
    const T e = eps<T>();
    const T gp = g(p), gq = g(q), d = p - q;
    const T m = T(0.5) * (p + q), h2 = T(0.25) * d * d;
    T S = T(0), total = T(0), power = T(1), fact = T(1);
    T tail[4] = {T(0), T(0), T(0), T(0)};
    for (int k = 0; k < terms; ++k) {
        if (k > 0) fact *= T(2 * k) * T(2 * k + 1);
        const T t = deriv(2 * k + 1, m) * power / fact;
        S += t; total += fabs(t);
        tail[0] = tail[1]; tail[1] = tail[2]; tail[2] = tail[3]; tail[3] = t;
        power *= h2;
    }
    if (d == T(0)) return S;
    const T Q = (gp - gq) / d;
    const T E_Q = T(2) * e * (fabs(gp) + fabs(gq)) / fabs(d);
    const T r2 = (fabs(tail[3]) + fabs(tail[2])) / (fabs(tail[1]) + fabs(tail[0]));
    T E_S = inf<T>();
    if (r2 < T(1) && total > T(0) && isfinite(S))
        E_S = T(10) * (fabs(tail[3]) + fabs(tail[2])) * r2 / (T(1) - sqrt(r2)) + T(4) * e * total;
    return E_S < E_Q ? S : Q;
}

}  // namespace ag
