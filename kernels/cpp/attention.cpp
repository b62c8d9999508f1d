// Attention, FlashAttention-2's way (Dao 2023; layers/attention/scaled_dot_product.py is the textbook):
// q (B, L, E), k (B, S, E), v (B, S, Ev); the query rows in blocks of Br, the keys in blocks of Bc; never an (L, S)
// matrix, only one (Br, Bc) block of scores at a time, each block's products one matrix product (BLAS's gemm, as
// ATen's own FlashAttentionKernel.cpp calls it through at::cpublas::gemm).
//
// The textbook holds the scores and the softmax, s = scale q k^T, P = softmax(s), out = P v, and backpropagates
// dv = P^T dout, dP = dout v^T, ds = P * (dP - rowsum(dP * P)), dq = scale ds k, dk = scale ds^T q.
//
// forward, for each block i of query rows and each key block j, with a running row maximum m (Br), row sum l (Br)
// and output accumulator acc (Br, Ev) (the online softmax: whatever was summed against the old maximum is
// rescaled to the new one):
//   s    = scale log2(e) q_i k_j^T                      (Br, Bc)  one product; base 2: exp(x) = 2^(x log2 e)
//   m'   = max(m, rowmax(s));  p = 2^(s - m')           (Br, Bc)  row by row, in s's memory
//   l    = l 2^(m - m') + rowsum(p);   acc = acc 2^(m - m') + p v_j      one product, added into acc
// then out_i = acc / l, and only out and lse = m + log2(l) are kept for the backward.
//
// backward, for each block i of query rows and each key block j, P recomputed from lse rather than stored, and
// rowsum(dP * P) replaced by D = rowsum(dout * out), the same number (sum_s dP_s P_s = sum_s (dout . v_s) P_s =
// dout . out):
//   p = 2^(scale log2(e) q_i k_j^T - lse_i);   dp = dout_i v_j^T;   ds = p * (dp - D_i)      (Br, Bc)
//   dv_j += p^T dout_i;   dq_i += scale ds k_j;   dk_j += scale ds^T q_i                     three products
//
// is_causal: row i sees keys 0..i (top-left aligned, as torch), so a key block after a query block's last row is
// skipped, the block's keys after its last row are left out of the products, and inside the block p = 0 where the
// key comes after the row.  The forward runs (batch and head, block of Br rows) tasks on at::parallel_for, the
// backward one task per (batch, head) pair (dk_j and dv_j gather from every query block of their pair).
//
// q, k, v and dout are (B, L, E) or, heads apart, (B, H, L, E), with any batch, head and row strides as long as each
// row is contiguous (a head's view of a wider projection, say: the GPT's q = qkv[..., :C].view(B, T, nh, hs)
// .transpose(1, 2)): BLAS reads a block's rows through their stride, so no copy is made.  A 3-D input is one head
// (H = 1).  The (batch, head) pairs are the forward's and backward's independent problems.  Where q's heads lie side
// by side in memory (its head stride below its row stride), out, dq, dk and dv are written so too, (B, L, H, E) in
// memory and returned as its (B, H, L, E) view, so that out.transpose(1, 2).reshape(B, L, H E) -- the GPT's heads
// side by side -- is a view, not a copy; otherwise they are contiguous (writing a contiguous input's outputs side by
// side measured slower: rows H E apart).  attention_backward_into writes dq, dk, dv into tensors it is given (the
// GPT's views of c_attn's output gradient).  lse is contiguous, (B, L, 1) or (B, H, L, 1), as D must be.
#include "common.h"

#include <ATen/ops/addmm.h>
#include <ATen/ops/from_blob.h>

#include <vector>

// BLAS's gemm (column major), which libtorch_cpu exports where torch is built with a BLAS (MKL on x86; ATen's
// at::cpublas::gemm, which calls it, is not exported).  Weak: where it is absent the products go through at::addmm.
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc) __attribute__((weak));
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc) __attribute__((weak));
}

namespace handgrad {
namespace {

// c (m, n) = alpha op(a) op(b) + beta c, row major: op(a) (m, k) is a, or a (k, m) transposed (ta); op(b) (k, n)
// is b, or b (n, k) transposed (tb); lda, ldb, ldc the rows' strides.  A row-major matrix is its transpose in
// column-major order, so BLAS computes c^T = op(b)^T op(a)^T, the operands swapped.  beta = 0 ignores c's values.
template <typename T>
void mm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
        int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  constexpr bool is_float = std::is_same_v<T, float>;
  const bool blas = is_float ? sgemm_ != nullptr : dgemm_ != nullptr;
  if (blas && std::max({m, n, k, lda, ldb, ldc}) < std::numeric_limits<int>::max()) {
    const char opb = tb ? 'T' : 'N', opa = ta ? 'T' : 'N';
    // BLAS wants each stride at least the rows it spans (k = 0: nothing is read)
    const int M = int(n), N = int(m), K = int(k), LDB = int(std::max<int64_t>(ldb, tb ? k : n)),
              LDA = int(std::max<int64_t>(lda, ta ? m : k)), LDC = int(std::max<int64_t>(ldc, n));
    const int ldb1 = std::max(LDB, 1), lda1 = std::max(LDA, 1), ldc1 = std::max(LDC, 1);
    if constexpr (is_float) {
      sgemm_(&opb, &opa, &M, &N, &K, &alpha, b, &ldb1, a, &lda1, &beta, c, &ldc1);
    } else {
      dgemm_(&opb, &opa, &M, &N, &K, &alpha, b, &ldb1, a, &lda1, &beta, c, &ldc1);
    }
    return;
  }
  const auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  auto view = [&](const T* p, int64_t rows, int64_t cols, int64_t ld, bool t) {  // (rows, cols) of op(p)
    return t ? at::from_blob(const_cast<T*>(p), {rows, cols}, {1, ld}, opts)
             : at::from_blob(const_cast<T*>(p), {rows, cols}, {ld, 1}, opts);
  };
  Tensor C = view(c, m, n, ldc, false);
  at::addmm_out(C, C, view(a, m, k, lda, ta), view(b, k, n, ldb, tb), beta, alpha);
}

// Query rows per block: enough rows that a product is worth a BLAS call, few enough that a causal pass skips most
// of what it need not compute and that short sequences still give every thread tasks.
inline int64_t rows_per_block(int64_t L) {
  return L >= 768 ? 128 : L >= 192 ? 64 : 32;
}

// c (m, n) = alpha a (m, k) b (n, k)^T + beta c
template <typename T>
inline void mm_nt(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
                  T* c, int64_t ldc) {
  mm(false, true, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// c (m, n) = alpha a (m, k) b (k, n) + beta c
template <typename T>
inline void mm_nn(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
                  T* c, int64_t ldc) {
  mm(false, false, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// c (m, n) = alpha a (k, m)^T b (k, n) + beta c
template <typename T>
inline void mm_tn(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
                  T* c, int64_t ldc) {
  mm(true, false, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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

// The keys of block j0.. (bc of them) that query row i sees: all of them, or (causal) those up to key i.
inline int64_t seen(bool causal, int64_t i, int64_t j0, int64_t bc) {
  return causal ? std::clamp<int64_t>(i + 1 - j0, 0, bc) : bc;
}

// A (B, H, rows, cols) tensor with any batch, head and row strides, its rows contiguous: a view of q, k or v split
// into heads, or an output written heads side by side.  Indexed by the (batch, head) pair bh = b H + h.
template <typename T>
struct Rows {
  T* data;
  int64_t H, batch, head, row;  // heads; strides, in elements
  T* at(int64_t bh, int64_t i) const { return data + (bh / H) * batch + (bh % H) * head + i * row; }
};

// t (B, rows, cols) or (B, H, rows, cols) as Rows (a 3-D t: one head).
template <typename T>
Rows<T> rows_of(const Tensor& t) {
  T* p = const_cast<T*>(t.data_ptr<T>());
  if (t.dim() == 3) return {p, 1, t.stride(0), 0, t.stride(1)};
  return {p, t.size(1), t.stride(0), t.stride(1), t.stride(2)};
}

// t itself where BLAS can read its rows through their stride (apart, not overlapping), else a contiguous copy (rows
// broadcast with stride 0, say).
Tensor readable(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  return rows <= 1 || t.stride(-2) >= cols ? t : t.contiguous();
}

// A new output of q's (batch, head) pairs, (B, [H,] rows, cols): for a 4-D q whose heads lie side by side in memory
// (its head stride below its row stride: views of one projection, as the GPT's), laid out (B, rows, H, cols) and
// returned as its (B, H, rows, cols) view, the heads side by side too; else contiguous.
Tensor output_like(const Tensor& q, int64_t rows, int64_t cols) {
  if (q.dim() == 4 && q.stride(1) < q.stride(2)) {
    return at::empty({q.size(0), rows, q.size(1), cols}, q.options()).transpose(1, 2);
  }
  std::vector<int64_t> shape(q.sizes().begin(), q.sizes().end());
  shape[shape.size() - 2] = rows, shape.back() = cols;
  return at::empty(shape, q.options());
}

// rows i0..i1 of the (batch, head) pair bh's slice of t set to zero.
template <typename T>
void zero_rows(const Rows<T>& t, int64_t bh, int64_t i0, int64_t i1, int64_t cols) {
  for (int64_t i = i0; i < i1; ++i) std::fill(t.at(bh, i), t.at(bh, i) + cols, T(0));
}

template <typename T>
void forward_kernel(Rows<T> q, Rows<T> k, Rows<T> v, Rows<T> out, T* lse, int64_t BH, int64_t L, int64_t S,
                    int64_t E, int64_t Ev, T scale2, bool causal, int64_t Bc) {
  const int64_t V = Vec<T>::size();
  const int64_t Br = rows_per_block(L), row_blocks = (L + Br - 1) / Br;
  const T inf = std::numeric_limits<T>::infinity();
  at::parallel_for(0, BH * row_blocks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> s(Br * Bc), m(Br), l(Br);
    for (int64_t task = t0; task < t1; ++task) {
      // b: the (batch, head) pair
      const int64_t b = task / row_blocks, r0 = (task % row_blocks) * Br, br = std::min(L, r0 + Br) - r0;
      const T* qi = q.at(b, r0);  // (br, E)
      T* acc = out.at(b, r0);  // (br, Ev) the output rows accumulate in place, their stride ld
      const int64_t ld = out.row;
      zero_rows(out, b, r0, r0 + br, Ev);
      std::fill(m.begin(), m.end(), -inf);
      std::fill(l.begin(), l.end(), T(0));
      for (int64_t j0 = 0; j0 < S; j0 += Bc) {
        if (causal && j0 >= r0 + br) break;  // no row of this block sees these keys, nor any after them
        // the block's keys, less (causal) those after the block's last row
        const int64_t bc = causal ? std::min({S, j0 + Bc, r0 + br}) - j0 : std::min(S, j0 + Bc) - j0;
        mm_nt(br, bc, E, scale2, qi, q.row, k.at(b, j0), k.row, T(0), s.data(), bc);  // (br, bc) scale2 q_i k_j^T
        for (int64_t r = 0; r < br; ++r) {
          T* sr = s.data() + r * bc;
          const int64_t n = seen(causal, r0 + r, j0, bc);
          std::fill(sr + n, sr + bc, T(0));  // the keys after the row: p = 0
          if (n == 0) continue;
          Vec<T> vmax(-inf);
          for (int64_t j = 0; j < n; j += V) {
            vmax = at::vec::maximum(vmax, Vec<T>::set(Vec<T>(-inf), Vec<T>::loadu(sr + j, std::min(V, n - j)),
                                                      std::min(V, n - j)));
          }
          const T m_new = std::max(m[r], lanes_max(vmax));
          Vec<T> sum(T(0));
          for (int64_t j = 0; j < n; j += V) {  // p = 2^(s - m'), in s's memory
            const int64_t c = std::min<int64_t>(V, n - j);
            const Vec<T> p = (Vec<T>::loadu(sr + j, c) - Vec<T>(m_new)).exp2();
            p.store(sr + j, c);
            sum += first(p, c);
          }
          const T corr = std::exp2(m[r] - m_new);  // rescales what was summed against the old maximum (0 at first)
          l[r] = l[r] * corr + lanes_sum(sum);
          if (corr != T(1)) scale_row(acc + r * ld, Ev, corr);
          m[r] = m_new;
        }
        mm_nn(br, Ev, bc, T(1), s.data(), bc, v.at(b, j0), v.row, T(1), acc, ld);  // (br, Ev) acc += p v_j
      }
      for (int64_t r = 0; r < br; ++r) {
        if (l[r] == T(0)) {  // a row that saw no key (no keys at all): zeros, and 2^(s - inf) = 0 in backward
          lse[b * L + r0 + r] = inf;
          continue;
        }
        scale_row(acc + r * ld, Ev, T(1) / l[r]);
        lse[b * L + r0 + r] = m[r] + std::log2(l[r]);
      }
    }
  });
}

template <typename T>
void backward_kernel(Rows<T> q, Rows<T> k, Rows<T> v, Rows<T> dout, const T* D, const T* lse, Rows<T> dq,
                     Rows<T> dk, Rows<T> dv, int64_t BH, int64_t L, int64_t S, int64_t E, int64_t Ev, T scale,
                     bool causal, int64_t Bc) {
  const int64_t V = Vec<T>::size();
  const int64_t Br = rows_per_block(L);
  const T scale2 = scale * T(1.4426950408889634);  // scale log2(e)
  at::parallel_for(0, BH, 1, [&](int64_t b0, int64_t b1) {
    std::vector<T> p(Br * Bc), ds(Br * Bc);
    for (int64_t b = b0; b < b1; ++b) {  // b: the (batch, head) pair
      zero_rows(dq, b, 0, L, E);
      zero_rows(dk, b, 0, S, E);  // (a key no query row sees keeps zeros)
      zero_rows(dv, b, 0, S, Ev);
      for (int64_t r0 = 0; r0 < L; r0 += Br) {
        const int64_t br = std::min(L, r0 + Br) - r0;
        const T *qi = q.at(b, r0), *gi = dout.at(b, r0), *lse_i = lse + b * L + r0, *D_i = D + b * L + r0;
        for (int64_t j0 = 0; j0 < S; j0 += Bc) {
          if (causal && j0 >= r0 + br) break;
          const int64_t bc = causal ? std::min({S, j0 + Bc, r0 + br}) - j0 : std::min(S, j0 + Bc) - j0;
          mm_nt(br, bc, E, scale2, qi, q.row, k.at(b, j0), k.row, T(0), p.data(), bc);      // scale2 q_i k_j^T
          mm_nt(br, bc, Ev, T(1), gi, dout.row, v.at(b, j0), v.row, T(0), ds.data(), bc);  // dp = dout_i v_j^T
          for (int64_t r = 0; r < br; ++r) {
            T *pr = p.data() + r * bc, *dsr = ds.data() + r * bc;
            // a row that saw no key (lse = inf) has no gradient
            const int64_t n = std::isinf(lse_i[r]) ? 0 : seen(causal, r0 + r, j0, bc);
            const Vec<T> lse_r(lse_i[r]), D_r(D_i[r]);
            for (int64_t j = 0; j < n; j += V) {
              const int64_t c = std::min<int64_t>(V, n - j);
              // p = 2^(scale log2(e) q_i . k_j - lse_i), recomputed; ds = p (dp - D_i)
              const Vec<T> pj = (Vec<T>::loadu(pr + j, c) - lse_r).exp2();
              pj.store(pr + j, c);
              (pj * (Vec<T>::loadu(dsr + j, c) - D_r)).store(dsr + j, c);
            }
            std::fill(pr + n, pr + bc, T(0));  // the keys after the row
            std::fill(dsr + n, dsr + bc, T(0));
          }
          mm_tn(bc, Ev, br, T(1), p.data(), bc, gi, dout.row, T(1), dv.at(b, j0), dv.row);  // dv_j += p^T dout_i
          // dq_i += scale ds k_j
          mm_nn(br, E, bc, scale, ds.data(), bc, k.at(b, j0), k.row, T(1), dq.at(b, r0), dq.row);
          mm_tn(bc, E, br, scale, ds.data(), bc, qi, q.row, T(1), dk.at(b, j0), dk.row);  // dk_j += scale ds^T q_i
        }
      }
    }
  });
}

// t (B, rows, cols) or (B, H, rows, cols) in any layout whose rows are contiguous (a head's view of a wider
// projection, say): the kernels read it through its strides, no copy.
void check_rows(const Tensor& t, const Tensor& like, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "handgrad::", op, ": ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.scalar_type() == like.scalar_type() &&
                  (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble),
              "handgrad::", op, ": ", name, " must be float32 or float64 as q, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == like.dim() && (t.dim() == 3 || t.dim() == 4) && (t.stride(-1) == 1 || t.size(-1) <= 1),
              "handgrad::", op, ": ", name, " must be 3-D (B, rows, cols) or 4-D (B, H, rows, cols) as q, with ",
              "contiguous rows (last stride 1), got sizes ", t.sizes(), " strides ", t.strides());
}

// (B H, L, S, E, Ev): the (batch, head) pairs and the sizes, q (B, [H,] L, E), k (B, [H,] S, E), v (B, [H,] S, Ev).
std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t> check_qkv(const Tensor& q, const Tensor& k, const Tensor& v,
                                                                  const char* op) {
  check_rows(q, q, op, "q");
  check_rows(k, q, op, "k");
  check_rows(v, q, op, "v");
  const int64_t n = q.dim();
  bool ok = k.size(-1) == q.size(-1) && v.size(-2) == k.size(-2);
  for (int64_t d = 0; d < n - 2; ++d) ok = ok && k.size(d) == q.size(d) && v.size(d) == q.size(d);
  TORCH_CHECK(ok, "handgrad::", op, ": expected q (B, [H,] L, E), k (B, [H,] S, E), v (B, [H,] S, Ev), got ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  const int64_t BH = n == 3 ? q.size(0) : q.size(0) * q.size(1);
  return {BH, q.size(-2), k.size(-2), q.size(-1), v.size(-1)};
}

std::tuple<Tensor, Tensor> attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                             bool causal, int64_t block) {
  const auto [BH, L, S, E, Ev] = check_qkv(q, k, v, "attention_forward");
  TORCH_CHECK(block >= 1, "handgrad::attention_forward: block must be >= 1, got ", block);
  Tensor out = output_like(q, L, Ev);  // (B, [H,] L, Ev), the heads side by side in memory where q's are
  std::vector<int64_t> lse_shape(q.sizes().begin(), q.sizes().end());
  lse_shape.back() = 1;
  Tensor lse = at::empty(lse_shape, q.options());  // (B, [H,] L, 1)
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "attention_forward", [&] {
    forward_kernel<scalar_t>(rows_of<scalar_t>(readable(q)), rows_of<scalar_t>(readable(k)),
                             rows_of<scalar_t>(readable(v)), rows_of<scalar_t>(out), lse.data_ptr<scalar_t>(), BH,
                             L, S, E, Ev, static_cast<scalar_t>(scale * 1.4426950408889634), causal, block);
  });
  return {out, lse};
}

// The backward's checks, then its kernel writing dq, dk, dv (shaped as q, k, v, rows contiguous and apart).
void backward_into(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const Tensor& D,
                   const Tensor& lse, double scale, bool causal, int64_t block, const Tensor& dq, const Tensor& dk,
                   const Tensor& dv, const char* op) {
  const auto [BH, L, S, E, Ev] = check_qkv(q, k, v, op);
  TORCH_CHECK(block >= 1, "handgrad::", op, ": block must be >= 1, got ", block);
  check_rows(dout, q, op, "dout");
  std::vector<int64_t> dout_shape(q.sizes().begin(), q.sizes().end());
  dout_shape.back() = Ev;
  TORCH_CHECK(dout.sizes() == at::IntArrayRef(dout_shape), "handgrad::", op, ": dout must be ",
              at::IntArrayRef(dout_shape), " (q's with Ev last), got ", dout.sizes());
  check_same(D, q, op, "D"), check_numel(D, BH * L, op, "D");
  check_same(lse, q, op, "lse"), check_numel(lse, BH * L, op, "lse");
  for (const auto& [g, like, name] : {std::tuple<const Tensor&, const Tensor&, const char*>{dq, q, "dq"},
                                      {dk, k, "dk"}, {dv, v, "dv"}}) {
    check_rows(g, q, op, name);
    TORCH_CHECK(g.sizes() == like.sizes() && (g.size(-2) <= 1 || g.stride(-2) >= g.size(-1)), "handgrad::", op,
                ": ", name, " must be shaped as its input, ", like.sizes(), ", its rows apart, got sizes ",
                g.sizes(), " strides ", g.strides());
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "attention_backward", [&] {
    backward_kernel<scalar_t>(rows_of<scalar_t>(readable(q)), rows_of<scalar_t>(readable(k)),
                              rows_of<scalar_t>(readable(v)), rows_of<scalar_t>(readable(dout)),
                              D.data_ptr<scalar_t>(), lse.data_ptr<scalar_t>(), rows_of<scalar_t>(dq),
                              rows_of<scalar_t>(dk), rows_of<scalar_t>(dv), BH, L, S, E, Ev,
                              static_cast<scalar_t>(scale), causal, block);
  });
}

std::tuple<Tensor, Tensor, Tensor> attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                      const Tensor& dout, const Tensor& D, const Tensor& lse,
                                                      double scale, bool causal, int64_t block) {
  check_qkv(q, k, v, "attention_backward");
  // the heads side by side in memory where q's are, else contiguous, whatever k's and v's layout
  const int64_t L = q.size(-2), S = k.size(-2), E = q.size(-1), Ev = v.size(-1);
  Tensor dq = output_like(q, L, E), dk = output_like(q, S, E), dv = output_like(q, S, Ev);
  backward_into(q, k, v, dout, D, lse, scale, causal, block, dq, dk, dv, "attention_backward");
  return {dq, dk, dv};
}

// The same, written into dq, dk, dv given, any layout whose rows are contiguous: the GPT's (B, nh, T, hs) views of
// c_attn's (B, T, 3C) output gradient, so that no copy assembles it.
void attention_backward_into(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const Tensor& D,
                             const Tensor& lse, double scale, bool causal, int64_t block, const Tensor& dq,
                             const Tensor& dk, const Tensor& dv) {
  backward_into(q, k, v, dout, D, lse, scale, causal, block, dq, dk, dv, "attention_backward_into");
}

}  // namespace

TORCH_LIBRARY_IMPL(handgrad, CPU, m) {
  m.impl("attention_forward", &attention_forward);
  m.impl("attention_backward", &attention_backward);
  m.impl("attention_backward_into", &attention_backward_into);
}

}  // namespace handgrad
