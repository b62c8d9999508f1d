// GELU's backward (layers/activations.py): out = x Phi(x), Phi the standard normal CDF ("none"), or
// out = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3) ("tanh").  The product rule gives
//
//   "none":  dx = dout * (Phi(x) + x phi(x)),   phi(x) = exp(-x^2/2) / sqrt(2 pi)
//   "tanh":  dx = dout * (1/2 (1 + t) + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)),   t = tanh(u)
//
// One pass: reads x (and, for "none", the output) and dout, writes dx.  "none" reads Phi off the forward's output,
// as kernels/elementwise.py does: out = x Phi(x), so Phi(x) = 1/2 + (out - x/2) / x -- no erf, which is the costly
// part of the formula -- with Phi(0) = 1/2 where that is 0/0; phi(x) = 2^(-x^2/2 log2(e) - log2(sqrt(2 pi))), in
// exp2.  In the eager kernel's order of operations (so the two agree to the last bit where their exp2 does).
#include "common.h"

namespace handgrad {
namespace {

constexpr double kLog2e = 1.4426950408889634;             // e^y = 2^(y log2 e)
constexpr double kLog2InvSqrt2Pi = -1.3257480647361595;   // 2^this = 1 / sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.7978845608028654;       // sqrt(2 / pi)

// f(first, count) over [0, n) in vector-sized pieces, the pieces split across threads.
template <typename T, typename F>
void for_vectors(int64_t n, const F& f) {
  const int64_t V = Vec<T>::size();
  at::parallel_for(0, (n + V - 1) / V, 2048, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) f(b * V, std::min<int64_t>(V, n - b * V));
  });
}

template <typename T>
void gelu_backward_kernel(const T* x, const T* out, const T* dout, T* dx, int64_t n) {
  const Vec<T> c{T(kLog2InvSqrt2Pi)}, k(T(-0.5 * kLog2e)), half(T(0.5)), zero(T(0));
  for_vectors<T>(n, [&](int64_t i, int64_t m) {
    const Vec<T> vx = Vec<T>::loadu(x + i, m);
    const Vec<T> pdf = (c + k * vx * vx).exp2();                          // phi(x)
    Vec<T> g = (half + pdf * vx) + (Vec<T>::loadu(out + i, m) - half * vx) / vx;  // x phi(x) + Phi(x)
    g = Vec<T>::blendv(g, half, vx == zero);                            // Phi(0) + 0 = 1/2 (there 0/0)
    (g * Vec<T>::loadu(dout + i, m)).store(dx + i, m);
  });
}

template <typename T>
void gelu_tanh_backward_kernel(const T* x, const T* dout, T* dx, int64_t n) {
  const Vec<T> a(T(0.044715)), one(T(1)), s{T(kSqrt2OverPi)}, hs(T(0.5 * kSqrt2OverPi)), a3(T(3 * 0.044715)),
      half(T(0.5));
  for_vectors<T>(n, [&](int64_t i, int64_t m) {
    const Vec<T> vx = Vec<T>::loadu(x + i, m);
    const Vec<T> x2 = vx * vx;
    const Vec<T> t = ((x2 * a + one) * vx * s).tanh();                   // t = tanh(sqrt(2/pi) (x + 0.044715 x^3))
    const Vec<T> right = (one - t * t) * vx * hs * (x2 * a3 + one);      // x/2 (1 - t^2) sqrt(2/pi) (1 + 3a x^2)
    ((right + (t + one) * half) * Vec<T>::loadu(dout + i, m)).store(dx + i, m);
  });
}

Tensor gelu_backward(const Tensor& x, const Tensor& out, const Tensor& dout) {
  check_input(x, "gelu_backward", "x");
  check_same(out, x, "gelu_backward", "out"), check_numel(out, x.numel(), "gelu_backward", "out");
  check_same(dout, x, "gelu_backward", "dout"), check_numel(dout, x.numel(), "gelu_backward", "dout");
  Tensor dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gelu_backward", [&] {
    gelu_backward_kernel<scalar_t>(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(),
                                   dx.data_ptr<scalar_t>(), x.numel());
  });
  return dx;
}

Tensor gelu_tanh_backward(const Tensor& x, const Tensor& dout) {
  check_input(x, "gelu_tanh_backward", "x");
  check_same(dout, x, "gelu_tanh_backward", "dout"), check_numel(dout, x.numel(), "gelu_tanh_backward", "dout");
  Tensor dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gelu_tanh_backward", [&] {
    gelu_tanh_backward_kernel<scalar_t>(x.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(),
                                        x.numel());
  });
  return dx;
}

}  // namespace

TORCH_LIBRARY_IMPL(handgrad, CPU, m) {
  m.impl("gelu_backward", &gelu_backward);
  m.impl("gelu_tanh_backward", &gelu_tanh_backward);
}

}  // namespace handgrad
