// Max pooling's backward (layers/pool.py): out[n, c, o] = x[n, c, argmax[n, c, o]] over each window, so
//
//   dx[n, c, q] = sum over the outputs o whose argmax is q of dout[n, c, o]        (zero where q is no window's max)
//
// the textbook's scatter-add, one plane (n, c) at a time: the plane's H*W gradients zeroed and the H_out*W_out
// values added in while the plane is in cache, the planes split across threads (each plane is written by one
// thread only, so overlapping windows add up without atomics).  The argmaxes are flat indices into the H*W plane,
// as F.max_pool2d(return_indices=True) gives them.
#include "common.h"

namespace handgrad {
namespace {

template <typename T>
void max_pool_backward_kernel(const T* dout, const int64_t* idx, T* dx, int64_t planes, int64_t outs, int64_t hw,
                              bool* bad) {
  at::parallel_for(0, planes, std::max<int64_t>(1, 32768 / std::max<int64_t>(hw + outs, 1)), [&](int64_t p0,
                                                                                                 int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      T* d = dx + p * hw;
      const T* g = dout + p * outs;
      const int64_t* q = idx + p * outs;
      std::fill(d, d + hw, T(0));
      for (int64_t o = 0; o < outs; ++o) {
        if (q[o] < 0 || q[o] >= hw) {
          *bad = true;
          continue;
        }
        d[q[o]] += g[o];
      }
    }
  });
}

Tensor max_pool2d_backward(const Tensor& dout, const Tensor& idx, int64_t hw) {
  const char* op = "max_pool2d_backward";
  check_input(dout, op, "dout");
  TORCH_CHECK(idx.device().is_cpu() && idx.scalar_type() == at::kLong && idx.is_contiguous() &&
                  idx.sizes() == dout.sizes() && dout.dim() == 4,
              "handgrad::", op, ": idx must be a contiguous CPU int64 tensor of dout's shape (N, C, H_out, W_out) ",
              dout.sizes(), ", got ", idx.scalar_type(), " of shape ", idx.sizes());
  TORCH_CHECK(hw >= 0, "handgrad::", op, ": hw must be >= 0, got ", hw);
  const int64_t N = dout.size(0), C = dout.size(1), outs = dout.size(2) * dout.size(3);
  Tensor dx = at::empty({N, C, hw}, dout.options());
  bool bad = false;
  AT_DISPATCH_FLOATING_TYPES(dout.scalar_type(), "max_pool2d_backward", [&] {
    max_pool_backward_kernel<scalar_t>(dout.data_ptr<scalar_t>(), idx.data_ptr<int64_t>(), dx.data_ptr<scalar_t>(),
                                       N * C, outs, hw, &bad);
  });
  TORCH_CHECK(!bad, "handgrad::", op, ": idx holds an index outside [0, ", hw - 1, "]");
  return dx;
}

}  // namespace

TORCH_LIBRARY_IMPL(handgrad, CPU, m) { m.impl("max_pool2d_backward", &max_pool2d_backward); }

}  // namespace handgrad
