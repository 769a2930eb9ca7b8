// Choosing the implementation of a call: the first one in priority order (sm90, portable,
// reference) that serves the problem, or the one options.impl forces. A forced implementation
// that cannot serve the call is an error naming the missing feature, never a fallback.
#pragma once

#include <vector>

#include "api/implementation.hpp"

namespace sa::api {

// Every implementation built into this library, fastest first.
const std::vector<const Implementation*>& implementations();

const Implementation& select(const BsaFwdProblem& p);
const Implementation& select(const BsaBwdProblem& p);
const Implementation& select(const DsaFwdProblem& p);
const Implementation& select(const DsaBwdProblem& p);
const Implementation& select(const IndexerScoresProblem& p);
const Implementation& select(const IndexerTopkProblem& p);
const Implementation& select(const IndexerLossProblem& p);

}  // namespace sa::api
