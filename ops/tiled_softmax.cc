// The softmax over a whole catalogue without TensorFlow's [rows x items] logits, softmax and
// gradient: the logits s[p, n] = queries[p] . table[n] are made one tile of items at a time
// and used at once.
//
// TiledSoftmaxLoss: loss[p] = logsumexp_n s[p, n] - s[p, label[p]] and the log-sum-exp,
//   a running (max, sum of exp) per row over each range of tiles, the ranges then merged.
// TiledSoftmaxLossGrad: with the log-sum-exp, each tile's logits made again, then
//   G = grad[p] (exp(s - lse[p]) - [n == label[p]]) and d_queries += G T, d_table += G^T Q.
//   Where the forward pass kept its exponentials (kept_limit: below 256 MB, say), G is read
//   from them instead: exps[tile, p, c] = exp(s - shifts[tile, p]), the running max of row p
//   once that tile is in, so exp(s - lse) = exps * exp(shift - lse). That saves one of the
//   four products and the gradient's exp per logit (P rounded up to 6 rows; padding zero).
// TiledTargetRanks: rank[p] = #{n : s[p, n] >= s[p, target[p]]} - 1 (ties count against the
//   target, as retrieval/metrics.py's target_ranks), and the same without the row's seen
//   items (seen [p, L], -1: none; the target is never removed).
//
// As TensorFlow ops, the loss and its gradient write and read the [rows x items] logits, their
// softmax and its gradient in full (~40 MB each at 900 pairs x 12,101 items, out of cache):
// the step waited on memory. Here a tile of items (kTile x d) and a chunk of rows' logits
// (kRows x kTile) stay in cache while three small matrix products run on them; the kept
// exponentials are written once, past the caches, and read once.
//
// Every logit is one chain of FMAs over k = 0..d-1 from 0 (the lanes of a vector hold
// items, never parts of one sum), so the target's score computed alone (Dot) is the tile's
// value bit for bit: a tie is a tie. The items are split into kGroups ranges, a fixed count,
// summed apart and merged in order: results do not depend on the thread count.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// first_row: the table's rows before it take no part (a padding row kept in the table, so
// that the caller need not slice it off and the gradient need not pad it back: a copy of the
// whole table each); labels count from it.
REGISTER_OP("TiledSoftmaxLoss")
    .Input("queries: float")  // [P, d]
    .Input("table: float")    // [first_row + N, d]
    .Input("labels: int64")   // [P] in [0, N)
    .Output("loss: float")    // [P]
    .Output("lse: float")     // [P]
    .Output("exps: float")    // kept for the gradient (below), or [0]
    .Output("shifts: float")  // kept for the gradient (below), or [0]
    .Attr("first_row: int = 0")
    .Attr("kept_limit: int = 0")  // keep exps when they hold at most this many floats
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle q;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &q));
      c->set_output(0, c->Vector(c->Dim(q, 0)));
      c->set_output(1, c->Vector(c->Dim(q, 0)));
      c->set_output(2, c->UnknownShape());
      c->set_output(3, c->UnknownShape());
      return OkStatus();
    });

REGISTER_OP("TiledSoftmaxLossGrad")
    .Input("queries: float")
    .Input("table: float")
    .Input("labels: int64")
    .Input("lse: float")   // [P]
    .Input("grad: float")  // [P] the gradient reaching loss
    .Input("exps: float")    // TiledSoftmaxLoss's: the softmax read from them where not [0],
    .Input("shifts: float")  // else made again from the logits
    .Output("d_queries: float")
    .Output("d_table: float")  // the table's shape, 0 in the rows before first_row
    .Attr("first_row: int = 0")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(1));
      return OkStatus();
    });

REGISTER_OP("TiledTargetRanks")
    .Input("queries: float")  // [U, d]
    .Input("table: float")    // [N, d]
    .Input("targets: int64")  // [U] in [0, N)
    .Input("seen: int64")     // [U, L] in [0, N), -1: none
    .Output("ranks: int32")
    .Output("filtered_ranks: int32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle q;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &q));
      c->set_output(0, c->Vector(c->Dim(q, 0)));
      c->set_output(1, c->Vector(c->Dim(q, 0)));
      return OkStatus();
    });

namespace {

constexpr int64_t kTile = 192;  // items per tile: a multiple of 32 (Logits16) and 48 (AddQG16)
constexpr int64_t kRows = 48;   // rows per chunk of logits: a multiple of 6
// item ranges: a fixed count (sums do not depend on the threads), several per thread (a
// thread slowed by other work on its core leaves its ranges to the others)
constexpr int64_t kGroups = 16;
constexpr float kMinExp = -87.0f;  // below it exp underflows float32's normal range

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// exp(x) for x <= 0: 2^n e^r with n = round(x / ln 2), |r| <= ln2 / 2, e^r by its Taylor
// polynomial to r^6 (relative error < 2e-7); exactly 0 below kMinExp; NaN stays NaN (a
// diverged step's loss must not look finite).
inline __m256 Exp(__m256 x) {
  const __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(kMinExp), _CMP_NLT_UQ);
  x = _mm256_max_ps(_mm256_set1_ps(kMinExp), x);  // the second operand when one is NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), valid);
}

// The largest of kTile floats (none NaN).
inline float Max(const float* s) {
  __m256 top = _mm256_loadu_ps(s);
  for (int64_t c = 8; c < kTile; c += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(s + c));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top);
  return *std::max_element(lanes, lanes + 8);
}

// to[0, n) = from[0, n), n a multiple of 8, `to` 32-byte aligned: past the caches (the kept
// exponentials are read again only by the gradient, after the whole forward pass).
inline void StreamCopy(const float* from, int64_t n, float* to) {
  for (int64_t c = 0; c < n; c += 8) _mm256_stream_ps(to + c, _mm256_loadu_ps(from + c));
}

// The score of one query and one item as every tile makes it.
float Dot(const float* q, const float* t, int64_t d) {
  float s = 0.0f;
  for (int64_t k = 0; k < d; ++k) s = std::fma(q[k], t[k], s);
  return s;
}

// S[r][c] = sum_k Q[r][k] Tt[k][c]: rows a multiple of 6, kTile columns, Q [rows][D],
// Tt [D][kTile], S [rows][kTile].
void Logits8(const float* Q, int64_t D, const float* Tt, int64_t rows, float* S) {
  for (int64_t c = 0; c < kTile; c += 16) {
    for (int64_t r = 0; r < rows; r += 6) {
      __m256 acc[6][2];
      for (int i = 0; i < 6; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
      const float* q = Q + r * D;
      for (int64_t k = 0; k < D; ++k) {
        const __m256 b0 = _mm256_loadu_ps(Tt + k * kTile + c);
        const __m256 b1 = _mm256_loadu_ps(Tt + k * kTile + c + 8);
        for (int i = 0; i < 6; ++i) {
          const __m256 a = _mm256_broadcast_ss(q + i * D + k);
          acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
      }
      for (int i = 0; i < 6; ++i) {
        _mm256_storeu_ps(S + (r + i) * kTile + c, acc[i][0]);
        _mm256_storeu_ps(S + (r + i) * kTile + c + 8, acc[i][1]);
      }
    }
  }
}

// dQ[r][k] += sum_c G[r][c] Tr[c][k]: rows a multiple of 6, D a multiple of 16,
// G [rows][kTile], Tr [kTile][D], dQ [rows][D].
void AddGT8(const float* G, const float* Tr, int64_t D, int64_t rows, float* dQ) {
  for (int64_t k = 0; k < D; k += 16) {
    for (int64_t r = 0; r < rows; r += 6) {
      __m256 acc[6][2];
      for (int i = 0; i < 6; ++i) {
        acc[i][0] = _mm256_loadu_ps(dQ + (r + i) * D + k);
        acc[i][1] = _mm256_loadu_ps(dQ + (r + i) * D + k + 8);
      }
      for (int64_t c = 0; c < kTile; ++c) {
        const __m256 b0 = _mm256_loadu_ps(Tr + c * D + k);
        const __m256 b1 = _mm256_loadu_ps(Tr + c * D + k + 8);
        for (int i = 0; i < 6; ++i) {
          const __m256 a = _mm256_broadcast_ss(G + (r + i) * kTile + c);
          acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
      }
      for (int i = 0; i < 6; ++i) {
        _mm256_storeu_ps(dQ + (r + i) * D + k, acc[i][0]);
        _mm256_storeu_ps(dQ + (r + i) * D + k + 8, acc[i][1]);
      }
    }
  }
}

// dTt[k][c] += sum_r Q[r][k] G[r][c]: D a multiple of 4, Q [rows][D], G [rows][kTile],
// dTt [D][kTile].
void AddQG8(const float* Q, int64_t D, const float* G, int64_t rows, float* dTt) {
  for (int64_t c = 0; c < kTile; c += 24) {  // a column slab of G stays in L1 across k
    for (int64_t k = 0; k < D; k += 4) {
      __m256 acc[4][3];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j) acc[i][j] = _mm256_loadu_ps(dTt + (k + i) * kTile + c + 8 * j);
      for (int64_t r = 0; r < rows; ++r) {
        const __m256 b0 = _mm256_loadu_ps(G + r * kTile + c);
        const __m256 b1 = _mm256_loadu_ps(G + r * kTile + c + 8);
        const __m256 b2 = _mm256_loadu_ps(G + r * kTile + c + 16);
        for (int i = 0; i < 4; ++i) {
          const __m256 a = _mm256_broadcast_ss(Q + r * D + k + i);
          acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
          acc[i][2] = _mm256_fmadd_ps(a, b2, acc[i][2]);
        }
      }
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j) _mm256_storeu_ps(dTt + (k + i) * kTile + c + 8 * j, acc[i][j]);
    }
  }
}

// The same three products with 16 lanes (AVX-512), for CPUs that have it: each lane runs the
// same chain of FMAs in the same order as the 8-lane code's, so the results are bit for bit
// the same (tests/test_tiled_softmax.py runs both on such a CPU); only more items (or
// columns of dQ) go through one instruction.
__attribute__((target("avx512f")))
void Logits16(const float* Q, int64_t D, const float* Tt, int64_t rows, float* S) {
  for (int64_t c = 0; c < kTile; c += 32) {
    for (int64_t r = 0; r < rows; r += 6) {
      __m512 acc[6][2];
      for (int i = 0; i < 6; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
      const float* q = Q + r * D;
      for (int64_t k = 0; k < D; ++k) {
        const __m512 b0 = _mm512_loadu_ps(Tt + k * kTile + c);
        const __m512 b1 = _mm512_loadu_ps(Tt + k * kTile + c + 16);
        for (int i = 0; i < 6; ++i) {
          const __m512 a = _mm512_set1_ps(q[i * D + k]);
          acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
          acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
        }
      }
      for (int i = 0; i < 6; ++i) {
        _mm512_storeu_ps(S + (r + i) * kTile + c, acc[i][0]);
        _mm512_storeu_ps(S + (r + i) * kTile + c + 16, acc[i][1]);
      }
    }
  }
}

// D a multiple of 32 (the caller falls back to AddGT8 otherwise).
__attribute__((target("avx512f")))
void AddGT16(const float* G, const float* Tr, int64_t D, int64_t rows, float* dQ) {
  for (int64_t k = 0; k < D; k += 32) {
    for (int64_t r = 0; r < rows; r += 6) {
      __m512 acc[6][2];
      for (int i = 0; i < 6; ++i) {
        acc[i][0] = _mm512_loadu_ps(dQ + (r + i) * D + k);
        acc[i][1] = _mm512_loadu_ps(dQ + (r + i) * D + k + 16);
      }
      for (int64_t c = 0; c < kTile; ++c) {
        const __m512 b0 = _mm512_loadu_ps(Tr + c * D + k);
        const __m512 b1 = _mm512_loadu_ps(Tr + c * D + k + 16);
        for (int i = 0; i < 6; ++i) {
          const __m512 a = _mm512_set1_ps(G[(r + i) * kTile + c]);
          acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
          acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
        }
      }
      for (int i = 0; i < 6; ++i) {
        _mm512_storeu_ps(dQ + (r + i) * D + k, acc[i][0]);
        _mm512_storeu_ps(dQ + (r + i) * D + k + 16, acc[i][1]);
      }
    }
  }
}

__attribute__((target("avx512f")))
void AddQG16(const float* Q, int64_t D, const float* G, int64_t rows, float* dTt) {
  for (int64_t c = 0; c < kTile; c += 48) {
    for (int64_t k = 0; k < D; k += 4) {
      __m512 acc[4][3];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j)
          acc[i][j] = _mm512_loadu_ps(dTt + (k + i) * kTile + c + 16 * j);
      for (int64_t r = 0; r < rows; ++r) {
        const __m512 b0 = _mm512_loadu_ps(G + r * kTile + c);
        const __m512 b1 = _mm512_loadu_ps(G + r * kTile + c + 16);
        const __m512 b2 = _mm512_loadu_ps(G + r * kTile + c + 32);
        for (int i = 0; i < 4; ++i) {
          const __m512 a = _mm512_set1_ps(Q[r * D + k + i]);
          acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
          acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
          acc[i][2] = _mm512_fmadd_ps(a, b2, acc[i][2]);
        }
      }
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j)
          _mm512_storeu_ps(dTt + (k + i) * kTile + c + 16 * j, acc[i][j]);
    }
  }
}

// 16 lanes where the CPU has AVX-512 and TILED_SOFTMAX_LANES is not 8 (a test's switch).
bool WideLanes() {
  static const bool wide = [] {
    const char* lanes = std::getenv("TILED_SOFTMAX_LANES");
    return __builtin_cpu_supports("avx512f") && !(lanes && std::string(lanes) == "8");
  }();
  return wide;
}

void Logits(const float* Q, int64_t D, const float* Tt, int64_t rows, float* S) {
  WideLanes() ? Logits16(Q, D, Tt, rows, S) : Logits8(Q, D, Tt, rows, S);
}

void AddGT(const float* G, const float* Tr, int64_t D, int64_t rows, float* dQ) {
  WideLanes() && D % 32 == 0 ? AddGT16(G, Tr, D, rows, dQ) : AddGT8(G, Tr, D, rows, dQ);
}

void AddQG(const float* Q, int64_t D, const float* G, int64_t rows, float* dTt) {
  WideLanes() ? AddQG16(Q, D, G, rows, dTt) : AddQG8(Q, D, G, rows, dTt);
}

// One call's shapes and the padded copies its work reads: queries [P6][D] (zero rows and
// columns added), and per tile the items transposed (Tt). A value per Compute (a kernel may
// run in several steps at once).
struct Tiles {
  // Checks queries [P, d], table [first_row + N, d] and a [P] int64 input `ids` in [0, N).
  Status Prepare(OpKernelContext* ctx, int ids, int64_t first_row = 0) {
    const Tensor& q = ctx->input(0);
    const Tensor& t = ctx->input(1);
    const Tensor& id = ctx->input(ids);
    if (q.dims() != 2 || t.dims() != 2 || q.dim_size(1) != t.dim_size(1)) {
      return errors::InvalidArgument("queries [P, d] and table [N, d] expected, found ",
                                     q.shape().DebugString(), " and ", t.shape().DebugString());
    }
    if (id.dims() != 1 || id.dim_size(0) != q.dim_size(0)) {
      return errors::InvalidArgument("input ", ids, " must be [", q.dim_size(0), "], found ",
                                     id.shape().DebugString());
    }
    if (first_row < 0 || first_row > t.dim_size(0)) {
      return errors::InvalidArgument("first_row ", first_row, " outside the table's ",
                                     t.dim_size(0), " rows");
    }
    rows = q.dim_size(0);
    items = t.dim_size(0) - first_row;
    d = q.dim_size(1);
    this->ids = id.flat<int64_t>().data();
    for (int64_t p = 0; p < rows; ++p) {
      if (this->ids[p] < 0 || this->ids[p] >= items) {
        return errors::InvalidArgument("id ", this->ids[p], " at ", p,
                                       " outside the table's rows [0, ", items, ")");
      }
    }
    D = RoundUp(std::max<int64_t>(d, 1), 16);
    padded_rows = RoundUp(rows, 6);
    tiles = (items + kTile - 1) / kTile;
    groups = std::min(kGroups, tiles);
    queries = q.flat<float>().data();
    table = t.flat<float>().data() + first_row * d;
    Q.assign(padded_rows * D, 0.0f);
    for (int64_t p = 0; p < rows; ++p)
      std::copy(queries + p * d, queries + (p + 1) * d, &Q[p * D]);
    return OkStatus();
  }

  // The first item of tile `i`, how many items it holds, the first tile of a group.
  int64_t TileStart(int64_t i) const { return i * kTile; }
  int64_t TileItems(int64_t i) const { return std::min(kTile, items - i * kTile); }
  int64_t FirstTile(int64_t group) const { return group * tiles / groups; }

  // Tt [D][kTile]: tile i's items as columns (zeros past the table and past d).
  void Transposed(int64_t i, std::vector<float>* Tt) const {
    Tt->assign(D * kTile, 0.0f);
    const int64_t first = TileStart(i), count = TileItems(i);
    for (int64_t c = 0; c < count; ++c)
      for (int64_t k = 0; k < d; ++k) (*Tt)[k * kTile + c] = table[(first + c) * d + k];
  }

  // Runs work(group) for each group on the intra-op threads, each group a task of its own
  // (taken by whichever thread is free).
  template <typename Work>
  void ForGroups(OpKernelContext* ctx, Work work) const {
    const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t cost = std::max<int64_t>(1, padded_rows * D * kTile * tiles / groups);
    Shard(std::max<int64_t>(groups, workers.num_threads), workers.workers, groups, cost,
          [&](int64_t first, int64_t last) {
            for (int64_t g = first; g < last; ++g) work(g);
          });
  }

  int64_t rows = 0, items = 0, d = 0, D = 0, padded_rows = 0, tiles = 0, groups = 0;
  const int64_t* ids = nullptr;
  const float* queries = nullptr;
  const float* table = nullptr;
  std::vector<float> Q;
};

class TiledSoftmaxLossOp : public OpKernel {
 public:
  explicit TiledSoftmaxLossOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("first_row", &first_row_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kept_limit", &kept_limit_));
  }

  void Compute(OpKernelContext* ctx) override {
    Tiles w;
    OP_REQUIRES_OK(ctx, w.Prepare(ctx, 2, first_row_));
    Tensor *loss_out = nullptr, *lse_out = nullptr, *exps_out = nullptr, *shifts_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({w.rows}), &loss_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({w.rows}), &lse_out));
    const bool keep = w.rows > 0 && w.tiles * w.padded_rows * kTile <= kept_limit_;
    const TensorShape none({0});
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            2, keep ? TensorShape({w.tiles, w.padded_rows, kTile}) : none,
                            &exps_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, keep ? TensorShape({w.tiles, w.padded_rows}) : none,
                                             &shifts_out));
    float* kept = keep ? exps_out->flat<float>().data() : nullptr;
    float* shifts = keep ? shifts_out->flat<float>().data() : nullptr;
    if (w.rows == 0) return;
    OP_REQUIRES(ctx, w.items > 0, errors::InvalidArgument(name(), ": an empty table"));
    // per group and row: the largest logit and the sum of exp(logit - it)
    std::vector<float> top(w.groups * w.rows, -std::numeric_limits<float>::infinity());
    std::vector<float> sum(w.groups * w.rows, 0.0f);
    w.ForGroups(ctx, [&](int64_t g) {
      std::vector<float> Tt, S(kRows * kTile);
      float* m = &top[g * w.rows];
      float* z = &sum[g * w.rows];
      for (int64_t i = w.FirstTile(g); i < w.FirstTile(g + 1); ++i) {
        w.Transposed(i, &Tt);
        const int64_t count = w.TileItems(i);
        for (int64_t r = 0; r < w.padded_rows; r += kRows) {
          const int64_t chunk = std::min(kRows, w.padded_rows - r);
          Logits(&w.Q[r * w.D], w.D, Tt.data(), chunk, S.data());
          for (int64_t j = 0; j < chunk && r + j < w.rows; ++j) {
            float* s = &S[j * kTile];
            std::fill(s + count, s + kTile, -std::numeric_limits<float>::infinity());
            const float tile_top = Max(s);
            float& mp = m[r + j];
            float& zp = z[r + j];
            if (tile_top > mp) {
              zp *= std::exp(mp - tile_top);
              mp = tile_top;
            }
            const __m256 shift = _mm256_set1_ps(mp);
            __m256 acc = _mm256_setzero_ps();
            for (int64_t c = 0; c < kTile; c += 8) {
              const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(s + c), shift));
              acc = _mm256_add_ps(acc, e);
              if (kept) _mm256_storeu_ps(s + c, e);
            }
            alignas(32) float lanes[8];
            _mm256_store_ps(lanes, acc);
            for (float v : lanes) zp += v;
            if (kept) shifts[i * w.padded_rows + r + j] = mp;
          }
          if (kept) StreamCopy(S.data(), chunk * kTile, kept + (i * w.padded_rows + r) * kTile);
        }
      }
      _mm_sfence();  // the streamed exponentials visible before the gradient reads them
    });
    float* loss = loss_out->flat<float>().data();
    float* lse = lse_out->flat<float>().data();
    for (int64_t p = 0; p < w.rows; ++p) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t g = 0; g < w.groups; ++g) m = std::max(m, top[g * w.rows + p]);
      float z = 0.0f;
      for (int64_t g = 0; g < w.groups; ++g)
        z += sum[g * w.rows + p] * std::exp(top[g * w.rows + p] - m);
      lse[p] = m + std::log(z);
      loss[p] = lse[p] - Dot(w.queries + p * w.d, w.table + w.ids[p] * w.d, w.d);
    }
  }

 private:
  int64_t first_row_ = 0, kept_limit_ = 0;
};

class TiledSoftmaxLossGradOp : public OpKernel {
 public:
  explicit TiledSoftmaxLossGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("first_row", &first_row_));
  }

  void Compute(OpKernelContext* ctx) override {
    Tiles w;
    OP_REQUIRES_OK(ctx, w.Prepare(ctx, 2, first_row_));
    const Tensor& lse_in = ctx->input(3);
    const Tensor& grad_in = ctx->input(4);
    OP_REQUIRES(ctx, lse_in.NumElements() == w.rows && grad_in.NumElements() == w.rows,
                errors::InvalidArgument(name(), ": lse and grad must be [", w.rows, "]"));
    const Tensor& exps_in = ctx->input(5);
    const Tensor& shifts_in = ctx->input(6);
    const bool keep = exps_in.NumElements() > 0;
    OP_REQUIRES(ctx, exps_in.NumElements() == (keep ? w.tiles * w.padded_rows * kTile : 0) &&
                         shifts_in.NumElements() == (keep ? w.tiles * w.padded_rows : 0),
                errors::InvalidArgument(name(), ": exps and shifts must be TiledSoftmaxLoss's, ",
                                        "found ", exps_in.shape().DebugString(), " and ",
                                        shifts_in.shape().DebugString()));
    const float* kept = keep ? exps_in.flat<float>().data() : nullptr;
    const float* shifts = keep ? shifts_in.flat<float>().data() : nullptr;
    Tensor *dq_out = nullptr, *dt_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ctx->input(0).shape(), &dq_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ctx->input(1).shape(), &dt_out));
    float* dq = dq_out->flat<float>().data();
    float* dt = dt_out->flat<float>().data();
    std::fill(dq, dq + w.rows * w.d, 0.0f);
    std::fill(dt, dt + first_row_ * w.d, 0.0f);
    dt += first_row_ * w.d;
    if (w.rows == 0 || w.items == 0) {
      std::fill(dt, dt + w.items * w.d, 0.0f);
      return;
    }  // else every tile writes its rows of dt whole
    const float* lse = lse_in.flat<float>().data();
    const float* grad = grad_in.flat<float>().data();
    std::vector<float> partial(w.groups * w.padded_rows * w.D, 0.0f);  // d_queries per group
    w.ForGroups(ctx, [&](int64_t g) {
      std::vector<float> Tt, Tr(kTile * w.D), dTt(w.D * kTile), G(kRows * kTile);
      float* dQ = &partial[g * w.padded_rows * w.D];
      for (int64_t i = w.FirstTile(g); i < w.FirstTile(g + 1); ++i) {
        if (!kept) w.Transposed(i, &Tt);
        const int64_t first = w.TileStart(i), count = w.TileItems(i);
        std::fill(Tr.begin(), Tr.end(), 0.0f);
        for (int64_t c = 0; c < count; ++c)
          std::copy(w.table + (first + c) * w.d, w.table + (first + c + 1) * w.d, &Tr[c * w.D]);
        std::fill(dTt.begin(), dTt.end(), 0.0f);
        for (int64_t r = 0; r < w.padded_rows; r += kRows) {
          const int64_t chunk = std::min(kRows, w.padded_rows - r);
          if (!kept) Logits(&w.Q[r * w.D], w.D, Tt.data(), chunk, G.data());
          for (int64_t j = 0; j < chunk; ++j) {
            float* s = &G[j * kTile];
            const int64_t p = r + j;
            if (p >= w.rows) {  // a padding row: no gradient
              std::fill(s, s + kTile, 0.0f);
              continue;
            }
            if (kept) {  // exps * exp(shift - lse) * grad
              const float* e = kept + ((i * w.padded_rows) + p) * kTile;
              const __m256 scale =
                  _mm256_set1_ps(grad[p] * std::exp(shifts[i * w.padded_rows + p] - lse[p]));
              for (int64_t c = 0; c < kTile; c += 8)
                _mm256_storeu_ps(s + c, _mm256_mul_ps(scale, _mm256_loadu_ps(e + c)));
            } else {
              const __m256 shift = _mm256_set1_ps(lse[p]), scale = _mm256_set1_ps(grad[p]);
              for (int64_t c = 0; c < kTile; c += 8) {
                const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(s + c), shift));
                _mm256_storeu_ps(s + c, _mm256_mul_ps(scale, e));
              }
            }
            std::fill(s + count, s + kTile, 0.0f);
            const int64_t target = w.ids[p] - first;
            if (target >= 0 && target < count) s[target] -= grad[p];
          }
          AddGT(G.data(), Tr.data(), w.D, chunk, dQ + r * w.D);
          AddQG(&w.Q[r * w.D], w.D, G.data(), chunk, dTt.data());
        }
        for (int64_t c = 0; c < count; ++c)
          for (int64_t k = 0; k < w.d; ++k) dt[(first + c) * w.d + k] = dTt[k * kTile + c];
      }
    });
    for (int64_t g = 0; g < w.groups; ++g) {
      const float* part = &partial[g * w.padded_rows * w.D];
      for (int64_t p = 0; p < w.rows; ++p)
        for (int64_t k = 0; k < w.d; ++k) dq[p * w.d + k] += part[p * w.D + k];
    }
  }

 private:
  int64_t first_row_ = 0;
};

class TiledTargetRanksOp : public OpKernel {
 public:
  explicit TiledTargetRanksOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    Tiles w;
    OP_REQUIRES_OK(ctx, w.Prepare(ctx, 2));
    const Tensor& seen_in = ctx->input(3);
    OP_REQUIRES(ctx, seen_in.dims() == 2 && seen_in.dim_size(0) == w.rows,
                errors::InvalidArgument(name(), ": seen must be [", w.rows, ", L], found ",
                                        seen_in.shape().DebugString()));
    Tensor *ranks_out = nullptr, *filtered_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({w.rows}), &ranks_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({w.rows}), &filtered_out));
    if (w.rows == 0) return;
    OP_REQUIRES(ctx, w.items > 0, errors::InvalidArgument(name(), ": an empty table"));
    std::vector<float> target(w.rows);
    for (int64_t p = 0; p < w.rows; ++p)
      target[p] = Dot(w.queries + p * w.d, w.table + w.ids[p] * w.d, w.d);
    std::vector<int32> counts(w.groups * w.rows, 0);  // items at or above the target, per group
    w.ForGroups(ctx, [&](int64_t g) {
      std::vector<float> Tt, S(kRows * kTile);
      int32* n = &counts[g * w.rows];
      for (int64_t i = w.FirstTile(g); i < w.FirstTile(g + 1); ++i) {
        w.Transposed(i, &Tt);
        const int64_t count = w.TileItems(i), whole = count / 8 * 8;
        for (int64_t r = 0; r < w.padded_rows; r += kRows) {
          const int64_t chunk = std::min(kRows, w.padded_rows - r);
          Logits(&w.Q[r * w.D], w.D, Tt.data(), chunk, S.data());
          for (int64_t j = 0; j < chunk && r + j < w.rows; ++j) {
            const float* s = &S[j * kTile];
            const __m256 bar = _mm256_set1_ps(target[r + j]);
            int32 above = 0;
            for (int64_t c = 0; c < whole; c += 8)
              above += __builtin_popcount(_mm256_movemask_ps(
                  _mm256_cmp_ps(_mm256_loadu_ps(s + c), bar, _CMP_GE_OQ)));
            for (int64_t c = whole; c < count; ++c) above += s[c] >= target[r + j];
            n[r + j] += above;
          }
        }
      }
    });
    // the filtered rank: less each distinct seen item (not the target) at or above it
    const int64_t length = seen_in.dim_size(1);
    const int64_t* seen = seen_in.flat<int64_t>().data();
    int32* ranks = ranks_out->flat<int32>().data();
    int32* filtered = filtered_out->flat<int32>().data();
    const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers.num_threads, workers.workers, w.rows, length * w.d * 8,
          [&](int64_t first, int64_t last) {
            std::vector<int64_t> ids;
            for (int64_t p = first; p < last; ++p) {
              int32 rank = -1;
              for (int64_t g = 0; g < w.groups; ++g) rank += counts[g * w.rows + p];
              ids.assign(seen + p * length, seen + (p + 1) * length);
              std::sort(ids.begin(), ids.end());
              int32 hidden = 0;
              for (size_t j = 0; j < ids.size(); ++j) {
                const int64_t id = ids[j];
                if (id < 0 || id >= w.items || id == w.ids[p] || (j && ids[j - 1] == id))
                  continue;
                hidden += Dot(w.queries + p * w.d, w.table + id * w.d, w.d) >= target[p];
              }
              ranks[p] = rank;
              filtered[p] = rank - hidden;
            }
          });
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("TiledSoftmaxLoss").Device(DEVICE_CPU), TiledSoftmaxLossOp);
REGISTER_KERNEL_BUILDER(Name("TiledSoftmaxLossGrad").Device(DEVICE_CPU),
                        TiledSoftmaxLossGradOp);
REGISTER_KERNEL_BUILDER(Name("TiledTargetRanks").Device(DEVICE_CPU), TiledTargetRanksOp);

}  // namespace tensorflow
