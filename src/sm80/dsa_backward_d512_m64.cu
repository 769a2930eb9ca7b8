// The portable DSA backward kernel for D_qk = 512, 64 heads per CTA (dsa_backward_launch.cuh).
#include "sm80/dsa_backward_launch.cuh"

namespace sa::portable::dsa_bwd {
template void launch_main<512, 64>(const DsaBwdParams&, int64_t, int, cudaStream_t);
}  // namespace sa::portable::dsa_bwd
