// Hopper indexer scores, host side: support checks, the TMA descriptors of q_I and k_I, the launch
// by H_I (one instantiation per H_I: 16, 32, 64). The kernel and its design are in
// indexer_scores_kernel.cuh.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "cuda/launch_checks.hpp"
#include "cuda/indexer_checks.hpp"
#include "sm90/indexer.hpp"
#include "sm90/indexer_host.hpp"
#include "sm90/indexer_scores_kernel.cuh"

namespace sa::sm90 {
namespace {

constexpr const char* kPath = "sm90 indexer scores";

template <int kHeads>
constexpr size_t smem_bytes() {
  // +1024: the kernel aligns its shared storage to 1024 bytes (128-byte swizzle atoms).
  return sizeof(indexer::ScoresSmem<indexer::ScoresTraits<kHeads>>) + 1024;
}
static_assert(smem_bytes<16>() <= 227 * 1024 && smem_bytes<32>() <= 227 * 1024 &&
                  smem_bytes<64>() <= 227 * 1024,
              "one CTA per SM: within the sm_90 opt-in shared memory");

size_t smem_bytes_for(int64_t heads) {
  return heads == 16 ? smem_bytes<16>() : heads == 32 ? smem_bytes<32>() : smem_bytes<64>();
}

int64_t tokens_per_cta(int64_t heads) { return 2 * 256 / heads; }
int64_t chunk_keys() { return indexer::ScoresTraits<64>::kChunkKeys; }

template <int kHeads>
void launch(const IndexerScoresProblem& p, cudaStream_t stream) {
  using T = indexer::ScoresTraits<kHeads>;
  const IndexerDims& d = p.dims;
  const int64_t q_blocks = (d.Sq + T::kTokensPerCta - 1) / T::kTokensPerCta;
  const int64_t key_chunks = (d.Skv + T::kChunkKeys - 1) / T::kChunkKeys;
  const int64_t grid = q_blocks * key_chunks;
  if (grid == 0) return;
  indexer::ScoresParams prm = indexer::score_params<kHeads>(kPath, p);
  prm.out = p.scores;
  prm.out_ss = p.scores_stride[0];
  prm.key_chunks = static_cast<int32_t>(key_chunks);
  prm.in_range_only = p.in_range_only;
  constexpr size_t kSmem = smem_bytes<kHeads>();
  auto* kernel = &indexer::indexer_scores_sm90_kernel<T>;
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmem)));
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  kernel<<<static_cast<unsigned>(grid), T::kThreads, kSmem, stream>>>(prm);
  SA_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::string indexer_scores_unsupported(const IndexerScoresProblem& p) {
  const IndexerDims& d = p.dims;
  std::string why = indexer::inputs_unsupported(p, kPath);
  if (!why.empty()) return why;
  std::ostringstream os;
  if (p.scores_stride[1] != 1 && d.Skv > 1) {
    os << "scores: the last dimension must be contiguous (" << kPath << ")";
    return os.str();
  }
  // The CTA indices are int32.
  const int64_t q_blocks = (d.Sq + tokens_per_cta(d.HI) - 1) / tokens_per_cta(d.HI);
  const int64_t key_chunks = (d.Skv + chunk_keys() - 1) / chunk_keys();
  if (d.Sq > INT32_MAX - 64 || q_blocks * key_chunks > INT32_MAX) {
    os << "S_q x S_kv = " << d.Sq << " x " << d.Skv << " (" << kPath
       << " supports < 2^31 CTAs of " << tokens_per_cta(d.HI) << " tokens x " << chunk_keys()
       << " keys)";
    return os.str();
  }
  return portable::smem_unsupported(p.device_index, smem_bytes_for(d.HI));
}

void indexer_scores(const IndexerScoresProblem& p, cudaStream_t stream) {
  const std::string why = indexer_scores_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "indexer_scores (sm90): " << why);
  switch (p.dims.HI) {
    case 16:
      launch<16>(p, stream);
      break;
    case 32:
      launch<32>(p, stream);
      break;
    default:
      launch<64>(p, stream);
      break;
  }
}

}  // namespace sa::sm90
