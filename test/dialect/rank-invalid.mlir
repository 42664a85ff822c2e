// RUN: plan-opt %s --split-input-file --verify-diagnostics

// expected-error @below {{role must be "input" or "label", got "weights"}}
rank.input_decl @x : memref<4x4xf32> role "weights"

// -----

func.func @step() {
  // expected-error @below {{refers to @nope, which is not a rank.param_decl}}
  %w = rank.param @nope : memref<4x2xf32>
  return
}

// -----

rank.param_decl @w : memref<4x2xf32> init <zeros>
func.func @step() {
  // expected-error @below {{has type 'memref<2x4xf32>' but @w is declared as 'memref<4x2xf32>'}}
  %w = rank.param @w : memref<2x4xf32>
  return
}

// -----

func.func @step(%a: memref<4x4xf32>, %b: memref<4x2xf32>, %c: memref<4x4xf32>) {
  // expected-error @below {{shapes do not agree}}
  rank.matmul %a, %b into %c {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32> -> memref<4x4xf32>
  return
}

// -----

// expected-error @below {{has an initializer but is optimizer state (zero at the start); only a 'buffer' takes 'init'}}
rank.state_decl @m : memref<4xf32> init <ones>

// -----

func.func @adamw(%w: memref<4xf32>, %m: memref<4xf32>, %v: memref<4xf32>) {
  // expected-error @below {{takes 'max_norm' exactly when it is clipped by a sum of squares}}
  rank.adamw_update %w, %w, %m, %v {beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, lr = 1.0e-3 : f32, max_norm = 1.0 : f32, weight_decay = 0.1 : f32} : memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<4xf32>
  return
}

// -----

func.func @adamw(%w: memref<4xf32>, %m: memref<4xf32>, %v: memref<4xf32>) {
  // expected-error @below {{clips by a sum of squares of one element, got 'memref<4xf32>'}}
  rank.adamw_update %w, %w, %m, %v clipped by %v {beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, lr = 1.0e-3 : f32, max_norm = 1.0 : f32, weight_decay = 0.1 : f32} : memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<4xf32>
  return
}

// -----

func.func @adamw(%w: memref<4xf32>, %m: memref<4xf32>, %v: memref<4xf32>, %sq: memref<f32>) {
  // expected-error @below {{max_norm must be > 0, got 0}}
  rank.adamw_update %w, %w, %m, %v clipped by %sq {beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, lr = 1.0e-3 : f32, max_norm = 0.0 : f32, weight_decay = 0.1 : f32} : memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<f32>
  return
}

// -----

func.func @routed(%x: memref<2x4x8xf32>, %c: memref<4x4x2xi32>, %out: memref<4x4x6xf32>) {
  // expected-error @below {{expects a block and the group's whole of one element type, differing only in dimension 0 by a whole factor, got 'memref<2x4x8xf32>' and 'memref<4x4x6xf32>'}}
  rank.routed_all_gather %x routed by %c into %out over "ep" {experts_per_rank = 2 : i64} : memref<2x4x8xf32>, memref<4x4x2xi32> -> memref<4x4x6xf32>
  return
}

// -----

func.func @routed(%x: memref<4x4x8xf32>, %c: memref<2x4x2xi32>, %out: memref<2x4x8xf32>) {
  // expected-error @below {{expects the group's choices with 16 rows, got 'memref<2x4x2xi32>'}}
  rank.routed_reduce_scatter %x routed by %c into %out over "ep" {experts_per_rank = 2 : i64} : memref<4x4x8xf32>, memref<2x4x2xi32> -> memref<2x4x8xf32>
  return
}

// -----

func.func @routed(%x: memref<2x4x8xf32>, %c: memref<4x4x2xi32>, %out: memref<4x4x8xf32>) {
  // expected-error @below {{experts_per_rank must be >= 1, got 0}}
  rank.routed_all_gather %x routed by %c into %out over "ep" {experts_per_rank = 0 : i64} : memref<2x4x8xf32>, memref<4x4x2xi32> -> memref<4x4x8xf32>
  return
}

// -----

func.func @matmul_bias(%a: memref<4x4xf32>, %b: memref<4x2xf32>, %bias: memref<4xf32>, %c: memref<4x2xf32>) {
  // expected-error @below {{expects a bias of out's last dim (2), got 'memref<4xf32>'}}
  rank.matmul_bias %a, %b, %bias into %c {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32>, memref<4xf32> -> memref<4x2xf32>
  return
}

// -----

func.func @matmul_bias(%a: memref<4x4xbf16>, %b: memref<4x2xbf16>, %bias: memref<2xf32>, %c: memref<4x2xbf16>) {
  // expected-error @below {{expects a bias of out's element type ('bf16'), got 'memref<2xf32>'}}
  rank.matmul_bias %a, %b, %bias into %c {transpose_lhs = false, transpose_rhs = false} : memref<4x4xbf16>, memref<4x2xbf16>, memref<2xf32> -> memref<4x2xbf16>
  return
}

// -----

func.func @matmul_bias(%a: memref<4x4xf32>, %b: memref<3x2xf32>, %bias: memref<2xf32>, %c: memref<4x2xf32>) {
  // expected-error @below {{shapes do not agree}}
  rank.matmul_bias %a, %b, %bias into %c {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<3x2xf32>, memref<2xf32> -> memref<4x2xf32>
  return
}

// -----

func.func @matmul_bias_gelu(%a: memref<4x4xf32>, %b: memref<4x2xf32>, %bias: memref<2xf32>, %c: memref<4x2xf32>) {
  // expected-error @below {{expects pre and out in two buffers (the backward reads pre)}}
  rank.matmul_bias_gelu %a, %b, %bias into %c, %c {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32>, memref<2xf32> -> memref<4x2xf32>, memref<4x2xf32>
  return
}

// -----

func.func @matmul_bias_gelu(%a: memref<4x4xf32>, %b: memref<4x2xf32>, %bias: memref<2xf32>, %c: memref<4x2xf32>, %g: memref<4x2xbf16>) {
  // expected-error @below {{expects pre and out of one type, got 'memref<4x2xf32>' and 'memref<4x2xbf16>'}}
  rank.matmul_bias_gelu %a, %b, %bias into %c, %g {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32>, memref<2xf32> -> memref<4x2xf32>, memref<4x2xbf16>
  return
}

// -----

func.func @matmul_bias_gelu(%a: memref<4x4xf32>, %b: memref<4x2xf32>, %bias: memref<4xf32>, %c: memref<4x2xf32>, %g: memref<4x2xf32>) {
  // expected-error @below {{expects a bias of out's last dim (2), got 'memref<4xf32>'}}
  rank.matmul_bias_gelu %a, %b, %bias into %c, %g {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32>, memref<4xf32> -> memref<4x2xf32>, memref<4x2xf32>
  return
}

// -----

func.func @matmul_dgelu(%a: memref<4x4xf32>, %b: memref<4x2xf32>, %c: memref<4x2xf32>) {
  // expected-error @below {{expects pre and out in two buffers}}
  rank.matmul_dgelu %a, %b, %c into %c {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32>, memref<4x2xf32> -> memref<4x2xf32>
  return
}

// -----

func.func @matmul_dgelu(%a: memref<4x4xf32>, %b: memref<4x2xf32>, %p: memref<4x2xbf16>, %c: memref<4x2xf32>) {
  // expected-error @below {{expects pre and out of one type, got 'memref<4x2xbf16>' and 'memref<4x2xf32>'}}
  rank.matmul_dgelu %a, %b, %p into %c {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32>, memref<4x2xbf16> -> memref<4x2xf32>
  return
}

// -----

func.func @matmul_bias_grad(%a: memref<4x4xf32>, %b: memref<2x4xf32>, %c: memref<4x2xf32>, %db: memref<4xf32>) {
  // expected-error @below {{expects rhs not transposed (the bias gradient sums its rows)}}
  rank.matmul_bias_grad %a, %b into %c, %db {transpose_lhs = true, transpose_rhs = true} : memref<4x4xf32>, memref<2x4xf32> -> memref<4x2xf32>, memref<4xf32>
  return
}

// -----

func.func @matmul_bias_grad(%a: memref<4x4xf32>, %b: memref<4x2xf32>, %c: memref<4x2xf32>, %db: memref<4xf32>) {
  // expected-error @below {{expects a bias gradient of rhs's last dim (2), got 'memref<4xf32>'}}
  rank.matmul_bias_grad %a, %b into %c, %db {transpose_lhs = true, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32> -> memref<4x2xf32>, memref<4xf32>
  return
}

// -----

func.func @matmul_bias_grad(%a: memref<4x4xf32>, %b: memref<4x2xf32>, %c: memref<4x2xf32>, %db: memref<2xbf16>) {
  // expected-error @below {{expects a bias gradient of rhs's element type or f32, got 'memref<2xbf16>'}}
  rank.matmul_bias_grad %a, %b into %c, %db {transpose_lhs = true, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32> -> memref<4x2xf32>, memref<2xbf16>
  return
}

// -----

// expected-error @below {{keeps a copy in bf16 or f16, got 'f32'}}
rank.param_decl @w : memref<4xf32> init <zeros> copy f32

// -----

rank.param_decl @w : memref<4xf32> init <zeros>
func.func @step() {
  // expected-error @below {{@w is declared without a 'copy' type}}
  %c = rank.param_copy @w : memref<4xbf16>
  return
}

// -----

rank.param_decl @w : memref<4xf32> init <zeros> copy bf16
func.func @step() {
  // expected-error @below {{has type 'memref<4xf16>' but @w's copy is 'memref<4xbf16>'}}
  %c = rank.param_copy @w : memref<4xf16>
  return
}

// -----

func.func @sgd(%w: memref<4xf32>, %c: memref<2xbf16>) {
  // expected-error @below {{writes a copy 'memref<2xbf16>' of a parameter 'memref<4xf32>': expected its shape in bf16 or f16 of an f32 parameter}}
  rank.sgd_update %w, %w copy %c {lr = 0.1 : f32} : memref<4xf32>, memref<4xf32>, memref<2xbf16>
  return
}

// -----

rank.param_decl @a : memref<4xf32> init <zeros> copy bf16
rank.param_decl @b : memref<4xf32> init <zeros> copy bf16
func.func @sgd(%g: memref<4xf32>) {
  %a = rank.param @a : memref<4xf32>
  %cb = rank.param_copy @b : memref<4xbf16>
  // expected-error @below {{writes a copy that is not the rank.param_copy of a}}
  rank.sgd_update %a, %g copy %cb {lr = 0.1 : f32} : memref<4xf32>, memref<4xf32>, memref<4xbf16>
  return
}

// -----

func.func @norm(%x: memref<2x4xbf16>, %g: memref<4xbf16>, %dg: memref<8xf32>) {
  // expected-error @below {{has a parameter gradient 'memref<8xf32>': expected 'memref<4xbf16>' or its shape in f32}}
  rank.rmsnorm_grad %x, %g, %x into %x, %dg {eps = 1.0e-5 : f32} : memref<2x4xbf16>, memref<4xbf16> -> memref<8xf32>
  return
}

// -----

func.func @layernorm_grad(%x: memref<4x8xbf16>, %g: memref<8xbf16>, %dy: memref<4x8xbf16>, %r: memref<4x8xf32>, %dx: memref<4x8xbf16>, %dg: memref<8xf32>, %db: memref<8xf32>) {
  // expected-error @+1 {{expects the residual of the input gradient's type, got 'memref<4x8xf32>' and 'memref<4x8xbf16>'}}
  rank.layernorm_grad %x, %g, %dy plus %r into %dx, %dg, %db {eps = 1.0e-05 : f32} : memref<4x8xbf16>, memref<8xbf16> plus memref<4x8xf32> -> memref<8xf32>
  return
}

// -----

func.func @rmsnorm_grad(%x: memref<4x8xf32>, %g: memref<8xf32>, %dy: memref<4x8xf32>, %dx: memref<4x8xf32>, %dg: memref<8xf32>) {
  // expected-error @+1 {{expects the residual and the input gradient in two buffers}}
  rank.rmsnorm_grad %x, %g, %dy plus %dx into %dx, %dg {eps = 1.0e-05 : f32} : memref<4x8xf32>, memref<8xf32> plus memref<4x8xf32> -> memref<8xf32>
  return
}

// -----

func.func @matmul(%a: memref<4x4xf32>, %b: memref<4x2xf32>, %r: memref<4x2xbf16>, %c: memref<4x2xf32>) {
  // expected-error @+1 {{expects the residual of out's type, got 'memref<4x2xbf16>' and 'memref<4x2xf32>'}}
  rank.matmul %a, %b plus %r into %c {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32> plus memref<4x2xbf16> -> memref<4x2xf32>
  return
}

// -----

func.func @matmul(%a: memref<4x4xf32>, %b: memref<4x2xf32>, %r: memref<4x2xf32>, %c: memref<4x2xf32>) {
  // expected-error @+1 {{adds either a residual or its own output (accumulate), not both}}
  rank.matmul %a, %b plus %r into %c {transpose_lhs = false, transpose_rhs = false, accumulate} : memref<4x4xf32>, memref<4x2xf32> plus memref<4x2xf32> -> memref<4x2xf32>
  return
}

// -----

func.func @matmul(%a: memref<4x4xf32>, %b: memref<4x2xf32>, %c: memref<4x2xf32>) {
  // expected-error @+1 {{expects the residual and out in two buffers}}
  rank.matmul %a, %b plus %c into %c {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32> plus memref<4x2xf32> -> memref<4x2xf32>
  return
}

// -----

func.func @cp_grad(%qkv: memref<2x8x128xbf16>, %kv: memref<2x16x64xbf16>, %dout: memref<2x8x64xbf16>, %dqkv: memref<2x8x128xbf16>, %dkv: memref<2x16x64xf32>, %o: memref<2x8x64xbf16>) {
  // expected-error @+1 {{takes the forward's output and log-sum-exp together, or neither}}
  "rank.attention_cp_grad"(%qkv, %kv, %dout, %dqkv, %dkv, %o) <{operandSegmentSizes = array<i32: 1, 1, 1, 1, 1, 1, 0>, num_heads = 4 : i64, num_kv_heads = 2 : i64, axis = "cp"}> : (memref<2x8x128xbf16>, memref<2x16x64xbf16>, memref<2x8x64xbf16>, memref<2x8x128xbf16>, memref<2x16x64xf32>, memref<2x8x64xbf16>) -> ()
  return
}

// -----

func.func @cp_grad(%qkv: memref<2x8x128xbf16>, %kv: memref<2x16x64xbf16>, %dout: memref<2x8x64xbf16>, %dqkv: memref<2x8x128xbf16>, %dkv: memref<2x16x64xf32>, %o: memref<2x8x64xf32>, %lse: memref<64xf32>) {
  // expected-error @+1 {{reads the forward's output 'memref<2x8x64xf32>' beside its gradient 'memref<2x8x64xbf16>': they must match}}
  rank.attention_cp_grad %qkv, %kv, %dout kept %o, %lse into %dqkv, %dkv over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x16x64xbf16>, memref<2x8x64xbf16> kept memref<2x8x64xf32>, memref<64xf32> -> memref<2x8x128xbf16>, memref<2x16x64xf32>
  return
}

// -----

func.func @ring_lse(%qkv: memref<2x8x128xbf16>, %out: memref<2x8x64xbf16>, %lse: memref<2x8x4xf32>) {
  // expected-error @+1 {{keeps each row's log-sum-exp in an f32 [B, H, L] buffer (2x4x8), got 'memref<2x8x4xf32>'}}
  rank.attention_ring %qkv into %out keeping %lse over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16> -> memref<2x8x64xbf16> keeping memref<2x8x4xf32>
  return
}

// -----

func.func @ring_grad(%qkv: memref<2x8x128xbf16>, %dout: memref<2x8x64xbf16>, %dqkv: memref<2x8x128xbf16>, %o: memref<2x8x64xbf16>) {
  // expected-error @+1 {{takes the forward's output and log-sum-exp together, or neither}}
  "rank.attention_ring_grad"(%qkv, %dout, %dqkv, %o) <{operandSegmentSizes = array<i32: 1, 1, 1, 1, 0>, num_heads = 4 : i64, num_kv_heads = 2 : i64, axis = "cp"}> : (memref<2x8x128xbf16>, memref<2x8x64xbf16>, memref<2x8x128xbf16>, memref<2x8x64xbf16>) -> ()
  return
}

// -----

func.func @ring_grad(%qkv: memref<2x8x128xbf16>, %dout: memref<2x8x64xbf16>, %dqkv: memref<2x8x128xbf16>, %o: memref<2x8x64xf32>, %lse: memref<2x4x8xf32>) {
  // expected-error @+1 {{reads the forward's output 'memref<2x8x64xf32>' beside its gradient 'memref<2x8x64xbf16>': they must match}}
  rank.attention_ring_grad %qkv, %dout kept %o, %lse into %dqkv over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x8x64xbf16> kept memref<2x8x64xf32>, memref<2x4x8xf32> -> memref<2x8x128xbf16>
  return
}

// -----

func.func @ring_grad(%qkv: memref<2x8x128xbf16>, %dout: memref<2x8x64xbf16>, %dqkv: memref<2x8x128xbf16>, %o: memref<2x8x64xbf16>, %lse: memref<64xf32>) {
  // expected-error @+1 {{keeps each row's log-sum-exp in an f32 [B, H, L] buffer (2x4x8), got 'memref<64xf32>'}}
  rank.attention_ring_grad %qkv, %dout kept %o, %lse into %dqkv over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x8x64xbf16> kept memref<2x8x64xbf16>, memref<64xf32> -> memref<2x8x128xbf16>
  return
}
