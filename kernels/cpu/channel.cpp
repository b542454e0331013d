// kernels/cpu/channel.cpp: channel split and insert on the CPU (see kernels/channel.hpp).
//
// Both are the same strided copy: `rows` rows (one per sample) of count*height*width contiguous
// floats, with a different row pitch on each side. The rows are walked in memory order, split
// into one contiguous range per thread, and copied with memcpy.
#include "kernels/channel.hpp"

#include <algorithm>
#include <cstring>

namespace petra::kernels::cpu {

namespace {

// A thread gets at least this many floats: smaller parts cost more in threads than they save.
constexpr std::int64_t kMinValuesPerThread = 1 << 14;

// dst[r * dst_pitch + i] = src[r * src_pitch + i] for r < rows, i < row_length.
void copy_rows(const StreamHandle& s, std::int64_t rows, std::int64_t row_length, const float* src,
               std::int64_t src_pitch, float* dst, std::int64_t dst_pitch) {
  const std::int64_t total = rows * row_length;
  if (total == 0) return;
  const int parts = int(std::min<std::int64_t>(std::max(s.num_threads, 1),
                                               std::max<std::int64_t>(1, total / kMinValuesPerThread)));
#pragma omp parallel for schedule(static) num_threads(parts)
  for (int p = 0; p < parts; ++p) {
    const std::int64_t begin = total * p / parts, end = total * (p + 1) / parts;
    for (std::int64_t at = begin; at < end;) {
      const std::int64_t r = at / row_length, i = at % row_length;
      const std::int64_t length = std::min(row_length - i, end - at);
      std::memcpy(dst + r * dst_pitch + i, src + r * src_pitch + i, sizeof(float) * length);
      at += length;
    }
  }
}

}  // namespace

void channel_split(const StreamHandle& s, const ChannelShape& shape, const float* full,
                   std::int64_t first_channel, std::int64_t count, float* part) {
  use_threads(s);
  const std::int64_t row = count * shape.plane();
  copy_rows(s, shape.batch, row, full + first_channel * shape.plane(),
            shape.channels * shape.plane(), part, row);
}

void channel_insert(const StreamHandle& s, const ChannelShape& shape, const float* part,
                    std::int64_t first_channel, std::int64_t count, float* full) {
  use_threads(s);
  const std::int64_t row = count * shape.plane();
  copy_rows(s, shape.batch, row, part, row, full + first_channel * shape.plane(),
            shape.channels * shape.plane());
}

}  // namespace petra::kernels::cpu
