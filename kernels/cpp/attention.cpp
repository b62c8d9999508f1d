// Attention, FlashAttention's way (Dao et al. 2022; layers/attention/scaled_dot_product.py is the textbook):
// q (B, L, E), k (B, S, E), v (B, S, Ev); the keys in blocks of Bc; never an (L, S) matrix.
//
// The textbook holds the scores and the softmax, s = scale q k^T, P = softmax(s), out = P v, and backpropagates
// dv = P^T dout, dP = dout v^T, ds = P * (dP - rowsum(dP * P)), dq = scale ds k, dk = scale ds^T q.
//
// forward, for each query row i and each key block j, with a running row maximum m, row sum l and output
// accumulator acc (the online softmax: whatever was summed against the old maximum is rescaled to the new one):
//   s    = scale log2(e) q_i . k_j                       (Bc)   base-2 scores: exp(x) = 2^(x log2 e)
//   m'   = max(m, max(s));  p = 2^(s - m')
//   l    = l 2^(m - m') + sum(p);   acc = acc 2^(m - m') + p v_j
// then out_i = acc / l, and only out and lse_i = m + log2(l) are kept for the backward.
//
// backward, for each key block j (its dk_j and dv_j summed over the query rows that see it) and each row i,
// P recomputed from lse rather than stored, and rowsum(dP * P) replaced by D_i = rowsum(dout_i * out_i), the same
// number (sum_s dP_s P_s = sum_s (dout . v_s) P_s = dout . out):
//   p = 2^(scale log2(e) q_i . k_j - lse_i);   dp = dout_i . v_j;   ds = p * (dp - D_i)
//   dv_j += p dout_i;   dk_j += scale ds q_i;   dq_i += scale ds k_j
//
// is_causal: row i sees keys 0..i (top-left aligned, as torch), so a key block after the row is skipped and the
// block on the diagonal is cut at key i.  The forward runs (batch, block of Bc rows) tasks on at::parallel_for,
// the backward one task per batch entry (dq_i gathers from every key block of its batch entry).
#include "common.h"

#include <vector>

namespace handgrad {
namespace {

// s[0..n) = sum_e a[e] bt[e * ld + 0..n): a row times a block of columns stored transposed (E rows of ld values).
template <typename T>
inline void row_times(const T* a, const T* bt, int64_t E, int64_t ld, int64_t n, T* s) {
  const int64_t V = Vec<T>::size();
  int64_t j = 0;
  for (; j + 4 * V <= n; j += 4 * V) {  // four independent sums: the products' latency overlapped
    Vec<T> c0(T(0)), c1(T(0)), c2(T(0)), c3(T(0));
    for (int64_t e = 0; e < E; ++e) {
      const Vec<T> ae(a[e]);
      const T* b = bt + e * ld + j;
      c0 = at::vec::fmadd(ae, Vec<T>::loadu(b), c0);
      c1 = at::vec::fmadd(ae, Vec<T>::loadu(b + V), c1);
      c2 = at::vec::fmadd(ae, Vec<T>::loadu(b + 2 * V), c2);
      c3 = at::vec::fmadd(ae, Vec<T>::loadu(b + 3 * V), c3);
    }
    c0.store(s + j), c1.store(s + j + V), c2.store(s + j + 2 * V), c3.store(s + j + 3 * V);
  }
  for (; j < n; j += V) {
    const int64_t m = std::min<int64_t>(V, n - j);
    Vec<T> c(T(0));
    for (int64_t e = 0; e < E; ++e) c = at::vec::fmadd(Vec<T>(a[e]), Vec<T>::loadu(bt + e * ld + j, m), c);
    c.store(s + j, m);
  }
}

// acc[0..E) += sum_j p[j] rows[j E + 0..E): a weighted sum of n rows of E values.
template <typename T>
inline void add_rows(const T* p, const T* rows, int64_t n, int64_t E, T* acc) {
  const int64_t V = Vec<T>::size();
  for (int64_t c = 0; c < E; c += 2 * V) {  // two vectors of the row, even and odd rows apart: four sums
    const int64_t m0 = std::min<int64_t>(V, E - c), m1 = std::clamp<int64_t>(E - c - V, 0, V);
    Vec<T> a0 = Vec<T>::loadu(acc + c, m0), a1 = Vec<T>::loadu(acc + c + V, m1), b0(T(0)), b1(T(0));
    int64_t j = 0;
    for (; j + 2 <= n; j += 2) {
      const T* r = rows + j * E + c;
      const Vec<T> p0(p[j]), p1(p[j + 1]);
      a0 = at::vec::fmadd(p0, Vec<T>::loadu(r, m0), a0);
      a1 = at::vec::fmadd(p0, Vec<T>::loadu(r + V, m1), a1);
      b0 = at::vec::fmadd(p1, Vec<T>::loadu(r + E, m0), b0);
      b1 = at::vec::fmadd(p1, Vec<T>::loadu(r + E + V, m1), b1);
    }
    if (j < n) {
      const T* r = rows + j * E + c;
      a0 = at::vec::fmadd(Vec<T>(p[j]), Vec<T>::loadu(r, m0), a0);
      a1 = at::vec::fmadd(Vec<T>(p[j]), Vec<T>::loadu(r + V, m1), a1);
    }
    (a0 + b0).store(acc + c, m0);
    (a1 + b1).store(acc + c + V, m1);
  }
}

// rows[j E + 0..E) += coef[j] row[0..E) for j < n: the outer product of a column with a row, added.
template <typename T>
inline void add_outer(const T* coef, const T* row, int64_t n, int64_t E, T* rows) {
  const int64_t V = Vec<T>::size();
  if (E <= 4 * V) {  // the row in registers, read once
    Vec<T> r[4];
    int64_t m[4];
    for (int k = 0; k < 4; ++k) {
      m[k] = std::clamp<int64_t>(E - k * V, 0, V);
      r[k] = Vec<T>::loadu(row + k * V, m[k]);
    }
    const int chunks = int((E + V - 1) / V);
    for (int64_t j = 0; j < n; ++j) {
      const Vec<T> c(coef[j]);
      T* out = rows + j * E;
      for (int k = 0; k < chunks; ++k) {
        at::vec::fmadd(c, r[k], Vec<T>::loadu(out + k * V, m[k])).store(out + k * V, m[k]);
      }
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const Vec<T> c(coef[j]);
    T* out = rows + j * E;
    for (int64_t e = 0; e < E; e += V) {
      const int64_t m = std::min<int64_t>(V, E - e);
      at::vec::fmadd(c, Vec<T>::loadu(row + e, m), Vec<T>::loadu(out + e, m)).store(out + e, m);
    }
  }
}

// dst (E, n) = src (n, E) transposed: a block of n rows laid out so that row_times reads it by columns.
template <typename T>
inline void transpose(const T* src, int64_t n, int64_t E, T* dst) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t e = 0; e < E; ++e) dst[e * n + j] = src[j * E + e];
  }
}

// x[0..n) *= a
template <typename T>
inline void scale_row(T* x, int64_t n, T a) {
  const int64_t V = Vec<T>::size();
  for (int64_t j = 0; j < n; j += V) {
    const int64_t m = std::min<int64_t>(V, n - j);
    (Vec<T>::loadu(x + j, m) * Vec<T>(a)).store(x + j, m);
  }
}

template <typename T>
void forward_kernel(const T* q, const T* k, const T* v, T* out, T* lse, int64_t B, int64_t L, int64_t S, int64_t E,
                    int64_t Ev, T scale2, bool causal, int64_t Bc) {
  const int64_t V = Vec<T>::size();
  const int64_t row_blocks = (L + Bc - 1) / Bc;
  const T inf = std::numeric_limits<T>::infinity();
  at::parallel_for(0, B * row_blocks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> kT(E * Bc), s(Bc), m(Bc), l(Bc), acc(Bc * Ev);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / row_blocks, r0 = (task % row_blocks) * Bc, r1 = std::min(L, r0 + Bc);
      const T* qb = q + b * L * E;
      const T* kb = k + b * S * E;
      const T* vb = v + b * S * Ev;
      std::fill(m.begin(), m.end(), -inf);
      std::fill(l.begin(), l.end(), T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t j0 = 0; j0 < S; j0 += Bc) {
        if (causal && j0 > r1 - 1) break;  // no row of this task sees these keys, nor any after them
        const int64_t j1 = std::min(S, j0 + Bc), bc = j1 - j0;
        transpose(kb + j0 * E, bc, E, kT.data());
        for (int64_t i = r0; i < r1; ++i) {
          if (causal && j0 > i) continue;
          const int64_t n = causal ? std::min(j1, i + 1) - j0 : bc;  // the keys of the block row i sees
          row_times(qb + i * E, kT.data(), E, bc, n, s.data());      // q_i . k_j
          Vec<T> vmax(-inf);
          for (int64_t j = 0; j < n; j += V) {  // s = scale log2(e) q_i . k_j, and its maximum
            const int64_t c = std::min<int64_t>(V, n - j);
            const Vec<T> x = Vec<T>::loadu(s.data() + j, c) * Vec<T>(scale2);
            x.store(s.data() + j, c);
            vmax = at::vec::maximum(vmax, Vec<T>::set(Vec<T>(-inf), x, c));
          }
          const int64_t r = i - r0;
          const T m_new = std::max(m[r], lanes_max(vmax));
          Vec<T> sum(T(0));
          for (int64_t j = 0; j < n; j += V) {  // p = 2^(s - m'), in s's memory
            const int64_t c = std::min<int64_t>(V, n - j);
            const Vec<T> p = (Vec<T>::loadu(s.data() + j, c) - Vec<T>(m_new)).exp2();
            p.store(s.data() + j, c);
            sum += first(p, c);
          }
          const T corr = std::exp2(m[r] - m_new);  // rescales what was summed against the old maximum (0 at first)
          l[r] = l[r] * corr + lanes_sum(sum);
          T* a = acc.data() + r * Ev;
          if (corr != T(1)) scale_row(a, Ev, corr);
          add_rows(s.data(), vb + j0 * Ev, n, Ev, a);  // acc += p v_j
          m[r] = m_new;
        }
      }
      for (int64_t i = r0; i < r1; ++i) {
        const int64_t r = i - r0;
        T* o = out + (b * L + i) * Ev;
        if (l[r] == T(0)) {  // a row that saw no key (no keys at all): zeros, and 2^(s - inf) = 0 in backward
          std::fill(o, o + Ev, T(0));
          lse[b * L + i] = inf;
          continue;
        }
        std::copy(acc.data() + r * Ev, acc.data() + (r + 1) * Ev, o);
        scale_row(o, Ev, T(1) / l[r]);
        lse[b * L + i] = m[r] + std::log2(l[r]);
      }
    }
  });
}

template <typename T>
void backward_kernel(const T* q, const T* k, const T* v, const T* dout, const T* D, const T* lse, T* dq, T* dk,
                     T* dv, int64_t B, int64_t L, int64_t S, int64_t E, int64_t Ev, T scale, bool causal,
                     int64_t Bc) {
  const int64_t V = Vec<T>::size();
  const T scale2 = scale * T(1.4426950408889634);  // scale log2(e)
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<T> kT(E * Bc), vT(Ev * Bc), p(Bc), ds(Bc), dk_acc(Bc * E), dv_acc(Bc * Ev);
    for (int64_t b = b0; b < b1; ++b) {
      const T *qb = q + b * L * E, *kb = k + b * S * E, *vb = v + b * S * Ev, *gb = dout + b * L * Ev;
      T* dqb = dq + b * L * E;
      std::fill(dqb, dqb + L * E, T(0));
      for (int64_t j0 = 0; j0 < S; j0 += Bc) {
        const int64_t j1 = std::min(S, j0 + Bc), bc = j1 - j0;
        transpose(kb + j0 * E, bc, E, kT.data());
        transpose(vb + j0 * Ev, bc, Ev, vT.data());
        std::fill(dk_acc.begin(), dk_acc.begin() + bc * E, T(0));
        std::fill(dv_acc.begin(), dv_acc.begin() + bc * Ev, T(0));
        for (int64_t i = causal ? j0 : 0; i < L; ++i) {
          const T lse_i = lse[b * L + i], D_i = D[b * L + i];
          if (std::isinf(lse_i)) continue;  // a row that saw no key: no gradient
          const int64_t n = causal ? std::min(j1, i + 1) - j0 : bc;
          row_times(qb + i * E, kT.data(), E, bc, n, p.data());       // q_i . k_j
          row_times(gb + i * Ev, vT.data(), Ev, bc, n, ds.data());    // dp = dout_i . v_j
          for (int64_t j = 0; j < n; j += V) {
            const int64_t c = std::min<int64_t>(V, n - j);
            // p = 2^(scale log2(e) q_i . k_j - lse_i), recomputed; ds = p (dp - D_i)
            const Vec<T> pj = (Vec<T>::loadu(p.data() + j, c) * Vec<T>(scale2) - Vec<T>(lse_i)).exp2();
            pj.store(p.data() + j, c);
            (pj * (Vec<T>::loadu(ds.data() + j, c) - Vec<T>(D_i))).store(ds.data() + j, c);
          }
          add_outer(p.data(), gb + i * Ev, n, Ev, dv_acc.data());  // dv_j += p dout_i
          add_outer(ds.data(), qb + i * E, n, E, dk_acc.data());   // dk_j += ds q_i (scaled once, below)
          scale_row(ds.data(), n, scale);
          add_rows(ds.data(), kb + j0 * E, n, E, dqb + i * E);     // dq_i += scale ds k_j
        }
        T* dkj = dk + (b * S + j0) * E;
        for (int64_t x = 0; x < bc * E; ++x) dkj[x] = scale * dk_acc[x];
        std::copy(dv_acc.begin(), dv_acc.begin() + bc * Ev, dv + (b * S + j0) * Ev);
      }
    }
  });
}

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  check_input(q, op, "q");
  check_same(k, q, op, "k");
  check_same(v, q, op, "v");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k.size(0) == q.size(0) && v.size(0) == q.size(0) &&
                  k.size(2) == q.size(2) && v.size(1) == k.size(1),
              "handgrad::", op, ": expected q (B, L, E), k (B, S, E), v (B, S, Ev), got ", q.sizes(), ", ",
              k.sizes(), ", ", v.sizes());
}

std::tuple<Tensor, Tensor> attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                             bool causal, int64_t block) {
  check_qkv(q, k, v, "attention_forward");
  TORCH_CHECK(block >= 1, "handgrad::attention_forward: block must be >= 1, got ", block);
  const int64_t B = q.size(0), L = q.size(1), S = k.size(1), E = q.size(2), Ev = v.size(2);
  Tensor out = at::empty({B, L, Ev}, q.options()), lse = at::empty({B, L, 1}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "attention_forward", [&] {
    forward_kernel<scalar_t>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                             out.data_ptr<scalar_t>(), lse.data_ptr<scalar_t>(), B, L, S, E, Ev,
                             static_cast<scalar_t>(scale * 1.4426950408889634), causal, block);
  });
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor> attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                      const Tensor& dout, const Tensor& D, const Tensor& lse,
                                                      double scale, bool causal, int64_t block) {
  check_qkv(q, k, v, "attention_backward");
  TORCH_CHECK(block >= 1, "handgrad::attention_backward: block must be >= 1, got ", block);
  const int64_t B = q.size(0), L = q.size(1), S = k.size(1), E = q.size(2), Ev = v.size(2);
  check_same(dout, q, "attention_backward", "dout");
  TORCH_CHECK(dout.dim() == 3 && dout.size(0) == B && dout.size(1) == L && dout.size(2) == Ev,
              "handgrad::attention_backward: dout must be (B, L, Ev) = ", at::IntArrayRef({B, L, Ev}), ", got ",
              dout.sizes());
  check_same(D, q, "attention_backward", "D"), check_numel(D, B * L, "attention_backward", "D");
  check_same(lse, q, "attention_backward", "lse"), check_numel(lse, B * L, "attention_backward", "lse");
  Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "attention_backward", [&] {
    backward_kernel<scalar_t>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                              dout.data_ptr<scalar_t>(), D.data_ptr<scalar_t>(), lse.data_ptr<scalar_t>(),
                              dq.data_ptr<scalar_t>(), dk.data_ptr<scalar_t>(), dv.data_ptr<scalar_t>(), B, L, S, E,
                              Ev, static_cast<scalar_t>(scale), causal, block);
  });
  return {dq, dk, dv};
}

}  // namespace

TORCH_LIBRARY_IMPL(handgrad, CPU, m) {
  m.impl("attention_forward", &attention_forward);
  m.impl("attention_backward", &attention_backward);
}

}  // namespace handgrad
