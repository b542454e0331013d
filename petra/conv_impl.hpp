// petra/conv_impl.hpp: which implementation runs convolutions and batch norms on GPUs, and with
// which arithmetic (FP32 or TF32), for the whole process.
//
//   ConvImpl::petra (the default): petra's own CUDA kernels (kernels/cuda/conv2d.cu, batchnorm.cu);
//   ConvImpl::cudnn: cuDNN's (kernels/cuda_libraries.hpp), a fallback and the benchmarks' anchor.
//
// petra/ops.cpp, the one dispatch point, reads it for every conv2d forward, backward-data and
// backward-weight and every batch-norm call on a CUDA tensor (the conv bias gradient stays petra's).
// CPU tensors ignore it: there is no CPU cuDNN. petra-train's --conv-impl sets it and refuses
// `cudnn` unless every --devices entry is a CUDA device.
#pragma once

#include <string_view>

namespace petra {

enum class ConvImpl { petra, cudnn };

// Throws DeviceError for ConvImpl::cudnn in a build without cuDNN (cudnn_compiled() is false).
void set_conv_impl(ConvImpl impl);
ConvImpl conv_impl();
// Whether this build has cuDNN (PETRA_HAVE_CUDA and PETRA_HAVE_CUDNN).
bool cudnn_compiled();

// "petra" or "cudnn"; anything else is a ValueError naming `flag` and the choices.
ConvImpl parse_conv_impl(std::string_view text, std::string_view flag = "--conv-impl");
const char* name_of(ConvImpl impl);

// The arithmetic of convolutions on GPUs, for the whole process (kernels::cuda::set_conv2d_math;
// petra-train's --conv-math): fp32 (the default: FP32 multiply-adds) or tf32 (the tensor cores,
// inputs rounded to TF32, FP32 accumulation; as PyTorch's allow_tf32), for the three passes of
// petra's kernels and of cuDNN's. CPU tensors ignore it. A build without CUDA accepts fp32 only.
enum class ConvMath { fp32, tf32 };
void set_conv_math(ConvMath math);  // DeviceError for tf32 without CUDA
ConvMath conv_math();
ConvMath parse_conv_math(std::string_view text, std::string_view flag = "--conv-math");
const char* name_of(ConvMath math);

// How cuDNN chooses its convolution algorithms (with ConvImpl::cudnn; petra-train's
// --cudnn-algorithms), for the whole process: deterministic (the default: cuDNN's heuristics, the
// first deterministic algorithm, nothing timed, the same bits from run to run) or fastest
// (cudnnFind* times every algorithm on a shape's first call and keeps the fastest, deterministic or
// not, as PyTorch's cudnn.benchmark: what determinism costs, measured; results may then vary in the
// last bits). A build without cuDNN accepts deterministic only.
enum class CudnnAlgorithms { deterministic, fastest };
void set_cudnn_algorithms(CudnnAlgorithms choice);  // DeviceError for fastest without cuDNN
CudnnAlgorithms cudnn_algorithms();
CudnnAlgorithms parse_cudnn_algorithms(std::string_view text, std::string_view flag = "--cudnn-algorithms");
const char* name_of(CudnnAlgorithms choice);

// The weight gradient of petra's 3x3, stride-1, padding-1 convolutions on GPUs, for the whole
// process (kernels::cuda::set_conv2d_weight_algorithm; petra-train's --conv-weight): automatic (the
// default: Winograd where a GPU timed it faster, 64+ channels in and out, in TF32 on planes of at
// most 16 x 16; else direct), direct (the implicit GEMM of the other passes) or winograd
// (Winograd's F(2x2, 3x3) wherever it applies: 2.25x fewer multiply-adds, the results a few
// roundings away, deterministic). CPU tensors ignore it (the CPU kernels choose their own). A build
// without CUDA accepts automatic and direct.
enum class ConvWeightAlgorithm { automatic, direct, winograd };
void set_conv_weight_algorithm(ConvWeightAlgorithm algorithm);  // DeviceError for winograd without CUDA
ConvWeightAlgorithm conv_weight_algorithm();
ConvWeightAlgorithm parse_conv_weight_algorithm(std::string_view text, std::string_view flag = "--conv-weight");
const char* name_of(ConvWeightAlgorithm algorithm);

// The forward and backward data of petra's 3x3, stride-1, padding-1 convolutions on GPUs, for the
// whole process (kernels::cuda::set_conv2d_forward_algorithm; petra-train's --conv-forward): direct
// (the default, the implicit GEMM), winograd (Winograd's F(2x2, 3x3), the weight gradient's 16
// products read the other way: 2.25x fewer multiply-adds, the results a few roundings away,
// deterministic) or automatic (winograd where run 12's numbers estimate it faster: 64+ channels,
// planes up to 16 x 16, in TF32 8 x 8). Options until a GPU has timed them. CPU tensors ignore it. A build
// without CUDA accepts direct only.
enum class ConvForwardAlgorithm { direct, winograd, automatic };
void set_conv_forward_algorithm(ConvForwardAlgorithm algorithm);  // DeviceError for winograd without CUDA
ConvForwardAlgorithm conv_forward_algorithm();
ConvForwardAlgorithm parse_conv_forward_algorithm(std::string_view text, std::string_view flag = "--conv-forward");
const char* name_of(ConvForwardAlgorithm algorithm);

// Whether petra's batch norm kernels on GPUs (the training forward, the backward, and their fused
// ReLU and coupling variants) take their one-pass form where a channel fits in the shared memory
// of a thread-block cluster (kernels::cuda::set_batchnorm_one_pass; petra-train's
// --batchnorm-one-pass): one read of x (and dy) instead of two. Off by default until a GPU has
// timed it. CPU tensors and cuDNN's batch norm ignore it. A build without CUDA accepts false only.
void set_batchnorm_one_pass(bool on);  // DeviceError for true without CUDA
bool batchnorm_one_pass();

// Whether petra's convolution kernels on GPUs cut the K of the forward and backward data (at
// stride 1) into slices where the 128 x 128 tile would leave too few blocks to fill the GPU (the
// 4x4 layers of RevNet18 at batch 128; kernels::cuda::set_conv2d_split_k; petra-train's
// --conv-split-k). Off by default until a GPU has timed it. The results differ in the last places,
// each deterministic. A build without CUDA accepts false only.
void set_conv_split_k(bool on);  // DeviceError for true without CUDA
bool conv_split_k();

}  // namespace petra
