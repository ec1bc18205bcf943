// A GRU (Keras' reset_after form) and an AUGRU over all their steps, forward and backward, each
// as one op. A batch row's recurrence never reads another row's, so the rows are split over the
// cores and each thread runs every step of its rows: a step's recurrent product is one small
// GEMM of the thread's rows (Eigen), its element-wise work one pass over them. As TensorFlow ops
// each step was a matmul and a cell op each way, ~100 ops per DIEN step whose dispatch cost more
// than their arithmetic at NVIDIA's shape (batch 256, 96 units, 10 steps).
//
// Layouts: time-major, projected [S, B, 3H] is x W + b of every step (sim/blocks.py): a step's
// rows lie together. Gate columns: GRU z, r, n; AUGRU r, u, c. keep [S, B] = 1 - attention.
// The kernels' gradients are one matmul over all steps each, left to TensorFlow (sim/blocks.py).
//
// GRU forward (hu = h_prev U, b' the recurrent bias, h_prev = 0 at step 0):
//   [z, r] = s(x_zr + hu_zr + b'_zr),  hu_n' = hu_n + b'_n,  n = tanh(x_n + r hu_n'),
//   h = n + z (h_prev - n)
// GRU backward (dh = carry + rec + d_state: the gradient reaching h):
//   dn = dh (1 - z)(1 - n^2),  dz = dh (h_prev - n) z (1 - z),  dr = dn hu_n' r (1 - r)
//   d_x = [dz, dr, dn],  d_hu = [dz, dr, r dn],  carry' = dh z,  rec' = d_hu U^T
// AUGRU forward: g = [r, u] = s(x_g + h_prev Wg_h),  rh = r h_prev;  c = tanh(x_c + rh Wc_h),
//   h = c + k u (h_prev - c)
// AUGRU backward (dh = carry + rec):  dc = dh (1 - k u)(1 - c^2),  d_rh = dc Wc_h^T,
//   d_ku = dh (h_prev - c),  dg = [d_rh h_prev, k d_ku] g (1 - g),  d_keep = sum(u d_ku),
//   carry' = k u dh + r d_rh,  rec' = dg Wg_h^T
#include <algorithm>
#include <string>
#include <vector>

#include "Eigen/Core"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

namespace {

// Outputs [S, B, k * units] for each k of `widths` (k = 0: [S, B]); S and B from input 0
// ([S, B, 3H] in every op), units the first dimension of input `kernel` ([H, ...]).
Status SetOutputs(InferenceContext* c, int kernel, std::initializer_list<int> widths) {
  ShapeHandle first, weights;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &first));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(kernel), 2, &weights));
  DimensionHandle steps = c->Dim(first, 0), batch = c->Dim(first, 1), units = c->Dim(weights, 0);
  int i = 0;
  for (int k : widths) {
    DimensionHandle columns;
    TF_RETURN_IF_ERROR(c->Multiply(units, k, &columns));
    c->set_output(i++, k ? c->MakeShape({steps, batch, columns}) : c->Matrix(steps, batch));
  }
  return OkStatus();
}

}  // namespace

REGISTER_OP("GruSequence")
    .Input("projected: float")       // [S, B, 3H]
    .Input("recurrent: float")       // [H, 3H]
    .Input("recurrent_bias: float")  // [3H]
    .Output("states: float")         // [S, B, H] the state after each step
    .Output("zr: float")             // [S, B, 2H]
    .Output("n: float")              // [S, B, H]
    .Output("hu_n: float")           // [S, B, H] with its bias
    .SetShapeFn([](InferenceContext* c) { return SetOutputs(c, 1, {1, 2, 1, 1}); });

REGISTER_OP("GruSequenceGrad")
    .Input("d_states: float")  // [S, B, H]
    .Input("recurrent: float")
    .Input("states: float")
    .Input("zr: float")
    .Input("n: float")
    .Input("hu_n: float")
    .Output("d_projected: float")  // [S, B, 3H]
    .Output("d_hu: float")         // [S, B, 3H] the gradient of h_prev U + b'
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle d;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 3, &d));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &d));
      ShapeHandle states;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &states));
      DimensionHandle columns;
      TF_RETURN_IF_ERROR(c->Multiply(c->Dim(states, 2), 3, &columns));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->ReplaceDim(states, 2, columns, &out));
      c->set_output(0, out);
      c->set_output(1, out);
      return OkStatus();
    });

REGISTER_OP("AugruSequence")
    .Input("projected: float")         // [S, B, 3H]
    .Input("keep: float")              // [S, B]
    .Input("gate_kernel: float")       // [H, 2H]
    .Input("candidate_kernel: float")  // [H, H]
    .Output("states: float")           // [S, B, H]
    .Output("g: float")                // [S, B, 2H]
    .Output("rh: float")               // [S, B, H]
    .Output("c: float")                // [S, B, H]
    .SetShapeFn([](InferenceContext* c) { return SetOutputs(c, 3, {1, 2, 1, 1}); });

REGISTER_OP("AugruSequenceGrad")
    .Input("projected: float")  // [S, B, 3H]: its shape only
    .Input("d_last: float")     // [B, H]
    .Input("keep: float")
    .Input("gate_kernel: float")
    .Input("candidate_kernel: float")
    .Input("states: float")
    .Input("g: float")
    .Input("c: float")
    .Output("d_projected: float")  // [S, B, 3H] = [dg, dc]
    .Output("d_keep: float")       // [S, B]
    .SetShapeFn([](InferenceContext* c) { return SetOutputs(c, 4, {3, 0}); });

namespace {

using Row = Eigen::Map<Eigen::ArrayXf>;
using ConstRow = Eigen::Map<const Eigen::ArrayXf>;
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<Matrix>;
using ConstMatrixMap = Eigen::Map<const Matrix>;

// Checks shapes, allocates outputs, then runs Rows(begin, end) over the batch split across
// the cores; S, B, H and the tensors' data as members.
class SequenceKernel : public OpKernel {
 public:
  explicit SequenceKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& first = ctx->input(0);
    OP_REQUIRES(ctx, first.dims() == 3,
                errors::InvalidArgument(name(), ": input 0 must be [steps, batch, columns], got ",
                                        first.shape().DebugString()));
    steps_ = first.dim_size(0);
    batch_ = first.dim_size(1);
    units_ = 0;  // set by Prepare from a kernel's shape
    OP_REQUIRES_OK(ctx, Prepare(ctx));
    if (steps_ == 0 || batch_ == 0) return;
    auto workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, batch_, steps_ * 20 * units_ * units_,
          [this](int64_t begin, int64_t end) {
            for (int64_t b = begin; b < end; b += kBlock) Rows(b, std::min(end, b + kBlock));
          });
  }

 protected:
  static constexpr int64_t kBlock = 64;  // rows of one recurrent GEMM: its operands stay in L2

  virtual Status Prepare(OpKernelContext* ctx) = 0;
  virtual void Rows(int64_t begin, int64_t end) = 0;

  // Input i's data, checked to be [S, B, k * units] (k = 0: [S, B]), or [B, units] if batch_row.
  Status In(OpKernelContext* ctx, int i, int k, const float** data, bool batch_row = false) {
    const Tensor& t = ctx->input(i);
    bool ok = batch_row ? t.dims() == 2 && t.dim_size(0) == batch_ && t.dim_size(1) == units_
              : k       ? t.dims() == 3 && t.dim_size(0) == steps_ && t.dim_size(1) == batch_ &&
                        t.dim_size(2) == k * units_
                        : t.dims() == 2 && t.dim_size(0) == steps_ && t.dim_size(1) == batch_;
    if (!ok) {
      std::string want = batch_row ? std::to_string(batch_) + ", " + std::to_string(units_)
                         : std::to_string(steps_) + ", " + std::to_string(batch_) +
                               (k ? ", " + std::to_string(k * units_) : "");
      return errors::InvalidArgument(name(), ": input ", i, " has shape ",
                                     t.shape().DebugString(), ", expected [", want, "]");
    }
    *data = t.flat<float>().data();
    return OkStatus();
  }

  // Input i, a kernel [units, k * units]; sets units_ when it is not set yet.
  Status Kernel(OpKernelContext* ctx, int i, int k, const float** data) {
    const Tensor& t = ctx->input(i);
    if (units_ == 0 && t.dims() == 2) units_ = t.dim_size(0);
    if (t.dims() != 2 || t.dim_size(0) != units_ || t.dim_size(1) != k * units_) {
      return errors::InvalidArgument(name(), ": input ", i, " has shape ",
                                     t.shape().DebugString(), ", expected [", units_, ", ",
                                     k * units_, "]");
    }
    *data = t.flat<float>().data();
    return OkStatus();
  }

  Status Out(OpKernelContext* ctx, int i, int k, float** data) {
    Tensor* t = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(
        i, k ? TensorShape({steps_, batch_, k * units_}) : TensorShape({steps_, batch_}), &t));
    *data = t->flat<float>().data();
    return OkStatus();
  }

  // Offset of row b of step t in a [S, B, k * units] tensor.
  int64_t At(int64_t t, int64_t b, int k) const { return (t * batch_ + b) * k * units_; }

  int64_t steps_ = 0, batch_ = 0, units_ = 0;
};

class GruSequenceOp : public SequenceKernel {
 public:
  using SequenceKernel::SequenceKernel;

 private:
  Status Prepare(OpKernelContext* ctx) override {
    TF_RETURN_IF_ERROR(Kernel(ctx, 1, 3, &recurrent_));
    TF_RETURN_IF_ERROR(In(ctx, 0, 3, &x_));
    const Tensor& bias = ctx->input(2);
    if (bias.dims() != 1 || bias.dim_size(0) != 3 * units_) {
      return errors::InvalidArgument(name(), ": recurrent_bias must be [", 3 * units_, "], got ",
                                     bias.shape().DebugString());
    }
    bias_ = bias.flat<float>().data();
    TF_RETURN_IF_ERROR(Out(ctx, 0, 1, &states_));
    TF_RETURN_IF_ERROR(Out(ctx, 1, 2, &zr_));
    TF_RETURN_IF_ERROR(Out(ctx, 2, 1, &n_));
    return Out(ctx, 3, 1, &hu_n_);
  }

  void Rows(int64_t begin, int64_t end) override {
    const int64_t H = units_, rows = end - begin;
    Matrix hu = Matrix::Zero(rows, 3 * H);
    const Eigen::ArrayXf zero = Eigen::ArrayXf::Zero(H);
    ConstMatrixMap U(recurrent_, H, 3 * H);
    for (int64_t t = 0; t < steps_; ++t) {
      if (t) hu.noalias() = ConstMatrixMap(states_ + At(t - 1, begin, 1), rows, H) * U;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t b = begin + i;
        const float* x = x_ + At(t, b, 3);
        const float* h_prev = t ? states_ + At(t - 1, b, 1) : zero.data();
        Row zr(zr_ + At(t, b, 2), 2 * H), n(n_ + At(t, b, 1), H), hu_n(hu_n_ + At(t, b, 1), H);
        zr = (ConstRow(x, 2 * H) + hu.row(i).head(2 * H).array().transpose() +
              ConstRow(bias_, 2 * H)).logistic();
        hu_n = hu.row(i).tail(H).array().transpose() + ConstRow(bias_ + 2 * H, H);
        n = (ConstRow(x + 2 * H, H) + zr.tail(H) * hu_n).tanh();
        Row(states_ + At(t, b, 1), H) = n + zr.head(H) * (ConstRow(h_prev, H) - n);
      }
    }
  }

  const float *x_, *recurrent_, *bias_;
  float *states_, *zr_, *n_, *hu_n_;
};

class GruSequenceGradOp : public SequenceKernel {
 public:
  using SequenceKernel::SequenceKernel;

 private:
  Status Prepare(OpKernelContext* ctx) override {
    TF_RETURN_IF_ERROR(Kernel(ctx, 1, 3, &recurrent_));
    TF_RETURN_IF_ERROR(In(ctx, 0, 1, &d_states_));
    TF_RETURN_IF_ERROR(In(ctx, 2, 1, &states_));
    TF_RETURN_IF_ERROR(In(ctx, 3, 2, &zr_));
    TF_RETURN_IF_ERROR(In(ctx, 4, 1, &n_));
    TF_RETURN_IF_ERROR(In(ctx, 5, 1, &hu_n_));
    TF_RETURN_IF_ERROR(Out(ctx, 0, 3, &d_x_));
    return Out(ctx, 1, 3, &d_hu_);
  }

  void Rows(int64_t begin, int64_t end) override {
    const int64_t H = units_, rows = end - begin;
    Matrix carry = Matrix::Zero(rows, H), rec = Matrix::Zero(rows, H);
    const Eigen::ArrayXf zero = Eigen::ArrayXf::Zero(H);
    ConstMatrixMap U(recurrent_, H, 3 * H);
    for (int64_t t = steps_ - 1; t >= 0; --t) {
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t b = begin + i;
        Eigen::ArrayXf dh = carry.row(i).array().transpose() + rec.row(i).array().transpose() +
                            ConstRow(d_states_ + At(t, b, 1), H);
        const float* zr = zr_ + At(t, b, 2);
        ConstRow z(zr, H), r(zr + H, H), n(n_ + At(t, b, 1), H);
        ConstRow h_prev(t ? states_ + At(t - 1, b, 1) : zero.data(), H);
        Row d_x(d_x_ + At(t, b, 3), 3 * H), d_hu(d_hu_ + At(t, b, 3), 3 * H);
        d_x.segment(2 * H, H) = dh * (1.0f - z) * (1.0f - n * n);  // dn
        d_x.head(H) = dh * (h_prev - n) * z * (1.0f - z);          // dz
        d_x.segment(H, H) = d_x.segment(2 * H, H) * ConstRow(hu_n_ + At(t, b, 1), H) * r *
                            (1.0f - r);
        d_hu.head(2 * H) = d_x.head(2 * H);
        d_hu.tail(H) = r * d_x.tail(H);
        carry.row(i) = (dh * z).transpose().matrix();
      }
      if (t) rec.noalias() = ConstMatrixMap(d_hu_ + At(t, begin, 3), rows, 3 * H) * U.transpose();
    }
  }

  const float *recurrent_, *d_states_, *states_, *zr_, *n_, *hu_n_;
  float *d_x_, *d_hu_;
};

class AugruSequenceOp : public SequenceKernel {
 public:
  using SequenceKernel::SequenceKernel;

 private:
  Status Prepare(OpKernelContext* ctx) override {
    TF_RETURN_IF_ERROR(Kernel(ctx, 3, 1, &candidate_));
    TF_RETURN_IF_ERROR(Kernel(ctx, 2, 2, &gate_));
    TF_RETURN_IF_ERROR(In(ctx, 0, 3, &x_));
    TF_RETURN_IF_ERROR(In(ctx, 1, 0, &keep_));
    TF_RETURN_IF_ERROR(Out(ctx, 0, 1, &states_));
    TF_RETURN_IF_ERROR(Out(ctx, 1, 2, &g_));
    TF_RETURN_IF_ERROR(Out(ctx, 2, 1, &rh_));
    return Out(ctx, 3, 1, &c_);
  }

  void Rows(int64_t begin, int64_t end) override {
    const int64_t H = units_, rows = end - begin;
    Matrix hg = Matrix::Zero(rows, 2 * H), hc = Matrix::Zero(rows, H);
    const Eigen::ArrayXf zero = Eigen::ArrayXf::Zero(H);
    ConstMatrixMap Wg(gate_, H, 2 * H), Wc(candidate_, H, H);
    for (int64_t t = 0; t < steps_; ++t) {
      if (t) hg.noalias() = ConstMatrixMap(states_ + At(t - 1, begin, 1), rows, H) * Wg;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t b = begin + i;
        const float* h_prev = t ? states_ + At(t - 1, b, 1) : zero.data();
        Row g(g_ + At(t, b, 2), 2 * H);
        g = (ConstRow(x_ + At(t, b, 3), 2 * H) + hg.row(i).array().transpose()).logistic();
        Row(rh_ + At(t, b, 1), H) = g.head(H) * ConstRow(h_prev, H);
      }
      if (t) hc.noalias() = ConstMatrixMap(rh_ + At(t, begin, 1), rows, H) * Wc;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t b = begin + i;
        ConstRow h_prev(t ? states_ + At(t - 1, b, 1) : zero.data(), H);
        Row c(c_ + At(t, b, 1), H);
        c = (ConstRow(x_ + At(t, b, 3) + 2 * H, H) + hc.row(i).array().transpose()).tanh();
        Row(states_ + At(t, b, 1), H) =
            c + keep_[t * batch_ + b] * ConstRow(g_ + At(t, b, 2) + H, H) * (h_prev - c);
      }
    }
  }

  const float *x_, *keep_, *gate_, *candidate_;
  float *states_, *g_, *rh_, *c_;
};

class AugruSequenceGradOp : public SequenceKernel {
 public:
  using SequenceKernel::SequenceKernel;

 private:
  Status Prepare(OpKernelContext* ctx) override {
    TF_RETURN_IF_ERROR(Kernel(ctx, 4, 1, &candidate_));
    TF_RETURN_IF_ERROR(Kernel(ctx, 3, 2, &gate_));
    const float* unused;
    TF_RETURN_IF_ERROR(In(ctx, 0, 3, &unused));
    TF_RETURN_IF_ERROR(In(ctx, 1, 1, &d_last_, /*batch_row=*/true));
    TF_RETURN_IF_ERROR(In(ctx, 2, 0, &keep_));
    TF_RETURN_IF_ERROR(In(ctx, 5, 1, &states_));
    TF_RETURN_IF_ERROR(In(ctx, 6, 2, &g_));
    TF_RETURN_IF_ERROR(In(ctx, 7, 1, &c_));
    TF_RETURN_IF_ERROR(Out(ctx, 0, 3, &d_x_));
    return Out(ctx, 1, 0, &d_keep_);
  }

  void Rows(int64_t begin, int64_t end) override {
    const int64_t H = units_, rows = end - begin;
    Matrix carry = ConstMatrixMap(d_last_ + begin * H, rows, H), rec = Matrix::Zero(rows, H);
    Matrix dc(rows, H), d_rh(rows, H), dg(rows, 2 * H);
    const Eigen::ArrayXf zero = Eigen::ArrayXf::Zero(H);
    ConstMatrixMap Wg(gate_, H, 2 * H), Wc(candidate_, H, H);
    for (int64_t t = steps_ - 1; t >= 0; --t) {
      carry += rec;  // dh of each row
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t b = begin + i;
        const float k = keep_[t * batch_ + b];
        ConstRow c(c_ + At(t, b, 1), H);
        dc.row(i) = (carry.row(i).array().transpose() *
                     (1.0f - k * ConstRow(g_ + At(t, b, 2) + H, H)) * (1.0f - c * c))
                        .transpose()
                        .matrix();
      }
      d_rh.noalias() = dc * Wc.transpose();
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t b = begin + i;
        const float k = keep_[t * batch_ + b];
        ConstRow h_prev(t ? states_ + At(t - 1, b, 1) : zero.data(), H);
        ConstRow r(g_ + At(t, b, 2), H), u(g_ + At(t, b, 2) + H, H);
        Eigen::ArrayXf dh = carry.row(i).array().transpose();
        Eigen::ArrayXf drh = d_rh.row(i).array().transpose();
        Eigen::ArrayXf d_ku = dh * (h_prev - ConstRow(c_ + At(t, b, 1), H));
        Row d_x(d_x_ + At(t, b, 3), 3 * H);
        d_x.head(H) = drh * h_prev * r * (1.0f - r);
        d_x.segment(H, H) = k * d_ku * u * (1.0f - u);
        d_x.tail(H) = dc.row(i).array().transpose();
        d_keep_[t * batch_ + b] = (u * d_ku).sum();
        carry.row(i) = (k * u * dh + r * drh).transpose().matrix();
        dg.row(i) = d_x.head(2 * H).transpose().matrix();
      }
      if (t) rec.noalias() = dg * Wg.transpose();
    }
  }

  const float *d_last_, *keep_, *gate_, *candidate_, *states_, *g_, *c_;
  float *d_x_, *d_keep_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("GruSequence").Device(DEVICE_CPU), GruSequenceOp);
REGISTER_KERNEL_BUILDER(Name("GruSequenceGrad").Device(DEVICE_CPU), GruSequenceGradOp);
REGISTER_KERNEL_BUILDER(Name("AugruSequence").Device(DEVICE_CPU), AugruSequenceOp);
REGISTER_KERNEL_BUILDER(Name("AugruSequenceGrad").Device(DEVICE_CPU), AugruSequenceGradOp);

}  // namespace tensorflow
