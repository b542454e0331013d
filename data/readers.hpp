// data/readers.hpp: one reader per file format, each returning the Dataset form of data/dataset.hpp.
//
// Every reader checks what it reads: magic numbers, dims, file sizes, image/label counts and label
// ranges. Anything wrong raises petra::IOError naming the file and the byte offset; for a gzipped
// file the offset is in the decompressed stream, and the message says so. Sizes from headers are
// computed with petra/checked.hpp and bounded by kMaxChannels, kMaxImageSide and kMaxClasses
// (data/dataset.hpp); nothing is allocated for a header before the file's bytes can back it (a
// plain file's size is checked first, compressed data is inflated into buffers that grow with it).
// A file that holds no images is refused. The number of classes is the format's (10 for
// (Fashion-)MNIST and CIFAR-10, 100 for CIFAR-100, 1000 for ImageNet32) or an npy directory's
// classes.txt, and every label is checked against it.
//
// Formats and layouts:
//   IDX (MNIST, Fashion-MNIST)   train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
//                                t10k-labels-idx1-ubyte, each raw or gzipped (name + ".gz" is tried
//                                first; the spelling train-images.idx3-ubyte is accepted too).
//                                Big-endian header: 0, 0, type 0x08 (unsigned byte), ndims,
//                                then ndims int32 sizes, then the bytes.
//   CIFAR-10 binary              cifar-10-batches-bin/data_batch_1..5.bin, test_batch.bin: records of
//                                1 label byte + 3072 image bytes (1024 R, 1024 G, 1024 B, rows).
//   CIFAR-100 binary             cifar-100-binary/train.bin, test.bin: 2 label bytes (coarse, fine) +
//                                3072 image bytes; the fine label (100 classes) is used.
//   ImageNet32 (Chrabaszcz et al. 2017, "A downsampled variant of ImageNet as an alternative to the
//                                CIFAR datasets"): train_data_batch_1..10.npz and val_data.npz, each a
//                                zip of 'data.npy' (uint8 [N, 3072], channel planes R, G, B) and
//                                'labels.npy' (integers 1..1000). 16x16 and 64x64 variants read too
//                                (the side is derived from the row length).
//   npy directory                images.npy (float32 [N, C, H, W] or uint8 [N, H, W, C]; [N, H, W]
//                                for one channel) and labels.npy (integer [N], >= 0), optionally
//                                test_images.npy and test_labels.npy, and classes.txt: one class name
//                                per line, line k naming label k. The number of classes is the number
//                                of lines of classes.txt or, without it, the caller's (petra-train
//                                --classes); never the largest label + 1. The normalisation is
//                                computed from the training images.
//   synthetic                    generated from a seed, see make_synthetic.
// A directory argument may also be the parent of cifar-10-batches-bin / cifar-100-binary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

#include "petra/data/dataset.hpp"

namespace petra::data {

// One IDX image file ([N, H, W] unsigned bytes -> [N, 1, H, W]) and its label file ([N]).
Dataset read_idx(const std::filesystem::path& images_file, const std::filesystem::path& labels_file,
                 std::int64_t classes);
Split read_fashion_mnist(const std::filesystem::path& directory);
Split read_mnist(const std::filesystem::path& directory);

// CIFAR binary batches: label_bytes is 1 (CIFAR-10) or 2 (CIFAR-100: coarse, fine; fine is kept).
Dataset read_cifar_batches(std::span<const std::filesystem::path> files, int label_bytes, std::int64_t classes);
Split read_cifar10(const std::filesystem::path& directory);
Split read_cifar100(const std::filesystem::path& directory);

// Downsampled-ImageNet .npz batches, concatenated in the order given; labels become 0-based.
Dataset read_imagenet_npz(std::span<const std::filesystem::path> files);
Split read_imagenet32(const std::filesystem::path& directory);

// A bring-your-own directory of .npy files (see above). Without test files the test set is empty.
// `classes` is the number of classes when the directory has no classes.txt (0: none given, which is
// then an IOError); with classes.txt it is unused.
Split read_npy_directory(const std::filesystem::path& directory, std::int64_t classes = 0);

// A learnable synthetic data set: each class has a smooth random pattern per channel (sums of
// cosines, symmetric left-right so flips keep the class), every sample is its class pattern with a
// random contrast and brightness plus uniform pixel noise, stored as uint8. Sample i has label
// i % classes. Everything is drawn from Philox(spec.seed), so the same spec gives the same bytes.
Split make_synthetic(const SyntheticSpec& spec);

}  // namespace petra::data
