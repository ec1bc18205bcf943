// LazyAdamRows: lazy Adam's update of the rows of a table (and of its two moments) in one
// pass, in place. TensorFlow has no sparse Adam kernel: as gather / scatter ops the same update
// reads and writes every row five times (about a quarter of a small SIM step on CPU).
//
// For each i (indices distinct, as after summing a sparse gradient per row), row r = indices[i]:
//   m[r] = beta1 m[r] + (1 - beta1) g[i]
//   v[r] = beta2 v[r] + (1 - beta2) g[i]^2
//   var[r] -= lr_t m[r] / (sqrt(v[r]) + epsilon) + decay var[r]
// (lr_t: the bias-corrected rate; decay: lr * weight decay, 0 for plain Adam).
#include <cmath>
#include <cstring>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {

REGISTER_OP("LazyAdamRows")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("indices: Tindices")
    .Input("grad: float")
    .Input("lr_t: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .Input("decay: float")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn(shape_inference::NoOutputs);

namespace {

// The variable's buffer, writable in place: copied first when a reader still holds it.
Status WritableTensor(OpKernelContext* ctx, Var* var, float** data) {
  Tensor* tensor = var->tensor();
  if (!tensor->RefCountIsOne()) {
    Tensor copy;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensor->dtype(), tensor->shape(), &copy));
    std::memcpy(copy.flat<float>().data(), tensor->flat<float>().data(),
                tensor->NumElements() * sizeof(float));
    *tensor = copy;
  }
  *data = tensor->flat<float>().data();
  return OkStatus();
}

template <typename Index>
class LazyAdamRowsOp : public OpKernel {
 public:
  explicit LazyAdamRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    Var* vars[3];
    for (int i = 0; i < 3; ++i) {
      OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, i), &vars[i]));
    }
    core::ScopedUnref unref0(vars[0]), unref1(vars[1]), unref2(vars[2]);
    mutex_lock lock0(*vars[0]->mu()), lock1(*vars[1]->mu()), lock2(*vars[2]->mu());
    const Tensor& shape_of = *vars[0]->tensor();
    for (int i = 0; i < 3; ++i) {
      OP_REQUIRES(ctx, vars[i]->tensor()->dtype() == DT_FLOAT &&
                           vars[i]->tensor()->shape() == shape_of.shape(),
                  errors::InvalidArgument("LazyAdamRows: var, m and v must be float32 of one "
                                          "shape"));
    }
    OP_REQUIRES(ctx, shape_of.dims() == 2,
                errors::InvalidArgument("LazyAdamRows: the table must be 2-D"));
    const Tensor& indices = ctx->input(3);
    const Tensor& grad = ctx->input(4);
    const int64_t rows = shape_of.dim_size(0), width = shape_of.dim_size(1);
    const int64_t count = indices.NumElements();
    OP_REQUIRES(ctx, grad.dims() == 2 && grad.dim_size(0) == count && grad.dim_size(1) == width,
                errors::InvalidArgument("LazyAdamRows: grad must be [len(indices), ", width,
                                        "], found ", grad.shape().DebugString()));
    float* data[3];
    for (int i = 0; i < 3; ++i) OP_REQUIRES_OK(ctx, WritableTensor(ctx, vars[i], &data[i]));
    const float lr_t = ctx->input(5).scalar<float>()(), beta1 = ctx->input(6).scalar<float>()();
    const float beta2 = ctx->input(7).scalar<float>()(), eps = ctx->input(8).scalar<float>()();
    const float decay = ctx->input(9).scalar<float>()();
    const Index* index = indices.flat<Index>().data();
    for (int64_t i = 0; i < count; ++i) {
      OP_REQUIRES(ctx, index[i] >= 0 && index[i] < rows,
                  errors::InvalidArgument("LazyAdamRows: row ", index[i], " outside [0, ",
                                          rows, ")"));
    }
    const float* g = grad.flat<float>().data();
    auto update_rows = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t r = static_cast<int64_t>(index[i]);
        UpdateRow(data[0] + r * width, data[1] + r * width, data[2] + r * width,
                  g + i * width, width, lr_t, beta1, beta2, eps, decay);
      }
    };
    // the two cores share the rows (distinct rows: no two threads touch one row)
    auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(pool->num_threads, pool->workers, count, 40 * width, update_rows);
  }

 private:
  static void UpdateRow(float* __restrict__ w, float* __restrict__ m, float* __restrict__ v,
                        const float* __restrict__ g, int64_t width, float lr_t, float beta1,
                        float beta2, float eps, float decay) {
    for (int64_t j = 0; j < width; ++j) {
      const float m_new = beta1 * m[j] + (1 - beta1) * g[j];
      const float v_new = beta2 * v[j] + (1 - beta2) * g[j] * g[j];
      m[j] = m_new;
      v[j] = v_new;
      w[j] -= lr_t * m_new / (std::sqrt(v_new) + eps) + decay * w[j];
    }
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(
    Name("LazyAdamRows").Device(DEVICE_CPU).TypeConstraint<int32>("Tindices"),
    LazyAdamRowsOp<int32>);
REGISTER_KERNEL_BUILDER(
    Name("LazyAdamRows").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tindices"),
    LazyAdamRowsOp<int64_t>);

}  // namespace tensorflow
