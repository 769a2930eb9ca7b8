// TMA descriptors of BHSD-strided bf16 attention tensors for the Hopper kernels (host side).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

#include "common/problem.hpp"

namespace sa::sm90 {

// "" when a [B, H, S, D] bf16 tensor can be described by a TMA descriptor: 16-byte aligned base,
// contiguous last dim, every stride of a dimension longer than 1 a positive multiple of 16 bytes
// below 2^40 (strides of length-1 dimensions are never used and get a legal stand-in); else the
// reason, naming the tensor.
std::string check_tma_tensor(const char* name, const Bhsd& t, int64_t B, int64_t H, int64_t S);

// Dims (D, S, H, B), box (64, box_rows, 1, 1), 128-byte swizzle: a box lands in (or, for a TMA
// store, leaves from) one 64-column panel of a kernel's shared tiles; loaded rows past S read as
// 0, stored rows past S are not written. `op` prefixes errors ("sm90 bsa_forward"). `dtype`: bf16
// or fp16.
CUtensorMap make_tensor_map(const char* op, const char* name, const Bhsd& t, int64_t B, int64_t H,
                            int64_t S, int64_t D, int box_rows, sa_dtype dtype = SA_DTYPE_BF16);

}  // namespace sa::sm90
