// Validation: public argument structs -> problem descriptors (src/common/problem.hpp).
// Everything SPEC section 3 lists is checked here, before any implementation is chosen or any
// memory is touched. Throws sa::Error (SA_ERROR_INVALID_ARGUMENT) naming the argument.
// Metadata *values* are not read here (they may live on the GPU); options.validate asks the
// chosen implementation to check them.
#pragma once

#include "common/indexer_problem.hpp"
#include "common/problem.hpp"
#include "sparse_attention/sparse_attention.h"

namespace sa::api {

BsaFwdProblem make_problem(const sa_bsa_fwd_args& args);
BsaBwdProblem make_problem(const sa_bsa_bwd_args& args);
DsaFwdProblem make_problem(const sa_dsa_fwd_args& args);
DsaBwdProblem make_problem(const sa_dsa_bwd_args& args);
IndexerScoresProblem make_problem(const sa_indexer_scores_args& args);
IndexerTopkProblem make_problem(const sa_indexer_topk_args& args);
IndexerLossProblem make_problem(const sa_indexer_loss_args& args);

}  // namespace sa::api
