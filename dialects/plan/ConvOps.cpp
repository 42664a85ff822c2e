//===- ConvOps.cpp - Verifiers of the convolutional-network ops -----------===//
//
// MLIR's asserts are off in this build, so every shape the kernels rely on
// is checked here: NCHW ranks, channel/group divisibility and the output
// size the spatial attributes imply.
//===----------------------------------------------------------------------===//
#include "dialects/plan/PlanDialect.h"

using namespace mlir;
using namespace planc::plan;

namespace {
/// Checks a [height, width] attribute: two values >= `min`.
LogicalResult checkPair(Operation *op, StringRef name, ArrayRef<int64_t> v,
                        int64_t min) {
  if (v.size() != 2 || v[0] < min || v[1] < min)
    return op->emitOpError() << name << " must be two integers >= " << min
                             << " ([height, width]), got " << v.size()
                             << " value" << (v.size() == 1 ? "" : "s");
  return success();
}

LogicalResult checkNchw(Operation *op, StringRef name, RankedTensorType t) {
  if (t.getRank() != 4)
    return op->emitOpError() << name << " must be NCHW (rank 4), got " << t;
  return success();
}

/// The conv2d result type for `input` and `filter`, or a failure reported.
FailureOr<RankedTensorType> convResult(Operation *op, RankedTensorType in,
                                       RankedTensorType w,
                                       ArrayRef<int64_t> stride,
                                       ArrayRef<int64_t> pad,
                                       ArrayRef<int64_t> dil, int64_t groups) {
  if (failed(checkNchw(op, "the input", in)) ||
      failed(checkNchw(op, "the filter", w)) ||
      failed(checkPair(op, "stride", stride, 1)) ||
      failed(checkPair(op, "padding", pad, 0)) ||
      failed(checkPair(op, "dilation", dil, 1)))
    return failure();
  int64_t c = in.getDimSize(1), o = w.getDimSize(0);
  if (groups < 1 || c % groups || o % groups)
    return op->emitOpError()
           << "groups (" << groups << ") must divide the input channels (" << c
           << ") and the output channels (" << o << ")";
  if (w.getDimSize(1) != c / groups)
    return op->emitOpError()
           << "the filter " << w << " must have C / groups = " << c / groups
           << " input channels (dimension 1)";
  int64_t ho = spatialOutSize(in.getDimSize(2), w.getDimSize(2), stride[0],
                              pad[0], dil[0]);
  int64_t wo = spatialOutSize(in.getDimSize(3), w.getDimSize(3), stride[1],
                              pad[1], dil[1]);
  if (ho < 1 || wo < 1)
    return op->emitOpError() << "the filter " << w
                             << " (dilated, with padding) does not fit in the "
                             << "input " << in;
  return RankedTensorType::get({in.getDimSize(0), o, ho, wo},
                               in.getElementType());
}

FailureOr<RankedTensorType> poolResult(Operation *op, RankedTensorType in,
                                       StringRef kind, ArrayRef<int64_t> k,
                                       ArrayRef<int64_t> stride,
                                       ArrayRef<int64_t> pad) {
  if (failed(checkNchw(op, "the input", in)) ||
      failed(checkPair(op, "kernel", k, 1)) ||
      failed(checkPair(op, "stride", stride, 1)) ||
      failed(checkPair(op, "padding", pad, 0)))
    return failure();
  if (kind != "max" && kind != "avg")
    return op->emitOpError()
           << "kind must be \"max\" or \"avg\", got \"" << kind << "\"";
  // A window of padding only would have no maximum.
  if (pad[0] * 2 > k[0] || pad[1] * 2 > k[1])
    return op->emitOpError() << "padding must be at most half the kernel";
  int64_t ho = spatialOutSize(in.getDimSize(2), k[0], stride[0], pad[0]);
  int64_t wo = spatialOutSize(in.getDimSize(3), k[1], stride[1], pad[1]);
  if (ho < 1 || wo < 1)
    return op->emitOpError() << "the window does not fit in the input " << in;
  return RankedTensorType::get({in.getDimSize(0), in.getDimSize(1), ho, wo},
                               in.getElementType());
}

LogicalResult expectType(Operation *op, StringRef what, Type got,
                         RankedTensorType want) {
  if (got != want)
    return op->emitOpError() << what << " must be " << want << ", got " << got;
  return success();
}
} // namespace

LogicalResult Conv2dOp::verify() {
  auto r = convResult(*this, getInput().getType(), getFilter().getType(),
                      getStride(), getPadding(), getDilation(), getGroups());
  if (failed(r))
    return failure();
  return expectType(*this, "the result", getResult().getType(), *r);
}

LogicalResult Conv2dGradOp::verify() {
  auto r = convResult(*this, getInput().getType(), getFilter().getType(),
                      getStride(), getPadding(), getDilation(), getGroups());
  if (failed(r))
    return failure();
  return expectType(*this, "the output gradient", getGrad().getType(), *r);
}

LogicalResult Pool2dOp::verify() {
  auto r = poolResult(*this, getInput().getType(), getKind(), getKernel(),
                      getStride(), getPadding());
  if (failed(r))
    return failure();
  return expectType(*this, "the result", getResult().getType(), *r);
}

LogicalResult Pool2dGradOp::verify() {
  auto r = poolResult(*this, getInput().getType(), getKind(), getKernel(),
                      getStride(), getPadding());
  if (failed(r))
    return failure();
  return expectType(*this, "the output gradient", getGrad().getType(), *r);
}

LogicalResult ChannelBiasAddOp::verify() {
  auto in = getInput().getType();
  auto b = getBias().getType();
  if (in.getRank() < 2)
    return emitOpError() << "the input must have a channel dimension "
                            "(dimension 1), got "
                         << in;
  if (b.getRank() != 1 || b.getDimSize(0) != in.getDimSize(1))
    return emitOpError() << "the bias " << b << " must be 1-D with one value "
                         << "per channel (" << in.getDimSize(1) << ")";
  return success();
}

LogicalResult ChannelBiasGradOp::verify() {
  auto g = getGrad().getType();
  if (g.getRank() < 2)
    return emitOpError() << "the gradient must have a channel dimension, got "
                         << g;
  auto want = RankedTensorType::get({g.getDimSize(1)}, g.getElementType());
  return expectType(*this, "the result", getResult().getType(), want);
}

LogicalResult BatchNormOp::verify() {
  auto in = getInput().getType();
  auto g = getGamma().getType();
  if (in.getRank() < 2)
    return emitOpError() << "the input must be [N, C, ...], got " << in;
  if (g.getRank() != 1 || g.getDimSize(0) != in.getDimSize(1))
    return emitOpError() << "gamma and beta " << g << " must be 1-D with one "
                         << "value per channel (" << in.getDimSize(1) << ")";
  if (!(getEps().convertToDouble() >= 0))
    return emitOpError() << "eps must be >= 0";
  if (!getRunning().empty()) {
    if (getRunning().size() != 2)
      return emitOpError() << "takes either no running statistics or two "
                           << "(mean, variance), got " << getRunning().size();
    for (Value r : getRunning())
      if (r.getType() != g)
        return emitOpError() << "the running statistics must have the type "
                             << "of gamma, " << g << ", got " << r.getType();
  }
  double m = getMomentum().convertToDouble();
  if (!(m >= 0 && m <= 1))
    return emitOpError() << "momentum must be in [0, 1], got " << m;
  return success();
}

LogicalResult BatchNormMomentsOp::verify() {
  auto in = getInput().getType();
  if (in.getRank() < 2)
    return emitOpError() << "the input must be [N, C, ...], got " << in;
  auto want = RankedTensorType::get({in.getDimSize(1)}, in.getElementType());
  return expectType(*this, "the sums", getSum().getType(), want);
}

LogicalResult RunningStatsUpdateOp::verify() {
  if (getRunningMean().getType().getRank() != 1)
    return emitOpError() << "the statistics must be 1-D (one per channel), "
                         << "got " << getRunningMean().getType();
  double m = getMomentum().convertToDouble();
  if (!(m >= 0 && m <= 1))
    return emitOpError() << "momentum must be in [0, 1], got " << m;
  if (getCount() < 2)
    return emitOpError() << "count must be >= 2 (the unbiased variance "
                         << "divides by count - 1), got " << getCount();
  return success();
}

LogicalResult GroupNormOp::verify() {
  auto in = getInput().getType();
  auto g = getGamma().getType();
  if (in.getRank() < 2)
    return emitOpError() << "the input must be [N, C, ...], got " << in;
  int64_t c = in.getDimSize(1), groups = getGroups();
  if (groups < 1 || c % groups)
    return emitOpError() << "groups (" << groups
                         << ") must divide the channels (" << c << ")";
  if (g.getRank() != 1 || g.getDimSize(0) != c)
    return emitOpError() << "gamma and beta " << g << " must be 1-D with one "
                         << "value per channel (" << c << ")";
  if (!(getEps().convertToDouble() >= 0))
    return emitOpError() << "eps must be >= 0";
  return success();
}

LogicalResult DropoutOp::verify() {
  double p = getP().convertToDouble();
  if (!(p >= 0 && p < 1))
    return emitOpError() << "p must be in [0, 1), got " << p;
  return success();
}
