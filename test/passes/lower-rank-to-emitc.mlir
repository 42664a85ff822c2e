// RUN: plan-opt %s --plan-lower-rank-to-emitc | FileCheck %s
// RUN: plan-opt %s --plan-memory --plan-lower-rank-to-emitc | FileCheck %s --check-prefix=PLANNED
// RUN: plan-opt %s --plan-lower-rank-to-emitc | FileCheck %s --check-prefix=TABLES
// A parameter's row: name, ndim, 4 local dims, init kind (2 = normal, 0 =
// zeros), mean, std; a state tensor's: name, ndim, 4 local dims (zero at
// the start).
// TABLES: emitc.global static const @plan_params : !emitc.array<2x!emitc.opaque<"planrt::ParamDecl">> = #emitc.opaque<"{\0A  {\22w\22, 2, 4, 2, 1, 1, 2, 0.0e+00f, 5.000000000e-01f},\0A  {\22b\22, 1, 2, 1, 1, 1, 0, 0.0e+00f, 0.0e+00f},\0A}">
// TABLES: emitc.global static const @plan_states : !emitc.array<4x!emitc.opaque<"planrt::StateDecl">> = #emitc.opaque<"{\0A  {\22w.exp_avg\22, 2, 4, 2, 1, 1},\0A  {\22w.exp_avg_sq\22, 2, 4, 2, 1, 1},\0A  {\22b.exp_avg\22, 1, 2, 1, 1, 1},\0A  {\22b.exp_avg_sq\22, 1, 2, 1, 1, 1},\0A}">

module {
  plan.mesh @mesh axes = ["dp"] shape = [2]
  plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "adamw", seed = 1 : i64, steps = 3 : i64}
  rank.input_decl @x : memref<4x4xf32> role "input" batch_axis "dp"
  rank.input_decl @y : memref<4x2xf32> role "label" batch_axis "dp"
  rank.param_decl @w : memref<4x2xf32> init <normal, 0.000000e+00, 5.000000e-01>
  rank.param_decl @b : memref<2xf32> init <zeros>
  rank.state_decl @w.exp_avg : memref<4x2xf32>
  rank.state_decl @w.exp_avg_sq : memref<4x2xf32>
  rank.state_decl @b.exp_avg : memref<2xf32>
  rank.state_decl @b.exp_avg_sq : memref<2xf32>
  func.func @plan_step() attributes {rank.expected_bytes = array<i64: 40, 40, 80>} {
    %0 = rank.input @x : memref<4x4xf32>
    %1 = rank.input @y : memref<4x2xf32>
    %2 = rank.param @w : memref<4x2xf32>
    %3 = rank.param @b : memref<2xf32>
    %m0 = rank.state @w.exp_avg : memref<4x2xf32>
    %v0 = rank.state @w.exp_avg_sq : memref<4x2xf32>
    %m1 = rank.state @b.exp_avg : memref<2xf32>
    %v1 = rank.state @b.exp_avg_sq : memref<2xf32>
    %4 = rank.alloc : memref<4x2xf32>
    rank.matmul %0, %2 into %4 {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32> -> memref<4x2xf32>
    %5 = rank.alloc : memref<4x2xf32>
    rank.bias_add %4, %3 into %5 : memref<4x2xf32>, memref<2xf32> -> memref<4x2xf32>
    %6 = rank.alloc : memref<4x2xf32>
    rank.relu %5 into %6 : memref<4x2xf32> -> memref<4x2xf32>
    %7 = rank.alloc : memref<f32>
    rank.mse_loss %6, %1 into %7 {scale = 6.250000e-02 : f32} : memref<4x2xf32>, memref<4x2xf32> -> memref<f32>
    rank.all_reduce %7 over ["dp"] : memref<f32>
    %8 = rank.alloc : memref<4x2xf32>
    rank.mse_loss_grad %6, %1 into %8 {scale = 6.250000e-02 : f32} : memref<4x2xf32>, memref<4x2xf32> -> memref<4x2xf32>
    %9 = rank.alloc : memref<4x2xf32>
    rank.relu_grad %5, %8 into %9 : memref<4x2xf32>, memref<4x2xf32> -> memref<4x2xf32>
    %10 = rank.alloc : memref<2xf32>
    rank.bias_grad %9 into %10 : memref<4x2xf32> -> memref<2xf32>
    rank.all_reduce %10 over ["dp"] : memref<2xf32>
    %11 = rank.alloc : memref<4x2xf32>
    rank.matmul %0, %9 into %11 {transpose_lhs = true, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32> -> memref<4x2xf32>
    rank.all_reduce %11 over ["dp"] : memref<4x2xf32>
    rank.adamw_update %2, %11, %m0, %v0 {beta1 = 0.899999976 : f32, beta2 = 9.990000e-01 : f32, eps = 9.99999993E-9 : f32, lr = 1.000000e-03 : f32, weight_decay = 0.000000e+00 : f32} : memref<4x2xf32>, memref<4x2xf32>, memref<4x2xf32>, memref<4x2xf32>
    rank.adamw_update %3, %10, %m1, %v1 {beta1 = 0.899999976 : f32, beta2 = 9.990000e-01 : f32, eps = 9.99999993E-9 : f32, lr = 1.000000e-03 : f32, weight_decay = 0.000000e+00 : f32} : memref<2xf32>, memref<2xf32>, memref<2xf32>, memref<2xf32>
    rank.report_loss %7 : memref<f32>
    return
  }
}

// Numbers are passed as the C++ literals they become (#emitc.opaque, one per
// value: the emitter would otherwise convert every use to decimal again);
// f32 ones with the digits EmitC prints for an f32 attribute.
// CHECK: emitc.include "planrt/planrt.h"
// CHECK-LABEL: emitc.func @plan_step(
// CHECK: %[[X:.*]] = call_opaque "planrt::input"(%{{.*}}) {args = [0 : index, #emitc.opaque<"0">]}
// CHECK: %[[W:.*]] = call_opaque "planrt::param"(%{{.*}}) {args = [0 : index, #emitc.opaque<"0">]}
// CHECK: %[[T:.*]] = call_opaque "planrt::alloc"(%{{.*}}) {args = [0 : index, #emitc.opaque<"2">, #emitc.opaque<"4">, #emitc.opaque<"2">, #emitc.opaque<"1">, #emitc.opaque<"1">]}
// CHECK: call_opaque "planrt::matmul"(%{{.*}}, %[[X]], %[[W]], %[[T]]) {args = [0 : index, 1 : index, 2 : index, 3 : index, false, false]}
// CHECK: call_opaque "planrt::mse_loss"({{.*}}#emitc.opaque<"6.250000000e-02f">]}
// Mesh axis dp is bit 0 of the mask.
// CHECK: call_opaque "planrt::all_reduce_sum"(%{{.*}}) {args = [0 : index, 1 : index, #emitc.opaque<"1">]}
// AdamW's arguments in planrt's order: parameter, gradient, both moments,
// lr, beta1, beta2, eps, decay.
// CHECK: call_opaque "planrt::adamw_update"({{.*}}) {args = [0 : index, 1 : index, 2 : index, 3 : index, 4 : index, #emitc.opaque<"1.000000050e-03f">, #emitc.opaque<"8.999999760e-01f">, #emitc.opaque<"9.990000120e-01f">, #emitc.opaque<"9.999999930e-09f">, #emitc.opaque<"0.0e+00f">]}
// CHECK: call_opaque "planrt::report_loss"
// CHECK: emitc.func @plan_setup(%[[C:.*]]: !emitc.ptr<!emitc.opaque<"planrt::Context">>) attributes {specifiers = ["static"]}
// CHECK: call_opaque "planrt::declare_mesh_axis"(%[[C]]) {args = [0 : index, #emitc.opaque<"\22dp\22">, #emitc.opaque<"2">]}
// Parameters and optimizer state come from static tables (emitted before
// the functions, checked by TABLES below), one row each.
// CHECK: %[[P:.*]] = get_global @plan_params : !emitc.array<2x!emitc.opaque<"planrt::ParamDecl">>
// CHECK: call_opaque "planrt::declare_params"(%[[C]], %[[P]]) {args = [0 : index, 1 : index, #emitc.opaque<"2">]}
// CHECK: %[[S:.*]] = get_global @plan_states : !emitc.array<4x!emitc.opaque<"planrt::StateDecl">>
// CHECK: call_opaque "planrt::declare_states"(%[[C]], %[[S]]) {args = [0 : index, 1 : index, #emitc.opaque<"4">]}
// Name, role (1 = label), ndim, local dims, batch axis index.
// CHECK: call_opaque "planrt::declare_input"(%[[C]]) {args = [0 : index, #emitc.opaque<"\22y\22">, #emitc.opaque<"1">, #emitc.opaque<"2">, #emitc.opaque<"4">, #emitc.opaque<"2">, #emitc.opaque<"1">, #emitc.opaque<"1">, #emitc.opaque<"0">]}
// CHECK: call_opaque "planrt::set_training"(%[[C]]) {args = [0 : index, #emitc.opaque<"3">, #emitc.opaque<"1">, #emitc.opaque<"8">, #emitc.opaque<"0">]}
// The per-rank bytes of parameters, gradients and state, checked by planrt.
// CHECK: call_opaque "planrt::expect_bytes"(%[[C]]) {args = [0 : index, #emitc.opaque<"40">, #emitc.opaque<"40">, #emitc.opaque<"80">]}
// CHECK-LABEL: emitc.func @main(
// CHECK: call_opaque "planrt::run"(%arg0, %arg1) {args = [0 : index, 1 : index, #emitc.opaque<"\22plan\22">, #emitc.opaque<"plan_setup">, #emitc.opaque<"plan_step">]}
// Nothing of the rank level is left.
// CHECK-NOT: rank.
// CHECK-NOT: plan.

// With the memory plan: the setup declares the arena, the step runs between
// arena_begin and arena_end, buffers are placed (offset, kind, shape) and
// released, and an op's temporaries are given to it just before it runs.
// PLANNED-LABEL: emitc.func @plan_step(
// PLANNED: call_opaque "planrt::arena_begin"(%{{.*}}) {args = [0 : index, #emitc.opaque<"0">]}
// PLANNED: %[[T:.*]] = call_opaque "planrt::alloc_at"(%{{.*}}) {args = [0 : index, #emitc.opaque<"0">, #emitc.opaque<"0">, #emitc.opaque<"2">, #emitc.opaque<"4">, #emitc.opaque<"2">, #emitc.opaque<"1">, #emitc.opaque<"1">]}
// PLANNED: call_opaque "planrt::dealloc"(%{{.*}}, %[[T]])
// PLANNED: call_opaque "planrt::op_workspace"(%{{.*}}) {args = [0 : index, #emitc.opaque<"768">, #emitc.opaque<"256">]}
// PLANNED-NEXT: call_opaque "planrt::mse_loss"
// Gradients are kind 1.
// PLANNED: call_opaque "planrt::alloc_at"(%{{.*}}) {args = [0 : index, #emitc.opaque<"768">, #emitc.opaque<"1">, #emitc.opaque<"2">, #emitc.opaque<"4">, #emitc.opaque<"2">, #emitc.opaque<"1">, #emitc.opaque<"1">]}
// PLANNED: call_opaque "planrt::arena_end"
// PLANNED-NEXT: return
// PLANNED-LABEL: emitc.func @plan_setup(
// PLANNED: call_opaque "planrt::plan_arena"(%{{.*}}) {args = [0 : index, #emitc.opaque<"0">, #emitc.opaque<"0">, #emitc.opaque<"1024">, #emitc.opaque<"2304">]}
