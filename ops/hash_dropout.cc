// HashDropout: y[r][e] = x[r][e] / (1 - rate) where the element is kept, else 0, kept when
// h(row[r], offset[r] + e) >= threshold, h being core/dropout.py's keep_hash (murmur3's
// finalizer over (seed, row, column)): the values of its TensorFlow-op path, bit for bit.
// Dropout is linear in x: its gradient is the same op applied to the upstream gradient, the
// mask made again from the indices.
//
// As TensorFlow ops the hash is ~15 elementwise ops, each a pass over memory and an op
// launch: nine dropouts of a retrieval step's packed [800, 64] activations and their
// gradients took ~6 of its 54 ms. Here it is one loop that g++ vectorizes.
#include <cstdint>
#include <cstring>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

REGISTER_OP("HashDropout")
    .Input("x: float")          // [n, m]
    .Input("rows: int32")       // [n]: the hash's row of each of x's rows
    .Input("offsets: int32")    // [n]: the hash's column of each row's element 0
    .Input("keys: uint32")      // [2]: keep_hash's k0, k1 (from the seed)
    .Input("threshold: uint32") // []: kept when the hash is at least this
    .Input("kept: float")       // []: 1 - rate, the divisor of what is kept
    .Output("y: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return OkStatus();
    });

namespace {

constexpr uint32_t kGolden = 0x9E3779B9u, kGolden2 = 0x85EBCA77u;

inline uint32_t Fmix(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

class HashDropoutOp : public OpKernel {
 public:
  explicit HashDropoutOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& rows = ctx->input(1);
    const Tensor& offsets = ctx->input(2);
    const Tensor& keys = ctx->input(3);
    OP_REQUIRES(ctx, x.dims() == 2 && rows.NumElements() == x.dim_size(0) &&
                         offsets.NumElements() == x.dim_size(0) && keys.NumElements() == 2,
                errors::InvalidArgument("HashDropout: x must be [n, m] with n rows and offsets "
                                        "and 2 keys, found x ", x.shape().DebugString(),
                                        ", rows ", rows.shape().DebugString(), ", offsets ",
                                        offsets.shape().DebugString(), ", keys ",
                                        keys.shape().DebugString()));
    const int64_t n = x.dim_size(0), m = x.dim_size(1);
    const uint32_t k0 = keys.flat<uint32_t>()(0), k1 = keys.flat<uint32_t>()(1);
    const uint32_t threshold = ctx->input(4).scalar<uint32_t>()();
    const float kept = ctx->input(5).scalar<float>()();
    Tensor* y = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    const float* in = x.flat<float>().data();
    float* out = y->flat<float>().data();
    const int32_t* row = rows.flat<int32_t>().data();
    const int32_t* offset = offsets.flat<int32_t>().data();
    for (int64_t r = 0; r < n; ++r) {
      const uint32_t h = Fmix(static_cast<uint32_t>(row[r]) * kGolden ^ k0);
      const uint32_t first = static_cast<uint32_t>(offset[r]);
      const float* a = in + r * m;
      float* b = out + r * m;
      for (int64_t e = 0; e < m; ++e) {
        const uint32_t col = first + static_cast<uint32_t>(e);
        // the quotient's bits and-ed with all ones or zeros: a loop without branches
        const float scaled = a[e] / kept;
        uint32_t bits;
        std::memcpy(&bits, &scaled, sizeof bits);
        bits &= -static_cast<uint32_t>(Fmix(Fmix(h + col * kGolden2) ^ k1) >= threshold);
        std::memcpy(b + e, &bits, sizeof bits);
      }
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("HashDropout").Device(DEVICE_CPU), HashDropoutOp);

}  // namespace
}  // namespace tensorflow
