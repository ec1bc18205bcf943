// DistinctIds: tf.unique for the ids of a table: ids [N] in [0, num_rows) -> (distinct [U] in
// order of first appearance, position [N] int32 with distinct[position[i]] == ids[i]), the
// outputs of tf.unique(ids) exactly.
// TensorFlow's Unique hashes every id; a table's ids are bounded by its rows, so where the
// table is not much larger than the batch's ids a slot per row (an array) finds each id's
// position without hashing: 25,856 ids of a 50,001-row table (DIN's items at batch 256) in
// 0.3 ms instead of 1.0-1.5. Larger tables take a hash map, as Unique.
#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

REGISTER_OP("DistinctIds")
    .Input("ids: Tindices")
    .Input("num_rows: int64")
    .Output("distinct: Tindices")
    .Output("position: int32")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->input(0));
      return OkStatus();
    });

namespace {

// an array of slots costs a pass over num_rows: worth it up to this many rows per id
constexpr int64_t kMaxRowsPerId = 8;

template <typename Index>
class DistinctIdsOp : public OpKernel {
 public:
  explicit DistinctIdsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    const int64_t rows = ctx->input(1).scalar<int64_t>()();
    OP_REQUIRES(ctx, ids.dims() == 1,
                errors::InvalidArgument("DistinctIds: ids must be 1-D, found ",
                                        ids.shape().DebugString()));
    const int64_t count = ids.NumElements();
    const Index* id = ids.flat<Index>().data();
    for (int64_t i = 0; i < count; ++i) {
      OP_REQUIRES(ctx, id[i] >= 0 && id[i] < rows,
                  errors::InvalidArgument("DistinctIds: id ", id[i], " at ", i,
                                          " outside the table's rows [0, ", rows, ")"));
    }
    Tensor* position = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ids.shape(), &position));
    int32* slot_of = position->flat<int32>().data();
    std::vector<Index> distinct;
    if (rows <= kMaxRowsPerId * count) {
      std::vector<int32> slot(rows, -1);
      for (int64_t i = 0; i < count; ++i) {
        int32& s = slot[id[i]];
        if (s < 0) {
          s = static_cast<int32>(distinct.size());
          distinct.push_back(id[i]);
        }
        slot_of[i] = s;
      }
    } else {
      absl::flat_hash_map<Index, int32> slot;
      slot.reserve(count);
      for (int64_t i = 0; i < count; ++i) {
        auto inserted = slot.emplace(id[i], static_cast<int32>(distinct.size()));
        if (inserted.second) distinct.push_back(id[i]);
        slot_of[i] = inserted.first->second;
      }
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(distinct.size())}), &out));
    std::copy(distinct.begin(), distinct.end(), out->flat<Index>().data());
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(
    Name("DistinctIds").Device(DEVICE_CPU).TypeConstraint<int32>("Tindices")
        .HostMemory("num_rows"),
    DistinctIdsOp<int32>);
REGISTER_KERNEL_BUILDER(
    Name("DistinctIds").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tindices")
        .HostMemory("num_rows"),
    DistinctIdsOp<int64_t>);

}  // namespace tensorflow
