// options.validate for BSA metadata that lives on the GPU: checks every value SPEC 1 constrains
// and reports the first bad entry with the same message as the CPU check
// (reference::check_bsa_metadata). It synchronises the stream to read the verdict back: validate
// is a debugging aid, not for the hot path.
#pragma once

#include <cuda_runtime_api.h>

#include "common/problem.hpp"

namespace sa::portable {

void check_bsa_metadata_gpu(const BsaDims& dims, const BsaMeta& meta, cudaStream_t stream);

}  // namespace sa::portable
