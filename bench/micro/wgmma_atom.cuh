// The microbenchmarks' wgmma atom: K-major 64 x N x 16, bf16 in, fp32 out, SS or (RS) with A from
// registers, as CuTe's selectors pick it. N not a multiple of 32 (e.g. 80) needs
// CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED defined before the CuTe headers.
#pragma once

#include <type_traits>

#include <cute/arch/mma_sm90.hpp>
#include <cute/tensor.hpp>

template <int N, bool RS>
using KMajorAtom = std::conditional_t<
    RS,
    decltype(cute::SM90::GMMA::rs_op_selector<cute::bfloat16_t, cute::bfloat16_t, float,
                                              cute::Shape<cute::_64, cute::Int<N>, cute::_16>>()),
    decltype(cute::SM90::GMMA::ss_op_selector<cute::bfloat16_t, cute::bfloat16_t, float,
                                              cute::Shape<cute::_64, cute::Int<N>, cute::_16>>())>;
