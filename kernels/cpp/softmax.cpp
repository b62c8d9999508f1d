// Softmax with cross-entropy (losses/cross_entropy.py), class-index targets y, label smoothing eps, C classes:
//
//   log p = z - max(z) - log(sum(exp(z - max(z))))                     (the row's log-softmax: no overflow)
//   loss  = -(1/N) sum_n [(1 - eps) log p[n, y_n] + eps/C sum_c log p[n, c]]      (q = (1 - eps) onehot + eps/C)
//   dL/dz = (p - q) * s = (p - (1 - eps) onehot - eps/C) * s,   p = exp(log p),  s = dout / N
//
// The forward is one pass a row for its maximum, one for the sum of exponentials, and one that writes log p and
// adds up the loss's terms -- where the eager path runs log_softmax, a gather and two sums.  The backward is one
// pass a row: p * s, the target's entry less (1 - eps) s, less eps/C s, in the eager kernel's order of operations
// (kernels/softmax.py) so that both round alike.
#include "common.h"

namespace handgrad {
namespace {

template <typename T>
void cross_entropy_forward_rows(const T* z, const int64_t* y, T* logp, double* row_terms, int64_t N, int64_t C,
                                double eps, bool* bad) {
  const int64_t V = Vec<T>::size();
  at::parallel_for(0, N, grain_rows(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* zr = z + r * C;
      T* lr = logp + r * C;
      Vec<T> vmax(-std::numeric_limits<T>::infinity());
      int64_t j = 0;
      for (; j + V <= C; j += V) vmax = at::vec::maximum(vmax, Vec<T>::loadu(zr + j));
      T mx = lanes_max(vmax);
      for (; j < C; ++j) mx = std::max(mx, zr[j]);
      const Vec<T> vm(mx);
      Vec<T> acc(T(0));
      for (j = 0; j + V <= C; j += V) acc += (Vec<T>::loadu(zr + j) - vm).exp();
      T sum = lanes_sum(acc);
      for (; j < C; ++j) sum += std::exp(zr[j] - mx);
      const T lse = std::log(sum);
      const Vec<T> vl(lse);
      Vec<T> tot(T(0));
      for (j = 0; j < C; j += V) {  // log p = z - max - log(sum), and the row's sum of log p alongside
        const int64_t n = std::min<int64_t>(V, C - j);
        const Vec<T> lp = Vec<T>::loadu(zr + j, n) - vm - vl;
        lp.store(lr + j, n);
        tot += first(lp, n);
      }
      const int64_t t = y[r];
      if (t < 0 || t >= C) {
        *bad = true;
        row_terms[r] = 0;
        continue;
      }
      // (1 - eps) log p[y] + eps/C sum_c log p
      row_terms[r] = (1 - eps) * double(lr[t]) + (eps ? eps / double(C) * double(lanes_sum(tot)) : 0.0);
    }
  });
}

template <typename T>
void cross_entropy_backward_rows(const T* logp, const int64_t* y, T* grad, int64_t N, int64_t C, double s,
                                 double eps) {
  const int64_t V = Vec<T>::size();
  const Vec<T> vs(static_cast<T>(s)), vu(static_cast<T>(eps / double(C) * s));
  const T target = static_cast<T>((eps - 1) * s);
  at::parallel_for(0, N, grain_rows(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* lr = logp + r * C;
      T* gr = grad + r * C;
      for (int64_t j = 0; j < C; j += V) {
        const int64_t n = std::min<int64_t>(V, C - j);
        (Vec<T>::loadu(lr + j, n).exp() * vs).store(gr + j, n);  // p * s
      }
      gr[y[r]] += target;  // - (1 - eps) s at the target
      if (eps) {
        for (int64_t j = 0; j < C; j += V) {  // - eps/C s everywhere
          const int64_t n = std::min<int64_t>(V, C - j);
          (Vec<T>::loadu(gr + j, n) - vu).store(gr + j, n);
        }
      }
    }
  });
}

void check_target(const Tensor& target, int64_t N, const char* op) {
  TORCH_CHECK(target.device().is_cpu() && target.scalar_type() == at::kLong && target.is_contiguous() &&
                  target.dim() == 1 && target.size(0) == N,
              "handgrad::", op, ": target must be a contiguous CPU int64 tensor of shape (", N, "), got ",
              target.scalar_type(), " of shape ", target.sizes());
}

std::tuple<Tensor, Tensor> cross_entropy_forward(const Tensor& logits, const Tensor& target, double eps) {
  check_input(logits, "cross_entropy_forward", "logits");
  TORCH_CHECK(logits.dim() == 2, "handgrad::cross_entropy_forward: logits must be (N, C), got ", logits.sizes());
  const int64_t N = logits.size(0), C = logits.size(1);
  check_target(target, N, "cross_entropy_forward");
  Tensor logp = at::empty_like(logits), terms = at::empty({N}, logits.options().dtype(at::kDouble));
  bool bad = false;
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "cross_entropy_forward", [&] {
    cross_entropy_forward_rows<scalar_t>(logits.data_ptr<scalar_t>(), target.data_ptr<int64_t>(),
                                         logp.data_ptr<scalar_t>(), terms.data_ptr<double>(), N, C, eps, &bad);
  });
  TORCH_CHECK(!bad, "handgrad::cross_entropy_forward: target holds a class outside [0, ", C - 1, "]");
  double total = 0;  // the rows' terms added in float64, in row order: the same sum on any thread count
  const double* t = terms.data_ptr<double>();
  for (int64_t r = 0; r < N; ++r) total += t[r];
  return {logp, at::scalar_tensor(total, logits.options())};
}

Tensor cross_entropy_backward(const Tensor& logp, const Tensor& target, double s, double eps) {
  check_input(logp, "cross_entropy_backward", "logp");
  TORCH_CHECK(logp.dim() == 2, "handgrad::cross_entropy_backward: logp must be (N, C), got ", logp.sizes());
  const int64_t N = logp.size(0), C = logp.size(1);
  check_target(target, N, "cross_entropy_backward");
  const int64_t* y = target.data_ptr<int64_t>();
  for (int64_t r = 0; r < N; ++r) {
    TORCH_CHECK(y[r] >= 0 && y[r] < C, "handgrad::cross_entropy_backward: target holds class ", y[r],
                ", outside [0, ", C - 1, "]");
  }
  Tensor grad = at::empty_like(logp);
  AT_DISPATCH_FLOATING_TYPES(logp.scalar_type(), "cross_entropy_backward", [&] {
    cross_entropy_backward_rows<scalar_t>(logp.data_ptr<scalar_t>(), y, grad.data_ptr<scalar_t>(), N, C, s, eps);
  });
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(handgrad, CPU, m) {
  m.impl("cross_entropy_forward", &cross_entropy_forward);
  m.impl("cross_entropy_backward", &cross_entropy_backward);
}

}  // namespace handgrad
