// kernels/cpu/channel.cpp: channel split and insert on the CPU (see kernels/channel.hpp).
//
// Both are the same strided copy: `rows` rows (one per sample) of count*height*width contiguous
// floats, with a different row pitch on each side. The rows are walked in memory order, split
// into one contiguous range per thread (for_each_row_run, kernels/cpu/parallel.hpp), and copied
// with memcpy.
#include "petra/kernels/channel.hpp"

#include <algorithm>
#include <cstring>

#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu {

namespace {

// dst[r * dst_pitch + i] = src[r * src_pitch + i] for r < rows, i < row_length.
void copy_rows(const StreamHandle& s, std::int64_t rows, std::int64_t row_length, const float* src,
               std::int64_t src_pitch, float* dst, std::int64_t dst_pitch) {
  const std::int64_t total = rows * row_length;
  if (total == 0) return;
  for_each_row_run(threads_with_share(s, total), rows, row_length,
                   [&](std::int64_t r, std::int64_t begin, std::int64_t end) {
    std::memcpy(dst + r * dst_pitch + begin, src + r * src_pitch + begin, sizeof(float) * (end - begin));
  });
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
