// RUN: plan-opt %s --split-input-file --verify-diagnostics
// Every verifier diagnostic of the convolutional-network ops.

func.func @rank(%x: tensor<2x3x8xf32>, %w: tensor<4x3x3x3xf32>) {
  // expected-error @below {{the input must be NCHW (rank 4)}}
  %y = plan.conv2d %x, %w {stride = array<i64: 1, 1>, padding = array<i64: 0, 0>, dilation = array<i64: 1, 1>, groups = 1 : i64} : tensor<2x3x8xf32>, tensor<4x3x3x3xf32> -> tensor<2x4x6x6xf32>
  return
}

// -----

func.func @pair(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>) {
  // expected-error @below {{stride must be two integers >= 1 ([height, width]), got 1 value}}
  %y = plan.conv2d %x, %w {stride = array<i64: 1>, padding = array<i64: 0, 0>, dilation = array<i64: 1, 1>, groups = 1 : i64} : tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32> -> tensor<2x4x6x6xf32>
  return
}

// -----

func.func @groups(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>) {
  // expected-error @below {{groups (2) must divide the input channels (3) and the output channels (4)}}
  %y = plan.conv2d %x, %w {stride = array<i64: 1, 1>, padding = array<i64: 0, 0>, dilation = array<i64: 1, 1>, groups = 2 : i64} : tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32> -> tensor<2x4x6x6xf32>
  return
}

// -----

func.func @filter_channels(%x: tensor<2x4x8x8xf32>, %w: tensor<4x4x3x3xf32>) {
  // expected-error @below {{must have C / groups = 2 input channels (dimension 1)}}
  %y = plan.conv2d %x, %w {stride = array<i64: 1, 1>, padding = array<i64: 0, 0>, dilation = array<i64: 1, 1>, groups = 2 : i64} : tensor<2x4x8x8xf32>, tensor<4x4x3x3xf32> -> tensor<2x4x6x6xf32>
  return
}

// -----

func.func @fit(%x: tensor<2x3x4x4xf32>, %w: tensor<4x3x3x3xf32>) {
  // expected-error @below {{(dilated, with padding) does not fit in the input}}
  %y = plan.conv2d %x, %w {stride = array<i64: 1, 1>, padding = array<i64: 0, 0>, dilation = array<i64: 3, 3>, groups = 1 : i64} : tensor<2x3x4x4xf32>, tensor<4x3x3x3xf32> -> tensor<2x4x1x1xf32>
  return
}

// -----

func.func @result(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>) {
  // expected-error @below {{the result must be 'tensor<2x4x6x6xf32>'}}
  %y = plan.conv2d %x, %w {stride = array<i64: 1, 1>, padding = array<i64: 0, 0>, dilation = array<i64: 1, 1>, groups = 1 : i64} : tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32> -> tensor<2x4x8x8xf32>
  return
}

// -----

func.func @grad(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %dy: tensor<2x4x8x8xf32>) {
  // expected-error @below {{the output gradient must be 'tensor<2x4x6x6xf32>'}}
  %dx, %dw = plan.conv2d_grad %x, %w, %dy {stride = array<i64: 1, 1>, padding = array<i64: 0, 0>, dilation = array<i64: 1, 1>, groups = 1 : i64} : tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>, tensor<2x4x8x8xf32>
  return
}

// -----

func.func @kind(%x: tensor<2x3x8x8xf32>) {
  // expected-error @below {{kind must be "max" or "avg", got "min"}}
  %y = plan.pool2d %x {kind = "min", kernel = array<i64: 2, 2>, stride = array<i64: 2, 2>, padding = array<i64: 0, 0>} : tensor<2x3x8x8xf32> -> tensor<2x3x4x4xf32>
  return
}

// -----

func.func @pool_padding(%x: tensor<2x3x8x8xf32>) {
  // expected-error @below {{padding must be at most half the kernel}}
  %y = plan.pool2d %x {kind = "max", kernel = array<i64: 2, 2>, stride = array<i64: 2, 2>, padding = array<i64: 2, 0>} : tensor<2x3x8x8xf32> -> tensor<2x3x6x4xf32>
  return
}

// -----

func.func @pool_fit(%x: tensor<2x3x2x2xf32>) {
  // expected-error @below {{the window does not fit in the input}}
  %y = plan.pool2d %x {kind = "avg", kernel = array<i64: 3, 3>, stride = array<i64: 1, 1>, padding = array<i64: 0, 0>} : tensor<2x3x2x2xf32> -> tensor<2x3x1x1xf32>
  return
}

// -----

func.func @pool_result(%x: tensor<2x3x8x8xf32>) {
  // expected-error @below {{the result must be 'tensor<2x3x4x4xf32>'}}
  %y = plan.pool2d %x {kind = "max", kernel = array<i64: 2, 2>, stride = array<i64: 2, 2>, padding = array<i64: 0, 0>} : tensor<2x3x8x8xf32> -> tensor<2x3x8x8xf32>
  return
}

// -----

func.func @pool_grad(%x: tensor<2x3x8x8xf32>, %dy: tensor<2x3x8x8xf32>) {
  // expected-error @below {{the output gradient must be 'tensor<2x3x4x4xf32>'}}
  %dx = plan.pool2d_grad %x, %dy {kind = "max", kernel = array<i64: 2, 2>, stride = array<i64: 2, 2>, padding = array<i64: 0, 0>} : tensor<2x3x8x8xf32>, tensor<2x3x8x8xf32>
  return
}

// -----

func.func @bias(%x: tensor<2x3x8x8xf32>, %b: tensor<4xf32>) {
  // expected-error @below {{must be 1-D with one value per channel (3)}}
  %y = plan.channel_bias_add %x, %b : tensor<2x3x8x8xf32>, tensor<4xf32>
  return
}

// -----

func.func @bias_rank(%x: tensor<8xf32>, %b: tensor<8xf32>) {
  // expected-error @below {{the input must have a channel dimension}}
  %y = plan.channel_bias_add %x, %b : tensor<8xf32>, tensor<8xf32>
  return
}

// -----

func.func @bias_grad(%dy: tensor<2x3x8x8xf32>) {
  // expected-error @below {{the result must be 'tensor<3xf32>'}}
  %db = plan.channel_bias_grad %dy : tensor<2x3x8x8xf32> -> tensor<4xf32>
  return
}

// -----

func.func @bias_grad_rank(%dy: tensor<8xf32>) {
  // expected-error @below {{the gradient must have a channel dimension}}
  %db = plan.channel_bias_grad %dy : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

func.func @gn_groups(%x: tensor<2x6x4x4xf32>, %g: tensor<6xf32>) {
  // expected-error @below {{groups (4) must divide the channels (6)}}
  %y = plan.group_norm %x, %g, %g {groups = 4 : i64} : tensor<2x6x4x4xf32>, tensor<6xf32>
  return
}

// -----

func.func @gn_gamma(%x: tensor<2x6x4x4xf32>, %g: tensor<3xf32>) {
  // expected-error @below {{must be 1-D with one value per channel (6)}}
  %y = plan.group_norm %x, %g, %g {groups = 3 : i64} : tensor<2x6x4x4xf32>, tensor<3xf32>
  return
}

// -----

func.func @bn_gamma(%x: tensor<2x6x4x4xf32>, %g: tensor<3xf32>) {
  // expected-error @below {{gamma and beta 'tensor<3xf32>' must be 1-D with one value per channel (6)}}
  %y = plan.batch_norm %x, %g, %g : tensor<2x6x4x4xf32>, tensor<3xf32>
  return
}

// -----

func.func @bn_rank(%x: tensor<6xf32>, %g: tensor<6xf32>) {
  // expected-error @below {{the input must be [N, C, ...]}}
  %y = plan.batch_norm %x, %g, %g : tensor<6xf32>, tensor<6xf32>
  return
}

// -----

func.func @bn_one_running(%x: tensor<2x6x4x4xf32>, %g: tensor<6xf32>) {
  // expected-error @below {{takes either no running statistics or two (mean, variance), got 1}}
  %y = plan.batch_norm %x, %g, %g running(%g : tensor<6xf32>) : tensor<2x6x4x4xf32>, tensor<6xf32>
  return
}

// -----

func.func @bn_running_type(%x: tensor<2x6x4x4xf32>, %g: tensor<6xf32>, %r: tensor<3xf32>) {
  // expected-error @below {{the running statistics must have the type of gamma, 'tensor<6xf32>', got 'tensor<3xf32>'}}
  %y = plan.batch_norm %x, %g, %g running(%r, %r : tensor<3xf32>, tensor<3xf32>) : tensor<2x6x4x4xf32>, tensor<6xf32>
  return
}

// -----

func.func @bn_momentum(%x: tensor<2x6x4x4xf32>, %g: tensor<6xf32>) {
  // expected-error @below {{momentum must be in [0, 1], got 2}}
  %y = plan.batch_norm %x, %g, %g running(%g, %g : tensor<6xf32>, tensor<6xf32>) {momentum = 2.0 : f32} : tensor<2x6x4x4xf32>, tensor<6xf32>
  return
}

// -----

func.func @moments_rank(%x: tensor<6xf32>) {
  // expected-error @below {{the input must be [N, C, ...], got 'tensor<6xf32>'}}
  %s, %q = plan.batch_norm_moments %x : tensor<6xf32> -> tensor<6xf32>
  return
}

// -----

func.func @moments_type(%x: tensor<2x6x4x4xf32>) {
  // expected-error @below {{the sums}}
  %s, %q = plan.batch_norm_moments %x : tensor<2x6x4x4xf32> -> tensor<4xf32>
  return
}

// -----

func.func @running_rank(%m: tensor<2x3xf32>) {
  // expected-error @below {{the statistics must be 1-D (one per channel), got 'tensor<2x3xf32>'}}
  %a, %b = plan.running_stats_update %m, %m, %m, %m {count = 8 : i64, momentum = 0.1 : f32} : tensor<2x3xf32>
  return
}

// -----

func.func @running_momentum(%m: tensor<3xf32>) {
  // expected-error @below {{momentum must be in [0, 1], got -5.000000e-01}}
  %a, %b = plan.running_stats_update %m, %m, %m, %m {count = 8 : i64, momentum = -0.5 : f32} : tensor<3xf32>
  return
}

// -----

func.func @running_count(%m: tensor<3xf32>) {
  // expected-error @below {{count must be >= 2 (the unbiased variance divides by count - 1), got 1}}
  %a, %b = plan.running_stats_update %m, %m, %m, %m {count = 1 : i64, momentum = 0.1 : f32} : tensor<3xf32>
  return
}
