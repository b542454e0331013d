// data/npy_directory.cpp: bring-your-own data as .npy files (layout in data/readers.hpp).
//
// uint8 images come channels-last ([N, H, W, C], as image libraries and NumPy users hold them) and
// are transposed here to [N, C, H, W]; float32 images come channels-first and are used as they are.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "petra/data/reader_support.hpp"
#include "petra/data/readers.hpp"
#include "petra/npy.hpp"

namespace petra::data {

namespace fs = std::filesystem;
using ::petra::detail::concat;

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Byte offset of the first element: everything before the data is the npy header.
std::uint64_t data_offset(const fs::path& file, const NpyArray& array) {
  return fs::file_size(file) - array.data.size();
}

Tensor read_images(const fs::path& file) {
  const NpyArray array = read_npy(file);
  const auto& shape = array.shape;
  const bool channels_last_bytes = array.dtype == DType::u8 && shape.size() == 4;
  const bool three_dims = shape.size() == 3;
  if (!((array.dtype == DType::u8 || array.dtype == DType::f32) && (three_dims || shape.size() == 4)))
    detail::fail("npy", file, 0, false, concat("images must be float32 [N, C, H, W] or uint8 [N, H, W, C] (or [N, H, W]), got ",
                                               name_of(array.dtype), " ", shape_text(shape)));
  const std::int64_t n = shape[0];
  const std::int64_t channels = three_dims ? 1 : (channels_last_bytes ? shape[3] : shape[1]);
  const std::int64_t height = channels_last_bytes ? shape[1] : shape[shape.size() - 2];
  const std::int64_t width = channels_last_bytes ? shape[2] : shape[shape.size() - 1];
  if (channels <= 0 || height <= 0 || width <= 0)
    detail::fail("npy", file, 0, false, concat("image dims ", shape_text(shape), " have a zero size"));
  const auto field = [&](std::string_view what) {
    return [&file, &shape, what] { return concat("npy file '", file.string(), "', byte 0: images ", shape_text(shape), ": ", what); };
  };
  check_at_most<IOError>(channels, kMaxChannels, field("the channel count"));
  check_at_most<IOError>(height, kMaxImageSide, field("the height"));
  check_at_most<IOError>(width, kMaxImageSide, field("the width"));
  if (n == 0) detail::fail("npy", file, 0, false, concat("the file holds no images (its shape is ", shape_text(shape), ")"));

  Tensor images = Tensor::empty({n, channels, height, width}, array.dtype);
  if (!channels_last_bytes) {
    std::memcpy(images.raw_data(), array.data.data(), array.data.size());
  } else {
    const auto* in = reinterpret_cast<const std::uint8_t*>(array.data.data());
    std::uint8_t* out = images.data_ptr<std::uint8_t>();
    const std::int64_t plane = height * width;
    for (std::int64_t i = 0; i < n; ++i, in += plane * channels, out += plane * channels)
      for (std::int64_t p = 0; p < plane; ++p)
        for (std::int64_t c = 0; c < channels; ++c) out[c * plane + p] = in[p * channels + c];
  }
  if (array.dtype == DType::f32) {
    const float* value = images.data_ptr<float>();
    const std::uint64_t first = data_offset(file, array);
    for (std::int64_t i = 0; i < images.numel(); ++i)
      if (!std::isfinite(value[i]))
        detail::fail("npy", file, first + 4 * static_cast<std::uint64_t>(i), false, concat("pixel ", i, " is ", value[i]));
  }
  return images;
}

Tensor read_labels(const fs::path& file, std::int64_t expected, const fs::path& images_file) {
  const NpyArray array = read_npy(file);
  if (is_floating(array.dtype) || array.shape.size() != 1)
    detail::fail("npy", file, 0, false, concat("labels must be integers [N], got ", name_of(array.dtype), " ",
                                               shape_text(array.shape)));
  if (array.shape[0] != expected)
    detail::fail("npy", file, 0, false, concat(array.shape[0], " labels, but '", images_file.string(), "' has ",
                                               expected, " images"));
  Tensor labels = Tensor::empty({expected}, DType::i64);
  std::int64_t* label = labels.data_ptr<std::int64_t>();
  const std::size_t item = size_of(array.dtype);
  for (std::int64_t i = 0; i < expected; ++i) {
    const std::byte* p = array.data.data() + static_cast<std::size_t>(i) * item;
    if (array.dtype == DType::i64) std::memcpy(&label[i], p, 8);
    else if (array.dtype == DType::i32) { std::int32_t v; std::memcpy(&v, p, 4); label[i] = v; }
    else label[i] = std::to_integer<std::int64_t>(*p);
    if (label[i] < 0)
      detail::fail("npy", file, data_offset(file, array) + static_cast<std::uint64_t>(i) * item, false,
                   concat("label ", label[i], " of sample ", i, " is negative"));
  }
  return labels;
}

std::int64_t largest_label(const Tensor& labels) {
  const std::int64_t* label = labels.data_ptr<std::int64_t>();
  return labels.numel() == 0 ? -1 : *std::max_element(label, label + labels.numel());
}

}  // namespace

Split read_npy_directory(const fs::path& directory) {
  Split split;
  const fs::path train_images = directory / "images.npy", test_images = directory / "test_images.npy";
  const fs::path test_labels = directory / "test_labels.npy";
  split.train.images = read_images(train_images);
  split.train.labels = read_labels(directory / "labels.npy", split.train.size(), train_images);

  std::error_code error;
  const bool has_test_images = fs::exists(test_images, error), has_test_labels = fs::exists(test_labels, error);
  if (has_test_images != has_test_labels)
    throw IOError(concat("npy directory '", directory.string(), "': ", has_test_images ? "test_images.npy" : "test_labels.npy",
                         " without ", has_test_images ? "test_labels.npy" : "test_images.npy"));
  if (has_test_images) {
    split.test.images = read_images(test_images);
    const Shape& a = split.train.images.shape();
    const Shape& b = split.test.images.shape();
    if (a[1] != b[1] || a[2] != b[2] || a[3] != b[3] || split.train.images.dtype() != split.test.images.dtype())
      detail::fail("npy", test_images, 0, false, concat("test images are ", name_of(split.test.images.dtype()), " ", b.str(),
                                                        ", training images ", name_of(split.train.images.dtype()), " ", a.str()));
    split.test.labels = read_labels(test_labels, split.test.size(), test_images);
  } else {
    split.test.images = Tensor::empty(split.train.images.shape().with(0, 0), split.train.images.dtype());
    split.test.labels = Tensor::empty({0}, DType::i64);
  }

  const std::int64_t classes = std::max(largest_label(split.train.labels), largest_label(split.test.labels)) + 1;
  const Normalization normalization = compute_normalization(split.train.images);
  for (Dataset* d : {&split.train, &split.test}) {
    d->classes = classes;
    d->normalization = normalization;
    d->augmentation = default_augmentation(d->height(), true);
  }
  split.train.name = "npy/train";
  split.test.name = "npy/test";
  return split;
}

}  // namespace petra::data
