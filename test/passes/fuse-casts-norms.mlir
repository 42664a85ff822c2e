// RUN: plan-opt %s --plan-mixed-precision --plan-autodiff --plan-fuse-casts | FileCheck %s
// RUN: plan-opt %s --plan-mixed-precision=precision=fp16 --plan-autodiff --plan-fuse-casts | FileCheck %s --check-prefix=FP16

// A norm's parameter gradients are sums over rows, like a bias gradient:
// in bf16 they are widened once to the fp32 master weights, so the norm's
// backward writes them in f32 (the fp32 sums, not rounded to bf16 first),
// as PyTorch's autocast, which runs the norms in fp32, has them. The input
// gradient stays bf16.
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 5.000000e-02 : f64, optimizer = "sgd", precision = "bf16", seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x"},
             %y: tensor<8x4xf32> {plan.kind = "label", plan.name = "y"},
             %g: tensor<4xf32> {plan.kind = "param", plan.name = "g"},
             %b: tensor<4xf32> {plan.kind = "param", plan.name = "b"},
             %r: tensor<4xf32> {plan.kind = "param", plan.name = "r"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.layernorm %x, %g, %b : tensor<8x4xf32>, tensor<4xf32>
  %1 = plan.rmsnorm %0, %r : tensor<8x4xf32>, tensor<4xf32>
  %2 = plan.mse_loss %1, %y : tensor<8x4xf32> -> tensor<f32>
  return %2 : tensor<f32>
}
// CHECK-LABEL: func.func @train_step(
// CHECK: plan.rmsnorm_grad %{{.*}}, %{{.*}}, %{{.*}} : tensor<8x4xbf16>, tensor<4xbf16> -> tensor<4xf32>
// CHECK: plan.layernorm_grad %{{.*}}, %{{.*}}, %{{.*}} : tensor<8x4xbf16>, tensor<4xbf16> -> tensor<4xf32>
// CHECK-NOT: plan.cast %{{.*}} : tensor<4xbf16> -> tensor<4xf32>
// CHECK: return

// fp16 sums its gradients in fp16 (as Megatron's fp16 training does) and
// widens them after: the norms' too.
// FP16-LABEL: func.func @train_step(
// FP16: plan.rmsnorm_grad {{.*}} -> tensor<4xf16>
// FP16: plan.layernorm_grad {{.*}} -> tensor<4xf16>
// FP16: plan.cast %{{.*}} : tensor<4xf16> -> tensor<4xf32>
