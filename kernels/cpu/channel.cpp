// kernels/cpu/channel.cpp: channel split, insert and accumulate on the CPU (see kernels/channel.hpp).
//
// All three walk the same strided rows: `rows` rows (one per sample) of count*height*width contiguous
// floats, with a different row pitch on each side. The rows are walked in memory order, split
// into one contiguous range per thread (for_each_row_run, kernels/cpu/parallel.hpp), and copied
// with memcpy or added element by element.
#include "petra/kernels/channel.hpp"

#include <algorithm>
#include <cstring>

#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu {

namespace {

// op(dst + r * dst_pitch, src + r * src_pitch, begin, end) over every row r < rows, with the
// row's [0, row_length) split into per-thread ranges.
template <class RowOp>
void walk_rows(const StreamHandle& s, std::int64_t rows, std::int64_t row_length, const float* src,
               std::int64_t src_pitch, float* dst, std::int64_t dst_pitch, RowOp op) {
  const std::int64_t total = rows * row_length;
  if (total == 0) return;
  for_each_row_run(threads_with_share(s, total), rows, row_length,
                   [&](std::int64_t r, std::int64_t begin, std::int64_t end) {
    op(dst + r * dst_pitch, src + r * src_pitch, begin, end);
  });
}

void copy_range(float* to, const float* from, std::int64_t begin, std::int64_t end) {
  std::memcpy(to + begin, from + begin, sizeof(float) * (end - begin));
}

void add_range(float* __restrict to, const float* __restrict from, std::int64_t begin, std::int64_t end) {
  for (std::int64_t i = begin; i < end; ++i) to[i] += from[i];
}

// op(full's row, part's row, begin, end) over the rows of full's channel range and of part.
template <class RowOp>
void into_range(const StreamHandle& s, const ChannelShape& shape, const float* part, std::int64_t first_channel,
                std::int64_t count, float* full, RowOp op) {
  use_threads(s);
  const std::int64_t row = count * shape.plane();
  walk_rows(s, shape.batch, row, part, row, full + first_channel * shape.plane(), shape.channels * shape.plane(), op);
}

}  // namespace

void channel_split(const StreamHandle& s, const ChannelShape& shape, const float* full,
                   std::int64_t first_channel, std::int64_t count, float* part) {
  use_threads(s);
  const std::int64_t row = count * shape.plane();
  walk_rows(s, shape.batch, row, full + first_channel * shape.plane(), shape.channels * shape.plane(), part, row,
            copy_range);
}

void channel_insert(const StreamHandle& s, const ChannelShape& shape, const float* part,
                    std::int64_t first_channel, std::int64_t count, float* full) {
  into_range(s, shape, part, first_channel, count, full, copy_range);
}

void channel_accumulate(const StreamHandle& s, const ChannelShape& shape, const float* part,
                        std::int64_t first_channel, std::int64_t count, float* full) {
  into_range(s, shape, part, first_channel, count, full, add_range);
}

}  // namespace petra::kernels::cpu
