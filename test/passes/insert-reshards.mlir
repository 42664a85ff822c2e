// RUN: plan-opt %s --plan-propagate-sharding --plan-insert-reshards | FileCheck %s

// An intermediate value is resharded once, right after it is computed; a
// parameter right before each use (so that a sharded parameter is gathered
// just before it is needed, in forward and again in backward).
plan.mesh @mesh axes = ["dp"] shape = [2]
func.func @train_step(%x: tensor<8x4xf32> {plan.kind = "input", plan.sharding = #plan.sharding<@mesh, [[dp], []]>},
                      %w: tensor<4x4xf32> {plan.kind = "param", plan.sharding = #plan.sharding<@mesh, [[dp], []]>, plan.sharding_origin = "zero"})
    -> (tensor<8x4xf32> {plan.result = "loss"}) attributes {plan.train_step} {
  %y = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %z = plan.matmul %y, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  return %z : tensor<8x4xf32>
}
// The batch keeps dp (data beats ZeRO storage): the weight is gathered.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[W1:.*]] = plan.reshard %arg1 <@mesh, {{\[\[}}], []]>
// CHECK-NEXT: plan.matmul %arg0, %[[W1]]
// CHECK-NEXT: %[[W2:.*]] = plan.reshard %arg1 <@mesh, {{\[\[}}], []]>
// CHECK-NEXT: plan.matmul %{{.*}}, %[[W2]]
// The result goes back whole.
// CHECK: %[[R:.*]] = plan.reshard %{{.*}} <@mesh, {{\[\[}}], []]>
// CHECK: return %[[R]]
