// SgdRows: SGD's update of some rows of a table, in place: var[indices[i]] -= lr * grad[i],
// a row listed twice getting both steps (as ResourceScatterSub). TensorFlow 2.21's
// ResourceScatterSub takes about 3x TensorFlow 2.17's time for a step's 26 tables here
// (bench/results/tf221_vs_tf217.txt); this loop is as fast on both.
#include <cstring>

// w -= lr * g rounded twice, as TensorFlow's multiply then ResourceScatterSub: no fused
// multiply-add (the library is built with -mfma), so a step is bit for bit the op path's
#pragma GCC optimize("fp-contract=off")

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

REGISTER_OP("SgdRows")
    .Input("var: resource")
    .Input("indices: Tindices")
    .Input("grad: float")
    .Input("lr: float")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn(shape_inference::NoOutputs);

namespace {

template <typename Index>
class SgdRowsOp : public OpKernel {
 public:
  explicit SgdRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    Var* var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    core::ScopedUnref unref(var);
    mutex_lock lock(*var->mu());
    Tensor* table = var->tensor();
    OP_REQUIRES(ctx, table->dtype() == DT_FLOAT && table->dims() == 2,
                errors::InvalidArgument("SgdRows: the table must be 2-D float32"));
    const Tensor& indices = ctx->input(1);
    const Tensor& grad = ctx->input(2);
    const int64_t rows = table->dim_size(0), width = table->dim_size(1);
    const int64_t count = indices.NumElements();
    OP_REQUIRES(ctx, grad.dims() == 2 && grad.dim_size(0) == count && grad.dim_size(1) == width,
                errors::InvalidArgument("SgdRows: grad must be [len(indices), ", width,
                                        "], found ", grad.shape().DebugString()));
    const Index* index = indices.flat<Index>().data();
    for (int64_t i = 0; i < count; ++i) {
      OP_REQUIRES(ctx, index[i] >= 0 && index[i] < rows,
                  errors::InvalidArgument("SgdRows: row ", index[i], " outside [0, ", rows,
                                          ")"));
    }
    if (!table->RefCountIsOne()) {  // a reader still holds the buffer: write a copy
      Tensor copy;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_FLOAT, table->shape(), &copy));
      std::memcpy(copy.flat<float>().data(), table->flat<float>().data(),
                  table->NumElements() * sizeof(float));
      *table = copy;
    }
    float* data = table->flat<float>().data();
    const float* g = grad.flat<float>().data();
    const float lr = ctx->input(3).scalar<float>()();
    // one thread: a row may be listed twice, and a step's rows are a few MB at most
    for (int64_t i = 0; i < count; ++i) {
      float* __restrict__ w = data + static_cast<int64_t>(index[i]) * width;
      const float* __restrict__ gi = g + i * width;
      for (int64_t j = 0; j < width; ++j) w[j] -= lr * gi[j];
    }
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("SgdRows").Device(DEVICE_CPU).TypeConstraint<int32>("Tindices"),
                        SgdRowsOp<int32>);
REGISTER_KERNEL_BUILDER(Name("SgdRows").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tindices"),
                        SgdRowsOp<int64_t>);

}  // namespace tensorflow
