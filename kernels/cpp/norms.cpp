// LayerNorm and BatchNorm, forward and backward: layers/layernorm.py's and layers/batchnorm.py's formulas, each a
// few passes over a row (LayerNorm) or a channel (BatchNorm) while it is in cache.
//
// Both normalise a set of M values (LayerNorm: the K values of a row; BatchNorm: the N*S values of a channel):
//
//   mean = sum(x) / M,  var = sum((x - mean)^2) / M  (biased, as torch normalises),  rstd = 1 / sqrt(var + eps)
//   xhat = (x - mean) * rstd,  out = w * xhat + b
//
// and backward, with dxhat = w * dout and sums over the same M values (the layers' docstrings derive it: x reaches
// xhat directly, through the mean and through the variance, one term each):
//
//   dx = rstd * (dxhat - sum(dxhat) / M - xhat * sum(dxhat * xhat) / M)       term 1, term 2, term 3
//   dw = sum over the other axis of dout * xhat,  db = sum over the other axis of dout
//
// xhat is never stored: the forward keeps x, mean and rstd (llm.c's choice), the backward makes xhat again in the
// pass that reads x.
#include "common.h"

namespace handgrad {
namespace {

// -- LayerNorm: x (N, K), a row at a time ---------------------------------------------------------------------

template <typename T>
void layer_norm_forward_rows(const T* x, const T* w, const T* b, T* out, T* mean, T* rstd, int64_t N, int64_t K,
                             T eps) {
  const int64_t V = Vec<T>::size();
  at::parallel_for(0, N, grain_rows(K), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * K;
      T* yr = out + r * K;
      // pass 1: the mean
      Vec<T> acc(T(0));
      int64_t j = 0;
      for (; j + V <= K; j += V) acc += Vec<T>::loadu(xr + j);
      T sum = lanes_sum(acc);
      for (; j < K; ++j) sum += xr[j];
      const T m = sum / T(K);
      // pass 2: the variance from the deviations (two passes over a row in cache: no cancellation)
      const Vec<T> vm(m);
      acc = Vec<T>(T(0));
      for (j = 0; j + V <= K; j += V) {
        const Vec<T> d = Vec<T>::loadu(xr + j) - vm;
        acc = at::vec::fmadd(d, d, acc);
      }
      T sq = lanes_sum(acc);
      for (; j < K; ++j) sq += (xr[j] - m) * (xr[j] - m);
      const T rs = T(1) / std::sqrt(sq / T(K) + eps);
      mean[r] = m;
      rstd[r] = rs;
      // pass 3: out = w * xhat + b
      const Vec<T> vr(rs);
      for (j = 0; j < K; j += V) {
        const int64_t n = std::min<int64_t>(V, K - j);
        Vec<T> y = (Vec<T>::loadu(xr + j, n) - vm) * vr;
        if (w) y = y * Vec<T>::loadu(w + j, n);
        if (b) y = y + Vec<T>::loadu(b + j, n);
        y.store(yr + j, n);
      }
    }
  });
}

// dx row by row; dw and db as column sums, each run of rows adding into its own row of the (runs, K) partial sums.
template <typename T>
void layer_norm_backward_rows(const T* dout, const T* x, const T* mean, const T* rstd, const T* w, T* dx, T* dw_runs,
                              T* db_runs, int64_t N, int64_t K, int64_t runs) {
  const int64_t V = Vec<T>::size();
  const T inv_k = T(1) / T(K);
  for_runs(N, runs, [&](int64_t run, int64_t r0, int64_t r1) {
    T* dw = dw_runs + run * K;
    T* db = db_runs + run * K;
    std::fill(dw, dw + K, T(0));
    std::fill(db, db + K, T(0));
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * K;
      const T* gr = dout + r * K;
      const Vec<T> vm(mean[r]), vr(rstd[r]);
      // the two reductions, llm.c's dnorm_mean and dnorm_norm_mean (as sums), and the column sums alongside
      Vec<T> s1(T(0)), s2(T(0));
      for (int64_t j = 0; j < K; j += V) {
        const int64_t n = std::min<int64_t>(V, K - j);
        const Vec<T> g = Vec<T>::loadu(gr + j, n);  // zeros past the row's end: they add nothing
        const Vec<T> xh = (Vec<T>::loadu(xr + j, n) - vm) * vr;
        const Vec<T> dn = w ? g * Vec<T>::loadu(w + j, n) : g;  // dxhat = w * dout
        s1 += dn;
        s2 = at::vec::fmadd(dn, xh, s2);
        at::vec::fmadd(g, xh, Vec<T>::loadu(dw + j, n)).store(dw + j, n);  // dw += dout * xhat
        (Vec<T>::loadu(db + j, n) + g).store(db + j, n);                     // db += dout
      }
      const Vec<T> a(lanes_sum(s1) * inv_k), c(lanes_sum(s2) * inv_k);
      T* dxr = dx + r * K;
      for (int64_t j = 0; j < K; j += V) {
        const int64_t n = std::min<int64_t>(V, K - j);
        const Vec<T> g = Vec<T>::loadu(gr + j, n);
        const Vec<T> xh = (Vec<T>::loadu(xr + j, n) - vm) * vr;
        const Vec<T> dn = w ? g * Vec<T>::loadu(w + j, n) : g;
        // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)): term 1, term 2, term 3
        (vr * (dn - a - xh * c)).store(dxr + j, n);
      }
    }
  });
}

// The (runs, K) partial sums added into row 0, which is returned.
template <typename T>
Tensor add_runs(const Tensor& partial, int64_t runs, int64_t K) {
  T* p = partial.data_ptr<T>();
  for (int64_t run = 1; run < runs; ++run) {
    for (int64_t j = 0; j < K; ++j) p[j] += p[run * K + j];
  }
  return partial[0];
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_forward(const Tensor& x, const std::optional<Tensor>& weight,
                                                      const std::optional<Tensor>& bias, double eps) {
  check_input(x, "layer_norm_forward", "x");
  TORCH_CHECK(x.dim() == 2, "handgrad::layer_norm_forward: x must be (N, K), got ", x.sizes());
  const int64_t N = x.size(0), K = x.size(1);
  const bool has_w = weight.has_value() && weight->defined(), has_b = bias.has_value() && bias->defined();
  if (has_w) check_same(*weight, x, "layer_norm_forward", "weight"), check_numel(*weight, K, "layer_norm_forward", "weight");
  if (has_b) check_same(*bias, x, "layer_norm_forward", "bias"), check_numel(*bias, K, "layer_norm_forward", "bias");
  Tensor out = at::empty_like(x), mean = at::empty({N}, x.options()), rstd = at::empty({N}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "layer_norm_forward", [&] {
    layer_norm_forward_rows<scalar_t>(x.data_ptr<scalar_t>(), has_w ? weight->data_ptr<scalar_t>() : nullptr,
                                      has_b ? bias->data_ptr<scalar_t>() : nullptr, out.data_ptr<scalar_t>(),
                                      mean.data_ptr<scalar_t>(), rstd.data_ptr<scalar_t>(), N, K,
                                      static_cast<scalar_t>(eps));
  });
  return {out, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& dout, const Tensor& x, const Tensor& mean,
                                                       const Tensor& rstd, const std::optional<Tensor>& weight) {
  check_input(x, "layer_norm_backward", "x");
  TORCH_CHECK(x.dim() == 2, "handgrad::layer_norm_backward: x must be (N, K), got ", x.sizes());
  const int64_t N = x.size(0), K = x.size(1);
  check_same(dout, x, "layer_norm_backward", "dout");
  TORCH_CHECK(dout.sizes() == x.sizes(), "handgrad::layer_norm_backward: dout ", dout.sizes(), " but x ", x.sizes());
  check_same(mean, x, "layer_norm_backward", "mean"), check_numel(mean, N, "layer_norm_backward", "mean");
  check_same(rstd, x, "layer_norm_backward", "rstd"), check_numel(rstd, N, "layer_norm_backward", "rstd");
  const bool has_w = weight.has_value() && weight->defined();
  if (has_w) check_same(*weight, x, "layer_norm_backward", "weight"), check_numel(*weight, K, "layer_norm_backward", "weight");
  const int64_t runs = runs_for(N, 64);
  Tensor dx = at::empty_like(x), dw = at::empty({runs, K}, x.options()), db = at::empty({runs, K}, x.options());
  Tensor dweight, dbias;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "layer_norm_backward", [&] {
    layer_norm_backward_rows<scalar_t>(dout.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), mean.data_ptr<scalar_t>(),
                                       rstd.data_ptr<scalar_t>(), has_w ? weight->data_ptr<scalar_t>() : nullptr,
                                       dx.data_ptr<scalar_t>(), dw.data_ptr<scalar_t>(), db.data_ptr<scalar_t>(), N,
                                       K, runs);
    dweight = add_runs<scalar_t>(dw, runs, K);
    dbias = add_runs<scalar_t>(db, runs, K);
  });
  return {dx, dweight, dbias};
}

// -- BatchNorm: x (N, C, S), a channel at a time (its N runs of S values) ------------------------------------

// sum over the channel's N runs of f(vector of x, lanes) -- the vector reductions of both BatchNorm passes
template <typename T, typename F>
inline T channel_sum(const T* x, int64_t N, int64_t C, int64_t S, int64_t c, const F& f) {
  const int64_t V = Vec<T>::size();
  Vec<T> acc(T(0));
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + (n * C + c) * S;
    int64_t j = 0;
    for (; j + V <= S; j += V) acc += f(xr + j, V);
    if (j < S) acc += first(f(xr + j, S - j), S - j);
  }
  return lanes_sum(acc);
}

template <typename T>
void batch_norm_forward_channels(const T* x, const T* w, const T* b, T* out, T* mean, T* var, T* rstd, int64_t N,
                                 int64_t C, int64_t S, T eps) {
  const int64_t V = Vec<T>::size();
  const T inv_m = T(1) / T(N * S);
  at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const T m = channel_sum(x, N, C, S, c, [](const T* p, int64_t n) { return Vec<T>::loadu(p, n); }) * inv_m;
      const Vec<T> vm(m);
      const T v = channel_sum(x, N, C, S, c, [&](const T* p, int64_t n) {
                    const Vec<T> d = Vec<T>::loadu(p, n) - vm;
                    return d * d;
                  }) * inv_m;
      const T rs = T(1) / std::sqrt(v + eps);
      mean[c] = m, var[c] = v, rstd[c] = rs;
      const Vec<T> scale((w ? w[c] : T(1)) * rs), shift(b ? b[c] : T(0));
      for (int64_t n = 0; n < N; ++n) {  // out = (x - mean) * (w * rstd) + b
        const T* xr = x + (n * C + c) * S;
        T* yr = out + (n * C + c) * S;
        for (int64_t j = 0; j < S; j += V) {
          const int64_t k = std::min<int64_t>(V, S - j);
          at::vec::fmadd(Vec<T>::loadu(xr + j, k) - vm, scale, shift).store(yr + j, k);
        }
      }
    }
  });
}

template <typename T>
void batch_norm_backward_channels(const T* dout, const T* x, const T* mean, const T* rstd, const T* w, T* dx, T* dw,
                                  T* db, int64_t N, int64_t C, int64_t S) {
  const int64_t V = Vec<T>::size();
  const T inv_m = T(1) / T(N * S);
  at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const Vec<T> vm(mean[c]);
      // pass 1: sum(dout) and sum(dout * (x - mean)), together
      Vec<T> s1(T(0)), s2(T(0));
      for (int64_t n = 0; n < N; ++n) {
        const T* xr = x + (n * C + c) * S;
        const T* gr = dout + (n * C + c) * S;
        for (int64_t j = 0; j < S; j += V) {
          const int64_t k = std::min<int64_t>(V, S - j);
          const Vec<T> g = Vec<T>::loadu(gr + j, k);  // zeros past the run's end: they add nothing
          s1 += g;
          s2 = at::vec::fmadd(g, Vec<T>::loadu(xr + j, k) - vm, s2);
        }
      }
      const T rs = rstd[c], sum_dout = lanes_sum(s1), sum_dout_xhat = lanes_sum(s2) * rs;
      db[c] = sum_dout;       // dbias = sum(dout)
      dw[c] = sum_dout_xhat;  // dweight = sum(dout * xhat)
      if (dx == nullptr) continue;  // the parameters' gradients only (a network's first layer)
      // pass 2: dx = rstd / M * (M dxhat - sum(dxhat) - xhat sum(dxhat xhat)), dxhat = w dout, as
      //   dx = k dout + a + (x - mean) b,  k = w rstd,  a = -k sum(dout) / M,  b = -k rstd sum(dout xhat) / M
      const T k = (w ? w[c] : T(1)) * rs;
      const Vec<T> vk(k), va(-k * sum_dout * inv_m), vb(-k * rs * sum_dout_xhat * inv_m);
      for (int64_t n = 0; n < N; ++n) {
        const T* xr = x + (n * C + c) * S;
        const T* gr = dout + (n * C + c) * S;
        T* dr = dx + (n * C + c) * S;
        for (int64_t j = 0; j < S; j += V) {
          const int64_t kk = std::min<int64_t>(V, S - j);
          const Vec<T> term1 = vk * Vec<T>::loadu(gr + j, kk);                      // term 1: directly
          at::vec::fmadd(Vec<T>::loadu(xr + j, kk) - vm, vb, term1 + va).store(dr + j, kk);  // + terms 2, 3
        }
      }
    }
  });
}

void check_channels(const Tensor& x, const std::optional<Tensor>& t, const char* op, const char* name) {
  if (t.has_value() && t->defined()) check_same(*t, x, op, name), check_numel(*t, x.size(1), op, name);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> batch_norm_forward(const Tensor& x, const std::optional<Tensor>& weight,
                                                              const std::optional<Tensor>& bias, double eps) {
  check_input(x, "batch_norm_forward", "x");
  TORCH_CHECK(x.dim() == 3 && x.size(0) * x.size(2) > 1,
              "handgrad::batch_norm_forward: x must be (N, C, S) with N * S > 1, got ", x.sizes());
  check_channels(x, weight, "batch_norm_forward", "weight");
  check_channels(x, bias, "batch_norm_forward", "bias");
  const int64_t N = x.size(0), C = x.size(1), S = x.size(2);
  Tensor out = at::empty_like(x), mean = at::empty({C}, x.options()), var = at::empty({C}, x.options()),
         rstd = at::empty({C}, x.options());
  const bool has_w = weight.has_value() && weight->defined(), has_b = bias.has_value() && bias->defined();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "batch_norm_forward", [&] {
    batch_norm_forward_channels<scalar_t>(x.data_ptr<scalar_t>(), has_w ? weight->data_ptr<scalar_t>() : nullptr,
                                          has_b ? bias->data_ptr<scalar_t>() : nullptr, out.data_ptr<scalar_t>(),
                                          mean.data_ptr<scalar_t>(), var.data_ptr<scalar_t>(),
                                          rstd.data_ptr<scalar_t>(), N, C, S, static_cast<scalar_t>(eps));
  });
  return {out, mean, var, rstd};
}

// dx is an empty (0,) tensor where need_dx is false: its pass is skipped
std::tuple<Tensor, Tensor, Tensor> batch_norm_backward(const Tensor& dout, const Tensor& x, const Tensor& mean,
                                                       const Tensor& rstd, const std::optional<Tensor>& weight,
                                                       bool need_dx) {
  check_input(x, "batch_norm_backward", "x");
  TORCH_CHECK(x.dim() == 3, "handgrad::batch_norm_backward: x must be (N, C, S), got ", x.sizes());
  check_same(dout, x, "batch_norm_backward", "dout");
  TORCH_CHECK(dout.sizes() == x.sizes(), "handgrad::batch_norm_backward: dout ", dout.sizes(), " but x ", x.sizes());
  check_channels(x, mean, "batch_norm_backward", "mean");
  check_channels(x, rstd, "batch_norm_backward", "rstd");
  check_channels(x, weight, "batch_norm_backward", "weight");
  const int64_t N = x.size(0), C = x.size(1), S = x.size(2);
  Tensor dx = need_dx ? at::empty_like(x) : at::empty({0}, x.options()), dw = at::empty({C}, x.options()),
         db = at::empty({C}, x.options());
  const bool has_w = weight.has_value() && weight->defined();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "batch_norm_backward", [&] {
    batch_norm_backward_channels<scalar_t>(dout.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                           mean.data_ptr<scalar_t>(), rstd.data_ptr<scalar_t>(),
                                           has_w ? weight->data_ptr<scalar_t>() : nullptr,
                                           need_dx ? dx.data_ptr<scalar_t>() : nullptr,
                                           dw.data_ptr<scalar_t>(), db.data_ptr<scalar_t>(), N, C, S);
  });
  return {dx, dw, db};
}

}  // namespace

TORCH_LIBRARY_IMPL(handgrad, CPU, m) {
  m.impl("layer_norm_forward", &layer_norm_forward);
  m.impl("layer_norm_backward", &layer_norm_backward);
  m.impl("batch_norm_forward", &batch_norm_forward);
  m.impl("batch_norm_backward", &batch_norm_backward);
}

}  // namespace handgrad
