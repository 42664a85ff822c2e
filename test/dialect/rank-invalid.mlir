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
