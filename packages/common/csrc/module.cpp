// _distkit_common: exposes the shared native code (distkit/*.hpp) for tests and tools.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "distkit/adagrad.hpp"
#include "distkit/dtype.hpp"
#include "distkit/fsio.hpp"
#include "distkit/half.hpp"
#include "distkit/node.hpp"
#include "distkit/parallel.hpp"
#include "distkit/pybind.hpp"
#include "distkit/rows_cpu.hpp"
#include "distkit/rows_vec.hpp"
#include "distkit/shm.hpp"
#include "rows_dispatch.hpp"

namespace py = pybind11;
using namespace distkit;

namespace {

template <class T, class I>
void cpu_row_op(RowOp op, const RowOpArgs& a) {
  std::vector<T*> chunks(a.chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) chunks[i] = reinterpret_cast<T*>(a.chunks[i]);
  RowTable<T> t{chunks.data(), a.rows_per_chunk, a.nrows, a.ncols, a.row_stride, a.col_stride};
  const I* idx = reinterpret_cast<const I*>(a.idx);
  check_indices(idx, a.n, a.nrows);
  T* data = reinterpret_cast<T*>(a.data);
  switch (op) {
    case RowOp::Gather: gather_rows_cpu(t, idx, a.n, data); break;
    case RowOp::Scatter: scatter_rows_cpu(t, idx, a.n, static_cast<const T*>(data)); break;
    case RowOp::ScatterAdd: scatter_add_rows_cpu(t, idx, a.n, static_cast<const T*>(data), a.alpha); break;
  }
}

void row_op(RowOp op, std::vector<uintptr_t> chunks, int64_t rows_per_chunk, int64_t nrows, int64_t ncols,
            int64_t row_stride, int64_t col_stride, int dtype, uintptr_t idx, bool idx64, int64_t n, uintptr_t data,
            float alpha, bool on_device, uintptr_t stream, bool validate) {
  check(!chunks.empty(), "at least one chunk is required");
  check(rows_per_chunk > 0, "rows_per_chunk must be positive, got ", rows_per_chunk);
  check(static_cast<int64_t>(chunks.size()) * rows_per_chunk >= nrows, "chunk table of ", chunks.size(),
        " chunks x ", rows_per_chunk, " rows cannot hold ", nrows, " rows");
  check(ncols >= 0 && n >= 0 && nrows >= 0, "negative size");
  RowOpArgs a{std::move(chunks), rows_per_chunk, nrows, ncols, row_stride, col_stride,
              dtype_from_code(dtype), idx, idx64, n, data, alpha, validate};
  if (on_device) {
#ifdef DISTKIT_WITH_CUDA
    nogil release;
    cuda_row_op(op, a, stream);
    return;
#else
    throw Error("this build of distkit-common has no CUDA support (built without nvcc)");
#endif
  }
  nogil release;
  dispatch(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (a.idx64) {
      cpu_row_op<T, int64_t>(op, a);
    } else {
      cpu_row_op<T, int32_t>(op, a);
    }
  });
}

/// The row functions of rows_vec.hpp, run on the CPU the way a kernel runs them: rows in
/// groups of kRowsInFlight, each group's words split over `lanes` lanes that run in turn
/// (0: as many as the kernel would use). Returns the word width used; after the whole
/// call an IndexError names the first bad index (whose rows were zero-filled or skipped).
int row_op_words(RowOp op, const std::vector<uintptr_t>& chunks, int64_t rows_per_chunk, int64_t nrows,
                 int64_t row0, int64_t col0, int64_t ncols, int64_t row_stride, int64_t col_stride, int dtype,
                 uintptr_t idx, bool idx64, int64_t n, uintptr_t data, float alpha, int lanes) {
  check(!chunks.empty(), "at least one chunk is required");
  check(rows_per_chunk > 0, "rows_per_chunk must be positive, got ", rows_per_chunk);
  check(ncols >= 0 && n >= 0 && nrows >= 0 && row0 >= 0 && col0 >= 0, "negative size or offset");
  check(static_cast<int64_t>(chunks.size()) * rows_per_chunk >= row0 + nrows, "chunk table of ", chunks.size(),
        " chunks x ", rows_per_chunk, " rows cannot hold ", row0 + nrows, " rows");
  check(lanes >= 0 && lanes <= 32 && (lanes & (lanes - 1)) == 0, "lanes must be 0 or a power of two up to 32, got ",
        lanes);
  const DType dt = dtype_from_code(dtype);
  const int64_t es = itemsize(dt);
  std::vector<char*> bases(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) bases[c] = reinterpret_cast<char*>(chunks[c]);
  const ByteRows t = make_byte_rows(bases.data(), chunks[0], chunks.size(),
                                    rows_per_chunk, nrows, row0, col0, ncols, es, row_stride, col_stride);
  const int w = choose_word_bytes(t, chunks.data(), chunks.size(), data);
  if (op == RowOp::ScatterAdd && w < es) {
    throw ValueError(str("scatter-add needs elements aligned to their size (", es, " bytes); the table or values are ",
                         w, "-byte aligned"));
  }
  if (n == 0 || ncols == 0) return w;
  nogil release;
  const int G = lanes > 0 ? lanes : lanes_per_row(row_words(t, w));
  int64_t bad = -1;
  auto note = [&](int64_t b) {
    if (b >= 0 && (bad < 0 || b < bad)) bad = b;
  };
  auto run = [&](auto ix) {
    using I = std::remove_const_t<std::remove_pointer_t<decltype(ix)>>;
    dispatch_word(w, [&](auto wc) {
      constexpr int W = decltype(wc)::value;
      for (int64_t i0 = 0; i0 < n; i0 += kRowsInFlight) {
        for (int lane = 0; lane < G; ++lane) {
          char* d = reinterpret_cast<char*>(data);
          if (op == RowOp::Gather) {
            note(gather_rows_group<W, kRowsInFlight, I>(t, ix, i0, n, d, lane, G));
          } else if (op == RowOp::Scatter) {
            note(scatter_rows_group<W, kRowsInFlight, I>(t, ix, i0, n, d, lane, G));
          } else {
            dispatch(dt, [&](auto tag) {
              using T = decltype(tag);
              if constexpr (W >= static_cast<int>(sizeof(T))) {
                auto add = [](T* e, T v, float a) { add_scaled(*e, v, a); };
                note(scatter_add_rows_group<T, W, I>(t, ix, i0, n, kRowsInFlight, d, alpha, lane, G, add));
              }
            });
          }
        }
      }
    });
  };
  if (idx64) {
    run(reinterpret_cast<const int64_t*>(idx));
  } else {
    run(reinterpret_cast<const int32_t*>(idx));
  }
  if (bad >= 0) {
    const int64_t v = idx64 ? reinterpret_cast<const int64_t*>(idx)[bad] : reinterpret_cast<const int32_t*>(idx)[bad];
    throw IndexError(str("index ", v, " at position ", bad, " is out of range for ", nrows, " rows"));
  }
  return w;
}

RowOp row_op_code(const std::string& op) {
  if (op == "gather") return RowOp::Gather;
  if (op == "scatter") return RowOp::Scatter;
  if (op == "scatter_add") return RowOp::ScatterAdd;
  throw ValueError(str("unknown row op '", op, "'"));
}

class PyShm {
 public:
  explicit PyShm(ShmSegment s) : seg(std::move(s)) {}
  ShmSegment seg;
};

}  // namespace

PYBIND11_MODULE(_distkit_common, m) {
  m.doc() = "distkit-common native helpers (thread pool, fp16 conversion, row ops, shared memory)";
  init_module(m);

  m.def(
      "parallel_sum", [](int64_t n, int64_t grain, int64_t throw_at) {
        std::vector<int64_t> partial(static_cast<size_t>(get_num_threads()) * 64, 0);
        std::atomic<int64_t> total{0};
        {
          nogil release;
          parallel_for(0, n, grain, [&](int64_t lo, int64_t hi) {
            int64_t s = 0;
            for (int64_t i = lo; i < hi; ++i) {
              if (i == throw_at) throw ValueError(str("body failed at ", i));
              s += i;
            }
            total += s;
          });
        }
        return total.load();
      },
      py::arg("n"), py::arg("grain") = 1, py::arg("throw_at") = -1,
      "Sum 0..n-1 with parallel_for (tests the pool, including exception propagation).");

  m.def(
      "parallel_stress",
      [](int64_t calls) {
        nogil release;
        int64_t bad = 0;
        for (int64_t i = 0; i < calls; ++i) {
          std::atomic<int> hits[8];
          for (auto& h : hits) h.store(0);
          // 8 parts, then 2: a worker late from one call must not take a part of the next
          parallel_for(0, 8, (i % 2) ? 1 : 4, [&](int64_t lo, int64_t hi) {
            for (int64_t j = lo; j < hi; ++j) hits[j]++;
          });
          for (auto& h : hits) bad += h.load() != 1;
        }
        return bad;
      },
      py::arg("calls"),
      "Back-to-back parallel_for calls of 8 and 2 parts; returns how many parts ran other than once.");

  m.def(
      "convert_f32", [](uintptr_t src, uintptr_t dst, int64_t n, int dtype) {
        const DType t = dtype_from_code(dtype);
        check<TypeError>(t == DType::Float16 || t == DType::BFloat16, "convert_f32 supports float16/bfloat16");
        nogil release;
        auto* s = ptr<const float>(src);
        auto* d = ptr<uint16_t>(dst);
        parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) d[i] = t == DType::Float16 ? f32_to_f16(s[i]) : f32_to_bf16(s[i]);
        });
      },
      "Convert n float32 values at src to float16/bfloat16 bits at dst.");
  m.def(
      "convert_to_f32", [](uintptr_t src, uintptr_t dst, int64_t n, int dtype) {
        const DType t = dtype_from_code(dtype);
        check<TypeError>(t == DType::Float16 || t == DType::BFloat16, "convert_to_f32 supports float16/bfloat16");
        nogil release;
        auto* s = ptr<const uint16_t>(src);
        auto* d = ptr<float>(dst);
        parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) d[i] = t == DType::Float16 ? f16_to_f32(s[i]) : bf16_to_f32(s[i]);
        });
      },
      "Convert n float16/bfloat16 values at src to float32 at dst.");

  m.def(
      "row_op",
      [](const std::string& op, std::vector<uintptr_t> chunks, int64_t rows_per_chunk, int64_t nrows,
         int64_t ncols, int64_t row_stride, int64_t col_stride, int dtype, uintptr_t idx, bool idx64, int64_t n,
         uintptr_t data, float alpha, bool on_device, uintptr_t stream, bool validate) {
        row_op(row_op_code(op), std::move(chunks), rows_per_chunk, nrows, ncols, row_stride, col_stride, dtype, idx,
               idx64, n, data, alpha, on_device, stream, validate);
      },
      py::arg("op"), py::arg("chunks"), py::arg("rows_per_chunk"), py::arg("nrows"), py::arg("ncols"),
      py::arg("row_stride"), py::arg("col_stride"), py::arg("dtype"), py::arg("idx"), py::arg("idx64"), py::arg("n"),
      py::arg("data"), py::arg("alpha") = 1.0f, py::arg("on_device") = false, py::arg("stream") = 0,
      py::arg("validate") = true,
      "Row gather / scatter / scatter-add over a table of chunks (raw pointers). On a device, validate=False "
      "skips the index check (its stream synchronisation; allowed in CUDA graph capture): the kernels then "
      "skip rows with bad indices (a gather writes zeros there) and report nothing.");

  m.def(
      "row_op_words",
      [](const std::string& op, const std::vector<uintptr_t>& chunks, int64_t rows_per_chunk, int64_t nrows,
         int64_t row0, int64_t col0, int64_t ncols, int64_t row_stride, int64_t col_stride, int dtype, uintptr_t idx,
         bool idx64, int64_t n, uintptr_t data, float alpha, int lanes) {
        return row_op_words(row_op_code(op), chunks, rows_per_chunk, nrows, row0, col0, ncols, row_stride, col_stride,
                            dtype, idx, idx64, n, data, alpha, lanes);
      },
      py::arg("op"), py::arg("chunks"), py::arg("rows_per_chunk"), py::arg("nrows"), py::arg("row0"), py::arg("col0"),
      py::arg("ncols"), py::arg("row_stride"), py::arg("col_stride"), py::arg("dtype"), py::arg("idx"),
      py::arg("idx64"), py::arg("n"), py::arg("data"), py::arg("alpha") = 1.0f, py::arg("lanes") = 0,
      "Test hook: the GPU row functions (distkit/rows_vec.hpp) run on host memory, lane by lane; "
      "returns the word width in bytes.");
  m.def(
      "row_locate",
      [](int64_t rows_per_chunk, int64_t nchunks, int64_t row0, int64_t row_stride_bytes, int64_t r) {
        check(rows_per_chunk > 0 && nchunks > 0, "rows_per_chunk and nchunks must be positive");
        ByteRows t{};
        t.rows_per_chunk = rows_per_chunk;
        t.row0 = row0;
        t.row_stride_bytes = row_stride_bytes;
        t.single = nchunks == 1;
        int64_t c = 0, off = 0;
        t.locate(r, c, off);
        return py::make_tuple(c, off);
      },
      py::arg("rows_per_chunk"), py::arg("nchunks"), py::arg("row0"), py::arg("row_stride_bytes"), py::arg("r"),
      "Test hook: (chunk, byte offset) of row r as the GPU row functions compute it (no memory touched).");
  m.def(
      "adagrad_rows",
      [](uintptr_t w, uintptr_t acc, uintptr_t g, int64_t n, int dtype, double lr, double eps, bool fused) {
        check(n >= 0, "n must be >= 0, got ", n);
        nogil release;
        dispatch_floating(dtype_from_code(dtype), [&](auto tag) {
          using T = decltype(tag);
          using A = acc_t<T>;
          T* wt = ptr<T>(w);
          A* at = ptr<A>(acc);
          const A* gt = ptr<const A>(g);
          const A neg_lr = static_cast<A>(-lr), e = static_cast<A>(eps);
          for (int64_t i = 0; i < n; ++i) {  // as wholemem: the weight as A, updated, stored back as T
            A wi = static_cast<A>(wt[i]);
            if (fused) {
              adagrad_update<true>(wi, at[i], gt[i], neg_lr, e);
            } else {
              adagrad_update<false>(wi, at[i], gt[i], neg_lr, e);
            }
            wt[i] = T(wi);
          }
        });
      },
      py::arg("w"), py::arg("acc"), py::arg("g"), py::arg("n"), py::arg("dtype"), py::arg("lr"), py::arg("eps"),
      py::arg("fused"),
      "Test hook: distkit/adagrad.hpp's adagrad_update over n elements in place: weights w of dtype (16-bit "
      "ones updated in float32), accumulators acc and gradients g in the accumulation type (float32 or float64).");
  m.def("word_bytes_for", &word_bytes_for, py::arg("bits"),
        "The widest word (16/8/4/2/1 bytes) dividing bits (the OR of lengths, strides and addresses).");

  m.def(
      "fsync_path",
      [](const std::string& path) {
        nogil release;
        fsync_path(path);
      },
      py::arg("path"), "fsync a file or a directory by path (OSError with errno on failure).");
  m.def(
      "exchange_paths",
      [](const std::string& a, const std::string& b) {
        nogil release;
        return exchange_paths(a, b);
      },
      py::arg("a"), py::arg("b"),
      "Atomically swap two existing paths (renameat2 RENAME_EXCHANGE); False where unsupported.");

  m.attr("NODE_ID_ENV") = kNodeIdEnv;
  m.def("node_key", &node_key, "Equal on processes that share a node (hostname, boot id, /dev/shm; $DISTKIT_NODE_ID).");
  m.def("node_label", &node_label, "How messages name this node: its hostname, or 'node <id>' under $DISTKIT_NODE_ID.");

  m.def("random_token", &random_token, py::arg("nbytes") = 16, "Hex token of nbytes random bytes (getrandom).");

  py::class_<PyShm>(m, "ShmSegment", py::buffer_protocol())
      .def_static(
          "create", [](size_t size, const std::string& name) { return new PyShm(ShmSegment::create(size, name)); },
          py::arg("size"), py::arg("name") = "", "Create an owner-only (0600) segment and map it.")
      .def_static(
          "open", [](const std::string& name, size_t size) { return new PyShm(ShmSegment::open(name, size)); },
          py::arg("name"), py::arg("size"), "Map an existing segment.")
      .def("unlink", [](PyShm& s) { s.seg.unlink(); })
      .def_property_readonly("name", [](const PyShm& s) { return s.seg.name(); })
      .def_property_readonly("size", [](const PyShm& s) { return s.seg.size(); })
      .def_property_readonly("address", [](const PyShm& s) { return reinterpret_cast<uintptr_t>(s.seg.data()); })
      .def_property_readonly("linked", [](const PyShm& s) { return s.seg.linked(); })
      .def_buffer([](PyShm& s) {
        return py::buffer_info(s.seg.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(s.seg.size())}, {1});
      });
}
