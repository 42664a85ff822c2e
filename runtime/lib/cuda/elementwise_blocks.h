//===- elementwise_blocks.h - Element-wise ops, 16 bytes a load -----------===//
//
// The element-wise functors of kernels.h (kElementwise: output i from inputs
// i) ran one GPU thread per element (cuda_backend.cu: map_kernel), so a
// thread of a bf16 residual add loaded 2 bytes per operand: a warp's load
// instruction moved 64 bytes, and the SMs issued four times the load and
// store instructions that 128-bit accesses need for the same bytes. An
// element-wise op does nothing but move bytes, so that is its speed.
//
// Here a thread runs a group of kGroup (8) consecutive elements: it loads
// each operand's 8 elements with 128-bit loads (one for 16-bit types, two
// for fp32), runs the functor itself on them (a copy of the functor whose
// pointers point at the thread's own arrays, which the unrolled loop keeps
// in registers), and stores the outputs with 128-bit stores. The math is
// the functor's, one definition shared with the host; only the memory
// accesses differ. An output may be one of the inputs (kElementwise allows
// it, never shifted): a group loads all its inputs before it stores.
//
// A group needs every pointer 16-byte aligned (the memory plan's buffers
// are; a view at an odd offset may not be) and, for a bias add, rows of a
// multiple of 8; otherwise the one-thread-per-element kernel runs (Io<F>::
// aligned says which). The n % 8 elements after the last group run the
// functor as it is, one thread each.
//
// Io<F> says, for each functor with groups, which of its pointers are read
// and written. The host compiler runs the same code (test/runtime/cuda
// compares it with the functors, bit for bit).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_ELEMENTWISE_BLOCKS_H
#define PLANRT_LIB_CUDA_ELEMENTWISE_BLOCKS_H

#include "block.h"
#include "planrt/kernels.h"

#include <cstdint>
#include <cstring>

namespace planrt {
namespace elementwise {

constexpr int kGroup = 8;
constexpr int kThreads = 256;

using block::copy16;

/// kGroup elements of T in a thread's registers (16 or 32 bytes).
template <class T> struct Group {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "16- or 32-bit elements");
  alignas(16) T v[kGroup];
  PLANRT_BLOCK_FN void load(const T *p) { copy16(v, p, (int)sizeof(v)); }
  PLANRT_BLOCK_FN void store(T *p) const { copy16(p, v, (int)sizeof(v)); }
};

inline bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

/// Functors without groups run one thread per element.
template <class F> struct Io { static constexpr bool kGroups = false; };

/// A functor whose group reads element i of its inputs `Ins` and writes
/// element i of its output `Out` (pointer members of F, elements of T).
template <class F, class T, auto Out, auto... Ins> struct MemberIo {
  static constexpr bool kGroups = true;
  static constexpr int kIns = sizeof...(Ins);
  struct Regs {
    Group<T> in[kIns], out;
  };
  static bool aligned(const F &f) {
    return aligned16(f.*Out) && (aligned16(f.*Ins) && ...);
  }
  PLANRT_BLOCK_FN static F local(const F &f, int64_t i, Regs &r) {
    F l = f;
    int k = 0;
    ((r.in[k].load(f.*Ins + i), l.*Ins = r.in[k].v, ++k), ...);
    l.*Out = r.out.v;
    return l;
  }
  PLANRT_BLOCK_FN static void store(const F &f, int64_t i, const Regs &r) {
    r.out.store(f.*Out + i);
  }
};
template <class T>
struct Io<kernels::AddFn<T>>
    : MemberIo<kernels::AddFn<T>, T, &kernels::AddFn<T>::out,
               &kernels::AddFn<T>::a, &kernels::AddFn<T>::b> {};
template <class T>
struct Io<kernels::SubFn<T>>
    : MemberIo<kernels::SubFn<T>, T, &kernels::SubFn<T>::out,
               &kernels::SubFn<T>::a, &kernels::SubFn<T>::b> {};
template <class T>
struct Io<kernels::MulFn<T>>
    : MemberIo<kernels::MulFn<T>, T, &kernels::MulFn<T>::out,
               &kernels::MulFn<T>::a, &kernels::MulFn<T>::b> {};
/// out = factor x.
template <class T>
struct Io<kernels::ScaleFn<T>>
    : MemberIo<kernels::ScaleFn<T>, T, &kernels::ScaleFn<T>::out,
               &kernels::ScaleFn<T>::x> {};
/// out = A(x): GELU, ReLU, SiLU.
template <class A, class T>
struct Io<kernels::MapFn<A, T>>
    : MemberIo<kernels::MapFn<A, T>, T, &kernels::MapFn<A, T>::out,
               &kernels::MapFn<A, T>::x> {};
/// dx = dy A'(x).
template <class A, class T>
struct Io<kernels::MapGradFn<A, T>>
    : MemberIo<kernels::MapGradFn<A, T>, T, &kernels::MapGradFn<A, T>::dx,
               &kernels::MapGradFn<A, T>::x, &kernels::MapGradFn<A, T>::dy> {};
/// dst = src (fp32).
template <>
struct Io<kernels::CopyFn>
    : MemberIo<kernels::CopyFn, float, &kernels::CopyFn::dst,
               &kernels::CopyFn::src> {};

/// out = x + b[i % n]: a group lies in one row when n is a multiple of 8,
/// and reads 8 consecutive elements of b.
template <class T> struct Io<kernels::BiasAddFn<T>> {
  static constexpr bool kGroups = true;
  using F = kernels::BiasAddFn<T>;
  struct Regs {
    Group<T> x, b, out;
  };
  static bool aligned(const F &f) {
    return f.n % kGroup == 0 && aligned16(f.x) && aligned16(f.b) &&
           aligned16(f.out);
  }
  PLANRT_BLOCK_FN static F local(const F &f, int64_t i, Regs &r) {
    r.x.load(f.x + i);
    r.b.load(f.b + i % f.n);
    F l = f;
    l.x = r.x.v;
    l.b = r.b.v;
    l.out = r.out.v;
    l.n = kGroup; // local index k < 8: b[k]
    return l;
  }
  PLANRT_BLOCK_FN static void store(const F &f, int64_t i, const Regs &r) {
    r.out.store(f.out + i);
  }
};

/// Casts between fp32, bf16 and fp16: the widths are the functor's
/// (run time), so the registers hold 8 elements of the widest.
template <> struct Io<kernels::CastFn> {
  static constexpr bool kGroups = true;
  using F = kernels::CastFn;
  PLANRT_BLOCK_FN static int width(int type) {
    return type == kernels::CastF32 ? 4 : 2;
  }
  struct Regs {
    Group<float> in, out;
  };
  static bool aligned(const F &f) {
    return aligned16(f.in) && aligned16(f.out);
  }
  PLANRT_BLOCK_FN static F local(const F &f, int64_t i, Regs &r) {
    copy16(r.in.v, static_cast<const char *>(f.in) + i * width(f.from),
           kGroup * width(f.from));
    F l = f;
    l.in = r.in.v;
    l.out = r.out.v;
    return l;
  }
  PLANRT_BLOCK_FN static void store(const F &f, int64_t i, const Regs &r) {
    copy16(static_cast<char *>(f.out) + i * width(f.to), r.out.v,
           kGroup * width(f.to));
  }
};

/// Elements [i, i + kGroup) of f.
template <class F> PLANRT_BLOCK_FN void group(const F &f, int64_t i) {
  typename Io<F>::Regs r;
  const F l = Io<F>::local(f, i, r);
  PLANRT_UNROLL
  for (int k = 0; k < kGroup; ++k)
    l(k);
  Io<F>::store(f, i, r);
}

/// What thread t of `threads` (a grid-stride loop) runs of f over [0, n):
/// the groups t, t + threads, ..., then the elements after the last group
/// the same way, one at a time.
template <class F>
PLANRT_BLOCK_FN void thread_work(const F &f, int64_t t, int64_t threads,
                                 int64_t n) {
  const int64_t groups = n / kGroup;
  for (int64_t g = t; g < groups; g += threads)
    group(f, g * kGroup);
  for (int64_t i = groups * kGroup + t; i < n; i += threads)
    f(i);
}

} // namespace elementwise
} // namespace planrt

#endif // PLANRT_LIB_CUDA_ELEMENTWISE_BLOCKS_H
