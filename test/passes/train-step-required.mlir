// RUN: not plan-opt %s --plan-recompute=policy=full 2>&1 | FileCheck %s
// RUN: not plan-opt %s --plan-loss-scale 2>&1 | FileCheck %s
// Passes that rewrite the train step say so when there is none (before
// plan-autodiff).
// CHECK: error: expected a train step; run plan-autodiff first
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, loss_scale = "dynamic", lr = 5.000000e-02 : f64, optimizer = "sgd", precision = "fp16", seed = 1 : i64, steps = 3 : i64}
