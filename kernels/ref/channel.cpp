// kernels/ref/channel.cpp: the oracle for kernels/channel.hpp, plain loops.
#include "petra/kernels/channel.hpp"

namespace petra::kernels::ref {

template <class T>
void channel_split(const StreamHandle&, const ChannelShape& shape, const T* full,
                   std::int64_t first_channel, std::int64_t count, T* part) {
  for (std::int64_t n = 0; n < shape.batch; ++n)
    for (std::int64_t c = 0; c < count; ++c)
      for (std::int64_t i = 0; i < shape.plane(); ++i)
        part[(n * count + c) * shape.plane() + i] =
            full[(n * shape.channels + first_channel + c) * shape.plane() + i];
}

template <class T>
void channel_insert(const StreamHandle&, const ChannelShape& shape, const T* part,
                    std::int64_t first_channel, std::int64_t count, T* full) {
  for (std::int64_t n = 0; n < shape.batch; ++n)
    for (std::int64_t c = 0; c < count; ++c)
      for (std::int64_t i = 0; i < shape.plane(); ++i)
        full[(n * shape.channels + first_channel + c) * shape.plane() + i] =
            part[(n * count + c) * shape.plane() + i];
}

template <class T>
void channel_accumulate(const StreamHandle&, const ChannelShape& shape, const T* part,
                        std::int64_t first_channel, std::int64_t count, T* full) {
  for (std::int64_t n = 0; n < shape.batch; ++n)
    for (std::int64_t c = 0; c < count; ++c)
      for (std::int64_t i = 0; i < shape.plane(); ++i)
        full[(n * shape.channels + first_channel + c) * shape.plane() + i] +=
            part[(n * count + c) * shape.plane() + i];
}

#define PETRA_INSTANTIATE(T)                                                                \
  template void channel_split<T>(const StreamHandle&, const ChannelShape&, const T*,        \
                                 std::int64_t, std::int64_t, T*);                           \
  template void channel_insert<T>(const StreamHandle&, const ChannelShape&, const T*,       \
                                  std::int64_t, std::int64_t, T*);                          \
  template void channel_accumulate<T>(const StreamHandle&, const ChannelShape&, const T*,   \
                                      std::int64_t, std::int64_t, T*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::ref
