// RUN: plan-opt %s | plan-opt | FileCheck %s
// RUN: plan-opt %s --mlir-print-op-generic | plan-opt | FileCheck %s
// RUN: plan-opt %s --mlir-print-op-generic | FileCheck %s --check-prefix=GENERIC

// Transformer ops, the generalized matmul, sharding_constraint and the
// module-level settings ops.

plan.mesh @mesh axes = ["dp", "tp"] shape = [2, 4]

// Every new plan.train setting, set.
// CHECK: plan.train {checkpoint_dir = "/ckpt", checkpoint_every = 50 : i64, data = "shards", data_path = "/data/tok", decay_steps = 90 : i64, global_batch = 32 : i64, grad_clip = 1.000000e+00 : f64, loss_scale = "dynamic", lr = 1.000000e-03 : f64, lr_schedule = "cosine", micro_batch = 4 : i64, min_lr = 1.000000e-04 : f64, optimizer = "adamw", precision = "fp16", seed = 3 : i64, steps = 100 : i64, warmup_steps = 10 : i64}
plan.train {data = "shards", data_path = "/data/tok", global_batch = 32 : i64, lr = 1.0e-03 : f64, optimizer = "adamw", seed = 3 : i64, steps = 100 : i64, micro_batch = 4 : i64, precision = "fp16", loss_scale = "dynamic", grad_clip = 1.0 : f64, lr_schedule = "cosine", warmup_steps = 10 : i64, min_lr = 1.0e-04 : f64, decay_steps = 90 : i64, checkpoint_dir = "/ckpt", checkpoint_every = 50 : i64}
// Left out, they take their defaults (elided when printed).
// CHECK: plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64}
// GENERIC: "plan.train"() <{beta1 = 9.000000e-01 : f64, beta2 = 0.99899999999999999 : f64, checkpoint_every = 0 : i64, data = "synthetic", eps = 1.000000e-08 : f64, global_batch = 8 : i64, loss_scale = "none", lr = 1.000000e-01 : f64, lr_schedule = "constant", optimizer = "sgd", precision = "fp32", seed = 3 : i64, steps = 5 : i64, warmup_steps = 0 : i64, weight_decay = 0.000000e+00 : f64}>
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64}
// bf16 with clipping, the other precisions and schedules.
// CHECK: plan.train {{{.*}}precision = "bf16"
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, precision = "bf16", grad_clip = 0.5 : f64, lr_schedule = "constant"}

// CHECK: plan.parallel {bucket_mb = 5.000000e+01 : f64, microbatches = 8 : i64, recompute = "selective", schedule = "interleaved_1f1b", sequence_parallel = true, stage_boundaries = array<i64: 4, 8, 12>, tensor_policy = "megatron", virtual_stages = 2 : i64, zero_stage = 1 : i64}
plan.parallel {schedule = "interleaved_1f1b", microbatches = 8 : i64, virtual_stages = 2 : i64, zero_stage = 1 : i64, bucket_mb = 50.0 : f64, recompute = "selective", sequence_parallel = true, tensor_policy = "megatron", stage_boundaries = array<i64: 4, 8, 12>}
// CHECK: plan.parallel {microbatches = 4 : i64, recompute = "full", schedule = "gpipe", zero_stage = 3 : i64}
plan.parallel {schedule = "gpipe", microbatches = 4 : i64, zero_stage = 3 : i64, recompute = "full"}
// CHECK: plan.parallel{{$}}
// GENERIC: "plan.parallel"() <{bucket_mb = 2.500000e+01 : f64, microbatches = 1 : i64, recompute = "none", schedule = "1f1b", sequence_parallel = false, tensor_policy = "none", virtual_stages = 1 : i64, zero_stage = 0 : i64}>
plan.parallel

// CHECK: plan.cluster {gpu = "H100", gpus_per_node = 8 : i64, inter_node_gbps = 5.000000e+01 : f64, intra_node_gbps = 4.500000e+02 : f64, nodes = 2 : i64}
plan.cluster {nodes = 2 : i64, gpus_per_node = 8 : i64, gpu = "H100", intra_node_gbps = 450.0 : f64, inter_node_gbps = 50.0 : f64}

// CHECK-LABEL: func.func @layers(
func.func @layers(%ids: tensor<2x8xi32>, %wte: tensor<64x16xf32>,
                  %g: tensor<16xf32>, %b: tensor<16xf32>,
                  %w: tensor<16x48xf32>, %t: tensor<2x8xi32>,
                  %flat_ids: tensor<5xi32>) {
  // CHECK: plan.embedding %{{.*}}, %{{.*}} : tensor<2x8xi32>, tensor<64x16xf32> -> tensor<2x8x16xf32>
  %h = plan.embedding %ids, %wte : tensor<2x8xi32>, tensor<64x16xf32> -> tensor<2x8x16xf32>
  // CHECK: plan.embedding %{{.*}}, %{{.*}} : tensor<5xi32>, tensor<64x16xf32> -> tensor<5x16xf32>
  %h1 = plan.embedding %flat_ids, %wte : tensor<5xi32>, tensor<64x16xf32> -> tensor<5x16xf32>
  // The default eps is elided.
  // CHECK: plan.layernorm %{{.*}}, %{{.*}}, %{{.*}} : tensor<2x8x16xf32>, tensor<16xf32>
  // GENERIC: "plan.layernorm"(%{{.*}}, %{{.*}}, %{{.*}}) <{eps = 9.99999974E-6 : f32}>
  %n = plan.layernorm %h, %g, %b {eps = 1.0e-05 : f32} : tensor<2x8x16xf32>, tensor<16xf32>
  // CHECK: plan.layernorm %{{.*}}, %{{.*}}, %{{.*}} {eps = 1.000000e-03 : f32} : tensor<2x8x16xf32>, tensor<16xf32>
  %n1 = plan.layernorm %h, %g, %b {eps = 1.0e-03 : f32} : tensor<2x8x16xf32>, tensor<16xf32>
  // CHECK: plan.rmsnorm %{{.*}}, %{{.*}} {eps = 1.000000e-03 : f32} : tensor<2x8x16xf32>, tensor<16xf32>
  %r = plan.rmsnorm %h, %g {eps = 1.0e-03 : f32} : tensor<2x8x16xf32>, tensor<16xf32>
  // CHECK: plan.rmsnorm %{{.*}}, %{{.*}} : tensor<2x8x16xf32>, tensor<16xf32>
  %r1 = plan.rmsnorm %h, %g : tensor<2x8x16xf32>, tensor<16xf32>
  // Batched lhs, 2-D weight.
  // CHECK: plan.matmul %{{.*}}, %{{.*}} : tensor<2x8x16xf32>, tensor<16x48xf32> -> tensor<2x8x48xf32>
  %qkv = plan.matmul %n, %w : tensor<2x8x16xf32>, tensor<16x48xf32> -> tensor<2x8x48xf32>
  // Grouped-query attention: 4 query heads, 2 key/value heads, 6 wide.
  // CHECK: plan.attention %{{.*}} {num_heads = 4 : i64, num_kv_heads = 2 : i64} : tensor<2x8x48xf32> -> tensor<2x8x24xf32>
  %a = plan.attention %qkv {num_heads = 4 : i64, num_kv_heads = 2 : i64} : tensor<2x8x48xf32> -> tensor<2x8x24xf32>
  // Rotary position embeddings of its query and key heads, and back.
  // CHECK: plan.rope %{{.*}} {num_heads = 4 : i64, num_kv_heads = 2 : i64, theta = 1.000000e+04 : f64} : tensor<2x8x48xf32>
  %rq = plan.rope %qkv {num_heads = 4 : i64, num_kv_heads = 2 : i64, theta = 1.0e+04 : f64} : tensor<2x8x48xf32>
  // CHECK: plan.rope %{{.*}} {inverse, num_heads = 4 : i64, num_kv_heads = 2 : i64, theta = 1.000000e+04 : f64} : tensor<2x8x48xf32>
  %rb = plan.rope %rq {inverse, num_heads = 4 : i64, num_kv_heads = 2 : i64, theta = 1.0e+04 : f64} : tensor<2x8x48xf32>
  // Batched lhs and rhs.
  // CHECK: plan.matmul %{{.*}}, %{{.*}} {transpose_rhs} : tensor<2x8x16xf32>, tensor<2x8x16xf32> -> tensor<2x8x8xf32>
  %s = plan.matmul %h, %h {transpose_rhs} : tensor<2x8x16xf32>, tensor<2x8x16xf32> -> tensor<2x8x8xf32>
  // CHECK: plan.matmul %{{.*}}, %{{.*}} {transpose_lhs} : tensor<2x8x16xf32>, tensor<2x8x16xf32> -> tensor<2x16x16xf32>
  %s1 = plan.matmul %h, %h {transpose_lhs} : tensor<2x8x16xf32>, tensor<2x8x16xf32> -> tensor<2x16x16xf32>
  // CHECK: plan.softmax %{{.*}} : tensor<2x8x8xf32>
  %p = plan.softmax %s : tensor<2x8x8xf32>
  // CHECK: plan.mul %{{.*}}, %{{.*}} : tensor<2x8x16xf32>
  %m = plan.mul %h, %r : tensor<2x8x16xf32>
  // CHECK: plan.sub %{{.*}}, %{{.*}} : tensor<2x8x16xf32>
  %d = plan.sub %h, %m : tensor<2x8x16xf32>
  // CHECK: plan.silu %{{.*}} : tensor<2x8x16xf32>
  %si = plan.silu %d : tensor<2x8x16xf32>
  // CHECK: plan.transpose %{{.*}} {permutation = array<i64: 0, 2, 1>} : tensor<2x8x16xf32> -> tensor<2x16x8xf32>
  %tr = plan.transpose %si {permutation = array<i64: 0, 2, 1>} : tensor<2x8x16xf32> -> tensor<2x16x8xf32>
  // CHECK: plan.reshape %{{.*}} : tensor<2x8x16xf32> -> tensor<16x16xf32>
  %rs = plan.reshape %si : tensor<2x8x16xf32> -> tensor<16x16xf32>
  // CHECK: plan.sharding_constraint %{{.*}} <@mesh, {{\[\[}}dp], []]> : tensor<16x16xf32>
  %c = plan.sharding_constraint %rs <@mesh, [[dp], []]> : tensor<16x16xf32>
  // CHECK: plan.sharding_constraint %{{.*}} <@mesh, {{\[\[}}], [tp]], partial = [dp]> : tensor<16x16xf32>
  // GENERIC: "plan.sharding_constraint"(%{{.*}}) <{sharding = #plan.sharding<@mesh, {{\[\[}}], [tp]], partial = [dp]>}>
  %c1 = plan.sharding_constraint %c <@mesh, [[], [tp]], partial = [dp]> : tensor<16x16xf32>
  // CHECK: plan.cross_entropy %{{.*}}, %{{.*}} : tensor<2x8x16xf32>, tensor<2x8xi32> -> tensor<f32>
  %l = plan.cross_entropy %h, %t : tensor<2x8x16xf32>, tensor<2x8xi32> -> tensor<f32>
  return
}

// CHECK-LABEL: func.func @pos_embedding
func.func @pos_embedding(%x: tensor<2x8x16xf32>, %t: tensor<32x16xf32>) -> tensor<2x8x16xf32> {
  // CHECK: plan.pos_embedding %{{.*}}, %{{.*}} : tensor<2x8x16xf32>, tensor<32x16xf32>
  %0 = plan.pos_embedding %x, %t : tensor<2x8x16xf32>, tensor<32x16xf32>
  return %0 : tensor<2x8x16xf32>
}
