#include "bhsd_layout.hpp"

namespace sa_testing {

std::vector<int64_t> bsa_physical_shape(sa_layout layout, int64_t B, int64_t H, int64_t S,
                                        int64_t X) {
  if (layout == SA_LAYOUT_BSHD) return {B, S, H, X};
  return {B, H, S, X};
}

int64_t bsa_index(const HostTensor& t, sa_layout layout, int64_t b, int64_t h, int64_t s,
                  int64_t x) {
  const std::vector<int64_t>& sh = t.shape();
  if (layout == SA_LAYOUT_BSHD) return ((b * sh[1] + s) * sh[2] + h) * sh[3] + x;
  return ((b * sh[1] + h) * sh[2] + s) * sh[3] + x;
}

std::vector<double> bhsd_doubles(const HostTensor& t, sa_layout layout) {
  const std::vector<int64_t>& sh = t.shape();
  const bool bshd = layout == SA_LAYOUT_BSHD;
  const int64_t B = sh[0], H = bshd ? sh[2] : sh[1], S = bshd ? sh[1] : sh[2], X = sh[3];
  std::vector<double> out;
  out.reserve(static_cast<size_t>(t.numel()));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t x = 0; x < X; ++x) out.push_back(t.get(bsa_index(t, layout, b, h, s, x)));
  return out;
}

}  // namespace sa_testing
