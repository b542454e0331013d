// kernels/cpu/linear.cpp: the fast fully connected layer: each pass is one Eigen GEMM on the
// row-major buffers seen in place (Eigen runs it on the stream's OpenMP threads).
#include <Eigen/Core>

#include "petra/kernels/linear.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu {
namespace {

template <class T>
using Matrix = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <class T>
using ConstMatrix = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <class T>
using ConstRow = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>;
template <class T>
using Row = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>;

// Sets the OpenMP thread count of the GEMM: the stream's, except for products under ~2 MFLOP
// (a classifier head), which take less time than waking up a second thread.
void use_threads_for(const StreamHandle& s, const LinearShape& shape) {
  StreamHandle gemm = s;
  gemm.num_threads = threads_above(s, shape.flops(), std::int64_t{1} << 21);
  use_threads(gemm);
}

template <class T>
void forward(const StreamHandle& s, const LinearShape& shape, const T* x, const T* w,
             const T* bias, T* y) {
  use_threads_for(s, shape);
  Matrix<T> out(y, shape.batch, shape.out_features);
  out.noalias() = ConstMatrix<T>(x, shape.batch, shape.in_features) *
                  ConstMatrix<T>(w, shape.out_features, shape.in_features).transpose();
  if (bias != nullptr) out.rowwise() += ConstRow<T>(bias, shape.out_features);
}

template <class T>
void backward_data(const StreamHandle& s, const LinearShape& shape, const T* dy, const T* w,
                   T* dx) {
  use_threads_for(s, shape);
  Matrix<T>(dx, shape.batch, shape.in_features).noalias() =
      ConstMatrix<T>(dy, shape.batch, shape.out_features) *
      ConstMatrix<T>(w, shape.out_features, shape.in_features);
}

template <class T>
void backward_weight(const StreamHandle& s, const LinearShape& shape, const T* x, const T* dy,
                     T* dw) {
  use_threads_for(s, shape);
  Matrix<T>(dw, shape.out_features, shape.in_features).noalias() +=
      ConstMatrix<T>(dy, shape.batch, shape.out_features).transpose() *
      ConstMatrix<T>(x, shape.batch, shape.in_features);
}

template <class T>
void backward_bias(const StreamHandle&, const LinearShape& shape, const T* dy, T* db) {
  Row<T>(db, shape.out_features) +=
      ConstMatrix<T>(dy, shape.batch, shape.out_features).colwise().sum();
}

}  // namespace

void linear_forward(const StreamHandle& s, const LinearShape& shape, const float* x,
                    const float* w, const float* bias, float* y) {
  forward(s, shape, x, w, bias, y);
}
void linear_backward_data(const StreamHandle& s, const LinearShape& shape, const float* dy,
                          const float* w, float* dx) {
  backward_data(s, shape, dy, w, dx);
}
void linear_backward_weight(const StreamHandle& s, const LinearShape& shape, const float* x,
                            const float* dy, float* dw) {
  backward_weight(s, shape, x, dy, dw);
}
void linear_backward_bias(const StreamHandle& s, const LinearShape& shape, const float* dy,
                          float* db) {
  backward_bias(s, shape, dy, db);
}

void linear_forward(const StreamHandle& s, const LinearShape& shape, const double* x,
                    const double* w, const double* bias, double* y) {
  forward(s, shape, x, w, bias, y);
}
void linear_backward_data(const StreamHandle& s, const LinearShape& shape, const double* dy,
                          const double* w, double* dx) {
  backward_data(s, shape, dy, w, dx);
}
void linear_backward_weight(const StreamHandle& s, const LinearShape& shape, const double* x,
                            const double* dy, double* dw) {
  backward_weight(s, shape, x, dy, dw);
}
void linear_backward_bias(const StreamHandle& s, const LinearShape& shape, const double* dy,
                          double* db) {
  backward_bias(s, shape, dy, db);
}

}  // namespace petra::kernels::cpu
