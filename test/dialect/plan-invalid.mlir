// RUN: plan-opt %s --split-input-file --verify-diagnostics

// expected-error @below {{has 2 axes but 1 sizes}}
plan.mesh @mesh axes = ["dp", "tp"] shape = [2]

// -----

// expected-error @below {{axis 'dp' is declared twice}}
plan.mesh @mesh axes = ["dp", "dp"] shape = [2, 2]

// -----

// expected-error @below {{axis 'dp' has size 0; sizes must be at least 1}}
plan.mesh @mesh axes = ["dp"] shape = [0]

// -----

// expected-error @below {{unknown optimizer 'lion'}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "lion", seed = 3 : i64, steps = 5 : i64}

// -----

// expected-error @below {{global_batch must be >= 1}}
plan.train {data = "synthetic", global_batch = 0 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64}

// -----

func.func @f(%a: tensor<8x4xf32>, %b: tensor<5x4xf32>) {
  // expected-error @below {{contracts a dimension of size 4 with one of size 5}}
  %0 = plan.matmul %a, %b : tensor<8x4xf32>, tensor<5x4xf32> -> tensor<8x4xf32>
  return
}

// -----

func.func @f(%a: tensor<8x4xf32>, %b: tensor<4x4xf32>) {
  // expected-error @below {{result must be 8x4, got 'tensor<8x5xf32>'}}
  %0 = plan.matmul %a, %b : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x5xf32>
  return
}

// -----

func.func @f(%a: tensor<8x4xf32>, %b: tensor<5xf32>) {
  // expected-error @below {{must be 1-D with the size of the last dimension of the input}}
  %0 = plan.bias_add %a, %b : tensor<8x4xf32>, tensor<5xf32>
  return
}

// -----

func.func @f(%a: tensor<8x4xf32>) {
  // expected-error @below {{must be 1-D with the size of the last dimension}}
  %0 = plan.bias_grad %a : tensor<8x4xf32> -> tensor<8xf32>
  return
}

// -----

// expected-error @below {{mesh axis 'dp' is used more than once in one sharding}}
func.func @f(%a: tensor<8x4xf32> {plan.sharding = #plan.sharding<@mesh, [[dp], [dp]]>}) {
  return
}

// -----

// expected-error @below {{unknown initializer 'xavier'}}
func.func @f(%a: tensor<8x4xf32> {plan.init = #plan.init<xavier>}) {
  return
}

// -----

// expected-error @below {{uniform initializer needs low < high}}
func.func @f(%a: tensor<8x4xf32> {plan.init = #plan.init<uniform, 1.0, 0.0>}) {
  return
}

// -----

// expected-error @below {{steps must be >= 0}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.0e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = -5 : i64}

// -----

func.func @sumsq_of_nothing() -> tensor<f32> {
  // expected-error @below {{expects at least one input}}
  %s = "plan.sumsq"() : () -> tensor<f32>
  return %s : tensor<f32>
}

// -----

func.func @clip_without_max_norm(%w: tensor<4xf32>, %g: tensor<4xf32>, %s: tensor<f32>) -> tensor<4xf32> {
  // expected-error @below {{takes 'max_norm' exactly when it is clipped by a sum of squares}}
  %0 = plan.sgd_update %w, %g clipped by %s {lr = 0.1 : f32} : tensor<4xf32>, tensor<f32>
  return %0 : tensor<4xf32>
}

// -----

func.func @clip_by_zero(%w: tensor<4xf32>, %g: tensor<4xf32>, %s: tensor<f32>) -> tensor<4xf32> {
  // expected-error @below {{max_norm must be > 0, got 0}}
  %0:3 = plan.adamw_update %w, %g, %w, %w clipped by %s {lr = 0.1 : f32, beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, weight_decay = 0.1 : f32, max_norm = 0.0 : f32} : tensor<4xf32>, tensor<f32>
  return %0#0 : tensor<4xf32>
}

// -----

func.func @norm(%x: tensor<2x4xbf16>, %g: tensor<4xbf16>) {
  // expected-error @below {{has a parameter gradient 'tensor<8xf32>': expected 'tensor<4xbf16>' or its shape in f32}}
  %0:3 = plan.layernorm_grad %x, %g, %x : tensor<2x4xbf16>, tensor<4xbf16> -> tensor<8xf32>
  return
}
