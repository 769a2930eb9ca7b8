// The small kernels of the portable DSA backward: see dsa_backward_aux.hpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <utility>
#include <cub/device/device_radix_sort.cuh>

#include "common/cuda_check.hpp"
#include "common/device_math.cuh"
#include "common/error.hpp"
#include "cuda/dsa_backward_aux.hpp"
#include "cuda/dsa_binned_fixed.cuh"
#include "cuda/dsa_fixed_point.cuh"

namespace sa::portable::dsa_bwd {
namespace {

constexpr int kThreads = 256;

// Grid of a grid-stride loop over `items`: enough blocks to fill any GPU, never more than needed.
unsigned grid_for(int64_t items, int threads) {
  const int64_t blocks = (items + threads - 1) / threads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{1} << 16)));
}

// Four columns per thread: one 16-byte load, one 8-byte store.
template <class Element>
__global__ void __launch_bounds__(kThreads)
    convert_dkv_kernel(const float* __restrict__ acc, Element* __restrict__ dkv, int64_t skv,
                       int dqk, int64_t dkv_ss) {
  const int quads = dqk / 4;
  const int64_t items = skv * quads;
  for (int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; q < items;
       q += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = q / quads;
    const int c = 4 * static_cast<int>(q - j * quads);
    const float4 v = *reinterpret_cast<const float4*>(acc + j * dqk + c);
    *reinterpret_cast<uint2*>(dkv + j * dkv_ss + c) =
        make_uint2(pack2<Element>(v.x, v.y), pack2<Element>(v.z, v.w));
  }
}

// The quad-16 column order (AccColumns::kQuad16): one 16-column group per thread, four 16-byte
// loads (position 4q holds columns 2q, 2q + 1, 2q + 8, 2q + 9), four 8-byte stores.
template <class Element>
__global__ void __launch_bounds__(kThreads)
    convert_dkv_quad16_kernel(const float* __restrict__ acc, Element* __restrict__ dkv,
                              int64_t skv, int dqk, int64_t dkv_ss) {
  const int groups = dqk / 16;
  const int64_t items = skv * groups;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < items;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e / groups;
    const int c = 16 * static_cast<int>(e - j * groups);
    const float4* src = reinterpret_cast<const float4*>(acc + j * dqk + c);
    float4 v[4];
    for (int q = 0; q < 4; ++q) v[q] = src[q];
    uint2* dst = reinterpret_cast<uint2*>(dkv + j * dkv_ss + c);
    dst[0] = make_uint2(pack2<Element>(v[0].x, v[0].y), pack2<Element>(v[1].x, v[1].y));
    dst[1] = make_uint2(pack2<Element>(v[2].x, v[2].y), pack2<Element>(v[3].x, v[3].y));
    dst[2] = make_uint2(pack2<Element>(v[0].z, v[0].w), pack2<Element>(v[1].z, v[1].w));
    dst[3] = make_uint2(pack2<Element>(v[2].z, v[2].w), pack2<Element>(v[3].z, v[3].w));
  }
}

// One block per head: each thread sums a fixed stride of tokens, then a fixed tree. No atomics,
// so the result is the same on every run.
__global__ void __launch_bounds__(kThreads)
    d_sink_kernel(const float* __restrict__ terms, int64_t sq, float* __restrict__ d_sink,
                  int64_t stride, int has_sink) {
  __shared__ float part[kThreads];
  const int h = blockIdx.x;
  float sum = 0.f;
  if (has_sink) {
    for (int64_t t = threadIdx.x; t < sq; t += kThreads) sum += terms[h * sq + t];
  }
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int off = kThreads / 2; off > 0; off /= 2) {
    if (static_cast<int>(threadIdx.x) < off) part[threadIdx.x] += part[threadIdx.x + off];
    __syncthreads();
  }
  if (threadIdx.x == 0) d_sink[h * stride] = has_sink ? part[0] : 0.f;
}

// The kv row of slot (t, i) when it is active (SPEC 2, the kernels' rule), else skv.
__device__ __forceinline__ int64_t slot_key(const SlotKeyArgs& a, int64_t t, int i) {
  int n = a.topk;
  if (a.len != nullptr) {
    const int32_t len = a.len[t * a.len_s];
    n = len <= 0 ? 0 : min(len, a.topk);
  }
  if (i < n) {
    const int32_t j = a.idx[t * a.idx_ss + i * a.idx_si];
    if (j >= 0 && j < a.skv) return j;
  }
  return a.skv;
}

__global__ void __launch_bounds__(kThreads)
    slot_keys_kernel(const SlotKeyArgs a, int64_t tok_begin, int64_t tokens,
                     uint32_t* __restrict__ keys, uint32_t* __restrict__ vals) {
  const int64_t items = tokens * a.topk;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < items;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t tl = e / a.topk;
    const int i = static_cast<int>(e - tl * a.topk);
    keys[e] = static_cast<uint32_t>(slot_key(a, tok_begin + tl, i));  // inactive: after all
    vals[e] = static_cast<uint32_t>(e);
  }
}

// ---- fixed-point deterministic mode ----

__global__ void __launch_bounds__(kThreads)
    fix_count_keys_kernel(const SlotKeyArgs a, int64_t sq, uint32_t* __restrict__ counts) {
  const int64_t items = sq * a.topk;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < items;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = e / a.topk;
    const int64_t j = slot_key(a, t, static_cast<int>(e - t * a.topk));
    if (j < a.skv) atomicAdd(counts + j, 1u);
  }
}

// The block's largest of `m` (every thread passes it) into *out, one atomic per block.
__device__ __forceinline__ void block_max_into(uint32_t m, uint32_t* out) {
  __shared__ uint32_t warp_max[kThreads / 32];
  m = __reduce_max_sync(0xffffffffu, m);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < kThreads / 32 ? warp_max[threadIdx.x] : 0u;
    m = __reduce_max_sync(0xffffffffu, m);
    if (threadIdx.x == 0 && m != 0) atomicMax(out, m);
  }
}

// One warp per row, 8 elements per lane and step: the largest finite |x| as float bits.
template <class Element>
__global__ void __launch_bounds__(kThreads) fix_max_abs_kernel(const FixRows a, uint32_t* out) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (kThreads / 32);
  const int64_t rows = a.outer * a.inner;
  uint32_t m = 0;
  for (int64_t r = blockIdx.x * int64_t{kThreads / 32} + threadIdx.x / 32; r < rows; r += warps) {
    const int64_t o = r / a.inner;
    const Element* row =
        static_cast<const Element*>(a.base) + o * a.s_outer + (r - o * a.inner) * a.s_inner;
    for (int c = 8 * lane; c < a.len; c += 256) {
      const uint4 v = *reinterpret_cast<const uint4*>(row + c);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      for (int k = 0; k < 4; ++k) {
        const float2 f = unpack2<Element>(w[k]);
        const uint32_t b0 = __float_as_uint(f.x) & 0x7fffffffu;
        const uint32_t b1 = __float_as_uint(f.y) & 0x7fffffffu;
        if (b0 < 0x7f800000u) m = max(m, b0);
        if (b1 < 0x7f800000u) m = max(m, b1);
      }
    }
  }
  block_max_into(m, out);
}

__global__ void __launch_bounds__(kThreads)
    fix_max_u32_kernel(const uint32_t* __restrict__ v, int64_t n, uint32_t* out) {
  uint32_t m = 0;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x)
    m = max(m, v[e]);
  block_max_into(m, out);
}

__device__ __forceinline__ FixScale fix_scale_of(const FixScaleArgs& s) {
  return fix_scale(*s.ctl, s.scale, s.rows, s.head_groups);
}

__global__ void __launch_bounds__(kThreads)
    fix_zero_if_retry_kernel(int64_t* __restrict__ fix, int64_t n, const FixScaleArgs s) {
  if (!fix_scale_of(s).retry) return;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n / 2;
       e += int64_t{gridDim.x} * blockDim.x)
    reinterpret_cast<uint4*>(fix)[e] = make_uint4(0u, 0u, 0u, 0u);
}

// Columns c .. c + 3 of int64 row j (row length dqk) times inv = 2^-s: two 16-byte loads.
// int64 -> double is exact to 53 bits, the power of two exact, then one rounding to float.
__device__ __forceinline__ void fixed_quad(const int64_t* __restrict__ fix, int64_t j, int dqk,
                                           int c, double inv, float (&v)[4]) {
  const longlong2* src = reinterpret_cast<const longlong2*>(fix + j * dqk + c);
  const longlong2 a = src[0], b = src[1];
  v[0] = static_cast<float>(static_cast<double>(a.x) * inv);
  v[1] = static_cast<float>(static_cast<double>(a.y) * inv);
  v[2] = static_cast<float>(static_cast<double>(b.x) * inv);
  v[3] = static_cast<float>(static_cast<double>(b.y) * inv);
}

// Columns c..c + 3 of a converted dkv row, v (NaN when the row is marked bad), one 8-byte
// store of Element.
template <class Element>
__device__ __forceinline__ void store_quad(Element* dst, float (&v)[4], bool bad_row) {
  if (bad_row) v[0] = v[1] = v[2] = v[3] = __uint_as_float(0x7fffffffu);
  *reinterpret_cast<uint2*>(dst) =
      make_uint2(pack2<Element>(v[0], v[1]), pack2<Element>(v[2], v[3]));
}

// Four columns per thread (fixed_quad), one 8-byte store: one more rounding, to Element (the
// same on every run).
template <class Element>
__global__ void __launch_bounds__(kThreads)
    convert_dkv_fixed_kernel(const int64_t* __restrict__ fix, const uint32_t* __restrict__ bad,
                             const FixScaleArgs s, Element* __restrict__ dkv, int64_t skv, int dqk,
                             int64_t dkv_ss) {
  const double inv = ldexp(1.0, -fix_scale_of(s).s);
  const int quads = dqk / 4;
  const int64_t items = skv * quads;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < items;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e / quads;
    const int c = 4 * static_cast<int>(e - j * quads);
    float v[4];
    fixed_quad(fix, j, dqk, c, inv, v);
    store_quad(dkv + j * dkv_ss + c, v, bad[j] != 0u);
  }
}

// ---- the binned plan ----

// Whether the call takes the binned form (the kernels' rule: the same slot counts).
__device__ __forceinline__ bool binned_form(const BinArgs& s) {
  return bin_serves(s.fix.ctl->count, s.fix.head_groups, s.min_resolution);
}

__global__ void __launch_bounds__(kThreads)
    bin_zero_if_retry_kernel(uint64_t* __restrict__ bins, int64_t skv, int dqk, const BinArgs s) {
  int64_t words = 0;
  if (binned_form(s)) {
    if (!bin_bound(*s.fix.ctl, s.fix.scale, s.fix.rows).retry) return;
    words = kBinCount * bin_plane_words(skv, dqk);
  } else {
    if (!fix_scale_of(s.fix).retry) return;
    words = skv * dqk;  // the int64 form's rows
  }
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < words / 2;
       e += int64_t{gridDim.x} * blockDim.x)
    reinterpret_cast<uint4*>(bins)[e] = make_uint4(0u, 0u, 0u, 0u);
}

// Four columns per thread. Binned form: for each plane one 16-byte load (two words), each
// column's kBinCount sums decoded in double (bin_decode), then rounded to float and to Element;
// int64 form: as convert_dkv_fixed_kernel. The same on every run.
template <class Element>
__global__ void __launch_bounds__(kThreads)
    convert_dkv_binned_kernel(const uint64_t* __restrict__ bins, const uint32_t* __restrict__ bad,
                              const BinArgs s, Element* __restrict__ dkv, int64_t skv, int dqk,
                              int64_t dkv_ss) {
  const FixCtl& ctl = *s.fix.ctl;
  const bool binned = binned_form(s);
  const int lw = bin_resolution(ctl.count, s.fix.head_groups);
  const int eb = bin_bound(ctl, s.fix.scale, s.fix.rows).e;
  const double inv = ldexp(1.0, -fix_scale_of(s.fix).s);
  const int64_t* fix = reinterpret_cast<const int64_t*>(bins);
  const int quads = dqk / 4;
  const int64_t items = skv * quads;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < items;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e / quads;
    const int c = 4 * static_cast<int>(e - j * quads);
    float v[4];
    if (binned) {
      int32_t sums[4][kBinCount];
      for (int b = 0; b < kBinCount; ++b) {
        const ulonglong2 w =
            *reinterpret_cast<const ulonglong2*>(bins + bin_word(b, j, c / 2, skv, dqk));
        const BinPair x = bin_unpack(w.x), y = bin_unpack(w.y);
        sums[0][b] = x.a;
        sums[1][b] = x.b;
        sums[2][b] = y.a;
        sums[3][b] = y.b;
      }
      for (int i = 0; i < 4; ++i) v[i] = static_cast<float>(bin_decode(sums[i], lw, eb));
    } else {
      fixed_quad(fix, j, dqk, c, inv, v);
    }
    store_quad(dkv + j * dkv_ss + c, v, bad[j] != 0u);
  }
}

// First position in keys[0, n) whose key is >= k.
__device__ __forceinline__ int lower_bound(const uint32_t* __restrict__ keys, int n, uint32_t k) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (keys[mid] < k) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// One block per key, four columns per thread; partial rows are added in sorted item order, and
// per item in group order: a fixed order, so the sums are the same on every run.
__global__ void reduce_partials_kernel(const uint32_t* __restrict__ keys,
                                       const uint32_t* __restrict__ vals, int n,
                                       const float* __restrict__ part, float* __restrict__ acc,
                                       int dqk, int topk, int groups) {
  const uint32_t j = blockIdx.x;
  const int lo = lower_bound(keys, n, j), hi = lower_bound(keys, n, j + 1);
  if (lo == hi) return;
  const int c = 4 * threadIdx.x;
  float4* dst = reinterpret_cast<float4*>(acc + int64_t{j} * dqk + c);
  float4 sum = *dst;
#pragma unroll 4
  for (int e = lo; e < hi; ++e) {
    const uint32_t item = vals[e];
    const int64_t tl = item / static_cast<uint32_t>(topk);
    const int64_t slot = item - tl * topk;
    for (int grp = 0; grp < groups; ++grp) {
      const float4 v =
          *reinterpret_cast<const float4*>(part + ((tl * groups + grp) * topk + slot) * dqk + c);
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
  }
  *dst = sum;
}

}  // namespace

void convert_dkv(const float* acc, void* dkv, sa_dtype dtype, int64_t skv, int dqk, int64_t dkv_ss,
                 AccColumns columns, cudaStream_t stream) {
  if (columns == AccColumns::kQuad16) {
    SA_CHECK(dqk % 16 == 0, SA_ERROR_INTERNAL, "convert_dkv: quad-16 order needs dqk % 16 == 0");
    const unsigned grid = grid_for(skv * (dqk / 16), kThreads);
    if (dtype == SA_DTYPE_BF16) {
      convert_dkv_quad16_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          acc, static_cast<__nv_bfloat16*>(dkv), skv, dqk, dkv_ss);
    } else {
      SA_CHECK(dtype == SA_DTYPE_FP16, SA_ERROR_INTERNAL, "convert_dkv: 16-bit dtype expected");
      convert_dkv_quad16_kernel<__half>
          <<<grid, kThreads, 0, stream>>>(acc, static_cast<__half*>(dkv), skv, dqk, dkv_ss);
    }
    SA_CUDA_CHECK_LAUNCH();
    return;
  }
  const unsigned grid = grid_for(skv * (dqk / 4), kThreads);
  if (dtype == SA_DTYPE_BF16) {
    convert_dkv_kernel<__nv_bfloat16>
        <<<grid, kThreads, 0, stream>>>(acc, static_cast<__nv_bfloat16*>(dkv), skv, dqk, dkv_ss);
  } else {
    SA_CHECK(dtype == SA_DTYPE_FP16, SA_ERROR_INTERNAL, "convert_dkv: 16-bit dtype expected");
    convert_dkv_kernel<__half>
        <<<grid, kThreads, 0, stream>>>(acc, static_cast<__half*>(dkv), skv, dqk, dkv_ss);
  }
  SA_CUDA_CHECK_LAUNCH();
}

void reduce_d_sink(const float* terms, int64_t sq, int64_t heads, float* d_sink, int64_t stride,
                   bool has_sink, cudaStream_t stream) {
  d_sink_kernel<<<static_cast<unsigned>(heads), kThreads, 0, stream>>>(terms, sq, d_sink, stride,
                                                                       has_sink ? 1 : 0);
  SA_CUDA_CHECK_LAUNCH();
}

void slot_keys(const SlotKeyArgs& a, int64_t tok_begin, int64_t tokens, uint32_t* keys,
               uint32_t* vals, cudaStream_t stream) {
  slot_keys_kernel<<<grid_for(tokens * a.topk, kThreads), kThreads, 0, stream>>>(
      a, tok_begin, tokens, keys, vals);
  SA_CUDA_CHECK_LAUNCH();
}

int key_bits(int64_t skv) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) <= skv) ++bits;
  return bits;
}

size_t sort_temp_bytes(int n, int end_bit) {
  size_t bytes = 0;
  SA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), n, 0, end_bit));
  return bytes;
}

void sort_slots(void* temp, size_t temp_bytes, const uint32_t* keys_in, uint32_t* keys_out,
                const uint32_t* vals_in, uint32_t* vals_out, int n, int end_bit,
                cudaStream_t stream) {
  SA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in,
                                                vals_out, n, 0, end_bit, stream));
}

void fix_count_keys(const SlotKeyArgs& a, int64_t sq, uint32_t* counts, cudaStream_t stream) {
  if (sq * a.topk == 0) return;
  fix_count_keys_kernel<<<grid_for(sq * a.topk, kThreads), kThreads, 0, stream>>>(a, sq, counts);
  SA_CUDA_CHECK_LAUNCH();
}

void fix_input_maxima(const FixRows& q, const FixRows& dout, const FixRows& kv,
                      const uint32_t* counts, int64_t skv, sa_dtype dtype, FixCtl* ctl,
                      cudaStream_t stream) {
  // At most 1,024 blocks (one atomic each per tensor).
  const auto blocks = [](int64_t rows) {
    return static_cast<unsigned>(std::max<int64_t>(
        1, std::min<int64_t>((rows + kThreads / 32 - 1) / (kThreads / 32), 1024)));
  };
  const std::pair<const FixRows*, uint32_t*> parts[3] = {
      {&q, &ctl->max_q}, {&dout, &ctl->max_dout}, {&kv, &ctl->max_kv}};
  for (const auto& [rows, out] : parts) {
    const int64_t n = rows->outer * rows->inner;
    if (n == 0) continue;
    if (dtype == SA_DTYPE_BF16) {
      fix_max_abs_kernel<__nv_bfloat16><<<blocks(n), kThreads, 0, stream>>>(*rows, out);
    } else {
      SA_CHECK(dtype == SA_DTYPE_FP16, SA_ERROR_INTERNAL,
               "fix_input_maxima: 16-bit dtype expected");
      fix_max_abs_kernel<__half><<<blocks(n), kThreads, 0, stream>>>(*rows, out);
    }
    SA_CUDA_CHECK_LAUNCH();
  }
  if (skv > 0) {
    fix_max_u32_kernel<<<std::min(grid_for(skv, kThreads), 1024u), kThreads, 0, stream>>>(
        counts, skv, &ctl->count);
    SA_CUDA_CHECK_LAUNCH();
  }
}

void fix_zero_if_retry(int64_t* fix, int64_t n, const FixScaleArgs& s, cudaStream_t stream) {
  fix_zero_if_retry_kernel<<<std::min(grid_for(n / 2, kThreads), 2048u), kThreads, 0, stream>>>(
      fix, n, s);
  SA_CUDA_CHECK_LAUNCH();
}

void convert_dkv_fixed(const int64_t* fix, const uint32_t* bad, const FixScaleArgs& s, void* dkv,
                       sa_dtype dtype, int64_t skv, int dqk, int64_t dkv_ss, cudaStream_t stream) {
  const unsigned grid = grid_for(skv * (dqk / 4), kThreads);
  if (dtype == SA_DTYPE_BF16) {
    convert_dkv_fixed_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
        fix, bad, s, static_cast<__nv_bfloat16*>(dkv), skv, dqk, dkv_ss);
  } else {
    SA_CHECK(dtype == SA_DTYPE_FP16, SA_ERROR_INTERNAL, "convert_dkv_fixed: 16-bit dtype expected");
    convert_dkv_fixed_kernel<__half>
        <<<grid, kThreads, 0, stream>>>(fix, bad, s, static_cast<__half*>(dkv), skv, dqk, dkv_ss);
  }
  SA_CUDA_CHECK_LAUNCH();
}

void bin_zero_if_retry(uint64_t* bins, int64_t skv, int dqk, const BinArgs& s,
                       cudaStream_t stream) {
  const int64_t most = kBinCount * bin_plane_words(skv, dqk) / 2;  // 16-byte stores
  bin_zero_if_retry_kernel<<<std::min(grid_for(most, kThreads), 2048u), kThreads, 0, stream>>>(
      bins, skv, dqk, s);
  SA_CUDA_CHECK_LAUNCH();
}

void convert_dkv_binned(const uint64_t* bins, const uint32_t* bad, const BinArgs& s, void* dkv,
                        sa_dtype dtype, int64_t skv, int dqk, int64_t dkv_ss,
                        cudaStream_t stream) {
  const unsigned grid = grid_for(skv * (dqk / 4), kThreads);
  if (dtype == SA_DTYPE_BF16) {
    convert_dkv_binned_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
        bins, bad, s, static_cast<__nv_bfloat16*>(dkv), skv, dqk, dkv_ss);
  } else {
    SA_CHECK(dtype == SA_DTYPE_FP16, SA_ERROR_INTERNAL,
             "convert_dkv_binned: 16-bit dtype expected");
    convert_dkv_binned_kernel<__half>
        <<<grid, kThreads, 0, stream>>>(bins, bad, s, static_cast<__half*>(dkv), skv, dqk, dkv_ss);
  }
  SA_CUDA_CHECK_LAUNCH();
}

void reduce_partials(const uint32_t* keys, const uint32_t* vals, int n, const float* part,
                     float* acc, int64_t skv, int dqk, int topk, int groups, cudaStream_t stream) {
  reduce_partials_kernel<<<static_cast<unsigned>(skv), dqk / 4, 0, stream>>>(
      keys, vals, n, part, acc, dqk, topk, groups);
  SA_CUDA_CHECK_LAUNCH();
}

}  // namespace sa::portable::dsa_bwd
