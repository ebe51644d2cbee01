// distkit/rows_cuda.cuh - CUDA kernels for rows.hpp: the same per-element code as the CPU.
#pragma once

#include "cuda.hpp"
#include "rows.hpp"

namespace distkit {
namespace cuda {

template <class T, class I>
__global__ void gather_rows_kernel(RowTable<T> t, const I* idx, int64_t n, T* out) {
  const int64_t total = n * t.ncols;
  for (int64_t f = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; f < total; f += int64_t(gridDim.x) * blockDim.x)
    gather_element(t, idx, out, f);
}

template <class T, class I>
__global__ void scatter_rows_kernel(RowTable<T> t, const I* idx, int64_t n, const T* vals) {
  const int64_t total = n * t.ncols;
  for (int64_t f = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; f < total; f += int64_t(gridDim.x) * blockDim.x)
    scatter_element(t, idx, vals, f);
}

/// Device-side accumulation: atomics where the hardware has them.
template <class T>
__device__ inline void atomic_add_scaled(T* p, T v, float alpha) {
  atomicAdd(p, static_cast<T>(alpha * v));
}

template <class T, class I>
__global__ void scatter_add_rows_kernel(RowTable<T> t, const I* idx, int64_t n, const T* vals, float alpha) {
  const int64_t total = n * t.ncols;
  for (int64_t f = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; f < total; f += int64_t(gridDim.x) * blockDim.x) {
    int64_t i, j;
    split_flat(f, t.ncols, i, j);
    atomic_add_scaled(&t.at(static_cast<int64_t>(idx[i]), j), vals[f], alpha);
  }
}

template <class T, class I>
void gather_rows(const RowTable<T>& t, const I* idx, int64_t n, T* out, cudaStream_t s) {
  if (n == 0 || t.ncols == 0) return;
  auto cfg = launch_config(n * t.ncols);
  gather_rows_kernel<<<cfg.blocks, cfg.threads, 0, s>>>(t, idx, n, out);
  check(cudaGetLastError(), "gather_rows_kernel launch");
}

template <class T, class I>
void scatter_rows(const RowTable<T>& t, const I* idx, int64_t n, const T* vals, cudaStream_t s) {
  if (n == 0 || t.ncols == 0) return;
  auto cfg = launch_config(n * t.ncols);
  scatter_rows_kernel<<<cfg.blocks, cfg.threads, 0, s>>>(t, idx, n, vals);
  check(cudaGetLastError(), "scatter_rows_kernel launch");
}

template <class T, class I>
void scatter_add_rows(const RowTable<T>& t, const I* idx, int64_t n, const T* vals, float alpha, cudaStream_t s) {
  if (n == 0 || t.ncols == 0) return;
  auto cfg = launch_config(n * t.ncols);
  scatter_add_rows_kernel<<<cfg.blocks, cfg.threads, 0, s>>>(t, idx, n, vals, alpha);
  check(cudaGetLastError(), "scatter_add_rows_kernel launch");
}

}  // namespace cuda
}  // namespace distkit
