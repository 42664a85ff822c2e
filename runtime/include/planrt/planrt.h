//===- planrt.h - The API that generated programs call ---------*- C++ -*-===//
//
// Generated programs (planc's host and cuda targets) call only what is
// declared here. The same declarations are implemented by two backends:
//   - host: each MPI rank plays one GPU; tensors live in host memory, GEMM is
//     OpenBLAS, collectives are MPI.
//   - cuda: tensors live in device memory, GEMM is cuBLASLt, collectives are
//     NCCL (the ncclUniqueId is broadcast over MPI).
// Which backend a program gets is decided at link time (libplanrt_host.a or
// libplanrt_cuda.a); the generated source is the same.
//
// Calling convention used by codegen: every call takes the Context first, then
// the op's tensor operands in order, then the attributes that the op's
// RuntimeCallOpInterface lists (dialects/rank/RankOps.td).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_PLANRT_H
#define PLANRT_PLANRT_H

#include <cstdint>

namespace planrt {

struct Context;

/// A dense fp32 tensor of rank 0..4, row-major. `data` points to host memory
/// on the host backend and to device memory on the cuda backend.
struct Tensor {
  float *data = nullptr;
  int ndim = 0;
  int64_t shape[4] = {1, 1, 1, 1};
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i)
      n *= shape[i];
    return n;
  }
};

/// Parameter initializers (values of `init_kind`).
enum InitKind : int {
  InitZeros = 0,
  InitOnes = 1,
  InitNormal = 2,
  InitUniform = 3
};
/// Roles of a per-step input (values of `role`).
enum InputRole : int { RoleInput = 0, RoleLabel = 1 };

//===--- Program description: called from the generated plan_setup() -----===//

/// Appends a mesh axis. Axes are declared outermost first; the last declared
/// axis varies fastest across consecutive ranks (it stays within a node).
void declare_mesh_axis(Context *ctx, const char *name, int64_t size);

/// Declares parameter number N (N = order of declaration, from 0). `ndim` and
/// `d0..d3` give the local shape (unused trailing dims are 1). Initialization
/// depends only on (seed, parameter name, global element index), so every
/// parallel plan starts from the same weights. For `InitNormal` a = mean,
/// b = stddev; for `InitUniform` a = low, b = high; ignored otherwise.
void declare_param(Context *ctx, const char *name, int64_t ndim, int64_t d0,
                   int64_t d1, int64_t d2, int64_t d3, int64_t init_kind,
                   float a, float b);

/// Declares per-step input number N. `d0..d3` is the local shape; if
/// `batch_axis` >= 0, dimension 0 (the batch) is split over that mesh axis
/// (index into the declared axes) and this rank holds rows
/// [coord * d0, (coord + 1) * d0) of the global batch.
void declare_input(Context *ctx, const char *name, int64_t role, int64_t ndim,
                   int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                   int64_t batch_axis);

/// Training loop settings. `data_kind` 0 = synthetic regression: each input
/// element is uniform in [-1, 1) from (seed, step, global row, column); each
/// label row is a fixed nonlinear "teacher" function of its input row (the
/// teacher depends only on the seed), so the data is the same for any plan.
void set_training(Context *ctx, int64_t steps, int64_t seed,
                  int64_t global_batch, int64_t data_kind);

/// Addition to the original API (optional; for tensor-parallel plans):
/// declares that dimension `dim` of parameter `param_index` is split over
/// mesh axis `mesh_axis`. The declared shape stays the local shard; the global
/// dimension is local * axis size and this rank holds block coord[mesh_axis].
/// Initialization then uses global element indices (every plan starts from
/// the same weights) and --save gathers and writes the full tensor. Call it
/// from plan_setup after declare_param.
void shard_param(Context *ctx, int64_t param_index, int64_t dim,
                 int64_t mesh_axis);

//===--- Step body: called from the generated plan_step() -----------------===//

/// Parameter / per-step input buffers by declaration index (persistent).
Tensor *param(Context *ctx, int64_t index);
Tensor *input(Context *ctx, int64_t index);
/// Scratch tensor valid until the end of the current step (arena-allocated;
/// the arena is reset before every step). Contents are undefined.
Tensor *alloc(Context *ctx, int64_t ndim, int64_t d0, int64_t d1, int64_t d2,
              int64_t d3);

/// c = op(a) @ op(b), a and b 2-D; op(x) = x^T when the flag is set.
void matmul(Context *ctx, const Tensor *a, const Tensor *b, Tensor *c,
            bool transpose_a, bool transpose_b);
/// out[r, j] = x[r, j] + b[j]   (x viewed as [numel / n, n], n = b.numel()).
void bias_add(Context *ctx, const Tensor *x, const Tensor *b, Tensor *out);
/// db[j] = sum_r dy[r, j].
void bias_grad(Context *ctx, const Tensor *dy, Tensor *db);
/// out = a + b (same shapes).
void add(Context *ctx, const Tensor *a, const Tensor *b, Tensor *out);
void relu(Context *ctx, const Tensor *x, Tensor *out);
/// dx = dy * (x > 0).
void relu_grad(Context *ctx, const Tensor *x, const Tensor *dy, Tensor *dx);
/// GELU, tanh approximation (GPT-2's form).
void gelu(Context *ctx, const Tensor *x, Tensor *out);
void gelu_grad(Context *ctx, const Tensor *x, const Tensor *dy, Tensor *dx);
/// out (rank-0) = scale * sum((pred - target)^2). With scale = 1/global_numel
/// and a later all-reduce this is the global mean squared error.
void mse_loss(Context *ctx, const Tensor *pred, const Tensor *target,
              Tensor *out, float scale);
/// dpred = 2 * scale * (pred - target).
void mse_loss_grad(Context *ctx, const Tensor *pred, const Tensor *target,
                   Tensor *dpred, float scale);
/// w -= lr * g.
void sgd_update(Context *ctx, Tensor *w, const Tensor *g, float lr);
/// AdamW with decoupled weight decay and bias correction; optimizer state
/// (m, v) is kept per parameter index. Uses the current step number (from 1).
void adamw_update(Context *ctx, Tensor *w, const Tensor *g, int64_t param_index,
                  float lr, float beta1, float beta2, float eps,
                  float weight_decay);
/// In-place sum over the ranks that differ only in the mesh axes whose bits
/// are set in `axis_mask` (bit i = i-th declared axis).
void all_reduce_sum(Context *ctx, Tensor *t, int64_t axis_mask);
/// Records this step's loss (rank-0 tensor, already reduced) for logging.
void report_loss(Context *ctx, const Tensor *loss);

//===--- Entry point: called from the generated main() --------------------===//

/// Initializes MPI (and CUDA/NCCL on the cuda backend), calls `setup` to
/// record the program description, checks that the MPI world size equals the
/// product of the mesh axes (otherwise every rank prints an error naming both
/// sizes and how to launch, and run returns 1 without any collective), creates
/// and initializes parameters, then runs `steps` training steps calling `step`
/// and printing one line per step on rank 0. Command-line options of the
/// generated program are parsed here (see --help).
int run(int argc, char **argv, const char *program_name,
        void (*setup)(Context *), void (*step)(Context *));

} // namespace planrt

#endif // PLANRT_PLANRT_H
