// RUN: plan-opt %s --split-input-file --verify-diagnostics

// One case per verifier error of the transformer, matmul, sharding_constraint
// and settings ops.

// expected-error @below {{unknown data source 'files'; expected "synthetic", "shards" or "cifar10"}}
plan.train {data = "files", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64}

// -----

// expected-error @below {{data = "shards" needs data_path}}
plan.train {data = "shards", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64}

// -----

// expected-error @below {{lr must be > 0}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 0.0 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64}

// -----

// expected-error @below {{micro_batch must be >= 1, got 0}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, micro_batch = 0 : i64}

// -----

// expected-error @below {{global_batch (8) must be a multiple of micro_batch (3)}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, micro_batch = 3 : i64}

// -----

// expected-error @below {{unknown precision 'fp8'; expected "fp32", "tf32", "bf16" or "fp16"}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, precision = "fp8"}

// -----

// expected-error @below {{unknown loss_scale 'static'; expected "none" or "dynamic"}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, precision = "fp16", loss_scale = "static"}

// -----

// expected-error @below {{unknown lr_schedule 'linear'; expected "constant" or "cosine"}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, lr_schedule = "linear"}

// -----

// expected-error @below {{loss_scale = "dynamic" is only for precision = "fp16" (got "bf16", which does not need loss scaling)}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, precision = "bf16", loss_scale = "dynamic"}

// -----

// expected-error @below {{grad_clip must be > 0 (leave it out to disable clipping), got 0}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, grad_clip = 0.0 : f64}

// -----

// expected-error @below {{warmup_steps must be >= 0}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, warmup_steps = -1 : i64}

// -----

// expected-error @below {{min_lr must be in [0, lr = 1.000000e-01], got 2.000000e-01}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, min_lr = 0.2 : f64}

// -----

// expected-error @below {{min_lr must be in [0, lr}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, min_lr = -1.0 : f64}

// -----

// expected-error @below {{decay_steps must be >= 1, got 0}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, decay_steps = 0 : i64}

// -----

// expected-error @below {{checkpoint_every must be >= 0 (0: never)}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, checkpoint_every = -2 : i64, checkpoint_dir = "/ckpt"}

// -----

// expected-error @below {{checkpoint_every = 10 needs checkpoint_dir}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64, checkpoint_every = 10 : i64}

// -----

// expected-error @below {{unknown schedule 'zb'; expected "gpipe", "1f1b", "interleaved_1f1b" or "zero_bubble"}}
plan.parallel {schedule = "zb"}

// -----

// expected-error @below {{unknown recompute 'some'; expected "none", "selective" or "full"}}
plan.parallel {recompute = "some"}

// -----

// expected-error @below {{unknown tensor_policy 'rows'; expected "none" or "megatron"}}
plan.parallel {tensor_policy = "rows"}

// -----

// expected-error @below {{microbatches must be >= 1, got 0}}
plan.parallel {microbatches = 0 : i64}

// -----

// expected-error @below {{virtual_stages must be >= 1, got 0}}
plan.parallel {schedule = "interleaved_1f1b", virtual_stages = 0 : i64}

// -----

// expected-error @below {{virtual_stages = 2 needs schedule = "interleaved_1f1b" ("1f1b" runs one stage per rank)}}
plan.parallel {virtual_stages = 2 : i64}

// -----

// expected-error @below {{zero_stage must be 0, 1, 2 or 3, got 4}}
plan.parallel {zero_stage = 4 : i64}

// -----

// expected-error @below {{bucket_mb must be > 0, got -1}}
plan.parallel {bucket_mb = -1.0 : f64}

// -----

// expected-error @below {{stage_boundaries must be > 0 and strictly increasing (the first layer of each stage after the first), got 4 after 4}}
plan.parallel {stage_boundaries = array<i64: 4, 4>}

// -----

// expected-error @below {{stage_boundaries must be > 0 and strictly increasing (the first layer of each stage after the first), got 0}}
plan.parallel {stage_boundaries = array<i64: 0, 4>}

// -----

// expected-error @below {{nodes must be >= 1}}
plan.cluster {nodes = 0 : i64, gpus_per_node = 8 : i64, gpu = "H100", intra_node_gbps = 450.0 : f64, inter_node_gbps = 50.0 : f64}

// -----

// expected-error @below {{gpus_per_node must be >= 1}}
plan.cluster {nodes = 1 : i64, gpus_per_node = -8 : i64, gpu = "H100", intra_node_gbps = 450.0 : f64, inter_node_gbps = 50.0 : f64}

// -----

// expected-error @below {{gpu must name the accelerator (e.g. "H100")}}
plan.cluster {nodes = 1 : i64, gpus_per_node = 8 : i64, gpu = "", intra_node_gbps = 450.0 : f64, inter_node_gbps = 50.0 : f64}

// -----

// expected-error @below {{intra_node_gbps must be > 0}}
plan.cluster {nodes = 1 : i64, gpus_per_node = 8 : i64, gpu = "H100", intra_node_gbps = 0.0 : f64, inter_node_gbps = 50.0 : f64}

// -----

// expected-error @below {{inter_node_gbps must be > 0}}
plan.cluster {nodes = 1 : i64, gpus_per_node = 8 : i64, gpu = "H100", intra_node_gbps = 450.0 : f64, inter_node_gbps = -5.0 : f64}

// -----

func.func @f(%a: tensor<8xf32>, %b: tensor<8x4xf32>) {
  // expected-error @below {{expects an lhs of rank >= 2, got 'tensor<8xf32>'}}
  %0 = plan.matmul %a, %b : tensor<8xf32>, tensor<8x4xf32> -> tensor<4xf32>
  return
}

// -----

func.func @f(%a: tensor<2x8x4xf32>, %b: tensor<3x2x4x4xf32>) {
  // expected-error @below {{expects a 2-D rhs or one of the lhs's rank 3, got 'tensor<3x2x4x4xf32>'}}
  %0 = plan.matmul %a, %b : tensor<2x8x4xf32>, tensor<3x2x4x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @f(%a: tensor<2x8x4xf32>, %b: tensor<3x4x4xf32>) {
  // expected-error @below {{batch dimensions of the lhs 'tensor<2x8x4xf32>' and the rhs 'tensor<3x4x4xf32>' differ}}
  %0 = plan.matmul %a, %b : tensor<2x8x4xf32>, tensor<3x4x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @f(%a: tensor<2x8x4xf32>, %b: tensor<4x6xf32>) {
  // expected-error @below {{result must be 2x8x6, got 'tensor<8x6xf32>'}}
  %0 = plan.matmul %a, %b : tensor<2x8x4xf32>, tensor<4x6xf32> -> tensor<8x6xf32>
  return
}

// -----

func.func @f(%a: tensor<2x8x4xf32>, %b: tensor<2x8x4xf32>) {
  // expected-error @below {{contracts a dimension of size 4 with one of size 8}}
  %0 = plan.matmul %a, %b : tensor<2x8x4xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @f(%a: tensor<f32>) {
  // expected-error @below {{expects a tensor of rank >= 1 (softmax runs over the last dimension)}}
  %0 = plan.softmax %a : tensor<f32>
  return
}

// -----

func.func @f(%i: tensor<i32>, %t: tensor<64x16xf32>) {
  // expected-error @below {{expects ids of rank >= 1, got 'tensor<i32>'}}
  %0 = plan.embedding %i, %t : tensor<i32>, tensor<64x16xf32> -> tensor<16xf32>
  return
}

// -----

func.func @f(%i: tensor<8xi32>, %t: tensor<64xf32>) {
  // expected-error @below {{expects a 2-D table [vocab, dim], got 'tensor<64xf32>'}}
  %0 = plan.embedding %i, %t : tensor<8xi32>, tensor<64xf32> -> tensor<8xf32>
  return
}

// -----

func.func @f(%i: tensor<2x8xi32>, %t: tensor<64x16xf32>) {
  // expected-error @below {{result must be 'tensor<2x8x16xf32>' (the ids' shape followed by the table's row width), got 'tensor<2x16xf32>'}}
  %0 = plan.embedding %i, %t : tensor<2x8xi32>, tensor<64x16xf32> -> tensor<2x16xf32>
  return
}

// -----

func.func @f(%i: tensor<8xf32>, %t: tensor<64x16xf32>) {
  // expected-error @below {{operand #0 must be ranked tensor of 32-bit signless integer values}}
  %0 = plan.embedding %i, %t : tensor<8xf32>, tensor<64x16xf32> -> tensor<8x16xf32>
  return
}

// -----

func.func @f(%x: tensor<f32>, %g: tensor<16xf32>) {
  // expected-error @below {{expects an input of rank >= 1, got 'tensor<f32>'}}
  %0 = plan.layernorm %x, %g, %g : tensor<f32>, tensor<16xf32>
  return
}

// -----

func.func @f(%x: tensor<8x16xf32>, %g: tensor<8xf32>) {
  // expected-error @below {{gamma and beta 'tensor<8xf32>' must be 1-D with the size of the last dimension of the input 'tensor<8x16xf32>' (16)}}
  %0 = plan.layernorm %x, %g, %g : tensor<8x16xf32>, tensor<8xf32>
  return
}

// -----

func.func @f(%x: tensor<8x16xf32>, %g: tensor<16xf32>) {
  // expected-error @below {{eps must be >= 0}}
  %0 = plan.layernorm %x, %g, %g {eps = -1.0 : f32} : tensor<8x16xf32>, tensor<16xf32>
  return
}

// -----

func.func @f(%x: tensor<8x16xf32>, %g: tensor<16x1xf32>) {
  // expected-error @below {{gamma 'tensor<16x1xf32>' must be 1-D with the size of the last dimension of the input 'tensor<8x16xf32>' (16)}}
  %0 = plan.rmsnorm %x, %g : tensor<8x16xf32>, tensor<16x1xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8x48xf32>) {
  // expected-error @below {{num_heads and num_kv_heads must be >= 1, got 4 and 0}}
  %0 = plan.attention %x {num_heads = 4 : i64, num_kv_heads = 0 : i64} : tensor<2x8x48xf32> -> tensor<2x8x24xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8x48xf32>) {
  // expected-error @below {{num_heads (4) must be a multiple of num_kv_heads (3)}}
  %0 = plan.attention %x {num_heads = 4 : i64, num_kv_heads = 3 : i64} : tensor<2x8x48xf32> -> tensor<2x8x24xf32>
  return
}

// -----

func.func @f(%x: tensor<8x48xf32>) {
  // expected-error @below {{expects qkv of rank 3 [batch, seq, (num_heads + 2 * num_kv_heads) * head_dim], got 'tensor<8x48xf32>'}}
  %0 = plan.attention %x {num_heads = 4 : i64, num_kv_heads = 4 : i64} : tensor<8x48xf32> -> tensor<8x16xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8x50xf32>) {
  // expected-error @below {{last dimension of qkv (50) must be a positive multiple of num_heads + 2 * num_kv_heads = 12}}
  %0 = plan.attention %x {num_heads = 4 : i64, num_kv_heads = 4 : i64} : tensor<2x8x50xf32> -> tensor<2x8x16xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8x48xf32>) {
  // expected-error @below {{result must be 'tensor<2x8x16xf32>' (num_heads * head_dim = 4 * 4), got 'tensor<2x8x48xf32>'}}
  %0 = plan.attention %x {num_heads = 4 : i64, num_kv_heads = 4 : i64} : tensor<2x8x48xf32> -> tensor<2x8x48xf32>
  return
}

// -----

func.func @f(%x: tensor<f32>, %t: tensor<i32>) {
  // expected-error @below {{expects logits of rank >= 1, got 'tensor<f32>'}}
  %0 = plan.cross_entropy %x, %t : tensor<f32>, tensor<i32> -> tensor<f32>
  return
}

// -----

func.func @f(%x: tensor<2x8x16xf32>, %t: tensor<2x16xi32>) {
  // expected-error @below {{targets must be 'tensor<2x8xi32>' (the logits' shape without the class dimension), got 'tensor<2x16xi32>'}}
  %0 = plan.cross_entropy %x, %t : tensor<2x8x16xf32>, tensor<2x16xi32> -> tensor<f32>
  return
}

// -----

func.func @f(%x: tensor<8x4xf32>) {
  // expected-error @below {{permutation has 3 entries but the input has rank 2}}
  %0 = plan.transpose %x {permutation = array<i64: 1, 0, 2>} : tensor<8x4xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @f(%x: tensor<8x4xf32>) {
  // expected-error @below {{permutation [1, 1] must list each of 0..1 once}}
  %0 = plan.transpose %x {permutation = array<i64: 1, 1>} : tensor<8x4xf32> -> tensor<4x4xf32>
  return
}

// -----

func.func @f(%x: tensor<8x4xf32>) {
  // expected-error @below {{result must be 'tensor<4x8xf32>', got 'tensor<8x4xf32>'}}
  %0 = plan.transpose %x {permutation = array<i64: 1, 0>} : tensor<8x4xf32> -> tensor<8x4xf32>
  return
}

// -----

func.func @f(%x: tensor<?x4xf32>) {
  // expected-error @below {{expects static shapes}}
  %0 = plan.reshape %x : tensor<?x4xf32> -> tensor<32xf32>
  return
}

// -----

func.func @f(%x: tensor<8x4xf32>) {
  // expected-error @below {{cannot reshape 'tensor<8x4xf32>' (32 elements) to 'tensor<30xf32>' (30 elements)}}
  %0 = plan.reshape %x : tensor<8x4xf32> -> tensor<30xf32>
  return
}

// -----

plan.mesh @mesh axes = ["dp"] shape = [2]
func.func @f(%x: tensor<8x4xf32>) {
  // expected-error @below {{sharding #plan.sharding<@mesh, [[dp]]> has 1 dimensions but the value has rank 2}}
  %0 = plan.sharding_constraint %x <@mesh, [[dp]]> : tensor<8x4xf32>
  return
}

// -----

plan.mesh @mesh axes = ["dp"] shape = [2]
func.func @f(%x: tensor<8x4xf32>) {
  // expected-error @below {{sharding refers to @grid, which is not a plan.mesh}}
  %0 = plan.sharding_constraint %x <@grid, [[dp], []]> : tensor<8x4xf32>
  return
}

// -----

plan.mesh @mesh axes = ["dp"] shape = [2]
func.func @f(%x: tensor<8x4xf32>) {
  // expected-error @below {{mesh axis 'tp' is not an axis of @mesh}}
  %0 = plan.sharding_constraint %x <@mesh, [[], [tp]]> : tensor<8x4xf32>
  return
}

// -----

plan.mesh @mesh axes = ["dp"] shape = [2]
func.func @f(%x: tensor<8x4xf32>) {
  // expected-error @below {{mesh axis 'tp' is not an axis of @mesh}}
  %0 = plan.sharding_constraint %x <@mesh, [[], []], partial = [tp]> : tensor<8x4xf32>
  return
}

// -----

plan.mesh @mesh axes = ["dp"] shape = [3]
func.func @f(%x: tensor<8x4xf32>) {
  // expected-error @below {{dimension 0 of size 8 cannot be split into 3 equal parts}}
  %0 = plan.sharding_constraint %x <@mesh, [[dp], []]> : tensor<8x4xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8x16xf32>, %t: tensor<4x16xf32>) {
  // expected-error @below {{adds rows 0..S-1 of a [max_seq, D] table to a [B, S, D] input}}
  %0 = plan.pos_embedding %x, %t : tensor<2x8x16xf32>, tensor<4x16xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8x36xf32>) {
  // expected-error @below {{the head dimension (3) must be even: rotate-half pairs its halves}}
  %0 = plan.rope %x {num_heads = 4 : i64, num_kv_heads = 4 : i64, theta = 1.0e+04 : f64} : tensor<2x8x36xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8x48xf32>) {
  // expected-error @below {{theta must be > 0}}
  %0 = plan.rope %x {num_heads = 4 : i64, num_kv_heads = 4 : i64, theta = 0.0 : f64} : tensor<2x8x48xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8x48xf32>) {
  // expected-error @below {{num_heads (4) must be a positive multiple of num_kv_heads (3)}}
  %0 = plan.rope %x {num_heads = 4 : i64, num_kv_heads = 3 : i64, theta = 1.0e+04 : f64} : tensor<2x8x48xf32>
  return
}

// -----

func.func @f(%x: tensor<8x48xf32>) {
  // expected-error @below {{expects qkv [batch, seq, (num_heads + 2 * num_kv_heads) * head_dim], got 'tensor<8x48xf32>'}}
  %0 = plan.rope %x {num_heads = 4 : i64, num_kv_heads = 4 : i64, theta = 1.0e+04 : f64} : tensor<8x48xf32>
  return
}
