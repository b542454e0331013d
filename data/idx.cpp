// data/idx.cpp: the IDX reader (MNIST and Fashion-MNIST), raw or gzipped.
//
// IDX (LeCun's format): two zero bytes, a type code (0x08 = unsigned byte), the number of dims,
// then each dim as a big-endian int32, then the elements in C order. Images are [N, H, W], labels
// [N]. Every size is checked (petra/checked.hpp) and each side is at most kMaxImageSide. A raw
// file's pixels are read straight into the image tensor once the file's size matches the header;
// a gzipped file's are inflated into a buffer that grows with them, and copied into the tensor at
// the end, so that a header promising more than the file holds allocates nothing for it.
#include <array>
#include <cstring>
#include <initializer_list>
#include <cstdint>
#include <vector>

#include "petra/data/reader_support.hpp"
#include "petra/data/readers.hpp"

namespace petra::data {

namespace fs = std::filesystem;
using ::petra::detail::concat;

namespace {

constexpr std::uint8_t kUnsignedByteType = 0x08;

std::uint32_t big_endian_u32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
}

// Reads and checks the magic and dims of an IDX file; returns the dims. `names` names each dim
// ("the image count", "the height", ...); dims after the first are at least 1 and, for images, at
// most kMaxImageSide.
std::vector<std::int64_t> read_idx_header(detail::ByteStream& in, std::initializer_list<std::string_view> names,
                                          std::string_view kind) {
  const int expected_dims = static_cast<int>(names.size());
  std::array<unsigned char, 4> magic{};
  in.read(magic.data(), magic.size(), "the magic number");
  if (magic[0] != 0 || magic[1] != 0)
    in.fail(0, concat("bad magic ", int{magic[0]}, " ", int{magic[1]}, ": not an IDX file (it starts with 0, 0)"));
  if (magic[2] != kUnsignedByteType)
    in.fail(2, concat("element type 0x", std::hex, int{magic[2]}, std::dec, " is not unsigned byte (0x08)"));
  if (magic[3] != expected_dims)
    in.fail(3, concat(int{magic[3]}, " dims, ", kind, " have ", expected_dims));
  std::vector<std::int64_t> dims;
  for (std::string_view name : names) {
    const int d = static_cast<int>(dims.size());
    const std::uint64_t at = 4 + 4 * static_cast<std::uint64_t>(d);
    std::array<unsigned char, 4> field{};
    in.read(field.data(), field.size(), "the dims");
    const std::uint32_t size = big_endian_u32(field.data());
    if (size > 0x7FFFFFFFu || (d > 0 && size == 0)) in.fail(at, concat("dim ", d, " (", name, ") is ", size));
    if (d > 0) check_at_most<IOError>(size, kMaxImageSide, [&] { return concat(in.where(at), ": dim ", d, " (", name, ")"); });
    dims.push_back(size);
  }
  return dims;
}

Split read_idx_split(const fs::path& directory, std::string_view name, const Normalization& normalization,
                     bool horizontal_flip) {
  auto file = [&](std::string_view stem, std::string_view dotted) {
    const std::string s(stem), d(dotted);
    return detail::find_file(directory, {s + ".gz", s, d + ".gz", d}, name);
  };
  // One statement each: a missing file is then reported in this order (argument order is unspecified).
  const fs::path train_images = file("train-images-idx3-ubyte", "train-images.idx3-ubyte");
  const fs::path train_labels = file("train-labels-idx1-ubyte", "train-labels.idx1-ubyte");
  const fs::path test_images = file("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte");
  const fs::path test_labels = file("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte");
  Split split;
  split.train = read_idx(train_images, train_labels, 10);
  split.test = read_idx(test_images, test_labels, 10);
  for (Dataset* d : {&split.train, &split.test}) {
    d->normalization = normalization;
    d->augmentation = default_augmentation(d->height(), horizontal_flip);
  }
  split.train.name = std::string(name) + "/train";
  split.test.name = std::string(name) + "/test";
  return split;
}

}  // namespace

Dataset read_idx(const fs::path& images_file, const fs::path& labels_file, std::int64_t classes) {
  Dataset dataset;
  dataset.name = images_file.filename().string();
  dataset.classes = classes;

  detail::ByteStream images_in(images_file, "idx");
  const std::vector<std::int64_t> dims = read_idx_header(images_in, {"the image count", "the height", "the width"}, "image files");
  const std::int64_t n = dims[0], height = dims[1], width = dims[2];
  if (n == 0) images_in.fail(4, "the file holds no images (dim 0, the image count, is 0)");
  const auto where = [&](std::uint64_t at, std::string_view what) { return [&images_in, at, what] {
    return concat(images_in.where(at), ": ", what); }; };
  const std::int64_t pixels = checked_mul<IOError>(n, checked_mul<IOError>(height, width, where(8, "the image size")),
                                                   where(4, "the pixel count"));
  images_in.expect_total_size(checked_add<IOError>(16, pixels, where(4, "the file size")),
                              concat(n, " images of ", height, "x", width));
  const std::string what = concat("the pixels of ", n, " images");
  if (images_in.compressed()) {  // inflated into chunks: the tensor comes once the pixels have
    const detail::ChunkedBuffer bytes = images_in.read_chunked(static_cast<std::uint64_t>(pixels), what);
    dataset.images = Tensor::empty({n, 1, height, width}, DType::u8);
    bytes.copy_to(dataset.images.raw_data());
  } else {  // the size was checked against the file's: straight into the tensor
    dataset.images = Tensor::empty({n, 1, height, width}, DType::u8);
    images_in.read(dataset.images.data_ptr<std::uint8_t>(), static_cast<std::size_t>(pixels), what);
  }
  images_in.expect_end();

  detail::ByteStream labels_in(labels_file, "idx");
  const std::int64_t label_count = read_idx_header(labels_in, {"the label count"}, "label files")[0];
  if (label_count != n)
    labels_in.fail(4, concat(label_count, " labels, but '", images_file.string(), "' has ", n, " images"));
  labels_in.expect_total_size(8 + static_cast<std::uint64_t>(n), concat(n, " labels"));
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(n));
  labels_in.read_chunked(static_cast<std::uint64_t>(n), concat(n, " labels")).copy_to(bytes.data());
  labels_in.expect_end();
  dataset.labels = Tensor::empty({n}, DType::i64);
  std::int64_t* label = dataset.labels.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) label[i] = bytes[static_cast<std::size_t>(i)];
  detail::check_labels(dataset.labels, classes, "idx", labels_file, 8, 1, labels_in.compressed());
  return dataset;
}

Split read_fashion_mnist(const fs::path& directory) {
  return read_idx_split(directory, "fashion-mnist", kFashionMnistNormalization, true);
}

// Digits are not left-right symmetric: no flips for MNIST.
Split read_mnist(const fs::path& directory) { return read_idx_split(directory, "mnist", kMnistNormalization, false); }

}  // namespace petra::data
