// What every kernel of kernels/cpp/ shares: the vector type, the dispatch over float and double, the checks, and
// the split of a reduction across threads.  The kernels compute in the input's dtype (float32 or float64); other
// dtypes never reach them (kernels/cpp/__init__.py routes those to the eager kernels).
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace handgrad {

using at::Tensor;
template <typename T>
using Vec = at::vec::Vectorized<T>;

// t is a CPU tensor of float32 or float64, laid out densely in row-major order (the wrappers call .contiguous()).
inline void check_input(const Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "handgrad::", op, ": ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, "handgrad::", op, ": ", name,
              " must be float32 or float64, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "handgrad::", op, ": ", name, " must be contiguous");
}

inline void check_same(const Tensor& t, const Tensor& like, const char* op, const char* name) {
  check_input(t, op, name);
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "handgrad::", op, ": ", name, " is ", t.scalar_type(),
              " but the input is ", like.scalar_type());
}

inline void check_numel(const Tensor& t, int64_t n, const char* op, const char* name) {
  TORCH_CHECK(t.numel() == n, "handgrad::", op, ": ", name, " has ", t.numel(), " elements, expected ", n);
}

// The sum of a vector's lanes.
template <typename T>
inline T lanes_sum(const Vec<T>& v) {
  return at::vec::vec_reduce_all<T>([](Vec<T>& a, Vec<T>& b) { return a + b; }, v);
}

// The largest of a vector's lanes.
template <typename T>
inline T lanes_max(const Vec<T>& v) {
  return at::vec::vec_reduce_all<T>([](Vec<T>& a, Vec<T>& b) { return at::vec::maximum(a, b); }, v);
}

// The first `count` lanes of v, zeros after (a row's tail, kept out of a sum).
template <typename T>
inline Vec<T> first(const Vec<T>& v, int64_t count) {
  return Vec<T>::set(Vec<T>(T(0)), v, count);
}

// A sum over rows that each thread takes a contiguous run of: the number of runs, at most one per thread, each of
// at least `min_rows` rows, so that a small problem stays in one run (no partial buffers to add up).
inline int64_t runs_for(int64_t rows, int64_t min_rows) {
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  return std::max<int64_t>(1, std::min<int64_t>(threads, rows / std::max<int64_t>(min_rows, 1)));
}

// f(run, begin, end) for each of `runs` contiguous runs of [0, n), the runs on at::parallel_for's threads.
template <typename F>
inline void for_runs(int64_t n, int64_t runs, const F& f) {
  at::parallel_for(0, runs, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      f(r, n * r / runs, n * (r + 1) / runs);
    }
  });
}

// Rows per at::parallel_for task for row-wise work of `cols` values a row: about 32k values a task.
inline int64_t grain_rows(int64_t cols) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
}

}  // namespace handgrad
