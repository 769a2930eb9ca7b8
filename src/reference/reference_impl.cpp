// The reference implementation as the dispatcher sees it: CPU tensors, any dtype, any size.
#include "api/implementation.hpp"
#include "reference/reference.hpp"

namespace sa {
namespace {

template <class Problem>
std::string cpu_only(const Problem& p) {
  return p.device == SA_DEVICE_CPU ? std::string() : std::string("needs CPU tensors");
}

// The reference checks BSA metadata values on every call, validate or not: it costs nothing next
// to the fp64 arithmetic, and the CPU path should never read out of bounds.
void run_bsa_fwd(const BsaFwdProblem& p, const ExecContext&) {
  reference::check_bsa_metadata(p.dims, p.meta);
  reference::bsa_forward(p);
}
void run_bsa_bwd(const BsaBwdProblem& p, const ExecContext&) {
  reference::check_bsa_metadata(p.dims, p.meta);
  reference::bsa_backward(p);
}
void run_dsa_fwd(const DsaFwdProblem& p, const ExecContext&) { reference::dsa_forward(p); }
void run_dsa_bwd(const DsaBwdProblem& p, const ExecContext&) { reference::dsa_backward(p); }
void run_indexer_scores(const IndexerScoresProblem& p, const ExecContext&) {
  reference::indexer_scores(p);
}
void run_indexer_topk(const IndexerTopkProblem& p, const ExecContext&) {
  reference::indexer_topk(p);
}
void run_indexer_loss(const IndexerLossProblem& p, const ExecContext&) {
  reference::indexer_loss(p);
}

}  // namespace

extern const Implementation kReferenceImplementation = {
    SA_IMPL_REFERENCE,
    "reference",
    {&cpu_only<BsaFwdProblem>, nullptr, &run_bsa_fwd},
    {&cpu_only<BsaBwdProblem>, nullptr, &run_bsa_bwd},
    {&cpu_only<DsaFwdProblem>, nullptr, &run_dsa_fwd},
    {&cpu_only<DsaBwdProblem>, nullptr, &run_dsa_bwd},
    {&cpu_only<IndexerScoresProblem>, nullptr, &run_indexer_scores},
    {&cpu_only<IndexerTopkProblem>, nullptr, &run_indexer_topk},
    {&cpu_only<IndexerLossProblem>, nullptr, &run_indexer_loss},
};

}  // namespace sa
