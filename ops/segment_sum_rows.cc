// SegmentSumRows: out[s] = sum of data[i] over the i with segment_ids[i] == s, for float32
// rows of any width; out has num_segments rows, 0 where no id points.
// TensorFlow's UnsortedSegmentSum does the same with a per-row Eigen expression and one
// thread: a [51712, 16] gradient summed into 20,000 rows (a SIM lookup's backward at batch
// 256) took 2.3 ms on CPU, this loop 0.3 ms. One thread, in id order (the sums are
// UnsortedSegmentSum's, bit for bit): splitting the output rows over two cores, each
// scanning every id, was 4x slower here (the rows a core skips still cost their branch).
//
// GatherSegmentSumRows: out[s] = sum of data[indices[i]] over the i with segment_ids[i] == s,
// the same without the gathered copy. grouped = false: in id order, SegmentSumRows of
// tf.gather(data, indices) bit for bit (one thread). grouped = true: segment_ids sorted,
// each segment's rows summed as TensorFlow's SparseSegmentSum sums them (its first
// num % 8 rows, 8 or 9 when that is 0 or 1, then += each next 8 summed alone), so
// tf.sparse.segment_sum's result bit for bit; the segments are split over the intra-op
// threads (each writes its own output rows). TensorFlow 2.21's SparseSegmentSum and GatherV2
// are each 40-50 % slower than 2.17's at Wide & Deep's first layer (4096 rows x 1024).
#include <algorithm>
#include <cstring>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {

REGISTER_OP("SegmentSumRows")
    .Input("data: float")
    .Input("segment_ids: Tindices")
    .Input("num_segments: int64")
    .Output("output: float")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle rest, out;
      shape_inference::DimensionHandle segments;
      TF_RETURN_IF_ERROR(c->Subshape(c->input(0), 1, &rest));
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &segments));
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(segments), rest, &out));
      c->set_output(0, out);
      return OkStatus();
    });

namespace {

template <typename Index>
class SegmentSumRowsOp : public OpKernel {
 public:
  explicit SegmentSumRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& data = ctx->input(0);
    const Tensor& ids = ctx->input(1);
    const int64_t segments = ctx->input(2).scalar<int64_t>()();
    OP_REQUIRES(ctx, data.dims() >= 1 && ids.dims() == 1 && ids.dim_size(0) == data.dim_size(0),
                errors::InvalidArgument("SegmentSumRows: segment_ids must be [",
                                        data.dims() ? data.dim_size(0) : 0, "], found ",
                                        ids.shape().DebugString()));
    OP_REQUIRES(ctx, segments >= 0,
                errors::InvalidArgument("SegmentSumRows: num_segments ", segments, " < 0"));
    const int64_t count = ids.dim_size(0);
    const int64_t width = count ? data.NumElements() / count : 0;
    const Index* id = ids.flat<Index>().data();
    for (int64_t i = 0; i < count; ++i) {
      OP_REQUIRES(ctx, id[i] >= 0 && id[i] < segments,
                  errors::InvalidArgument("SegmentSumRows: segment id ", id[i], " at ", i,
                                          " outside [0, ", segments, ")"));
    }
    TensorShape shape = data.shape();
    shape.set_dim(0, segments);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &output));
    float* out = output->flat<float>().data();
    const float* in = data.flat<float>().data();
    std::memset(out, 0, sizeof(float) * segments * width);
    for (int64_t i = 0; i < count; ++i) {
      float* __restrict__ target = out + static_cast<int64_t>(id[i]) * width;
      const float* __restrict__ row = in + i * width;
      for (int64_t j = 0; j < width; ++j) target[j] += row[j];
    }
  }
};

template <typename Index>
class GatherSegmentSumRowsOp : public OpKernel {
 public:
  explicit GatherSegmentSumRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("grouped", &grouped_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& data = ctx->input(0);
    const Tensor& indices = ctx->input(1);
    const Tensor& ids = ctx->input(2);
    const int64_t segments = ctx->input(3).scalar<int64_t>()();
    OP_REQUIRES(ctx, data.dims() >= 1 && indices.dims() == 1 && ids.dims() == 1 &&
                         ids.dim_size(0) == indices.dim_size(0),
                errors::InvalidArgument("GatherSegmentSumRows: indices and segment_ids must "
                                        "be vectors of one length, found ",
                                        indices.shape().DebugString(), " and ",
                                        ids.shape().DebugString()));
    OP_REQUIRES(ctx, segments >= 0,
                errors::InvalidArgument("GatherSegmentSumRows: num_segments ", segments,
                                        " < 0"));
    const int64_t count = ids.dim_size(0);
    const int64_t rows = data.dim_size(0);
    const int64_t width = rows ? data.NumElements() / rows : 0;
    const Index* id = ids.flat<Index>().data();
    const Index* index = indices.flat<Index>().data();
    for (int64_t i = 0; i < count; ++i) {
      OP_REQUIRES(ctx, id[i] >= 0 && id[i] < segments,
                  errors::InvalidArgument("GatherSegmentSumRows: segment id ", id[i], " at ",
                                          i, " outside [0, ", segments, ")"));
      OP_REQUIRES(ctx, index[i] >= 0 && index[i] < rows,
                  errors::InvalidArgument("GatherSegmentSumRows: index ", index[i], " at ", i,
                                          " outside [0, ", rows, ")"));
      OP_REQUIRES(ctx, !grouped_ || i == 0 || id[i - 1] <= id[i],
                  errors::InvalidArgument("GatherSegmentSumRows: segment_ids not sorted at ",
                                          i));
    }
    TensorShape shape = data.shape();
    shape.set_dim(0, segments);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &output));
    float* out = output->flat<float>().data();
    const float* in = data.flat<float>().data();
    if (!grouped_) {
      std::memset(out, 0, sizeof(float) * segments * width);
      for (int64_t i = 0; i < count; ++i) {
        float* __restrict__ target = out + static_cast<int64_t>(id[i]) * width;
        const float* __restrict__ row = in + static_cast<int64_t>(index[i]) * width;
        for (int64_t j = 0; j < width; ++j) target[j] += row[j];
      }
      return;
    }
    auto work = [&](int64_t first, int64_t last) {  // segments [first, last)
      int64_t i = std::lower_bound(id, id + count, static_cast<Index>(first)) - id;
      for (int64_t s = first; s < last; ++s) {
        float* __restrict__ target = out + s * width;
        const int64_t start = i;
        while (i < count && id[i] == s) ++i;
        const int64_t num = i - start;
        auto row = [&](int64_t k) { return in + static_cast<int64_t>(index[start + k]) * width; };
        if (num == 0) {
          std::memset(target, 0, sizeof(float) * width);
          continue;
        }
        int64_t head = num == 1 ? 1 : (num & 7) == 0 ? 8 : (num & 7) == 1 ? 9 : (num & 7);
        std::memcpy(target, row(0), sizeof(float) * width);
        for (int64_t k = 1; k < head; ++k) {
          const float* __restrict__ r = row(k);
          for (int64_t j = 0; j < width; ++j) target[j] += r[j];
        }
        for (int64_t k = head; k < num; k += 8) {
          const float* __restrict__ r[8] = {row(k), row(k + 1), row(k + 2), row(k + 3),
                                            row(k + 4), row(k + 5), row(k + 6), row(k + 7)};
          for (int64_t j = 0; j < width; ++j) {
            target[j] += ((((((r[0][j] + r[1][j]) + r[2][j]) + r[3][j]) + r[4][j]) + r[5][j]) +
                          r[6][j]) + r[7][j];
          }
        }
      }
    };
    const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t per_segment = (count / std::max<int64_t>(segments, 1) + 1) * width * 4;
    Shard(workers.num_threads, workers.workers, segments, per_segment, work);
  }

 private:
  bool grouped_;
};

}  // namespace

REGISTER_OP("GatherSegmentSumRows")
    .Input("data: float")
    .Input("indices: Tindices")
    .Input("segment_ids: Tindices")
    .Input("num_segments: int64")
    .Output("output: float")
    .Attr("Tindices: {int32, int64}")
    .Attr("grouped: bool = false")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle rest, out;
      shape_inference::DimensionHandle segments;
      TF_RETURN_IF_ERROR(c->Subshape(c->input(0), 1, &rest));
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(3, &segments));
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(segments), rest, &out));
      c->set_output(0, out);
      return OkStatus();
    });

REGISTER_KERNEL_BUILDER(
    Name("GatherSegmentSumRows").Device(DEVICE_CPU).TypeConstraint<int32>("Tindices")
        .HostMemory("num_segments"),
    GatherSegmentSumRowsOp<int32>);
REGISTER_KERNEL_BUILDER(
    Name("GatherSegmentSumRows").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tindices")
        .HostMemory("num_segments"),
    GatherSegmentSumRowsOp<int64_t>);

REGISTER_KERNEL_BUILDER(
    Name("SegmentSumRows").Device(DEVICE_CPU).TypeConstraint<int32>("Tindices")
        .HostMemory("num_segments"),
    SegmentSumRowsOp<int32>);
REGISTER_KERNEL_BUILDER(
    Name("SegmentSumRows").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tindices")
        .HostMemory("num_segments"),
    SegmentSumRowsOp<int64_t>);

}  // namespace tensorflow
