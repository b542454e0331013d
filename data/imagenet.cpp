// data/imagenet.cpp: the downsampled-ImageNet reader (ImageNet32 and its 16x16 / 64x64 siblings,
// Chrabaszcz, Loshchilov and Hutter 2017), from the .npz batches the authors distribute.
//
// Each .npz is a zip archive (data/zip.hpp) holding data.npy (uint8 [N, 3 * side * side], each row
// the red plane, then green, then blue: the [C, H, W] layout petra uses) and labels.npy (integers
// 1..1000; the train batches also hold mean.npy, unused). The batches are parsed one by one and
// copied into the final tensors as soon as all sizes are known, each part freed once copied.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "petra/data/reader_support.hpp"
#include "petra/data/readers.hpp"
#include "petra/data/zip.hpp"
#include "petra/npy.hpp"

namespace petra::data {

namespace fs = std::filesystem;
using ::petra::detail::concat;

namespace {

constexpr std::int64_t kClasses = 1000;

[[noreturn]] void fail_entry(const fs::path& file, std::string_view entry, std::uint64_t offset, const std::string& what) {
  throw IOError(concat("npz file '", file.string(), "', entry '", entry, "', byte ", offset, " of the entry: ", what));
}

NpyArray read_entry(const ZipArchive& zip, std::string_view name) {
  const ZipEntry* entry = zip.find(name);
  if (entry == nullptr) {
    std::string names;
    for (const ZipEntry& e : zip.entries()) names += (names.empty() ? "'" : ", '") + e.name + "'";
    throw IOError(concat("npz file '", zip.path().string(), "': no entry '", name, "' (it holds ", names, ")"));
  }
  const ZipEntryBytes bytes = zip.read(*entry);
  return parse_npy(bytes.bytes, concat(zip.path().string(), ":", name));
}

std::int64_t read_integer(const NpyArray& a, std::size_t i) {
  switch (a.dtype) {
    case DType::i64: { std::int64_t v; std::memcpy(&v, a.data.data() + 8 * i, 8); return v; }
    case DType::i32: { std::int32_t v; std::memcpy(&v, a.data.data() + 4 * i, 4); return v; }
    case DType::u8: return std::to_integer<std::int64_t>(a.data[i]);
    default: return -1;
  }
}

struct Part {
  NpyArray images;                  // uint8 [n, 3 * side * side]
  std::vector<std::int64_t> labels; // 0-based
};

Part read_batch(const fs::path& file, std::int64_t& side) {
  const ZipArchive zip(file);
  Part part;
  part.images = read_entry(zip, "data.npy");
  const NpyArray& images = part.images;
  const std::uint64_t images_header = 0;  // a wrong dtype or shape is in the npy header, which starts the entry
  if (images.dtype != DType::u8 || images.shape.size() != 2)
    fail_entry(file, "data.npy", images_header, concat("expected uint8 [N, 3 * side * side], got ", name_of(images.dtype),
                                                       " with ", images.shape.size(), " dims"));
  const std::int64_t n = images.shape[0], row = images.shape[1];
  const auto this_side = static_cast<std::int64_t>(std::lround(std::sqrt(static_cast<double>(row) / 3.0)));
  if (this_side > kMaxImageSide)
    fail_entry(file, "data.npy", images_header, concat("rows of ", row, " bytes are images of ", this_side, "x", this_side,
                                                       ", above the limit of ", kMaxImageSide, " pixels a side"));
  if (this_side <= 0 || 3 * this_side * this_side != row)
    fail_entry(file, "data.npy", images_header, concat("rows of ", row, " bytes are not 3 * side * side"));
  if (side != 0 && side != this_side)
    fail_entry(file, "data.npy", images_header, concat("images are ", this_side, "x", this_side, ", the batches before were ",
                                                       side, "x", side));
  if (n == 0) fail_entry(file, "data.npy", images_header, "the entry holds no images (its shape is [0, " + std::to_string(row) + "])");
  side = this_side;

  const NpyArray labels = read_entry(zip, "labels.npy");
  const std::size_t label_bytes = size_of(labels.dtype);
  const ZipEntry& labels_entry = *zip.find("labels.npy");
  const std::uint64_t first_label = labels_entry.size - labels.data.size();  // where the npy header ends
  if (is_floating(labels.dtype) || labels.shape.size() != 1)
    fail_entry(file, "labels.npy", 0, concat("expected integer labels [N], got ", name_of(labels.dtype), " with ",
                                             labels.shape.size(), " dims"));
  if (labels.shape[0] != n)
    fail_entry(file, "labels.npy", 0, concat(labels.shape[0], " labels, but data.npy has ", n, " images"));
  part.labels.resize(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < part.labels.size(); ++i) {
    const std::int64_t value = read_integer(labels, i);
    if (value < 1 || value > kClasses)
      fail_entry(file, "labels.npy", first_label + i * label_bytes,
                 concat("label ", value, " of sample ", i, " is outside 1..", kClasses, " (labels are 1-based)"));
    part.labels[i] = value - 1;
  }
  return part;
}

fs::path resolve(const fs::path& directory, std::string_view layout) {
  std::error_code error;
  const fs::path nested = directory / layout;
  return fs::is_directory(nested, error) ? nested : directory;
}

}  // namespace

Dataset read_imagenet_npz(std::span<const fs::path> files) {
  PETRA_CHECK(!files.empty(), ValueError, "read_imagenet_npz: no files given");
  std::vector<Part> parts;
  std::int64_t side = 0, total = 0;
  for (const fs::path& file : files) {
    parts.push_back(read_batch(file, side));
    total = checked_add<IOError>(total, parts.back().labels.size(),
                                 [&] { return concat("npz file '", file.string(), "': the image count"); });
  }
  Dataset dataset;
  dataset.name = files.empty() ? "imagenet" : files.front().filename().string();
  dataset.classes = kClasses;
  dataset.images = Tensor::empty({total, 3, side, side}, DType::u8);
  dataset.labels = Tensor::empty({total}, DType::i64);
  auto* image = reinterpret_cast<std::byte*>(dataset.images.data_ptr<std::uint8_t>());
  std::int64_t* label = dataset.labels.data_ptr<std::int64_t>();
  for (Part& part : parts) {
    std::memcpy(image, part.images.data.data(), part.images.data.size());
    image += part.images.data.size();
    std::memcpy(label, part.labels.data(), part.labels.size() * sizeof(std::int64_t));
    label += part.labels.size();
    part = Part{};  // free it now: the whole training set is ~4 GB
  }
  return dataset;
}

Split read_imagenet32(const fs::path& directory) {
  const fs::path train_root = resolve(directory, "Imagenet32_train_npz");
  const fs::path val_root = resolve(directory, "Imagenet32_val_npz");
  std::vector<fs::path> train;
  for (int b = 1; b <= 10; ++b) train.push_back(train_root / ("train_data_batch_" + std::to_string(b) + ".npz"));
  const std::vector<fs::path> val{val_root / "val_data.npz"};
  Split split{read_imagenet_npz(train), read_imagenet_npz(val)};
  for (Dataset* d : {&split.train, &split.test}) {
    d->normalization = kImagenet32Normalization;
    d->augmentation = default_augmentation(d->height(), true);
  }
  split.train.name = "imagenet32/train";
  split.test.name = "imagenet32/val";
  return split;
}

}  // namespace petra::data
