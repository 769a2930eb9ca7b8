// The portable tensor-core path (sm80 and newer) as the dispatcher sees it. Operations whose
// kernels are not written yet have no entry, so the dispatcher reports "not implemented".
#include "api/implementation.hpp"

namespace sa {

extern const Implementation kPortableImplementation = {
    SA_IMPL_PORTABLE, "portable", {}, {}, {}, {},
};

}  // namespace sa
