// The Hopper (sm_90a) fast path as the dispatcher sees it. Operations whose kernels are not
// written yet have no entry, so the dispatcher reports "not implemented".
#include "api/implementation.hpp"

namespace sa {

extern const Implementation kSm90Implementation = {
    SA_IMPL_SM90, "sm90", {}, {}, {}, {},
};

}  // namespace sa
