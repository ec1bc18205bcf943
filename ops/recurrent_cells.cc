// The element-wise work of one step of a GRU (Keras' reset_after form) and of an AUGRU, forward
// and backward, each as one pass over the batch. As TensorFlow ops the same step is a dozen
// element-wise ops, each reading and writing [batch, 3 x units] tensors: at NVIDIA's DIEN
// shape (96 units) they cost more than the step's matmuls. The matmuls stay TensorFlow's
// (sim/blocks.py calls these ops between them).
//
// Layouts: x [B, 3H] is the step's input projection (x W + b), a slice of the time-major
// [S, B, 3H] projection of every step (sim/blocks.py): a step's rows lie together, where a
// batch-major [B, S, 3H] spread them S rows apart and the ops waited on memory for half their
// time. Gate columns: GRU z, r, n; AUGRU r, u, c. keep [B] = 1 - the step's attention.
//
// GRU forward (hu = h_prev U, b' the recurrent bias):
//   [z, r] = s(x_zr + hu_zr + b'_zr),  hu_n' = hu_n + b'_n,  n = tanh(x_n + r hu_n'),
//   h = n + z (h_prev - n)
// GRU backward (dh = carry + rec + d_state: the gradient reaching h):
//   dn = dh (1 - z)(1 - n^2),  dz = dh (h_prev - n) z (1 - z),  dr = dn hu_n' r (1 - r)
//   d_x = [dz, dr, dn],  d_hu = [dz, dr, r dn],  carry' = dh z   (dh_prev = carry' + d_hu U^T)
// AUGRU forward: g = [r, u] = s(x_g + hg),  rh = r h_prev;  c = tanh(x_c + hc),
//   h = c + k u (h_prev - c)   (hg = h_prev Wg_h, hc = rh Wc_h)
// AUGRU backward (dh = carry + rec):  dc = dh (1 - k u)(1 - c^2)   (d_rh = dc Wc_h^T), then
//   d_ku = dh (h_prev - c),  dg = [d_rh h_prev, k d_ku] g (1 - g),  d_keep = sum(u d_ku),
//   carry' = k u dh + r d_rh   (dh_prev = carry' + dg Wg_h^T)
#include <initializer_list>
#include <string>

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

// Outputs [batch, k * units] for each k of `widths` (k = 0: [batch]); batch from input 0
// ([batch, columns] in every op), units the last dimension of input `units_from`.
Status SetOutputs(InferenceContext* c, int units_from, std::initializer_list<int> widths) {
  ShapeHandle first, with_units;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &first));
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(units_from), 1, &with_units));
  DimensionHandle batch = c->Dim(first, 0), units = c->Dim(with_units, -1);
  int i = 0;
  for (int k : widths) {
    DimensionHandle columns;
    TF_RETURN_IF_ERROR(c->Multiply(units, k, &columns));
    c->set_output(i++, k ? c->Matrix(batch, columns) : c->Vector(batch));
  }
  return OkStatus();
}

}  // namespace

REGISTER_OP("GruCellForward")
    .Input("hu: float")              // [B, 3H] h_prev U (no bias)
    .Input("x: float")               // [B, 3H]
    .Input("recurrent_bias: float")  // [3H]
    .Input("h_prev: float")          // [B, H]
    .Output("h: float")
    .Output("zr: float")
    .Output("n: float")
    .Output("hu_n: float")  // with its bias
    .SetShapeFn([](InferenceContext* c) { return SetOutputs(c, 3, {1, 2, 1, 1}); });

REGISTER_OP("GruCellBackward")
    .Input("carry: float")     // [B, H]
    .Input("rec: float")       // [B, H]
    .Input("d_state: float")   // [B, H]
    .Input("zr: float")
    .Input("n: float")
    .Input("hu_n: float")
    .Input("h_prev: float")
    .Output("d_x: float")    // [B, 3H]
    .Output("d_hu: float")   // [B, 3H]
    .Output("carry_out: float")
    .SetShapeFn([](InferenceContext* c) { return SetOutputs(c, 0, {3, 3, 1}); });

REGISTER_OP("AugruGates")
    .Input("hg: float")  // [B, 2H] h_prev Wg_h
    .Input("x: float")   // [B, 3H]
    .Input("h_prev: float")
    .Output("g: float")   // [B, 2H]
    .Output("rh: float")  // [B, H]
    .SetShapeFn([](InferenceContext* c) { return SetOutputs(c, 2, {2, 1}); });

REGISTER_OP("AugruUpdate")
    .Input("hc: float")    // [B, H] rh Wc_h
    .Input("x: float")     // [B, 3H]
    .Input("keep: float")  // [B]
    .Input("g: float")
    .Input("h_prev: float")
    .Output("h: float")
    .Output("c: float")
    .SetShapeFn([](InferenceContext* c) { return SetOutputs(c, 4, {1, 1}); });

REGISTER_OP("AugruBackwardCandidate")
    .Input("carry: float")  // [B, H]
    .Input("rec: float")    // [B, H]
    .Input("keep: float")   // [B]
    .Input("g: float")
    .Input("c: float")
    .Output("dh: float")
    .Output("dc: float")
    .SetShapeFn([](InferenceContext* c) { return SetOutputs(c, 0, {1, 1}); });

REGISTER_OP("AugruBackwardGates")
    .Input("dh: float")    // [B, H]
    .Input("d_rh: float")  // [B, H]
    .Input("keep: float")  // [B]
    .Input("g: float")
    .Input("c: float")
    .Input("h_prev: float")
    .Output("dg: float")      // [B, 2H]
    .Output("d_keep: float")  // [B]
    .Output("carry_out: float")
    .SetShapeFn([](InferenceContext* c) { return SetOutputs(c, 0, {2, 0, 1}); });

namespace {

using Row = Eigen::Map<Eigen::ArrayXf>;
using ConstRow = Eigen::Map<const Eigen::ArrayXf>;

// The element-wise pass of one op over rows [begin, end) of the batch.
class CellKernel : public OpKernel {
 public:
  explicit CellKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& first = ctx->input(0);
    OP_REQUIRES(ctx, first.dims() == 2,
                errors::InvalidArgument(name(), ": input 0 must be [batch, columns]"));
    batch_ = first.dim_size(0);
    OP_REQUIRES_OK(ctx, Prepare(ctx));
    if (!ctx->status().ok() || batch_ == 0) return;
    auto workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, batch_, 40 * units_,
          [this](int64_t begin, int64_t end) {
            for (int64_t b = begin; b < end; ++b) ComputeRow(b);
          });
  }

 protected:
  // Checks shapes, allocates the outputs.
  virtual Status Prepare(OpKernelContext* ctx) = 0;
  virtual void ComputeRow(int64_t b) = 0;

  // Input i's data, checked to be [batch, k * units] (k = 0: [batch]).
  Status In(OpKernelContext* ctx, int i, int k, const float** data) {
    const Tensor& t = ctx->input(i);
    bool ok = k ? t.dims() == 2 && t.dim_size(0) == batch_ && t.dim_size(1) == k * units_
                : t.dims() == 1 && t.dim_size(0) == batch_;
    if (!ok) {
      return errors::InvalidArgument(name(), ": input ", i, " has shape ",
                                     t.shape().DebugString(), ", expected [", batch_,
                                     k ? ", " + std::to_string(k * units_) + "]" : "]");
    }
    *data = t.flat<float>().data();
    return OkStatus();
  }

  Status Out(OpKernelContext* ctx, int i, int64_t columns, float** data) {
    Tensor* t = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(
        i, columns ? TensorShape({batch_, columns}) : TensorShape({batch_}), &t));
    *data = t->flat<float>().data();
    return OkStatus();
  }

  int64_t batch_ = 0, units_ = 0;
};

class GruCellForwardOp : public CellKernel {
 public:
  using CellKernel::CellKernel;

 private:
  Status Prepare(OpKernelContext* ctx) override {
    units_ = ctx->input(3).dims() == 2 ? ctx->input(3).dim_size(1) : -1;
    TF_RETURN_IF_ERROR(In(ctx, 3, 1, &h_prev_));
    TF_RETURN_IF_ERROR(In(ctx, 0, 3, &hu_));
    TF_RETURN_IF_ERROR(In(ctx, 1, 3, &x_));
    const Tensor& bias = ctx->input(2);
    if (bias.dims() != 1 || bias.dim_size(0) != 3 * units_) {
      return errors::InvalidArgument(name(), ": recurrent_bias must be [", 3 * units_, "]");
    }
    bias_ = bias.flat<float>().data();
    TF_RETURN_IF_ERROR(Out(ctx, 0, units_, &h_));
    TF_RETURN_IF_ERROR(Out(ctx, 1, 2 * units_, &zr_));
    TF_RETURN_IF_ERROR(Out(ctx, 2, units_, &n_));
    return Out(ctx, 3, units_, &hu_n_);
  }

  void ComputeRow(int64_t b) override {
    const int64_t H = units_;
    const float* x = x_ + b * 3 * H;
    const float* hu = hu_ + b * 3 * H;
    Row zr(zr_ + b * 2 * H, 2 * H), n(n_ + b * H, H), hu_n(hu_n_ + b * H, H);
    zr = (ConstRow(x, 2 * H) + ConstRow(hu, 2 * H) + ConstRow(bias_, 2 * H)).logistic();
    hu_n = ConstRow(hu + 2 * H, H) + ConstRow(bias_ + 2 * H, H);
    n = (ConstRow(x + 2 * H, H) + zr.tail(H) * hu_n).tanh();
    Row(h_ + b * H, H) = n + zr.head(H) * (ConstRow(h_prev_ + b * H, H) - n);
  }

  const float *hu_, *x_, *bias_, *h_prev_;
  float *h_, *zr_, *n_, *hu_n_;
};

class GruCellBackwardOp : public CellKernel {
 public:
  using CellKernel::CellKernel;

 private:
  Status Prepare(OpKernelContext* ctx) override {
    units_ = ctx->input(0).dim_size(1);
    TF_RETURN_IF_ERROR(In(ctx, 1, 1, &rec_));
    TF_RETURN_IF_ERROR(In(ctx, 0, 1, &carry_));
    TF_RETURN_IF_ERROR(In(ctx, 2, 1, &d_state_));
    TF_RETURN_IF_ERROR(In(ctx, 3, 2, &zr_));
    TF_RETURN_IF_ERROR(In(ctx, 4, 1, &n_));
    TF_RETURN_IF_ERROR(In(ctx, 5, 1, &hu_n_));
    TF_RETURN_IF_ERROR(In(ctx, 6, 1, &h_prev_));
    TF_RETURN_IF_ERROR(Out(ctx, 0, 3 * units_, &d_x_));
    TF_RETURN_IF_ERROR(Out(ctx, 1, 3 * units_, &d_hu_));
    return Out(ctx, 2, units_, &carry_out_);
  }

  void ComputeRow(int64_t b) override {
    const int64_t H = units_;
    const int64_t at = b * H;
    Eigen::ArrayXf dh = ConstRow(carry_ + at, H) + ConstRow(rec_ + at, H) +
                        ConstRow(d_state_ + at, H);
    ConstRow z(zr_ + 2 * at, H), r(zr_ + 2 * at + H, H), n(n_ + at, H);
    Row d_x(d_x_ + 3 * at, 3 * H), d_hu(d_hu_ + 3 * at, 3 * H);
    d_x.segment(2 * H, H) = dh * (1.0f - z) * (1.0f - n * n);                        // dn
    d_x.head(H) = dh * (ConstRow(h_prev_ + at, H) - n) * z * (1.0f - z);          // dz
    d_x.segment(H, H) = d_x.segment(2 * H, H) * ConstRow(hu_n_ + at, H) * r * (1.0f - r);
    d_hu.head(2 * H) = d_x.head(2 * H);
    d_hu.tail(H) = r * d_x.tail(H);
    Row(carry_out_ + at, H) = dh * z;
  }

  const float *carry_, *rec_, *d_state_, *zr_, *n_, *hu_n_, *h_prev_;
  float *d_x_, *d_hu_, *carry_out_;
};

class AugruGatesOp : public CellKernel {
 public:
  using CellKernel::CellKernel;

 private:
  Status Prepare(OpKernelContext* ctx) override {
    units_ = ctx->input(2).dims() == 2 ? ctx->input(2).dim_size(1) : -1;
    TF_RETURN_IF_ERROR(In(ctx, 2, 1, &h_prev_));
    TF_RETURN_IF_ERROR(In(ctx, 0, 2, &hg_));
    TF_RETURN_IF_ERROR(In(ctx, 1, 3, &x_));
    TF_RETURN_IF_ERROR(Out(ctx, 0, 2 * units_, &g_));
    return Out(ctx, 1, units_, &rh_);
  }

  void ComputeRow(int64_t b) override {
    const int64_t H = units_;
    Row g(g_ + b * 2 * H, 2 * H);
    g = (ConstRow(x_ + b * 3 * H, 2 * H) + ConstRow(hg_ + b * 2 * H, 2 * H)).logistic();
    Row(rh_ + b * H, H) = g.head(H) * ConstRow(h_prev_ + b * H, H);
  }

  const float *hg_, *x_, *h_prev_;
  float *g_, *rh_;
};

class AugruUpdateOp : public CellKernel {
 public:
  using CellKernel::CellKernel;

 private:
  Status Prepare(OpKernelContext* ctx) override {
    units_ = ctx->input(4).dims() == 2 ? ctx->input(4).dim_size(1) : -1;
    TF_RETURN_IF_ERROR(In(ctx, 4, 1, &h_prev_));
    TF_RETURN_IF_ERROR(In(ctx, 0, 1, &hc_));
    TF_RETURN_IF_ERROR(In(ctx, 1, 3, &x_));
    TF_RETURN_IF_ERROR(In(ctx, 2, 0, &keep_));
    TF_RETURN_IF_ERROR(In(ctx, 3, 2, &g_));
    TF_RETURN_IF_ERROR(Out(ctx, 0, units_, &h_));
    return Out(ctx, 1, units_, &c_);
  }

  void ComputeRow(int64_t b) override {
    const int64_t H = units_;
    const float k = keep_[b];
    Row c(c_ + b * H, H);
    c = (ConstRow(x_ + b * 3 * H + 2 * H, H) + ConstRow(hc_ + b * H, H)).tanh();
    Row(h_ + b * H, H) = c + k * ConstRow(g_ + b * 2 * H + H, H) *
                                 (ConstRow(h_prev_ + b * H, H) - c);
  }

  const float *hc_, *x_, *keep_, *g_, *h_prev_;
  float *h_, *c_;
};

class AugruBackwardCandidateOp : public CellKernel {
 public:
  using CellKernel::CellKernel;

 private:
  Status Prepare(OpKernelContext* ctx) override {
    units_ = ctx->input(0).dim_size(1);
    TF_RETURN_IF_ERROR(In(ctx, 0, 1, &carry_));
    TF_RETURN_IF_ERROR(In(ctx, 1, 1, &rec_));
    TF_RETURN_IF_ERROR(In(ctx, 2, 0, &keep_));
    TF_RETURN_IF_ERROR(In(ctx, 3, 2, &g_));
    TF_RETURN_IF_ERROR(In(ctx, 4, 1, &c_));
    TF_RETURN_IF_ERROR(Out(ctx, 0, units_, &dh_));
    return Out(ctx, 1, units_, &dc_);
  }

  void ComputeRow(int64_t b) override {
    const int64_t H = units_, at = b * H;
    const float k = keep_[b];
    Row dh(dh_ + at, H);
    dh = ConstRow(carry_ + at, H) + ConstRow(rec_ + at, H);
    ConstRow c(c_ + at, H);
    Row(dc_ + at, H) = dh * (1.0f - k * ConstRow(g_ + 2 * at + H, H)) * (1.0f - c * c);
  }

  const float *carry_, *rec_, *keep_, *g_, *c_;
  float *dh_, *dc_;
};

class AugruBackwardGatesOp : public CellKernel {
 public:
  using CellKernel::CellKernel;

 private:
  Status Prepare(OpKernelContext* ctx) override {
    units_ = ctx->input(0).dim_size(1);
    TF_RETURN_IF_ERROR(In(ctx, 0, 1, &dh_));
    TF_RETURN_IF_ERROR(In(ctx, 1, 1, &d_rh_));
    TF_RETURN_IF_ERROR(In(ctx, 2, 0, &keep_));
    TF_RETURN_IF_ERROR(In(ctx, 3, 2, &g_));
    TF_RETURN_IF_ERROR(In(ctx, 4, 1, &c_));
    TF_RETURN_IF_ERROR(In(ctx, 5, 1, &h_prev_));
    TF_RETURN_IF_ERROR(Out(ctx, 0, 2 * units_, &dg_));
    TF_RETURN_IF_ERROR(Out(ctx, 1, 0, &d_keep_));
    return Out(ctx, 2, units_, &carry_out_);
  }

  void ComputeRow(int64_t b) override {
    const int64_t H = units_, at = b * H;
    const float k = keep_[b];
    ConstRow dh(dh_ + at, H), d_rh(d_rh_ + at, H), h_prev(h_prev_ + at, H);
    ConstRow r(g_ + 2 * at, H), u(g_ + 2 * at + H, H);
    Eigen::ArrayXf d_ku = dh * (h_prev - ConstRow(c_ + at, H));
    Row dg(dg_ + 2 * at, 2 * H);
    dg.head(H) = d_rh * h_prev * r * (1.0f - r);
    dg.tail(H) = k * d_ku * u * (1.0f - u);
    d_keep_[b] = (u * d_ku).sum();
    Row(carry_out_ + at, H) = k * u * dh + r * d_rh;
  }

  const float *dh_, *d_rh_, *keep_, *g_, *c_, *h_prev_;
  float *dg_, *d_keep_, *carry_out_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("GruCellForward").Device(DEVICE_CPU),
                        GruCellForwardOp);
REGISTER_KERNEL_BUILDER(Name("GruCellBackward").Device(DEVICE_CPU),
                        GruCellBackwardOp);
REGISTER_KERNEL_BUILDER(Name("AugruGates").Device(DEVICE_CPU), AugruGatesOp);
REGISTER_KERNEL_BUILDER(Name("AugruUpdate").Device(DEVICE_CPU),
                        AugruUpdateOp);
REGISTER_KERNEL_BUILDER(Name("AugruBackwardCandidate").Device(DEVICE_CPU),
                        AugruBackwardCandidateOp);
REGISTER_KERNEL_BUILDER(Name("AugruBackwardGates").Device(DEVICE_CPU),
                        AugruBackwardGatesOp);

}  // namespace tensorflow
