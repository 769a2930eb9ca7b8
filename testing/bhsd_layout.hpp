// BSA attention tensors in either layout (SPEC 1): a logical [B, H, S, X] tensor is stored
// contiguously as [B, H, S, X] (BHSD) or [B, S, H, X] (BSHD).
#pragma once

#include <cstdint>
#include <vector>

#include "host_tensor.hpp"

namespace sa_testing {

// Physical shape of a logical [B, H, S, X] tensor stored in `layout`.
std::vector<int64_t> bsa_physical_shape(sa_layout layout, int64_t B, int64_t H, int64_t S,
                                        int64_t X);

// Flat index of logical element (b, h, s, x) of a contiguous tensor stored in `layout`.
int64_t bsa_index(const HostTensor& t, sa_layout layout, int64_t b, int64_t h, int64_t s,
                  int64_t x);

// The tensor's elements as doubles in logical [B, H, S, X] order, whatever its layout.
std::vector<double> bhsd_doubles(const HostTensor& t, sa_layout layout);

}  // namespace sa_testing
