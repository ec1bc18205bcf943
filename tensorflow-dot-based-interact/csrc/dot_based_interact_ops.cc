// TensorFlow registration of DotBasedInteract / DotBasedInteractGrad.
// Shape functions work everywhere; kernels are registered for GPU only and call the
// plain-CUDA launchers of dot_based_interact_kernels.cu on TF's compute stream.
#ifndef EIGEN_USE_GPU
#define EIGEN_USE_GPU
#endif

#include <cstdlib>
#include <cstring>

#include "dot_based_interact.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tsl/platform/tensor_float_32_utils.h"

namespace tensorflow {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

int64_t InteractOutputWidth(int64_t R, int64_t C) {
  const int64_t n = R * (R - 1) / 2 + C;
  return (n + 7) / 8 * 8;
}

Status ForwardShape(InferenceContext* c) {
  ShapeHandle input, bottom;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &input));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &bottom));
  DimensionHandle batch, channels;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(input, 0), c->Dim(bottom, 0), &batch));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(input, 2), c->Dim(bottom, 1), &channels));
  DimensionHandle rows = c->Dim(input, 1);
  DimensionHandle width = c->UnknownDim();
  if (c->ValueKnown(rows) && c->ValueKnown(channels)) {
    const int64_t R = c->Value(rows), C = c->Value(channels);
    if (R < 1 || C < 1)
      return errors::InvalidArgument("DotBasedInteract needs R >= 1 and C >= 1, got R=", R,
                                     " C=", C);
    width = c->MakeDim(InteractOutputWidth(R, C));
  }
  c->set_output(0, c->MakeShape({batch, width}));
  return OkStatus();
}

Status BackwardShape(InferenceContext* c) {
  ShapeHandle input, grad;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &input));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &grad));
  DimensionHandle batch;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(input, 0), c->Dim(grad, 0), &batch));
  DimensionHandle rows = c->Dim(input, 1), channels = c->Dim(input, 2);
  if (c->ValueKnown(rows) && c->ValueKnown(channels)) {
    DimensionHandle unused;
    TF_RETURN_IF_ERROR(c->Merge(
        c->Dim(grad, 1), c->MakeDim(InteractOutputWidth(c->Value(rows), c->Value(channels))),
        &unused));
  }
  c->set_output(0, c->MakeShape({batch, rows, channels}));
  c->set_output(1, c->MakeShape({batch, channels}));
  return OkStatus();
}

}  // namespace

REGISTER_OP("DotBasedInteract")
    .Input("input: T")
    .Input("bottom_mlp_output: T")
    .Output("output: T")
    .Attr("T: {float, half}")
    .SetShapeFn(ForwardShape)
    .Doc(R"doc(
DLRM dot interaction. input [B, R, C] (row 0 = bottom MLP output, rows 1.. =
embeddings), bottom_mlp_output [B, C]. output [B, roundup8(R*(R-1)/2 + C)] =
[bottom_mlp_output | <x_i, x_j> for i > j in row-major order | zeros].
)doc");

REGISTER_OP("DotBasedInteractGrad")
    .Input("input: T")
    .Input("upstream_grad: T")
    .Output("grad_input: T")
    .Output("grad_bottom_mlp_output: T")
    .Attr("T: {float, half}")
    .SetShapeFn(BackwardShape)
    .Doc(R"doc(
Gradient of DotBasedInteract. grad_bottom_mlp_output = upstream_grad[:, :C];
grad_input[b, k] = sum over pairs (k, m) of upstream(pair) * input[b, m].
)doc");

#if GOOGLE_CUDA

namespace {

template <typename T> struct DbiDtype;
template <> struct DbiDtype<float> { static constexpr int value = DBI_DTYPE_F32; };
template <> struct DbiDtype<Eigen::half> { static constexpr int value = DBI_DTYPE_F16; };

// TF_DOT_BASED_INTERACT_PATH=auto|tensor|generic|fallback forces a kernel path
// (debugging / comparisons). Read once.
int RequestedPath() {
  static const int path = [] {
    const char* v = std::getenv("TF_DOT_BASED_INTERACT_PATH");
    if (!v) return DBI_PATH_AUTO;
    if (!std::strcmp(v, "tensor")) return DBI_PATH_TENSOR;
    if (!std::strcmp(v, "generic")) return DBI_PATH_GENERIC;
    if (!std::strcmp(v, "fallback")) return DBI_PATH_FALLBACK;
    return DBI_PATH_AUTO;
  }();
  return path;
}

Status CheckInputs(const Tensor& x, const Tensor& second, int64_t second_width,
                   const char* second_name, int64_t* B, int* R, int* C) {
  if (x.dims() != 3)
    return errors::InvalidArgument("input must be [B, R, C], got ", x.shape().DebugString());
  if (second.dims() != 2)
    return errors::InvalidArgument(second_name, " must be rank 2, got ",
                                   second.shape().DebugString());
  *B = x.dim_size(0);
  const int64_t r = x.dim_size(1), c = x.dim_size(2);
  if (r < 1 || c < 1 || r > (1 << 16) || c > (1 << 24))
    return errors::InvalidArgument("unsupported R=", r, " C=", c);
  *R = static_cast<int>(r);
  *C = static_cast<int>(c);
  const int64_t want = second_width < 0 ? c : second_width;
  if (second.dim_size(0) != *B || second.dim_size(1) != want)
    return errors::InvalidArgument(second_name, " must be [", *B, ", ", want, "], got ",
                                   second.shape().DebugString());
  return OkStatus();
}

template <typename T>
class DotBasedInteractOp : public OpKernel {
 public:
  explicit DotBasedInteractOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& bottom = ctx->input(1);
    int64_t B = 0;
    int R = 0, C = 0;
    OP_REQUIRES_OK(ctx, CheckInputs(x, bottom, -1, "bottom_mlp_output", &B, &R, &C));
    const int64_t W = InteractOutputWidth(R, C);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({B, W}), &out));
    if (B == 0) return;
    const cudaStream_t stream = ctx->eigen_device<Eigen::GpuDevice>().stream();
    const int rc = dbi_forward(DbiDtype<T>::value, x.flat<T>().data(), bottom.flat<T>().data(),
                               out->flat<T>().data(), B, R, C, RequestedPath(),
                               tsl::tensor_float_32_execution_enabled() ? 1 : 0, stream,
                               nullptr);
    OP_REQUIRES(ctx, rc == 0,
                errors::Internal("DotBasedInteract launch failed: ", dbi_error_string(rc)));
  }
};

template <typename T>
class DotBasedInteractGradOp : public OpKernel {
 public:
  explicit DotBasedInteractGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& grad = ctx->input(1);
    OP_REQUIRES(ctx, x.dims() == 3,
                errors::InvalidArgument("input must be [B, R, C], got ",
                                        x.shape().DebugString()));
    int64_t B = 0;
    int R = 0, C = 0;
    OP_REQUIRES_OK(ctx, CheckInputs(x, grad, InteractOutputWidth(x.dim_size(1), x.dim_size(2)),
                                    "upstream_grad", &B, &R, &C));
    Tensor* grad_x = nullptr;
    Tensor* grad_bottom = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &grad_x));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({B, C}), &grad_bottom));
    if (B == 0) return;
    const cudaStream_t stream = ctx->eigen_device<Eigen::GpuDevice>().stream();
    const int rc = dbi_backward(DbiDtype<T>::value, x.flat<T>().data(), grad.flat<T>().data(),
                                grad_x->flat<T>().data(), grad_bottom->flat<T>().data(), B, R,
                                C, RequestedPath(),
                                tsl::tensor_float_32_execution_enabled() ? 1 : 0, stream,
                                nullptr);
    OP_REQUIRES(ctx, rc == 0,
                errors::Internal("DotBasedInteractGrad launch failed: ", dbi_error_string(rc)));
  }
};

}  // namespace

#define REGISTER_DBI_GPU(T)                                                          \
  REGISTER_KERNEL_BUILDER(                                                           \
      Name("DotBasedInteract").Device(DEVICE_GPU).TypeConstraint<T>("T"),            \
      DotBasedInteractOp<T>);                                                        \
  REGISTER_KERNEL_BUILDER(                                                           \
      Name("DotBasedInteractGrad").Device(DEVICE_GPU).TypeConstraint<T>("T"),        \
      DotBasedInteractGradOp<T>);

REGISTER_DBI_GPU(float);
REGISTER_DBI_GPU(Eigen::half);

#undef REGISTER_DBI_GPU

#endif  // GOOGLE_CUDA

}  // namespace tensorflow
