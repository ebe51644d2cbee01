// _distx_fake: native core of distx-fake (the checkpoint I/O engine).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "distkit/parallel.hpp"
#include "distkit/pybind.hpp"
#include "io_engine.hpp"
#include "mt19937.hpp"

namespace py = pybind11;

namespace {

using PieceTuple = std::tuple<uintptr_t, int64_t, int64_t>;

std::vector<distx::Piece> to_pieces(const std::vector<PieceTuple>& in) {
  std::vector<distx::Piece> out;
  out.reserve(in.size());
  for (const auto& [ptr, nbytes, offset] : in) {
    distkit::check(nbytes >= 0, "piece length must be >= 0, got ", nbytes);
    distkit::check(offset >= 0, "file offset must be >= 0, got ", offset);
    distkit::check(ptr != 0 || nbytes == 0, "null pointer for a piece of ", nbytes, " bytes");
    out.push_back({ptr, nbytes, offset});
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_distx_fake, m) {
  m.doc() = "native core of distx-fake: thread-pool checkpoint I/O with crc32c";
  distkit::init_module(m);
  m.def("crc32c_hw_available", &distx::crc32c_hw_available);
  m.attr("DIRECT_ALIGN") = distx::kDirectAlign;
  m.def(
      "crc32c",
      [](py::buffer data, uint32_t crc, bool software) {
        py::buffer_info info = data.request();
        size_t n = static_cast<size_t>(info.size * info.itemsize);
        distkit::nogil release;
        return software ? distx::crc32c_sw(info.ptr, n, crc) : distx::crc32c(info.ptr, n, crc);
      },
      py::arg("data"), py::arg("crc") = 0, py::arg("software") = false,
      "CRC-32C of a buffer, continuing from `crc`.");
  m.def(
      "crc32c_ptr",
      [](uintptr_t ptr, int64_t nbytes, uint32_t crc) {
        distkit::check(nbytes >= 0, "nbytes must be >= 0, got ", nbytes);
        distkit::nogil release;
        return distx::crc32c(distkit::ptr<void>(ptr), static_cast<size_t>(nbytes), crc);
      },
      py::arg("ptr"), py::arg("nbytes"), py::arg("crc") = 0);
  m.def(
      "write_pieces",
      [](int fd, const std::vector<PieceTuple>& pieces, bool direct) {
        auto pcs = to_pieces(pieces);
        distkit::nogil release;
        return distx::write_pieces(fd, pcs, direct);
      },
      py::arg("fd"), py::arg("pieces"), py::arg("direct") = false,
      "pwrite (ptr, nbytes, offset) pieces in parallel; returns their crc32c.");
  m.def(
      "read_pieces",
      [](int fd, const std::vector<PieceTuple>& pieces, bool direct) {
        auto pcs = to_pieces(pieces);
        distkit::nogil release;
        return distx::read_pieces(fd, pcs, direct);
      },
      py::arg("fd"), py::arg("pieces"), py::arg("direct") = false,
      "pread (ptr, nbytes, offset) pieces in parallel; returns their crc32c.");
  m.def(
      "copy_pieces",
      [](const std::vector<std::tuple<int, bool>>& sources, const std::vector<int>& dsts,
         const std::vector<std::tuple<int, int64_t, int64_t>>& pieces,
         const std::vector<std::tuple<int64_t, int64_t, int64_t, int, int64_t>>& runs, bool writeback) {
        std::vector<int> src_fds;
        std::vector<bool> src_direct;
        for (const auto& [fd, direct] : sources) {
          src_fds.push_back(fd);
          src_direct.push_back(direct);
        }
        std::vector<distx::SourcePiece> pcs;
        pcs.reserve(pieces.size());
        for (const auto& [src, offset, nbytes] : pieces) pcs.push_back({src, offset, nbytes});
        std::vector<distx::Run> rs;
        rs.reserve(runs.size());
        for (const auto& [piece, at, nbytes, dst, offset] : runs) rs.push_back({piece, at, nbytes, dst, offset});
        distkit::nogil release;
        return distx::copy_pieces(src_fds, src_direct, dsts, pcs, std::move(rs), writeback);
      },
      py::arg("sources"), py::arg("dsts"), py::arg("pieces"), py::arg("runs"), py::arg("writeback") = false,
      "Copy (source, offset, nbytes) pieces of `sources` ((fd, direct) pairs) to their "
      "(piece, at, nbytes, dst, offset) runs in the `dsts` fds, reading each piece once "
      "(`writeback`: start writing the pages to disk as they are done); returns each piece's crc32c.");
  m.def(
      "cached_fraction",
      [](int fd) {
        distkit::nogil release;
        return distx::cached_fraction(fd);
      },
      py::arg("fd"), "Fraction (0..1) of an open file's pages in the page cache now.");
  m.def(
      "fsync_fd",
      [](int fd) {
        distkit::nogil release;
        distx::fsync_fd(fd);
      },
      py::arg("fd"));
  m.def(
      "fsync_path",
      [](const std::string& path) {
        distkit::nogil release;
        distx::fsync_path(path);
      },
      py::arg("path"), "fsync a file or a directory by path.");
  m.def(
      "mt19937_advance",
      [](uintptr_t state_ptr, int64_t nbytes, int64_t draws) {
        distkit::nogil release;
        distx::mt_advance(distkit::ptr<uint8_t>(state_ptr), nbytes, draws);
      },
      py::arg("state_ptr"), py::arg("nbytes"), py::arg("draws"),
      "Advance a serialized torch CPU generator state (uint8 tensor memory) by `draws` 32-bit draws, in place.");
  m.def("exchange_paths", &distx::exchange_paths, py::arg("a"), py::arg("b"),
        "Atomically swap two paths (renameat2 RENAME_EXCHANGE); False if unsupported.");
}
