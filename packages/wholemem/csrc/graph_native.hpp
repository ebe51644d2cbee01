// graph_native.hpp - declarations shared by the graph bindings (graph_bindings.cpp),
// the CPU drivers (graph_cpu.cpp) and the CUDA drivers (graph_cuda.cu).
#pragma once

#include <cstdint>

namespace wholemem {
namespace graph {

/// One sampling call as raw addresses (0 = absent), filled by the bindings.
struct SampleArgs {
  // where the neighbour lists are: row_ptr + centers, or starts + ends (one per center)
  uintptr_t row_ptr = 0;
  int64_t num_nodes = 0;  // rows of the CSR (row_ptr has num_nodes + 1 entries)
  int64_t num_edges = 0;  // entries of col / weights
  uintptr_t centers = 0;
  bool centers64 = true;
  int64_t n = 0;  // number of centers
  uintptr_t starts = 0;
  uintptr_t ends = 0;
  // what to read
  uintptr_t col = 0;  // 0: dest is not written (the caller gathers col[edge_id])
  bool col64 = true;
  uintptr_t weights = 0;  // 0: unweighted
  bool weights64 = false;
  uintptr_t weight_offsets = 0;  // compact weights (see SampleJob)
  int64_t k = 0;
  uint64_t seed = 0;
  // outputs
  uintptr_t offsets = 0;  // int32 [n + 1]
  uintptr_t dest = 0;
  uintptr_t center_local = 0;
  uintptr_t edge_id = 0;  // int64 [total]
  uintptr_t keys = 0;     // float64 [total], weighted only
};

/// Validate the centers and their neighbour ranges, write offsets (exclusive prefix sum of
/// the per-center sample counts, offsets[n] = total) and return the total.
int64_t sample_offsets_cpu(const SampleArgs& a);
/// Sample every center into the outputs sized by sample_offsets_cpu.
void sample_fill_cpu(const SampleArgs& a);
/// WholeGraph's append_unique: out = targets, then each neighbour id not seen before, in order
/// of first appearance; map[j] = position of neighbours[j] in out (null: not wanted). Returns
/// the length of out (out must hold nt + nn ids).
int64_t append_unique_cpu(uintptr_t targets, int64_t nt, uintptr_t neighbors, int64_t nn, bool ids64, uintptr_t out,
                          uintptr_t map);

#ifdef DISTKIT_WITH_CUDA
namespace cuda {
/// offsets[0] = 0 and offsets[i + 1] = count of center i, on `stream` of `device` (the caller
/// turns them into a prefix sum on the device).
void sample_counts(const SampleArgs& a, int device, uintptr_t stream);
/// The CPU's sample_fill_cpu as a kernel (one thread per center) on `stream` of `device`.
void sample_fill(const SampleArgs& a, int device, uintptr_t stream);
}  // namespace cuda
#endif

}  // namespace graph
}  // namespace wholemem
