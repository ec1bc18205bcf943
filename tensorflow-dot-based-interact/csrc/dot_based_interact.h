/*
 * DLRM dot interaction: plain CUDA launchers, independent of TensorFlow.
 *
 * Forward   out[b] = [ bottom[b, 0:C] | Z[b, i, j] for i > j, row-major | 0 pad ]
 *           Z[b, i, j] = <x[b, i, :], x[b, j, :]>,  width = roundup8(R*(R-1)/2 + C)
 * Backward  grad_bottom[b, :] = grad[b, 0:C]
 *           grad_x[b, k, :]   = sum_{m != k} grad[b, C + pair(max(k,m), min(k,m))] * x[b, m, :]
 *
 * x is [B, R, C], bottom [B, C], out / grad [B, width], all dense row-major.
 * float16 data is accumulated in float32.
 *
 * The same translation unit is linked into the TensorFlow op library and into
 * the standalone ctypes harness (harness/), so both exercise identical kernels.
 */
#ifndef DOT_BASED_INTERACT_H_
#define DOT_BASED_INTERACT_H_

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dtypes */
#define DBI_DTYPE_F32 0
#define DBI_DTYPE_F16 1

/* kernel paths; DBI_PATH_AUTO picks tensor > generic > fallback */
#define DBI_PATH_AUTO 0
#define DBI_PATH_GENERIC 1  /* CUDA cores, one sample staged in shared memory */
#define DBI_PATH_TENSOR 2   /* WMMA: fp16 (sm70+) or TF32 (sm80+, allow_tf32) */
#define DBI_PATH_FALLBACK 3 /* CUDA cores straight from global memory, any size */

/* return codes: 0 ok, >0 a cudaError_t, <0 one of these */
#define DBI_ERR_ARGS (-1)        /* bad sizes, null pointers, unknown dtype/path */
#define DBI_ERR_UNSUPPORTED (-2) /* a forced path cannot run this shape/device */
#define DBI_ERR_CUDA (-3)        /* *_path only: the device query failed */

/* roundup8(R*(R-1)/2 + C); -1 when the arguments are invalid or overflow int32 */
int dbi_output_width(int R, int C);

/* Which path a launch with these arguments would take (no launch). Pointers
 * only matter for their alignment; pass NULL to assume 16-byte alignment.
 * Returns a DBI_PATH_* value or a negative error code. */
int dbi_forward_path(int dtype, const void* x, const void* bottom, const void* out,
                     long long B, int R, int C, int path, int allow_tf32);
int dbi_backward_path(int dtype, const void* x, const void* grad, const void* grad_x,
                      const void* grad_bottom, long long B, int R, int C, int path,
                      int allow_tf32);

/* Launch on `stream` (asynchronous). *path_used (may be NULL) receives the
 * path taken. */
int dbi_forward(int dtype, const void* x, const void* bottom, void* out, long long B,
                int R, int C, int path, int allow_tf32, cudaStream_t stream,
                int* path_used);
int dbi_backward(int dtype, const void* x, const void* grad, void* grad_x,
                 void* grad_bottom, long long B, int R, int C, int path, int allow_tf32,
                 cudaStream_t stream, int* path_used);

/* Diagnostics: launch configuration of the tensor path on the current device
 * (warps per block, resident blocks per SM, shared memory bytes per warp). */
int dbi_tensor_config(int dtype, int backward, int R, int C, int* warps_per_block,
                      int* blocks_per_sm, int* smem_per_warp);

const char* dbi_path_name(int path);
const char* dbi_error_string(int code);

#ifdef __cplusplus
}
#endif

#endif /* DOT_BASED_INTERACT_H_ */
