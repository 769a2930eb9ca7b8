// A minimal sm_90a kernel that exercises an sm_90a-only instruction (setmaxnreg). It proves, on
// the device, that the Hopper objects of this build were compiled for the arch-specific target
// and load on the GPU (tests/test_gpu_smoke.cpp).
#pragma once

namespace sa::sm90 {

// Runs the probe on the current device; returns the value it wrote (42) or -1 when the
// kernel could not run (no device, or not an sm_90 device).
int toolchain_probe();

}  // namespace sa::sm90
