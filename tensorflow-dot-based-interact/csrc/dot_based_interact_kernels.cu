// DLRM dot interaction kernels and their launchers (no TensorFlow here).
// See dot_based_interact.h for the contract.
//
// Three paths:
//   tensor   : one warp per sample on a persistent grid; each warp prefetches its next
//              sample into a second shared-memory buffer (cp.async on sm80+) while it
//              computes X*X^T / S*X on WMMA 16x16 tiles (fp16 k16, or TF32 k8) with
//              float32 accumulators. Needs C % (16 bytes / element size) == 0 and
//              16-byte aligned pointers; any R (tiles over roundup16(R)).
//   generic  : one block per sample, sample converted to float in shared memory,
//              CUDA-core dot products. Any R, C whose sample fits in shared memory.
//   fallback : one thread per output element straight from global memory. Any size.
#include "dot_based_interact.h"

#include <cuda_fp16.h>
#include <mma.h>

#include <atomic>
#include <initializer_list>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <climits>
#include <cstdint>

namespace dbi {
namespace {

using namespace nvcuda;

constexpr int kTcMaxWarps = 4;      // warps (= samples) per block on the tensor path
constexpr int kGenericThreads = 128;
constexpr int kFallbackThreads = 256;

// ---------------------------------------------------------------------------
// small device helpers
// ---------------------------------------------------------------------------
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// p-th element of the strictly lower triangle in row-major order:
// p = i*(i-1)/2 + j, 0 <= j < i.
__device__ __forceinline__ void decode_pair(int p, int& i, int& j) {
  int r = __float2int_rd((1.0f + sqrtf(8.0f * static_cast<float>(p) + 1.0f)) * 0.5f);
  while (static_cast<long long>(r) * (r - 1) / 2 > p) --r;
  while (static_cast<long long>(r + 1) * r / 2 <= p) ++r;
  i = r;
  j = p - static_cast<int>(static_cast<long long>(r) * (r - 1) / 2);
}

__device__ __forceinline__ int pair_index(int a, int b) {  // a != b
  const int i = a > b ? a : b;
  const int j = a > b ? b : a;
  return i * (i - 1) / 2 + j;
}

// ---------------------------------------------------------------------------
// generic path: one block per sample, sample in shared memory as float
// ---------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kGenericThreads)
generic_fwd_kernel(const T* __restrict__ x, const T* __restrict__ bottom,
                   T* __restrict__ out, long long B, int R, int C, int W, int ld) {
  extern __shared__ float gsm[];
  const int P = R * (R - 1) / 2;
  const int RC = R * C;
  for (long long b = blockIdx.x; b < B; b += gridDim.x) {
    const T* xb = x + b * RC;
    for (int e = threadIdx.x; e < RC; e += blockDim.x) {
      const int r = e / C;
      gsm[r * ld + (e - r * C)] = to_float(xb[e]);
    }
    __syncthreads();
    T* ob = out + b * W;
    const T* bb = bottom + b * C;
    for (int o = threadIdx.x; o < W; o += blockDim.x) {
      float v = 0.f;
      if (o < C) {
        v = to_float(bb[o]);
      } else if (o < C + P) {
        int i, j;
        decode_pair(o - C, i, j);
        const float* xi = gsm + i * ld;
        const float* xj = gsm + j * ld;
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
        int k = 0;
        for (; k + 3 < C; k += 4) {
          a0 = fmaf(xi[k], xj[k], a0);
          a1 = fmaf(xi[k + 1], xj[k + 1], a1);
          a2 = fmaf(xi[k + 2], xj[k + 2], a2);
          a3 = fmaf(xi[k + 3], xj[k + 3], a3);
        }
        for (; k < C; ++k) a0 = fmaf(xi[k], xj[k], a0);
        v = (a0 + a1) + (a2 + a3);
      }
      ob[o] = from_float<T>(v);
    }
    __syncthreads();
  }
}

constexpr int kGenericRowsPerThread = 4;

template <typename T>
__global__ void __launch_bounds__(kGenericThreads)
generic_bwd_kernel(const T* __restrict__ x, const T* __restrict__ grad,
                   T* __restrict__ grad_x, T* __restrict__ grad_bottom, long long B,
                   int R, int C, int W) {
  extern __shared__ float gsm[];
  constexpr int RB = kGenericRowsPerThread;
  const int RC = R * C;
  float* sx = gsm;       // [R][C]
  float* ss = gsm + RC;  // [R][R] symmetric, zero diagonal
  const int nrb = (R + RB - 1) / RB;
  for (long long b = blockIdx.x; b < B; b += gridDim.x) {
    const T* xb = x + b * RC;
    const T* gbp = grad + b * W;
    for (int e = threadIdx.x; e < RC; e += blockDim.x) sx[e] = to_float(xb[e]);
    for (int e = threadIdx.x; e < R * R; e += blockDim.x) {
      const int i = e / R;
      const int k = e - i * R;
      ss[e] = (i == k) ? 0.f : to_float(gbp[C + pair_index(i, k)]);
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) grad_bottom[b * C + c] = gbp[c];
    __syncthreads();
    T* gxb = grad_x + b * RC;
    for (int e = threadIdx.x; e < nrb * C; e += blockDim.x) {
      const int kb = e / C;
      const int c = e - kb * C;
      const int k0 = kb * RB;
      int rows[RB];
#pragma unroll
      for (int r = 0; r < RB; ++r) rows[r] = min(k0 + r, R - 1) * R;
      float acc[RB];
#pragma unroll
      for (int r = 0; r < RB; ++r) acc[r] = 0.f;
      for (int m = 0; m < R; ++m) {
        const float xv = sx[m * C + c];
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r] = fmaf(ss[rows[r] + m], xv, acc[r]);
      }
#pragma unroll
      for (int r = 0; r < RB; ++r)
        if (k0 + r < R) gxb[(k0 + r) * C + c] = from_float<T>(acc[r]);
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------
// fallback path: one thread per output element, straight from global memory
// ---------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kFallbackThreads)
fallback_fwd_kernel(const T* __restrict__ x, const T* __restrict__ bottom,
                    T* __restrict__ out, long long B, int R, int C, int W) {
  const long long P = static_cast<long long>(R) * (R - 1) / 2;
  const long long total = B * W;
  for (long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
       t < total; t += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long b = t / W;
    const int o = static_cast<int>(t - b * W);
    float v = 0.f;
    if (o < C) {
      v = to_float(bottom[b * C + o]);
    } else if (o < C + P) {
      int i, j;
      decode_pair(o - C, i, j);
      const T* xi = x + (b * R + i) * C;
      const T* xj = x + (b * R + j) * C;
      for (int k = 0; k < C; ++k) v = fmaf(to_float(xi[k]), to_float(xj[k]), v);
    }
    out[t] = from_float<T>(v);
  }
}

template <typename T>
__global__ void __launch_bounds__(kFallbackThreads)
fallback_bwd_kernel(const T* __restrict__ x, const T* __restrict__ grad,
                    T* __restrict__ grad_x, T* __restrict__ grad_bottom, long long B,
                    int R, int C, int W) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  const long long total = B * R * C;
  for (long long t = first; t < total; t += stride) {
    const long long bk = t / C;
    const int c = static_cast<int>(t - bk * C);
    const long long b = bk / R;
    const int k = static_cast<int>(bk - b * R);
    const T* gp = grad + b * W + C;
    const T* xb = x + b * R * C + c;
    float acc = 0.f;
    for (int m = 0; m < R; ++m) {
      if (m == k) continue;
      acc = fmaf(to_float(gp[pair_index(k, m)]), to_float(xb[static_cast<long long>(m) * C]),
                 acc);
    }
    grad_x[t] = from_float<T>(acc);
  }
  for (long long t = first; t < B * C; t += stride) {
    const long long b = t / C;
    grad_bottom[t] = grad[b * W + (t - b * C)];
  }
}

// ---------------------------------------------------------------------------
// tensor path
//
// One warp per sample, persistent grid: each warp walks samples b, b+stride, ...
// and prefetches the next sample (cp.async, sm80+) into a second buffer while it
// computes the current one, so every resident warp keeps a sample's worth of
// loads in flight. Per warp, shared memory holds:
//   forward : [x0][x1][bottom0][bottom1][z (unless z aliases the consumed x buffer)]
//   backward: [x0][x1][grad0][grad1][S][stage]
// x buffers are Rpad x ldx (Rpad = roundup16(R), Cpad = roundup16(C), ldx = Cpad +
// 16 bytes) with zero pad rows/columns; S is the symmetric Rpad x Rpad matrix of pair
// gradients (zero diagonal and pads); stage is one 16 x 32 float output tile pair.
// ---------------------------------------------------------------------------
constexpr int kStageLd = 36;  // backward staging tile row stride (floats)

template <typename T> struct Mma;  // WMMA shapes and loads per element type
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700
template <> struct Mma<__half> {
  static constexpr int K = 16;
  typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> A;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> B;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> Bt;
  typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
  template <typename F>
  static __device__ __forceinline__ void load(F& f, const __half* p, int ld) {
    wmma::load_matrix_sync(f, p, ld);
  }
};
#endif
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
template <> struct Mma<float> {  // TF32 inputs, float accumulators
  static constexpr int K = 8;
  typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> A;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> B;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> Bt;
  typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> Acc;
  template <typename F>
  static __device__ __forceinline__ void load(F& f, const float* p, int ld) {
    wmma::load_matrix_sync(f, p, ld);
#pragma unroll
    for (int t = 0; t < f.num_elements; ++t) f.x[t] = wmma::__float_to_tf32(f.x[t]);
  }
};
#endif

// Whether this compilation pass can run the tensor path for T (device code only).
template <typename T>
__host__ __device__ constexpr bool tc_arch_ok() {
#if defined(__CUDA_ARCH__)
  return __CUDA_ARCH__ >= (sizeof(T) == 4 ? 800 : 700);
#else
  return true;
#endif
}

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const size_t g = __cvta_generic_to_global(gmem_src);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
#else
  *reinterpret_cast<uint4*>(smem_dst) = *reinterpret_cast<const uint4*>(gmem_src);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {  // all but the N most recent groups done
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Copy n16 16-byte vectors from global src to shared dst (contiguous), async.
__device__ __forceinline__ void stage_vec(const void* src, void* dst, int n16, int lane) {
  const uint4* s = static_cast<const uint4*>(src);
  uint4* d = static_cast<uint4*>(dst);
  for (int v = lane; v < n16; v += 32) cp_async16(d + v, s + v);
}

// Stage x[b] (R rows of C elements, contiguous) into rows of `ld` elements.
// Row/column of each lane's vector advance incrementally (no division per vector).
template <typename T>
__device__ __forceinline__ void stage_rows(const T* __restrict__ src, T* dst, int R, int C,
                                           int ld, int lane) {
  constexpr int V = 16 / sizeof(T);
  const int vpr = C / V;
  const int total = R * vpr;
  const int dr = 32 / vpr;
  const int dc = 32 - dr * vpr;
  int r = lane / vpr;
  int cv = lane - r * vpr;
  for (int v = lane; v < total; v += 32) {
    cp_async16(dst + r * ld + cv * V, src + static_cast<long long>(v) * V);
    r += dr;
    cv += dc;
    if (cv >= vpr) {
      cv -= vpr;
      ++r;
    }
  }
}

// Zero rows [r0, r1) x columns [c0, c1) of a shared buffer (column bounds multiples
// of the vector width).
template <typename T>
__device__ __forceinline__ void zero_block(T* s, int r0, int r1, int c0, int c1, int ld,
                                           int lane) {
  constexpr int V = 16 / sizeof(T);
  const int vpr = (c1 - c0) / V;
  if (vpr <= 0 || r1 <= r0) return;
  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
  for (int v = lane; v < (r1 - r0) * vpr; v += 32) {
    const int r = v / vpr;
    *reinterpret_cast<uint4*>(s + (r0 + r) * ld + c0 + (v - r * vpr) * V) = z;
  }
}

struct TcGeom {
  int Rpad, Cpad, ldx, lds;
  int xbuf_bytes;   // one staged sample
  int vbuf_bytes;   // one staged bottom (fwd) / grad (bwd) row
  int z_alias;      // fwd: z lives in the consumed x buffer (else after the vbufs)
  int z_rows;       // fwd: x rows overwritten by an aliased z
  int warp_bytes;   // shared memory per warp
};

// Forward. NT = Rpad / 16 when 1 or 2 (all tiles in registers at once), 0 = any.
template <typename T, int NT>
__global__ void __launch_bounds__(32 * kTcMaxWarps, 1)
tc_fwd_kernel(const T* __restrict__ x, const T* __restrict__ bottom, T* __restrict__ out,
              long long B, int R, int C, int W, TcGeom g) {
  if constexpr (!tc_arch_ok<T>()) {
    __trap();
  } else {
    using M = Mma<T>;
    constexpr int V = 16 / sizeof(T);
    extern __shared__ __align__(128) unsigned char tsm[];
    const int warps = blockDim.x >> 5;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int P = R * (R - 1) / 2;
    const int ldz = g.Rpad;
    unsigned char* base = tsm + warp * g.warp_bytes;
    // buffer i of each pair (pointer arithmetic, not arrays: keeps them in registers)
    auto xs = [&](int i) { return reinterpret_cast<T*>(base + i * g.xbuf_bytes); };
    unsigned char* vb = base + 2 * g.xbuf_bytes;
    auto bs = [&](int i) { return reinterpret_cast<T*>(vb + i * g.vbuf_bytes); };
    float* zsep = reinterpret_cast<float*>(vb + 2 * g.vbuf_bytes);

    for (int i = 0; i < 2; ++i) {  // pads stay zero for the whole kernel
      zero_block(xs(i), R, g.Rpad, 0, g.Cpad, g.ldx, lane);
      zero_block(xs(i), 0, R, C, g.Cpad, g.ldx, lane);
    }
    const long long stride = static_cast<long long>(gridDim.x) * warps;
    long long b = static_cast<long long>(blockIdx.x) * warps + warp;
    if (b < B) {
      stage_rows(x + b * R * C, xs(0), R, C, g.ldx, lane);
      stage_vec(bottom + b * C, bs(0), C / V, lane);
    }
    cp_async_commit();
    int cur = 0;
    for (; b < B; b += stride, cur ^= 1) {
      const long long nb = b + stride;
      if (nb < B) {
        stage_rows(x + nb * R * C, xs(cur ^ 1), R, C, g.ldx, lane);
        stage_vec(bottom + nb * C, bs(cur ^ 1), C / V, lane);
      }
      cp_async_commit();
      cp_async_wait<1>();
      __syncwarp();
      const T* sx = xs(cur);
      float* sz = g.z_alias ? reinterpret_cast<float*>(xs(cur)) : zsep;
      if constexpr (NT == 1) {
        typename M::Acc c00;
        wmma::fill_fragment(c00, 0.f);
        for (int k = 0; k < g.Cpad; k += M::K) {
          typename M::A a0;
          typename M::Bt b0;
          M::load(a0, sx + k, g.ldx);
          M::load(b0, sx + k, g.ldx);
          wmma::mma_sync(c00, a0, b0, c00);
        }
        __syncwarp();
        wmma::store_matrix_sync(sz, c00, ldz, wmma::mem_row_major);
      } else if constexpr (NT == 2) {
        typename M::Acc c00, c10, c11;
        wmma::fill_fragment(c00, 0.f);
        wmma::fill_fragment(c10, 0.f);
        wmma::fill_fragment(c11, 0.f);
        const T* sx1 = sx + 16 * g.ldx;
        for (int k = 0; k < g.Cpad; k += M::K) {
          typename M::A a0, a1;
          typename M::Bt b0, b1;
          M::load(a0, sx + k, g.ldx);
          M::load(a1, sx1 + k, g.ldx);
          M::load(b0, sx + k, g.ldx);
          M::load(b1, sx1 + k, g.ldx);
          wmma::mma_sync(c00, a0, b0, c00);
          wmma::mma_sync(c10, a1, b0, c10);
          wmma::mma_sync(c11, a1, b1, c11);
        }
        __syncwarp();
        wmma::store_matrix_sync(sz, c00, ldz, wmma::mem_row_major);
        wmma::store_matrix_sync(sz + 16 * ldz, c10, ldz, wmma::mem_row_major);
        wmma::store_matrix_sync(sz + 16 * ldz + 16, c11, ldz, wmma::mem_row_major);
      } else {  // any R: tile by tile into a separate z buffer
        for (int ti = 0; ti < g.Rpad / 16; ++ti) {
          for (int tj = 0; tj <= ti; ++tj) {
            typename M::Acc acc;
            wmma::fill_fragment(acc, 0.f);
            for (int k = 0; k < g.Cpad; k += M::K) {
              typename M::A a;
              typename M::Bt bt;
              M::load(a, sx + ti * 16 * g.ldx + k, g.ldx);
              M::load(bt, sx + tj * 16 * g.ldx + k, g.ldx);
              wmma::mma_sync(acc, a, bt, acc);
            }
            wmma::store_matrix_sync(sz + ti * 16 * ldz + tj * 16, acc, ldz, wmma::mem_row_major);
          }
        }
      }
      __syncwarp();
      T* ob = out + b * W;
      const T* sb = bs(cur);
      for (int v = lane; v < W / V; v += 32) {
        const int e0 = v * V;
        uint4 pack;
        if (e0 < C) {
          pack = *reinterpret_cast<const uint4*>(sb + e0);
        } else {
          __align__(16) T vals[V];
          const int p0 = e0 - C;
          int i = 0, j = 0;
          if (p0 < P) decode_pair(p0, i, j);
#pragma unroll
          for (int t = 0; t < V; ++t) {
            if (p0 + t < P) {
              vals[t] = from_float<T>(sz[i * ldz + j]);
              if (++j == i) { ++i; j = 0; }
            } else {
              vals[t] = from_float<T>(0.f);
            }
          }
          pack = *reinterpret_cast<const uint4*>(vals);
        }
        *reinterpret_cast<uint4*>(ob + e0) = pack;
      }
      if (g.z_alias) {  // z overwrote k-pad columns of the first rows: restore zeros
        __syncwarp();
        zero_block(xs(cur), 0, g.z_rows, C, g.Cpad, g.ldx, lane);
      }
      __syncwarp();  // this buffer is refilled by the prefetch of the next iteration
    }
    cp_async_wait<0>();
  }
}

// Backward. NT = Rpad / 16 when 1 or 2 (S fragments kept in registers), 0 = any.
template <typename T, int NT>
__global__ void __launch_bounds__(32 * kTcMaxWarps, 1)
tc_bwd_kernel(const T* __restrict__ x, const T* __restrict__ grad, T* __restrict__ grad_x,
              T* __restrict__ grad_bottom, long long B, int R, int C, int W, TcGeom g) {
  if constexpr (!tc_arch_ok<T>()) {
    __trap();
  } else {
    using M = Mma<T>;
    constexpr int V = 16 / sizeof(T);
    constexpr int KS = NT > 0 ? NT * 16 / M::K : 1;  // k-steps over Rpad (NT > 0)
    extern __shared__ __align__(128) unsigned char tsm[];
    const int warps = blockDim.x >> 5;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int P = R * (R - 1) / 2;
    unsigned char* base = tsm + warp * g.warp_bytes;
    auto xs = [&](int i) { return reinterpret_cast<T*>(base + i * g.xbuf_bytes); };
    unsigned char* vb = base + 2 * g.xbuf_bytes;
    auto gs = [&](int i) { return reinterpret_cast<T*>(vb + i * g.vbuf_bytes); };
    T* ss = reinterpret_cast<T*>(vb + 2 * g.vbuf_bytes);
    float* st = reinterpret_cast<float*>(ss + g.Rpad * g.lds);

    for (int i = 0; i < 2; ++i) {
      zero_block(xs(i), R, g.Rpad, 0, g.Cpad, g.ldx, lane);
      zero_block(xs(i), 0, R, C, g.Cpad, g.ldx, lane);
    }
    zero_block(ss, 0, g.Rpad, 0, g.Rpad, g.lds, lane);  // diagonal and pads stay zero
    const long long stride = static_cast<long long>(gridDim.x) * warps;
    long long b = static_cast<long long>(blockIdx.x) * warps + warp;
    if (b < B) {
      stage_rows(x + b * R * C, xs(0), R, C, g.ldx, lane);
      stage_vec(grad + b * W, gs(0), W / V, lane);
    }
    cp_async_commit();
    int cur = 0;
    const int nct = g.Cpad / 16;
    for (; b < B; b += stride, cur ^= 1) {
      const long long nb = b + stride;
      if (nb < B) {
        stage_rows(x + nb * R * C, xs(cur ^ 1), R, C, g.ldx, lane);
        stage_vec(grad + nb * W, gs(cur ^ 1), W / V, lane);
      }
      cp_async_commit();
      cp_async_wait<1>();
      __syncwarp();
      const T* sx = xs(cur);
      const T* sg = gs(cur);
      // grad_bottom <- grad[b, :C]
      for (int v = lane; v < C / V; v += 32)
        reinterpret_cast<uint4*>(grad_bottom + b * C)[v] = reinterpret_cast<const uint4*>(sg)[v];
      // S[i][j] = S[j][i] = grad[b, C + pair(i, j)]
      for (int v = lane; v * V < P; v += 32) {
        __align__(16) T vals[V];
        *reinterpret_cast<uint4*>(vals) = *reinterpret_cast<const uint4*>(sg + C + v * V);
        const int p0 = v * V;
        int i, j;
        decode_pair(p0, i, j);
#pragma unroll
        for (int t = 0; t < V; ++t) {
          if (p0 + t < P) {
            ss[i * g.lds + j] = vals[t];
            ss[j * g.lds + i] = vals[t];
            if (++j == i) { ++i; j = 0; }
          }
        }
      }
      __syncwarp();
      T* gxb = grad_x + b * R * C;
      constexpr int CH = 32 / V;  // 16-byte output chunks per staged row (two tiles)
      // write staged rows ti*16.. (two 16x16 tiles side by side) to grad_x
      auto write_stage = [&](int ti, int tc) {
        for (int u = lane; u < 16 * CH; u += 32) {
          const int r = u / CH;
          const int q = u - r * CH;
          const int row = ti * 16 + r;
          const int col = tc * 16 + q * V;
          if (row < R && col < C) {
            __align__(16) T vals[V];
            const float4* sp = reinterpret_cast<const float4*>(st + r * kStageLd + q * V);
#pragma unroll
            for (int h = 0; h < V / 4; ++h) {
              const float4 f = sp[h];
              vals[4 * h + 0] = from_float<T>(f.x);
              vals[4 * h + 1] = from_float<T>(f.y);
              vals[4 * h + 2] = from_float<T>(f.z);
              vals[4 * h + 3] = from_float<T>(f.w);
            }
            *reinterpret_cast<uint4*>(gxb + row * C + col) =
                *reinterpret_cast<const uint4*>(vals);
          }
        }
      };
      if constexpr (NT > 0) {
        // all S fragments in registers; each X fragment is loaded once for all row tiles
        typename M::A a[NT][KS];
#pragma unroll
        for (int ti = 0; ti < NT; ++ti)
#pragma unroll
          for (int ks = 0; ks < KS; ++ks)
            M::load(a[ti][ks], ss + ti * 16 * g.lds + ks * M::K, g.lds);
        for (int tc = 0; tc < nct; tc += 2) {
          const bool two = tc + 1 < nct;
          typename M::Acc c[NT][2];
#pragma unroll
          for (int ti = 0; ti < NT; ++ti) {
            wmma::fill_fragment(c[ti][0], 0.f);
            wmma::fill_fragment(c[ti][1], 0.f);
          }
#pragma unroll
          for (int ks = 0; ks < KS; ++ks) {
            typename M::B b0, b1;
            const T* xr = sx + ks * M::K * g.ldx + tc * 16;
            M::load(b0, xr, g.ldx);
            if (two) M::load(b1, xr + 16, g.ldx);
#pragma unroll
            for (int ti = 0; ti < NT; ++ti) {
              wmma::mma_sync(c[ti][0], a[ti][ks], b0, c[ti][0]);
              if (two) wmma::mma_sync(c[ti][1], a[ti][ks], b1, c[ti][1]);
            }
          }
#pragma unroll
          for (int ti = 0; ti < NT; ++ti) {
            wmma::store_matrix_sync(st, c[ti][0], kStageLd, wmma::mem_row_major);
            if (two) wmma::store_matrix_sync(st + 16, c[ti][1], kStageLd, wmma::mem_row_major);
            __syncwarp();
            write_stage(ti, tc);
            __syncwarp();
          }
        }
      } else {  // any R: row tile by row tile, S fragments reloaded per k-step
        for (int ti = 0; ti < g.Rpad / 16; ++ti) {
          const T* srow = ss + ti * 16 * g.lds;
          for (int tc = 0; tc < nct; tc += 2) {
            const bool two = tc + 1 < nct;
            typename M::Acc c0, c1;
            wmma::fill_fragment(c0, 0.f);
            wmma::fill_fragment(c1, 0.f);
            for (int k = 0; k < g.Rpad; k += M::K) {
              typename M::A a0;
              typename M::B b0, b1;
              M::load(a0, srow + k, g.lds);
              const T* xr = sx + k * g.ldx + tc * 16;
              M::load(b0, xr, g.ldx);
              wmma::mma_sync(c0, a0, b0, c0);
              if (two) {
                M::load(b1, xr + 16, g.ldx);
                wmma::mma_sync(c1, a0, b1, c1);
              }
            }
            wmma::store_matrix_sync(st, c0, kStageLd, wmma::mem_row_major);
            if (two) wmma::store_matrix_sync(st + 16, c1, kStageLd, wmma::mem_row_major);
            __syncwarp();
            write_stage(ti, tc);
            __syncwarp();
          }
        }
      }
      __syncwarp();  // S and this x buffer are rewritten next iteration
    }
    cp_async_wait<0>();
  }
}

// ---------------------------------------------------------------------------
// host side
// ---------------------------------------------------------------------------
constexpr int kMaxDevices = 64;

struct DevInfo {
  int cc;          // major*10 + minor
  int sms;
  int smem_optin;  // max dynamic shared memory per block after opt-in
};

cudaError_t device_info(DevInfo* out) {
  static std::atomic<int> cached_cc[kMaxDevices];
  static std::atomic<int> cached_sms[kMaxDevices];
  static std::atomic<int> cached_smem[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= 0 && dev < kMaxDevices && cached_cc[dev].load() > 0) {
    out->cc = cached_cc[dev].load();
    out->sms = cached_sms[dev].load();
    out->smem_optin = cached_smem[dev].load();
    return cudaSuccess;
  }
  int major = 0, minor = 0, sms = 0, smem = 0;
  if ((err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev))) return err;
  if ((err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev))) return err;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev))) return err;
  if ((err = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)))
    return err;
  if (smem < 48 * 1024) smem = 48 * 1024;
  out->cc = major * 10 + minor;
  out->sms = sms;
  out->smem_optin = smem;
  if (dev >= 0 && dev < kMaxDevices) {
    cached_sms[dev].store(sms);
    cached_smem[dev].store(smem);
    cached_cc[dev].store(out->cc);
  }
  return cudaSuccess;
}

// Raise a kernel's dynamic shared memory limit once per device (monotonic).
template <typename Kernel>
cudaError_t ensure_smem(Kernel kernel, std::atomic<int>* cache, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  std::atomic<int>* slot = (dev >= 0 && dev < kMaxDevices) ? &cache[dev] : nullptr;
  if (slot && slot->load() >= static_cast<int>(bytes)) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes));
  if (err == cudaSuccess && slot) {
    int cur = slot->load();
    while (cur < static_cast<int>(bytes) &&
           !slot->compare_exchange_weak(cur, static_cast<int>(bytes))) {
    }
  }
  return err;
}

inline long long round_up(long long v, long long m) { return (v + m - 1) / m * m; }
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

bool valid_sizes(long long B, int R, int C) {
  if (B < 0 || R < 1 || C < 1) return false;
  const long long W = round_up(static_cast<long long>(R) * (R - 1) / 2 + C, 8);
  return W <= INT_MAX && static_cast<long long>(R) * C <= INT_MAX &&
         static_cast<long long>(R) * R <= INT_MAX;
}

int elem_size(int dtype) { return dtype == DBI_DTYPE_F16 ? 2 : 4; }

TcGeom tc_geom(int dtype, int R, int C, bool backward) {
  const long long es = elem_size(dtype);
  const int skew = static_cast<int>(16 / es);  // 16-byte row padding in shared memory
  TcGeom g{};
  g.Rpad = static_cast<int>(round_up(R, 16));
  g.Cpad = static_cast<int>(round_up(C, 16));
  g.ldx = g.Cpad + skew;
  g.lds = g.Rpad + skew;
  const long long W = round_up(static_cast<long long>(R) * (R - 1) / 2 + C, 8);
  const long long xbytes = round_up(static_cast<long long>(g.Rpad) * g.ldx * es, 128);
  const long long vbytes = round_up((backward ? W : C) * es, 128);
  long long bytes = 2 * xbytes + 2 * vbytes;
  if (backward) {
    bytes += round_up(static_cast<long long>(g.Rpad) * g.lds * es, 128) + 16LL * kStageLd * 4;
  } else {
    const long long zbytes = static_cast<long long>(g.Rpad) * g.Rpad * 4;
    const long long row_bytes = static_cast<long long>(g.ldx) * es;
    const long long z_rows = (zbytes + row_bytes - 1) / row_bytes;
    g.z_alias = (g.Rpad <= 32 && z_rows <= R) ? 1 : 0;
    g.z_rows = g.z_alias ? static_cast<int>(z_rows) : 0;
    if (!g.z_alias) bytes += zbytes;
  }
  bytes = round_up(bytes, 128);
  g.xbuf_bytes = static_cast<int>(xbytes > INT_MAX ? INT_MAX : xbytes);
  g.vbuf_bytes = static_cast<int>(vbytes > INT_MAX ? INT_MAX : vbytes);
  g.warp_bytes = static_cast<int>(bytes > INT_MAX ? INT_MAX : bytes);
  return g;
}

bool tc_eligible(int dtype, const DevInfo& d, int C, int allow_tf32, const TcGeom& g,
                 std::initializer_list<const void*> ptrs) {
  const int vec = 16 / elem_size(dtype);
  const int min_cc = dtype == DBI_DTYPE_F16 ? 70 : 80;  // fp16 WMMA: sm70+, TF32: sm80+
  if (d.cc < min_cc) return false;
  if (dtype == DBI_DTYPE_F32 && !allow_tf32) return false;
  if (C % vec != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return false;
  return g.warp_bytes <= d.smem_optin;
}

long long generic_fwd_smem(int R, int C) {
  const int ld = (C % 2 == 0) ? C + 1 : C;  // odd stride: rows spread over banks
  return static_cast<long long>(R) * ld * 4;
}
long long generic_bwd_smem(int R, int C) {
  return (static_cast<long long>(R) * C + static_cast<long long>(R) * R) * 4;
}

int grid_for(long long items, long long per_block, long long cap = 1LL << 22) {
  long long g = (items + per_block - 1) / per_block;
  if (g < 1) g = 1;
  if (g > cap) g = cap;
  return static_cast<int>(g);
}

int select_path(int requested, bool tc_ok, bool generic_ok) {
  switch (requested) {
    case DBI_PATH_AUTO:
      return tc_ok ? DBI_PATH_TENSOR : (generic_ok ? DBI_PATH_GENERIC : DBI_PATH_FALLBACK);
    case DBI_PATH_TENSOR:
      return tc_ok ? DBI_PATH_TENSOR : DBI_ERR_UNSUPPORTED;
    case DBI_PATH_GENERIC:
      return generic_ok ? DBI_PATH_GENERIC : DBI_ERR_UNSUPPORTED;
    case DBI_PATH_FALLBACK:
      return DBI_PATH_FALLBACK;
    default:
      return DBI_ERR_ARGS;
  }
}

int forward_path_impl(int dtype, const void* x, const void* bottom, const void* out,
                      long long B, int R, int C, int path, int allow_tf32, DevInfo* dinfo,
                      cudaError_t* cuda_err) {
  if (dtype != DBI_DTYPE_F32 && dtype != DBI_DTYPE_F16) return DBI_ERR_ARGS;
  if (!valid_sizes(B, R, C)) return DBI_ERR_ARGS;
  DevInfo d;
  *cuda_err = device_info(&d);
  if (*cuda_err != cudaSuccess) return DBI_ERR_CUDA;
  if (dinfo) *dinfo = d;
  const TcGeom g = tc_geom(dtype, R, C, false);
  const bool tc_ok = tc_eligible(dtype, d, C, allow_tf32, g, {x, bottom, out});
  const bool generic_ok = generic_fwd_smem(R, C) <= d.smem_optin;
  return select_path(path, tc_ok, generic_ok);
}

int backward_path_impl(int dtype, const void* x, const void* grad, const void* grad_x,
                       const void* grad_bottom, long long B, int R, int C, int path,
                       int allow_tf32, DevInfo* dinfo, cudaError_t* cuda_err) {
  if (dtype != DBI_DTYPE_F32 && dtype != DBI_DTYPE_F16) return DBI_ERR_ARGS;
  if (!valid_sizes(B, R, C)) return DBI_ERR_ARGS;
  DevInfo d;
  *cuda_err = device_info(&d);
  if (*cuda_err != cudaSuccess) return DBI_ERR_CUDA;
  if (dinfo) *dinfo = d;
  const TcGeom g = tc_geom(dtype, R, C, true);
  const bool tc_ok = tc_eligible(dtype, d, C, allow_tf32, g, {x, grad, grad_x, grad_bottom});
  const bool generic_ok = generic_bwd_smem(R, C) <= d.smem_optin;
  return select_path(path, tc_ok, generic_ok);
}

struct TcLaunch {
  int warps = 0;          // warps (samples in flight) per block
  int blocks_per_sm = 0;  // resident blocks per multiprocessor
};

// Pick the block size (1, 2 or 4 warps) that keeps the most warps resident, once per
// (kernel, device, shared-memory footprint).
std::mutex g_tc_config_mu;
std::map<std::tuple<const void*, int, int>, TcLaunch> g_tc_config_cache;

template <typename Kernel>
cudaError_t tc_config(Kernel kernel, const DevInfo& d, int warp_bytes, TcLaunch* cfg) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(g_tc_config_mu);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), dev, warp_bytes);
  auto it = g_tc_config_cache.find(key);
  if (it != g_tc_config_cache.end()) {
    *cfg = it->second;
    return cudaSuccess;
  }
  // Once per (kernel, device): allow the device's whole opt-in shared memory (a limit,
  // not an allocation; lowering it later would break cached configurations).
  const auto kdev = std::make_tuple(reinterpret_cast<const void*>(kernel), dev, -1);
  if (g_tc_config_cache.find(kdev) == g_tc_config_cache.end()) {
    if ((err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    d.smem_optin)))
      return err;
    if ((err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    static_cast<int>(cudaSharedmemCarveoutMaxShared))))
      return err;
    g_tc_config_cache[kdev] = TcLaunch();
  }
  const int attr = d.smem_optin;
  TcLaunch best;
  for (int w = kTcMaxWarps; w >= 1; w /= 2) {
    const long long smem = static_cast<long long>(w) * warp_bytes;
    if (smem > attr) continue;
    int nb = 0;
    if ((err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kernel, 32 * w,
                                                             static_cast<size_t>(smem))))
      return err;
    if (nb * w > best.warps * best.blocks_per_sm) {
      best.warps = w;
      best.blocks_per_sm = nb;
    }
  }
  if (best.blocks_per_sm == 0) return cudaErrorInvalidConfiguration;
  g_tc_config_cache[key] = best;
  *cfg = best;
  return cudaSuccess;
}

template <typename T, int NT>
int run_tc_forward(const DevInfo& d, const TcGeom& g, const T* x, const T* bottom, T* out,
                   long long B, int R, int C, int W, cudaStream_t stream, TcLaunch* used) {
  TcLaunch cfg;
  cudaError_t err = tc_config(tc_fwd_kernel<T, NT>, d, g.warp_bytes, &cfg);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (used) *used = cfg;
  if (B == 0) return 0;
  const long long max_blocks = static_cast<long long>(cfg.blocks_per_sm) * d.sms;
  const int grid = grid_for(B, cfg.warps, max_blocks);
  tc_fwd_kernel<T, NT><<<grid, 32 * cfg.warps, static_cast<size_t>(cfg.warps) * g.warp_bytes,
                         stream>>>(x, bottom, out, B, R, C, W, g);
  return static_cast<int>(cudaGetLastError());
}

template <typename T, int NT>
int run_tc_backward(const DevInfo& d, const TcGeom& g, const T* x, const T* grad, T* grad_x,
                    T* grad_bottom, long long B, int R, int C, int W, cudaStream_t stream,
                    TcLaunch* used) {
  TcLaunch cfg;
  cudaError_t err = tc_config(tc_bwd_kernel<T, NT>, d, g.warp_bytes, &cfg);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (used) *used = cfg;
  if (B == 0) return 0;
  const long long max_blocks = static_cast<long long>(cfg.blocks_per_sm) * d.sms;
  const int grid = grid_for(B, cfg.warps, max_blocks);
  tc_bwd_kernel<T, NT><<<grid, 32 * cfg.warps, static_cast<size_t>(cfg.warps) * g.warp_bytes,
                         stream>>>(x, grad, grad_x, grad_bottom, B, R, C, W, g);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int tc_forward(const DevInfo& d, const T* x, const T* bottom, T* out, long long B, int R, int C,
               cudaStream_t stream, TcLaunch* used) {
  const TcGeom g = tc_geom(sizeof(T) == 2 ? DBI_DTYPE_F16 : DBI_DTYPE_F32, R, C, false);
  const int W = dbi_output_width(R, C);
  switch (g.Rpad / 16) {
    case 1: return run_tc_forward<T, 1>(d, g, x, bottom, out, B, R, C, W, stream, used);
    case 2: return run_tc_forward<T, 2>(d, g, x, bottom, out, B, R, C, W, stream, used);
    default: return run_tc_forward<T, 0>(d, g, x, bottom, out, B, R, C, W, stream, used);
  }
}

template <typename T>
int tc_backward(const DevInfo& d, const T* x, const T* grad, T* grad_x, T* grad_bottom,
                long long B, int R, int C, cudaStream_t stream, TcLaunch* used) {
  const TcGeom g = tc_geom(sizeof(T) == 2 ? DBI_DTYPE_F16 : DBI_DTYPE_F32, R, C, true);
  const int W = dbi_output_width(R, C);
  switch (g.Rpad / 16) {
    case 1:
      return run_tc_backward<T, 1>(d, g, x, grad, grad_x, grad_bottom, B, R, C, W, stream, used);
    case 2:
      return run_tc_backward<T, 2>(d, g, x, grad, grad_x, grad_bottom, B, R, C, W, stream, used);
    default:
      return run_tc_backward<T, 0>(d, g, x, grad, grad_x, grad_bottom, B, R, C, W, stream, used);
  }
}

template <typename T>
int launch_forward(int path, const DevInfo& d, const T* x, const T* bottom, T* out,
                   long long B, int R, int C, cudaStream_t stream) {
  const int W = dbi_output_width(R, C);
  cudaError_t err = cudaSuccess;
  if (path == DBI_PATH_TENSOR) {
    return tc_forward<T>(d, x, bottom, out, B, R, C, stream, nullptr);
  } else if (path == DBI_PATH_GENERIC) {
    static std::atomic<int> smem_cache[kMaxDevices];
    const int ld = (C % 2 == 0) ? C + 1 : C;
    const size_t smem = static_cast<size_t>(generic_fwd_smem(R, C));
    if ((err = ensure_smem(generic_fwd_kernel<T>, smem_cache, smem))) return err;
    generic_fwd_kernel<T><<<grid_for(B, 1, INT_MAX), kGenericThreads, smem, stream>>>(
        x, bottom, out, B, R, C, W, ld);
  } else {
    fallback_fwd_kernel<T><<<grid_for(B * W, kFallbackThreads), kFallbackThreads, 0, stream>>>(
        x, bottom, out, B, R, C, W);
  }
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int launch_backward(int path, const DevInfo& d, const T* x, const T* grad, T* grad_x,
                    T* grad_bottom, long long B, int R, int C, cudaStream_t stream) {
  const int W = dbi_output_width(R, C);
  cudaError_t err = cudaSuccess;
  if (path == DBI_PATH_TENSOR) {
    return tc_backward<T>(d, x, grad, grad_x, grad_bottom, B, R, C, stream, nullptr);
  } else if (path == DBI_PATH_GENERIC) {
    static std::atomic<int> smem_cache[kMaxDevices];
    const size_t smem = static_cast<size_t>(generic_bwd_smem(R, C));
    if ((err = ensure_smem(generic_bwd_kernel<T>, smem_cache, smem))) return err;
    generic_bwd_kernel<T><<<grid_for(B, 1, INT_MAX), kGenericThreads, smem, stream>>>(
        x, grad, grad_x, grad_bottom, B, R, C, W);
  } else {
    fallback_bwd_kernel<T><<<grid_for(B * R * C, kFallbackThreads), kFallbackThreads, 0,
                             stream>>>(x, grad, grad_x, grad_bottom, B, R, C, W);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace
}  // namespace dbi

extern "C" {

int dbi_output_width(int R, int C) {
  if (!dbi::valid_sizes(0, R, C)) return -1;
  return static_cast<int>(dbi::round_up(static_cast<long long>(R) * (R - 1) / 2 + C, 8));
}

int dbi_forward_path(int dtype, const void* x, const void* bottom, const void* out,
                     long long B, int R, int C, int path, int allow_tf32) {
  cudaError_t err = cudaSuccess;
  return dbi::forward_path_impl(dtype, x, bottom, out, B, R, C, path, allow_tf32, nullptr,
                                &err);
}

int dbi_backward_path(int dtype, const void* x, const void* grad, const void* grad_x,
                      const void* grad_bottom, long long B, int R, int C, int path,
                      int allow_tf32) {
  cudaError_t err = cudaSuccess;
  return dbi::backward_path_impl(dtype, x, grad, grad_x, grad_bottom, B, R, C, path,
                                 allow_tf32, nullptr, &err);
}

int dbi_forward(int dtype, const void* x, const void* bottom, void* out, long long B, int R,
                int C, int path, int allow_tf32, cudaStream_t stream, int* path_used) {
  if (B > 0 && (!x || !bottom || !out)) return DBI_ERR_ARGS;
  dbi::DevInfo d{};
  cudaError_t err = cudaSuccess;
  const int p =
      dbi::forward_path_impl(dtype, x, bottom, out, B, R, C, path, allow_tf32, &d, &err);
  if (path_used) *path_used = p;
  if (p == DBI_ERR_CUDA) return static_cast<int>(err);
  if (p < 0) return p;
  if (B == 0) return 0;
  if (dtype == DBI_DTYPE_F16)
    return dbi::launch_forward<__half>(p, d, static_cast<const __half*>(x),
                                       static_cast<const __half*>(bottom),
                                       static_cast<__half*>(out), B, R, C, stream);
  return dbi::launch_forward<float>(p, d, static_cast<const float*>(x),
                                    static_cast<const float*>(bottom), static_cast<float*>(out),
                                    B, R, C, stream);
}

int dbi_backward(int dtype, const void* x, const void* grad, void* grad_x, void* grad_bottom,
                 long long B, int R, int C, int path, int allow_tf32, cudaStream_t stream,
                 int* path_used) {
  if (B > 0 && (!x || !grad || !grad_x || !grad_bottom)) return DBI_ERR_ARGS;
  dbi::DevInfo d{};
  cudaError_t err = cudaSuccess;
  const int p = dbi::backward_path_impl(dtype, x, grad, grad_x, grad_bottom, B, R, C, path,
                                        allow_tf32, &d, &err);
  if (path_used) *path_used = p;
  if (p == DBI_ERR_CUDA) return static_cast<int>(err);
  if (p < 0) return p;
  if (B == 0) return 0;
  if (dtype == DBI_DTYPE_F16)
    return dbi::launch_backward<__half>(
        p, d, static_cast<const __half*>(x), static_cast<const __half*>(grad),
        static_cast<__half*>(grad_x), static_cast<__half*>(grad_bottom), B, R, C, stream);
  return dbi::launch_backward<float>(p, d, static_cast<const float*>(x),
                                     static_cast<const float*>(grad),
                                     static_cast<float*>(grad_x),
                                     static_cast<float*>(grad_bottom), B, R, C, stream);
}

int dbi_tensor_config(int dtype, int backward, int R, int C, int* warps_per_block,
                      int* blocks_per_sm, int* smem_per_warp) {
  if ((dtype != DBI_DTYPE_F32 && dtype != DBI_DTYPE_F16) || !dbi::valid_sizes(0, R, C))
    return DBI_ERR_ARGS;
  dbi::DevInfo d{};
  cudaError_t err = dbi::device_info(&d);
  if (err != cudaSuccess) return static_cast<int>(err);
  const dbi::TcGeom g = dbi::tc_geom(dtype, R, C, backward != 0);
  if (smem_per_warp) *smem_per_warp = g.warp_bytes;
  if (g.warp_bytes > d.smem_optin) return DBI_ERR_UNSUPPORTED;
  dbi::TcLaunch cfg;
  int rc = 0;
  if (dtype == DBI_DTYPE_F16)
    rc = backward ? dbi::tc_backward<__half>(d, nullptr, nullptr, nullptr, nullptr, 0, R, C, 0, &cfg)
                  : dbi::tc_forward<__half>(d, nullptr, nullptr, nullptr, 0, R, C, 0, &cfg);
  else
    rc = backward ? dbi::tc_backward<float>(d, nullptr, nullptr, nullptr, nullptr, 0, R, C, 0, &cfg)
                  : dbi::tc_forward<float>(d, nullptr, nullptr, nullptr, 0, R, C, 0, &cfg);
  if (rc != 0) return rc;
  if (warps_per_block) *warps_per_block = cfg.warps;
  if (blocks_per_sm) *blocks_per_sm = cfg.blocks_per_sm;
  return 0;
}

const char* dbi_path_name(int path) {
  switch (path) {
    case DBI_PATH_AUTO: return "auto";
    case DBI_PATH_GENERIC: return "generic";
    case DBI_PATH_TENSOR: return "tensor";
    case DBI_PATH_FALLBACK: return "fallback";
    default: return "invalid";
  }
}

const char* dbi_error_string(int code) {
  if (code == 0) return "ok";
  if (code == DBI_ERR_ARGS) return "invalid arguments (dtype, path, sizes or null pointers)";
  if (code == DBI_ERR_CUDA) return "CUDA error while querying the device";
  if (code == DBI_ERR_UNSUPPORTED)
    return "the requested kernel path cannot run this shape/dtype/alignment on this device";
  if (code > 0) return cudaGetErrorString(static_cast<cudaError_t>(code));
  return "unknown error";
}

}  // extern "C"
