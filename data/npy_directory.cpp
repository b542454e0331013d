// data/npy_directory.cpp: bring-your-own data as .npy files (layout in data/readers.hpp).
//
// uint8 images come channels-last ([N, H, W, C], as image libraries and NumPy users hold them) and
// are transposed here to [N, C, H, W]; float32 images come channels-first and are used as they are.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

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

// A label file's labels, and where they lie in it (for messages).
struct Labels {
  Tensor values;             // int64 [N], each >= 0
  std::uint64_t first = 0;   // byte offset of label 0
  std::uint64_t stride = 0;  // bytes per label
};

Labels read_labels(const fs::path& file, std::int64_t expected, const fs::path& images_file) {
  const NpyArray array = read_npy(file);
  if (is_floating(array.dtype) || array.shape.size() != 1)
    detail::fail("npy", file, 0, false, concat("labels must be integers [N], got ", name_of(array.dtype), " ",
                                               shape_text(array.shape)));
  if (array.shape[0] != expected)
    detail::fail("npy", file, 0, false, concat(array.shape[0], " labels, but '", images_file.string(), "' has ",
                                               expected, " images"));
  Labels labels{Tensor::empty({expected}, DType::i64), data_offset(file, array), size_of(array.dtype)};
  std::int64_t* label = labels.values.data_ptr<std::int64_t>();
  const std::size_t item = size_of(array.dtype);
  for (std::int64_t i = 0; i < expected; ++i) {
    const std::byte* p = array.data.data() + static_cast<std::size_t>(i) * item;
    if (array.dtype == DType::i64) std::memcpy(&label[i], p, 8);
    else if (array.dtype == DType::i32) { std::int32_t v; std::memcpy(&v, p, 4); label[i] = v; }
    else label[i] = std::to_integer<std::int64_t>(*p);
    if (label[i] < 0)
      detail::fail("npy", file, labels.first + static_cast<std::uint64_t>(i) * item, false,
                   concat("label ", label[i], " of sample ", i, " is negative"));
  }
  return labels;
}

// The number of classes classes.txt names: one name per line ("\n" or "\r\n", a final newline or
// not). An empty line (it would shift the names after it), no name at all, or more than kMaxClasses
// names is refused, naming the line.
std::int64_t read_class_count(const fs::path& file) {
  constexpr std::uintmax_t kMaxBytes = std::uintmax_t{16} << 20;  // 100,000 names of ~160 characters
  std::error_code error;
  const std::uintmax_t bytes = fs::file_size(file, error);
  if (error) throw IOError(concat("classes file '", file.string(), "': cannot read: ", error.message()));
  if (bytes > kMaxBytes)
    detail::fail("classes", file, 0, false, concat("the file has ", bytes, " bytes, above the limit of ", kMaxBytes,
                                                   " for ", kMaxClasses, " class names"));
  std::ifstream in(file, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw IOError(concat("classes file '", file.string(), "': cannot read"));
  std::int64_t count = 0;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string_view name(text.data() + at, end - at);
    if (!name.empty() && name.back() == '\r') name.remove_suffix(1);
    if (name.find_first_not_of(" \t") == std::string_view::npos)
      detail::fail("classes", file, at, false, concat("line ", count + 1, " is empty: classes.txt holds one class name per line"));
    ++count;
    if (count > kMaxClasses)
      detail::fail("classes", file, at, false, concat("more than ", kMaxClasses, " class names, the limit"));
    at = end + 1;
  }
  if (count == 0) detail::fail("classes", file, 0, false, "the file names no class (one class name per line)");
  return count;
}

}  // namespace

Split read_npy_directory(const fs::path& directory, std::int64_t classes) {
  Split split;
  const fs::path train_images = directory / "images.npy", test_images = directory / "test_images.npy";
  const fs::path train_labels = directory / "labels.npy", test_labels = directory / "test_labels.npy";
  split.train.images = read_images(train_images);
  const Labels train = read_labels(train_labels, split.train.size(), train_images);
  split.train.labels = train.values;

  std::error_code error;
  const bool has_test_images = fs::exists(test_images, error), has_test_labels = fs::exists(test_labels, error);
  if (has_test_images != has_test_labels)
    throw IOError(concat("npy directory '", directory.string(), "': ", has_test_images ? "test_images.npy" : "test_labels.npy",
                         " without ", has_test_images ? "test_labels.npy" : "test_images.npy"));
  Labels test;
  if (has_test_images) {
    split.test.images = read_images(test_images);
    const Shape& a = split.train.images.shape();
    const Shape& b = split.test.images.shape();
    if (a[1] != b[1] || a[2] != b[2] || a[3] != b[3] || split.train.images.dtype() != split.test.images.dtype())
      detail::fail("npy", test_images, 0, false, concat("test images are ", name_of(split.test.images.dtype()), " ", b.str(),
                                                        ", training images ", name_of(split.train.images.dtype()), " ", a.str()));
    test = read_labels(test_labels, split.test.size(), test_images);
    split.test.labels = test.values;
  } else {
    split.test.images = Tensor::empty(split.train.images.shape().with(0, 0), split.train.images.dtype());
    split.test.labels = Tensor::empty({0}, DType::i64);
  }

  // The number of classes is the data set's to say, never its largest label's: classes.txt, else
  // the caller's (petra-train --classes); every label is then checked against it.
  const fs::path classes_file = directory / "classes.txt";
  std::string source;
  if (fs::exists(classes_file, error)) {
    classes = read_class_count(classes_file);
    source = concat("classes.txt names ", classes);
  } else if (classes > 0) {
    check_at_most<ValueError>(classes, kMaxClasses, "read_npy_directory: the number of classes");
    source = concat("given as ", classes);
  } else {
    throw IOError(concat("npy directory '", directory.string(), "': no classes.txt, and no number of classes given: "
                         "write the class names in classes.txt, one per line, or pass --classes (the number of "
                         "classes is not guessed from the largest label)"));
  }
  detail::check_labels(split.train.labels, classes, "npy", train_labels, train.first, train.stride, false, source);
  if (has_test_images)
    detail::check_labels(split.test.labels, classes, "npy", test_labels, test.first, test.stride, false, source);

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
