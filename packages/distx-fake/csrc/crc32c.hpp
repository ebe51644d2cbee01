// crc32c.hpp - CRC-32C (Castagnoli) of distx-fake's checkpoints: the SSE4.2 crc32 instruction
// (three interleaved streams) when the CPU has it, else a slicing-by-8 table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace distx {

/// CRC-32C (Castagnoli) of [data, data + n), continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
/// Same, forcing the portable software implementation (for tests).
uint32_t crc32c_sw(const void* data, size_t n, uint32_t crc = 0);
/// True when the SSE4.2 crc32 instruction is used.
bool crc32c_hw_available();

}  // namespace distx
