// kernels/cpu/batchnorm_maps.hpp: the per-channel arithmetic of every CPU batch norm, shared by
// kernels/cpu/batchnorm.cpp and the fused stem (kernels/cpu/conv_batchnorm.cpp) so that both turn
// the same sums into the same floats:
//   forward:  the training statistics (sums of x - shift and its square) -> mean, invstd, the
//             running statistics and the map y = fma(x - mean, scale, bias) that pass 2 applies;
//   backward: the sums of dy and dy * (x - mean) -> dgamma, dbeta and dx = a*dy + b*(x - mean) + k.
// Internal to kernels/cpu (not installed API).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace petra::kernels::cpu::bn {

// y = (x - mean) * scale + bias for one channel. When |mean| >> std, float(mean) alone would
// lose digits: mean is split into a float part, subtracted from x (nearly exactly), and a
// remainder folded into the bias in double.
struct AffineMap {
  float mean, scale, bias;
};

inline AffineMap affine_map(double mean, double scale, double beta) {
  const float mean_f = float(mean);
  return {mean_f, float(scale), float(beta - (mean - double(mean_f)) * scale)};
}

// BN(x) at one value, as every forward's pass 2 computes it: an explicit fma, so that a backward
// that recomputes the ReLU's mask from x (Mask::from_x) computes the same bits.
inline float normalised(float x, const AffineMap& m) { return std::fma(x - m.mean, m.scale, m.bias); }

// Where a training forward leaves channel c's statistics; any pointer but the saved ones may be null.
struct StatisticsOut {
  float* saved_mean;
  float* saved_invstd;
  float* running_mean;
  float* running_var;
  float* saved_affine;  // 3 floats a channel: the map's mean, scale, bias
};

// Channel c's map from the sums of d = x - shift and d^2 over `count` values (variance
// sum(d^2)/n - (sum(d)/n)^2, which does not cancel when shift is near the mean), with the saved
// and running statistics written as PyTorch does (running variance unbiased).
inline AffineMap finish_statistics(std::int64_t c, double sum_shifted, double square_shifted, double shift,
                                   double count, double eps, double momentum, const float* gamma, const float* beta,
                                   const StatisticsOut& out) {
  const double mean_shifted = sum_shifted / count;
  const double var = std::max(square_shifted / count - mean_shifted * mean_shifted, 0.0);
  const double mean = shift + mean_shifted;
  const double invstd = 1.0 / std::sqrt(var + eps);
  const AffineMap map = affine_map(mean, double(gamma[c]) * invstd, beta[c]);
  if (out.saved_affine) {
    out.saved_affine[3 * c] = map.mean;
    out.saved_affine[3 * c + 1] = map.scale;
    out.saved_affine[3 * c + 2] = map.bias;
  }
  out.saved_mean[c] = float(mean);
  out.saved_invstd[c] = float(invstd);
  const double unbiased_var = count > 1 ? var * count / (count - 1) : var;
  if (out.running_mean) out.running_mean[c] = float((1 - momentum) * out.running_mean[c] + momentum * mean);
  if (out.running_var) out.running_var[c] = float((1 - momentum) * out.running_var[c] + momentum * unbiased_var);
  return map;
}

// dx = gamma*invstd*(dy - sum_dy/n - xhat*sum_dy_xhat/n) with xhat = (x - mean)*invstd,
// that is dx = a*dy + b*(x - mean) + k per channel.
struct GradientCoefficients {
  float a, b, k;
};

// Channel c's coefficients from sum(dy) and sum(dy * (x - mean)) over `count` values (dy masked by
// the ReLU where there is one); dgamma[c] and dbeta[c] get += their share.
inline GradientCoefficients gradient_coefficients(std::int64_t c, double sum_dy, double sum_dy_centered,
                                                  const float* saved_invstd, const float* gamma, double count,
                                                  float* dgamma, float* dbeta) {
  const double invstd = saved_invstd[c];
  const double sum_dy_xhat = sum_dy_centered * invstd;
  const double scale = double(gamma[c]) * invstd;
  dgamma[c] += float(sum_dy_xhat);
  dbeta[c] += float(sum_dy);
  return {float(scale), float(-scale * invstd * sum_dy_xhat / count), float(-scale * sum_dy / count)};
}

}  // namespace petra::kernels::cpu::bn
