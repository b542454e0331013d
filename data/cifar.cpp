// data/cifar.cpp: the CIFAR-10 / CIFAR-100 binary reader.
//
// A batch file is a sequence of fixed-size records: the label byte(s), then 3072 image bytes, the
// 32x32 red plane, then green, then blue, each row by row: already the [C, H, W] layout petra
// uses, so a record's image is one memcpy. Records are read in chunks into one small reused
// buffer (a whole-file buffer would be fresh pages, which are slow to touch on these machines).
#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "petra/data/reader_support.hpp"
#include "petra/data/readers.hpp"

namespace petra::data {

namespace fs = std::filesystem;
using ::petra::detail::concat;

namespace {

constexpr std::int64_t kSide = 32;
constexpr std::int64_t kImageBytes = 3 * kSide * kSide;
constexpr std::int64_t kChunkRecords = 1024;

// `directory` itself, or its subdirectory `layout` when that exists (the archive's top folder).
fs::path resolve(const fs::path& directory, std::string_view layout) {
  std::error_code error;
  const fs::path nested = directory / layout;
  return fs::is_directory(nested, error) ? nested : directory;
}

Split finish(Dataset train, Dataset test, std::string_view name, const Normalization& normalization) {
  Split split{std::move(train), std::move(test)};
  for (Dataset* d : {&split.train, &split.test}) {
    d->normalization = normalization;
    d->augmentation = default_augmentation(kSide, true);
  }
  split.train.name = std::string(name) + "/train";
  split.test.name = std::string(name) + "/test";
  return split;
}

}  // namespace

Dataset read_cifar_batches(std::span<const fs::path> files, int label_bytes, std::int64_t classes) {
  PETRA_CHECK(label_bytes == 1 || label_bytes == 2, ValueError, "read_cifar_batches: label_bytes is ", label_bytes,
              ", CIFAR has 1 (CIFAR-10) or 2 (CIFAR-100)");
  PETRA_CHECK(!files.empty(), ValueError, "read_cifar_batches: no files given");
  const std::int64_t record_bytes = label_bytes + kImageBytes;

  // Every file must be a whole number of records; the counts give the size of the tensors.
  std::vector<std::int64_t> records;
  std::int64_t total = 0;
  for (const fs::path& file : files) {
    detail::ByteStream in(file, "cifar");
    if (in.compressed()) in.fail(0, "gzip-compressed; CIFAR batch files are read uncompressed");
    const auto size = static_cast<std::int64_t>(in.file_size());
    if (size == 0) in.fail(0, "the file is empty: it holds no images");
    if (size % record_bytes != 0)
      in.fail(static_cast<std::uint64_t>(size / record_bytes * record_bytes),
              concat("truncated record: the file has ", size, " bytes, not a multiple of the ", record_bytes,
                     "-byte record"));
    records.push_back(size / record_bytes);
    total = checked_add<IOError>(total, size / record_bytes, [&] { return concat(in.where(0), ": the record count"); });
  }

  Dataset dataset;
  dataset.name = files.empty() ? "cifar" : files.front().filename().string();
  dataset.classes = classes;
  dataset.images = Tensor::empty({total, 3, kSide, kSide}, DType::u8);
  dataset.labels = Tensor::empty({total}, DType::i64);
  std::uint8_t* image = dataset.images.data_ptr<std::uint8_t>();
  std::int64_t* label = dataset.labels.data_ptr<std::int64_t>();

  std::vector<std::uint8_t> chunk(static_cast<std::size_t>(kChunkRecords * record_bytes));
  for (std::size_t f = 0; f < files.size(); ++f) {
    detail::ByteStream in(files[f], "cifar");
    for (std::int64_t first = 0; first < records[f]; first += kChunkRecords) {
      const std::int64_t count = std::min(kChunkRecords, records[f] - first);
      in.read(chunk.data(), static_cast<std::size_t>(count * record_bytes), concat("records ", first, "..", first + count - 1));
      for (std::int64_t r = 0; r < count; ++r) {
        const std::uint8_t* record = chunk.data() + r * record_bytes;
        const std::int64_t value = record[label_bytes - 1];  // CIFAR-100: the fine label, after the coarse one
        if (value >= classes)
          in.fail(static_cast<std::uint64_t>((first + r) * record_bytes + label_bytes - 1),
                  concat("label ", value, " of record ", first + r, " is outside [0, ", classes, ")"));
        *label++ = value;
        std::memcpy(image, record + label_bytes, kImageBytes);
        image += kImageBytes;
      }
    }
    in.expect_end();
  }
  return dataset;
}

Split read_cifar10(const fs::path& directory) {
  const fs::path root = resolve(directory, "cifar-10-batches-bin");
  std::vector<fs::path> train;
  for (int b = 1; b <= 5; ++b) train.push_back(root / ("data_batch_" + std::to_string(b) + ".bin"));
  const std::array<fs::path, 1> test{root / "test_batch.bin"};
  Dataset train_set = read_cifar_batches(train, 1, 10);  // first, so errors come in file order
  return finish(std::move(train_set), read_cifar_batches(test, 1, 10), "cifar10", kCifar10Normalization);
}

Split read_cifar100(const fs::path& directory) {
  const fs::path root = resolve(directory, "cifar-100-binary");
  const std::array<fs::path, 1> train{root / "train.bin"}, test{root / "test.bin"};
  Dataset train_set = read_cifar_batches(train, 2, 100);
  return finish(std::move(train_set), read_cifar_batches(test, 2, 100), "cifar100", kCifar100Normalization);
}

}  // namespace petra::data
