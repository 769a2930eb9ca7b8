// Token groups of the DSA backward, host side: the entries a group's union can take and which
// problems take groups (dsa_token_groups.hpp).
#include "cuda/dsa_token_groups.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace sa::portable::dsa_bwd {

int64_t group_capacity(int64_t skv, int64_t topk, int G) {
  const int64_t slots = G * topk;
  const int64_t M = kGroupFieldMax;
  return std::max<int64_t>(1, std::min<int64_t>(slots, skv + (slots + M - 1) / M));
}

bool token_groups_eligible(const DsaBwdProblem& p) {
  const int64_t H = p.dims.H;
  const int G = group_tokens(H);
  if (G == 0 || p.options.deterministic != 0) return false;
  if (G * p.dims.topk > std::numeric_limits<int32_t>::max() - 64) return false;
  // Row r of a group is (token t0 + r / H, head r % H) at t0 * ss + r * sh: one token of 64 heads.
  auto rows = [H](const Shd& t) { return t.ss == H * t.sh; };
  return rows(p.q) && rows(p.dout) && rows(p.out) && rows(p.dq) &&
         p.lse_stride[0] == H * p.lse_stride[1];
}

}  // namespace sa::portable::dsa_bwd
