// The BSA backward's preprocess and conversion passes for packed (THD) batches (SPEC 4): the
// same contracts as bsa_backward_aux.hpp's, with the buffers laid out as cuda/bsa_packed_rows.hpp
// says ([H_q, Sq_pad] with Sq_pad = packed_stat_rows(T_q, B, block); [H_kv, Skv_pad = T_kv]).
// Each finds a row's sequence from cu_seqlens on the device (no host read). Kept in their own
// file so that the dense passes' module compiles to the code it had before packed batches.
// bsa_backward_aux.cu's launchers call these for p.meta.varlen().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/problem.hpp"

namespace sa::portable {

void launch_bwd_preprocess_packed(const BsaBwdProblem& p, int64_t Sq_pad, float* lse2,
                                  float* delta, float* dq_zero, uint32_t* u32_zero,
                                  int64_t u32_count, cudaStream_t stream);

// dq from the [H_q, Sq_pad, D] accumulator: row-major, or with `tiled` (the Hopper main kernel's
// bulk reductions) each sequence's 64-row tiles from its base row (dq_tiled_index_at).
void launch_bwd_convert_dq_packed(const BsaBwdProblem& p, int64_t Sq_pad, const float* dq_accum,
                                  bool tiled, cudaStream_t stream);

void launch_bwd_convert_dkv_packed(const BsaBwdProblem& p, int64_t Skv_pad, const float* dk_accum,
                                   const float* dv_accum, const int32_t* row_groups,
                                   cudaStream_t stream);

}  // namespace sa::portable
