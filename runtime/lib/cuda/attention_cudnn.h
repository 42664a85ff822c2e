//===- attention_cudnn.h - 16-bit attention on cuDNN (attention_cudnn.cpp)
//-===//
#ifndef PLANRT_LIB_CUDA_ATTENTION_CUDNN_H
#define PLANRT_LIB_CUDA_ATTENTION_CUDNN_H

#include "planrt/kernels.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace planrt {
namespace cuda_attention {
namespace cudnn {

/// One attention as cuDNN's SDPA graphs see it: every operand a strided
/// [B, heads, rows, D] view (heads D elements apart; strides in elements).
/// One GPU's attention is whole(); context parallelism's all_gather attends
/// with a chunk of a rank's queries over a prefix of the gathered keys, and
/// its ring with a chunk of them over a block of keys all before them
/// (unmasked) or ending with them (attention_cp.cu).
struct Sdpa {
  int64_t B, H, KV, D;
  int64_t sq, sk;           // query rows, key rows
  int64_t q_batch, q_row;   // q and dq [B, H, sq, D]
  int64_t kv_batch, kv_row; // k, v, dk and dv [B, KV, sk, D]
  int64_t o_batch, o_row;   // out and dout [B, H, sq, D]
  int64_t stats_head;       // the log-sum-exp [B, H, sq] (f32), per head
  float scale;
  bool bf16;          // else fp16
  bool bottom_right;  // query row i sees keys <= i + sk - sq (else <= i)
  bool causal = true; // else every query row sees every key
  /// One GPU's attention over the packed qkv of kernels::AttnShape.
  static Sdpa whole(const kernels::AttnShape &a, bool bf16);
};

/// The operands of one forward (q, k, v -> o and, when not null, stats) or
/// backward (q, k, v, o, stats, dout -> dq, dk, dv, overwritten).
struct SdpaIo {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void *o = nullptr;
  float *stats = nullptr;
  const void *dout = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

/// Whether cuDNN runs problem `p`: its forward (with the log-sum-exp where
/// `stats`), or with `backward` the forward with statistics and the
/// backward. Never with attention dropout (the tiles draw the host's mask).
/// Builds the graphs at first use; with PLANRT_ATTENTION=cudnn, false is
/// fatal instead.
bool runs(const Sdpa &p, bool stats, bool backward, bool dropout);
/// Runs what runs() said cuDNN runs, on stream `s`.
void forward(cudaStream_t s, const Sdpa &p, const SdpaIo &io);
void backward(cudaStream_t s, const Sdpa &p, const SdpaIo &io);

/// Device buffers held here for the callers' intermediates (outside the
/// planned memory, counted by bytes_held()): each only grows.
enum class Scratch {
  Out, // a backward's recomputed output
  Lse, // a forward's log-sum-exp
  Dkv  // context parallelism's dk and dv before they are added up
};
void *scratch(Scratch which, size_t bytes);

/// Causal attention of packed qkv (kernels::AttnShape's layout) into out on
/// stream `s`, on cuDNN's fused flash attention; with `lse` (B H S floats),
/// each row's log-sum-exp of its scaled scores. `bf16`: the operands are
/// bf16, else fp16. False when cuDNN does not run this problem (not loaded,
/// turned off, or no engine for the shape): nothing was launched.
bool forward(cudaStream_t s, const kernels::AttnShape &a, bool bf16,
             const void *qkv, void *out, float *lse);

/// Whether forward() runs this problem (with or without `lse`); never with
/// attention dropout (the tiles draw the host's mask). With
/// PLANRT_ATTENTION=cudnn, false is fatal instead.
bool runs_forward(const kernels::AttnShape &a, bool bf16, bool lse,
                  bool dropout);

/// A device buffer of `rows` floats held here, for forward()'s `lse`: the
/// same one the backward recomputes into (stream order keeps them apart).
float *lse_scratch(int64_t rows);

/// The whole backward: dq, dk and dv into dqkv (overwritten), from qkv and
/// dout. It runs the forward again into buffers of its own (cuDNN's
/// backward reads the output and its log-sum-exp, which the plan does not
/// keep). False when cuDNN does not run this problem: nothing launched.
bool backward(cudaStream_t s, const kernels::AttnShape &a, bool bf16,
              bool dropout, const void *qkv, const void *dout, void *dqkv);

/// The backward from the forward's output `out` and log-sum-exp `lse`
/// (what forward() wrote with `lse`), without running the forward again.
/// False when cuDNN does not run this problem: nothing launched.
bool backward_kept(cudaStream_t s, const kernels::AttnShape &a, bool bf16,
                   bool dropout, const void *qkv, const void *out,
                   const float *lse, const void *dout, void *dqkv);

/// Whether backward() ran (or would run) this problem: the key side of the
/// tiled backward asks, after backward() was called for the same problem.
bool runs_backward(const kernels::AttnShape &a, bool bf16, bool dropout);

/// Checks problem `p`'s graphs (the forward with and without statistics;
/// with `backward`, the backward, deterministic and not) against the rules
/// cuDNN's frontend applies before it asks the library for an engine, for
/// a GPU of compute capability `sm_version` (90: Hopper), with no GPU
/// here: what can be known of a shape before a device runs it. Loads cuDNN
/// (its version's rules); "" or the first part that fails, and why.
std::string validate(const Sdpa &p, bool backward, int sm_version);
/// The loaded cuDNN's version (91900 for 9.19), 0 where none loads.
size_t library_version();

/// Device bytes held for cuDNN (its workspace and the scratch buffers),
/// outside the planned memory.
size_t bytes_held();

/// One line on whether attention runs on cuDNN, and why not if it does
/// not; empty before the first 16-bit attention.
const char *status();

} // namespace cudnn
} // namespace cuda_attention
} // namespace planrt

#endif // PLANRT_LIB_CUDA_ATTENTION_CUDNN_H
