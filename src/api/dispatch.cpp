#include "api/dispatch.hpp"

#include <sstream>

#include "common/error.hpp"

namespace sa {
extern const Implementation kReferenceImplementation;
extern const Implementation kPortableImplementation;
#if SA_HAVE_SM90
extern const Implementation kSm90Implementation;
#endif
}  // namespace sa

namespace sa::api {

const std::vector<const Implementation*>& implementations() {
  static const std::vector<const Implementation*> list = {
#if SA_HAVE_SM90
      &kSm90Implementation,
#endif
      &kPortableImplementation,
      &kReferenceImplementation,
  };
  return list;
}

namespace {

template <class Problem>
const Implementation& select_impl(const Problem& p, const char* op,
                                  OpEntry<Problem> Implementation::*entry, sa_impl forced) {
  std::ostringstream reasons;
  bool found_forced = false;
  for (const Implementation* impl : implementations()) {
    if (forced != SA_IMPL_AUTO && impl->id != forced) continue;
    found_forced = true;
    const OpEntry<Problem>& e = impl->*entry;
    std::string why = e.unsupported == nullptr ? std::string("not implemented") : e.unsupported(p);
    if (why.empty()) return *impl;
    reasons << (reasons.tellp() > 0 ? "; " : "") << impl->name << ": " << why;
  }
  if (forced != SA_IMPL_AUTO && !found_forced)
    SA_FAIL(SA_ERROR_UNSUPPORTED, "options.impl: implementation '" << sa_impl_name(forced)
                                                                   << "' is not built into this "
                                                                      "library");
  if (forced != SA_IMPL_AUTO)
    SA_FAIL(SA_ERROR_UNSUPPORTED, "options.impl = " << sa_impl_name(forced) << " cannot serve "
                                                    << op << ": " << reasons.str());
  SA_FAIL(SA_ERROR_UNSUPPORTED, op << ": no implementation serves this call ("
                                   << reasons.str() << ")");
}

}  // namespace

const Implementation& select(const BsaFwdProblem& p) {
  return select_impl(p, "bsa_forward", &Implementation::bsa_fwd, p.options.impl);
}
const Implementation& select(const BsaBwdProblem& p) {
  return select_impl(p, "bsa_backward", &Implementation::bsa_bwd, p.options.impl);
}
const Implementation& select(const DsaFwdProblem& p) {
  return select_impl(p, "dsa_forward", &Implementation::dsa_fwd, p.options.impl);
}
const Implementation& select(const DsaBwdProblem& p) {
  return select_impl(p, "dsa_backward", &Implementation::dsa_bwd, p.options.impl);
}
const Implementation& select(const IndexerScoresProblem& p) {
  return select_impl(p, "indexer_scores", &Implementation::indexer_scores, p.options.impl);
}
const Implementation& select(const IndexerTopkProblem& p) {
  return select_impl(p, "indexer_topk", &Implementation::indexer_topk, p.options.impl);
}
const Implementation& select(const IndexerLossProblem& p) {
  return select_impl(p, "indexer_loss", &Implementation::indexer_loss, p.options.impl);
}

}  // namespace sa::api
