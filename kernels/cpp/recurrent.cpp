// The LSTM's and the GRU's gate arithmetic, one time step, forward and backward, each in one pass over the
// (batch, hidden) elements (layers/recurrent/cells.py has the textbook cell; kernels/recurrent/bptt.py calls these
// between the step's matrix products).  sigma(x) = 1 / (1 + e^-x), sigma' = sigma (1 - sigma), tanh' = 1 - tanh^2.
//
// LSTM, torch's gate order (i, f, g, o), a = x W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh (N, 4H):
//
//   forward    i, f, o = sigma(a_i, a_f, a_o),  g = tanh(a_g),  c = f c_{t-1} + i g,  r = o tanh(c)
//   backward   (dr the gradient reaching r; dc the one reaching c from step t+1, updated to step t-1's)
//              dc  <- dc + dr o (1 - tanh(c)^2)                                        (r = o tanh(c))
//              da_i = dc g i (1 - i),  da_f = dc c_{t-1} f (1 - f),  da_g = dc i (1 - g^2),
//              da_o = dr tanh(c) o (1 - o),                                            (c = f c_{t-1} + i g)
//              dc  <- dc f                                                             (what reaches c_{t-1})
//
// GRU, torch's gate order (r, z, n), the reset gate applied to m = h_{t-1} W_hh^T + b_hh (N, 3H), and a = x W_ih^T +
// b_ih (N, 3H):
//
//   forward    r = sigma(a_r + m_r),  z = sigma(a_z + m_z),  n = tanh(a_n + r m_n),  h = n + z (h_{t-1} - n)
//   backward   (d the gradient reaching h from the step's output and from step t+1's products; `carry` the one
//              reaching h directly from step t+1, dh_{t+1} z_{t+1}, updated to this step's dh z)
//              dh = d + carry,  dz = dh (h_{t-1} - n),  da_n = dh (1 - z)(1 - n^2),
//              dm_n = da_n r,  da_r = da_n m_n r (1 - r),  da_z = dz z (1 - z),  carry <- dh z
//
// Where the eager kernels run five to seven elementwise kernels a step (each a pass over memory and a call), these
// run one: every gate's value and derivative is computed in registers from what the step reads once.
#include "common.h"

namespace handgrad {
namespace {

template <typename T>
inline Vec<T> sigmoid(const Vec<T>& x) {
  return Vec<T>(T(1)) / (Vec<T>(T(1)) + x.neg().exp());
}

// f(n, j, m) for the m (<= V) hidden units from j of each batch row n, the rows split across threads.
template <typename T, typename F>
void for_units(int64_t N, int64_t H, int64_t row_values, const F& f) {
  const int64_t V = Vec<T>::size();
  at::parallel_for(0, N, grain_rows(row_values), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t j = 0; j < H; j += V) f(n, j, std::min<int64_t>(V, H - j));
    }
  });
}

template <typename T>
void lstm_forward_kernel(const T* a, const T* c_prev, T* act, T* c, T* tc, T* r, int64_t N, int64_t H) {
  for_units<T>(N, H, 4 * H, [&](int64_t n, int64_t j, int64_t m) {
    const T* an = a + n * 4 * H + j;  // a_i at an, a_f at an + H, a_g at an + 2H, a_o at an + 3H
    T* gn = act + n * 4 * H + j;
    const int64_t k = n * H + j;
    const Vec<T> i = sigmoid(Vec<T>::loadu(an, m)), f = sigmoid(Vec<T>::loadu(an + H, m)),
                 g = Vec<T>::loadu(an + 2 * H, m).tanh(), o = sigmoid(Vec<T>::loadu(an + 3 * H, m));
    const Vec<T> cn = f * Vec<T>::loadu(c_prev + k, m) + i * g;  // c = f c_{t-1} + i g
    const Vec<T> t = cn.tanh();
    i.store(gn, m), f.store(gn + H, m), g.store(gn + 2 * H, m), o.store(gn + 3 * H, m);
    cn.store(c + k, m), t.store(tc + k, m), (o * t).store(r + k, m);  // r = o tanh(c)
  });
}

template <typename T>
void lstm_backward_kernel(const T* dr, const T* act, const T* c_prev, const T* tc, T* dc, T* da, int64_t N,
                          int64_t H) {
  const Vec<T> one(T(1));
  for_units<T>(N, H, 4 * H, [&](int64_t n, int64_t j, int64_t m) {
    const T* gn = act + n * 4 * H + j;
    T* dn = da + n * 4 * H + j;
    const int64_t k = n * H + j;
    const Vec<T> i = Vec<T>::loadu(gn, m), f = Vec<T>::loadu(gn + H, m), g = Vec<T>::loadu(gn + 2 * H, m),
                 o = Vec<T>::loadu(gn + 3 * H, m);
    const Vec<T> t = Vec<T>::loadu(tc + k, m), d = Vec<T>::loadu(dr + k, m);
    const Vec<T> dcn = Vec<T>::loadu(dc + k, m) + d * (o * (one - t * t));  // dc + dr o (1 - tanh(c)^2)
    (dcn * (g * (i * (one - i)))).store(dn, m);                                      // da_i
    (dcn * (Vec<T>::loadu(c_prev + k, m) * (f * (one - f)))).store(dn + H, m);         // da_f
    (dcn * (i * (one - g * g))).store(dn + 2 * H, m);                                 // da_g
    (d * (t * (o * (one - o)))).store(dn + 3 * H, m);                                 // da_o
    (dcn * f).store(dc + k, m);                                                       // dc for step t-1
  });
}

template <typename T>
void gru_forward_kernel(T* act, const T* mm, const T* h_prev, T* mn, T* h, int64_t N, int64_t H) {
  for_units<T>(N, H, 3 * H, [&](int64_t n, int64_t j, int64_t m) {
    T* an = act + n * 3 * H + j;  // a_r, a_z, a_n in; r, z, n out
    const T* mr = mm + n * 3 * H + j;
    const int64_t k = n * H + j;
    const Vec<T> r = sigmoid(Vec<T>::loadu(an, m) + Vec<T>::loadu(mr, m));
    const Vec<T> z = sigmoid(Vec<T>::loadu(an + H, m) + Vec<T>::loadu(mr + H, m));
    const Vec<T> m_n = Vec<T>::loadu(mr + 2 * H, m);
    const Vec<T> nn = (Vec<T>::loadu(an + 2 * H, m) + r * m_n).tanh();  // n = tanh(a_n + r m_n)
    r.store(an, m), z.store(an + H, m), nn.store(an + 2 * H, m), m_n.store(mn + k, m);
    (nn + z * (Vec<T>::loadu(h_prev + k, m) - nn)).store(h + k, m);  // h = n + z (h_{t-1} - n)
  });
}

template <typename T>
void gru_backward_kernel(const T* d, const T* act, const T* mn, const T* h_prev, T* carry, T* dm, T* dan,
                         int64_t N, int64_t H) {
  const Vec<T> one(T(1));
  for_units<T>(N, H, 4 * H, [&](int64_t n, int64_t j, int64_t m) {
    const T* gn = act + n * 3 * H + j;
    T* dn = dm + n * 3 * H + j;  // da_r, da_z, dm_n: the hidden side's gradient
    const int64_t k = n * H + j;
    const Vec<T> r = Vec<T>::loadu(gn, m), z = Vec<T>::loadu(gn + H, m), nn = Vec<T>::loadu(gn + 2 * H, m);
    const Vec<T> dh = Vec<T>::loadu(d + k, m) + Vec<T>::loadu(carry + k, m);
    const Vec<T> da_n = dh * ((one - z) * (one - nn * nn));  // dh (1 - z)(1 - n^2)
    (da_n * Vec<T>::loadu(mn + k, m) * (r * (one - r))).store(dn, m);            // da_r
    (dh * (Vec<T>::loadu(h_prev + k, m) - nn) * (z * (one - z))).store(dn + H, m);  // da_z
    (da_n * r).store(dn + 2 * H, m);                                              // dm_n
    da_n.store(dan + k, m);
    (dh * z).store(carry + k, m);  // reaches h_{t-1} directly
  });
}

// t is (N, cols) with N * cols elements, the dtype of `like`, contiguous.
void check_rows(const Tensor& t, const Tensor& like, int64_t N, int64_t cols, const char* op, const char* name) {
  check_same(t, like, op, name);
  check_numel(t, N * cols, op, name);
}

void lstm_gates_forward(const Tensor& a, const Tensor& c_prev, const Tensor& act, const Tensor& c, const Tensor& tc,
                        const Tensor& r) {
  const char* op = "lstm_gates_forward";
  check_input(a, op, "a");
  TORCH_CHECK(a.dim() == 2 && a.size(1) % 4 == 0, "handgrad::", op, ": a must be (N, 4H), got ", a.sizes());
  const int64_t N = a.size(0), H = a.size(1) / 4;
  check_rows(c_prev, a, N, H, op, "c_prev"), check_rows(act, a, N, 4 * H, op, "act");
  check_rows(c, a, N, H, op, "c"), check_rows(tc, a, N, H, op, "tanh_c"), check_rows(r, a, N, H, op, "r");
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "lstm_gates_forward", [&] {
    lstm_forward_kernel<scalar_t>(a.data_ptr<scalar_t>(), c_prev.data_ptr<scalar_t>(), act.data_ptr<scalar_t>(),
                                  c.data_ptr<scalar_t>(), tc.data_ptr<scalar_t>(), r.data_ptr<scalar_t>(), N, H);
  });
}

void lstm_gates_backward(const Tensor& dr, const Tensor& act, const Tensor& c_prev, const Tensor& tc, const Tensor& dc,
                         const Tensor& da) {
  const char* op = "lstm_gates_backward";
  check_input(act, op, "act");
  TORCH_CHECK(act.dim() == 2 && act.size(1) % 4 == 0, "handgrad::", op, ": act must be (N, 4H), got ", act.sizes());
  const int64_t N = act.size(0), H = act.size(1) / 4;
  check_rows(dr, act, N, H, op, "dr"), check_rows(c_prev, act, N, H, op, "c_prev");
  check_rows(tc, act, N, H, op, "tanh_c"), check_rows(dc, act, N, H, op, "dc"), check_rows(da, act, N, 4 * H, op, "da");
  AT_DISPATCH_FLOATING_TYPES(act.scalar_type(), "lstm_gates_backward", [&] {
    lstm_backward_kernel<scalar_t>(dr.data_ptr<scalar_t>(), act.data_ptr<scalar_t>(), c_prev.data_ptr<scalar_t>(),
                                   tc.data_ptr<scalar_t>(), dc.data_ptr<scalar_t>(), da.data_ptr<scalar_t>(), N, H);
  });
}

void gru_gates_forward(const Tensor& act, const Tensor& m, const Tensor& h_prev, const Tensor& mn, const Tensor& h) {
  const char* op = "gru_gates_forward";
  check_input(act, op, "act");
  TORCH_CHECK(act.dim() == 2 && act.size(1) % 3 == 0, "handgrad::", op, ": act must be (N, 3H), got ", act.sizes());
  const int64_t N = act.size(0), H = act.size(1) / 3;
  check_rows(m, act, N, 3 * H, op, "m"), check_rows(h_prev, act, N, H, op, "h_prev");
  check_rows(mn, act, N, H, op, "m_n"), check_rows(h, act, N, H, op, "h");
  AT_DISPATCH_FLOATING_TYPES(act.scalar_type(), "gru_gates_forward", [&] {
    gru_forward_kernel<scalar_t>(act.data_ptr<scalar_t>(), m.data_ptr<scalar_t>(), h_prev.data_ptr<scalar_t>(),
                                 mn.data_ptr<scalar_t>(), h.data_ptr<scalar_t>(), N, H);
  });
}

void gru_gates_backward(const Tensor& d, const Tensor& act, const Tensor& mn, const Tensor& h_prev,
                        const Tensor& carry, const Tensor& dm, const Tensor& da_n) {
  const char* op = "gru_gates_backward";
  check_input(act, op, "act");
  TORCH_CHECK(act.dim() == 2 && act.size(1) % 3 == 0, "handgrad::", op, ": act must be (N, 3H), got ", act.sizes());
  const int64_t N = act.size(0), H = act.size(1) / 3;
  check_rows(d, act, N, H, op, "d"), check_rows(mn, act, N, H, op, "m_n"), check_rows(h_prev, act, N, H, op, "h_prev");
  check_rows(carry, act, N, H, op, "carry"), check_rows(dm, act, N, 3 * H, op, "dm");
  check_rows(da_n, act, N, H, op, "da_n");
  AT_DISPATCH_FLOATING_TYPES(act.scalar_type(), "gru_gates_backward", [&] {
    gru_backward_kernel<scalar_t>(d.data_ptr<scalar_t>(), act.data_ptr<scalar_t>(), mn.data_ptr<scalar_t>(),
                                  h_prev.data_ptr<scalar_t>(), carry.data_ptr<scalar_t>(), dm.data_ptr<scalar_t>(),
                                  da_n.data_ptr<scalar_t>(), N, H);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(handgrad, CPU, m) {
  m.impl("lstm_gates_forward", &lstm_gates_forward);
  m.impl("lstm_gates_backward", &lstm_gates_backward);
  m.impl("gru_gates_forward", &gru_gates_forward);
  m.impl("gru_gates_backward", &gru_gates_backward);
}

}  // namespace handgrad
