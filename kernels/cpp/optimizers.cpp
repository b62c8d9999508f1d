// The optimizers' updates (optimizers/sgd.py, optimizers/adam.py), each parameter read and written once per step.
//
// The eager update is a chain of foreach calls, one pass over every parameter (and its state) per line of the
// formula.  Every line is element-wise, so the chain can run element by element instead: each element of p, grad
// and the state is loaded once, the lines applied in registers, and the results stored once.
//
//   SGD with momentum (after the first step, where b = g):
//     g = grad + wd p;   b = momentum b + (1 - dampening) g;   g = g + momentum b (nesterov) or b;   p = p - lr g
//
//   Adam / AdamW, with c1 = 1 - beta1^t, c2 = 1 - beta2^t folded as in optimizers/adam.py:
//     p = decay p  (AdamW: decay = 1 - lr wd, else 1);   g = grad + wd p  (Adam's L2: wd, else 0)
//     m = m + (1 - beta1) (g - m)   (= beta1 m + (1 - beta1) g, torch's lerp);   v = beta2 v + (1 - beta2) g^2
//     p = p + s (m / (sqrt(v) + eps_hat)),   s = -lr sqrt(c2) / c1,   eps_hat = eps sqrt(c2)
//
// s and eps_hat are per parameter (a loaded state may hold different step counts), computed in Python.
#include "common.h"

namespace handgrad {
namespace {

// f(first, count) over [0, n) in vector-sized pieces, the pieces split across threads.
template <typename T, typename F>
void for_pieces(int64_t n, const F& f) {
  const int64_t V = Vec<T>::size();
  at::parallel_for(0, (n + V - 1) / V, 4096, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) f(b * V, std::min<int64_t>(V, n - b * V));
  });
}

void check_lists(at::TensorList params, std::initializer_list<std::pair<at::TensorList, const char*>> others,
                 const char* op) {
  for (size_t i = 0; i < params.size(); ++i) {
    check_input(params[i], op, "params[i]");
    for (const auto& [list, name] : others) {
      TORCH_CHECK(list.size() == params.size(), "handgrad::", op, ": ", name, " has ", list.size(),
                  " tensors, params ", params.size());
      check_same(list[i], params[i], op, name);
      TORCH_CHECK(list[i].sizes() == params[i].sizes(), "handgrad::", op, ": ", name, "[", i, "] is ",
                  list[i].sizes(), " but params[", i, "] is ", params[i].sizes());
    }
  }
}

// In the foreach chain's order of operations, each line rounded as ATen's kernel for it rounds (add with alpha and
// lerp as one fused multiply-add, addcmul and addcdiv left to right), so that the two agree to the last bit.
template <typename T>
void sgd_kernel(T* p, const T* grad, T* buf, int64_t n, double lr, double momentum, double damp, double wd,
                bool nesterov) {
  // each constant computed in double, then rounded once to T, as Python computes it and ATen reads it
  const Vec<T> vlr{T(-lr)}, vmom{T(momentum)}, vdamp{T(1.0 - damp)}, vwd{T(wd)};
  for_pieces<T>(n, [&](int64_t i, int64_t k) {
    const Vec<T> vp = Vec<T>::loadu(p + i, k);
    Vec<T> g = Vec<T>::loadu(grad + i, k);
    if (wd != 0.0) g = at::vec::fmadd(vp, vwd, g);                             // g = grad + wd p
    const Vec<T> b = at::vec::fmadd(g, vdamp, Vec<T>::loadu(buf + i, k) * vmom);  // b = momentum b + (1 - damp) g
    b.store(buf + i, k);
    g = nesterov ? at::vec::fmadd(b, vmom, g) : b;                             // g = g + momentum b, or b
    at::vec::fmadd(g, vlr, vp).store(p + i, k);                                // p = p - lr g
  });
}

template <typename T>
void adam_kernel(T* p, const T* grad, T* m, T* v, int64_t n, double s, double eps_hat, double beta1, double beta2,
                 double wd, double decay) {
  // each constant computed in double, then rounded once to T, as Python computes it and ATen reads it
  const T w = T(1.0 - beta1);
  const bool small = std::abs(w) < T(0.5);  // lerp's two forms: m + w (g - m), or g + (w - 1) (g - m)
  const Vec<T> vs{T(s)}, veps{T(eps_hat)}, vcoeff{small ? w : w - T(1)}, vb2{T(beta2)}, vw2{T(1.0 - beta2)},
      vwd{T(wd)}, vdecay{T(decay)};
  for_pieces<T>(n, [&](int64_t i, int64_t k) {
    Vec<T> vp = Vec<T>::loadu(p + i, k);
    if (decay != 1.0) vp = vp * vdecay;                                       // AdamW: p = (1 - lr wd) p
    Vec<T> g = Vec<T>::loadu(grad + i, k);
    if (wd != 0.0) g = at::vec::fmadd(vp, vwd, g);                             // Adam: g = grad + wd p
    Vec<T> vm = Vec<T>::loadu(m + i, k);
    vm = at::vec::fmadd(vcoeff, g - vm, small ? vm : g);                       // m = lerp(m, g, 1 - beta1)
    const Vec<T> vv = at::vec::fmadd(vw2 * g, g, Vec<T>::loadu(v + i, k) * vb2);  // v = beta2 v + (1 - beta2) g^2
    vm.store(m + i, k);
    vv.store(v + i, k);
    (vp + vs * vm / (vv.sqrt() + veps)).store(p + i, k);                       // p = p + s m / (sqrt(v) + eps_hat)
  });
}

void sgd_step(at::TensorList params, at::TensorList grads, at::TensorList bufs, double lr, double momentum,
              double dampening, double weight_decay, bool nesterov) {
  check_lists(params, {{grads, "grads"}, {bufs, "bufs"}}, "sgd_step");
  for (size_t i = 0; i < params.size(); ++i) {
    AT_DISPATCH_FLOATING_TYPES(params[i].scalar_type(), "sgd_step", [&] {
      using T = scalar_t;
      sgd_kernel<T>(params[i].data_ptr<T>(), grads[i].data_ptr<T>(), bufs[i].data_ptr<T>(), params[i].numel(), lr,
                    momentum, dampening, weight_decay, nesterov);
    });
  }
}

void adam_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
               at::ArrayRef<double> neg_step_sizes, at::ArrayRef<double> eps_hats, double beta1, double beta2,
               double weight_decay, double decay) {
  check_lists(params, {{grads, "grads"}, {exp_avgs, "exp_avgs"}, {exp_avg_sqs, "exp_avg_sqs"}}, "adam_step");
  TORCH_CHECK(neg_step_sizes.size() == params.size() && eps_hats.size() == params.size(),
              "handgrad::adam_step: one step size and one eps per parameter, got ", neg_step_sizes.size(), " and ",
              eps_hats.size(), " for ", params.size(), " parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    AT_DISPATCH_FLOATING_TYPES(params[i].scalar_type(), "adam_step", [&] {
      using T = scalar_t;
      adam_kernel<T>(params[i].data_ptr<T>(), grads[i].data_ptr<T>(), exp_avgs[i].data_ptr<T>(),
                     exp_avg_sqs[i].data_ptr<T>(), params[i].numel(), neg_step_sizes[i], eps_hats[i], beta1, beta2,
                     weight_decay, decay);
    });
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(handgrad, CPU, m) {
  m.impl("sgd_step", &sgd_step);
  m.impl("adam_step", &adam_step);
}

}  // namespace handgrad
