// Portable indexer scores, host side: support checks, the launch by H_I. The kernel and its
// design are in indexer_scores_kernel.cuh (the score tile: indexer_score_tile.cuh).
#include <cuda_bf16.h>

#include <cstdint>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "sm80/indexer.hpp"
#include "cuda/indexer_checks.hpp"
#include "sm80/indexer_scores_kernel.cuh"

namespace sa::portable {
namespace {

constexpr const char* kPath = "portable indexer scores";
constexpr int kBlockTiles = 8;  // 512 keys per CTA

template <int kHeads>
int smem_bytes() {
  return indexer::TileConfig<kHeads>::kTileSmemBytes;
}

int smem_bytes_for(int64_t heads) {
  return heads == 16 ? smem_bytes<16>() : heads == 32 ? smem_bytes<32>() : smem_bytes<64>();
}

template <int kHeads>
void launch(const IndexerScoresProblem& p, cudaStream_t stream) {
  using Cfg = indexer::TileConfig<kHeads>;
  const IndexerDims& d = p.dims;
  const int64_t q_blocks = (d.Sq + Cfg::kBlockQ - 1) / Cfg::kBlockQ;
  const int64_t key_blocks = (d.Skv + kBlockTiles * 64 - 1) / (kBlockTiles * 64);
  const int64_t grid = q_blocks * key_blocks;
  if (grid == 0) return;
  indexer::ScoresOut o{};
  o.out = p.scores;
  o.ss = p.scores_stride[0];
  o.key_blocks = static_cast<int>(key_blocks);
  auto* kernel = &indexer::scores_kernel<Cfg, kBlockTiles>;
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     Cfg::kTileSmemBytes));
  kernel<<<static_cast<unsigned>(grid), Cfg::kThreads, Cfg::kTileSmemBytes, stream>>>(
      indexer::make_score_params(p), o);
  SA_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::string indexer_scores_unsupported(const IndexerScoresProblem& p) {
  const IndexerDims& d = p.dims;
  std::string why = indexer_inputs_unsupported(p, kPath);
  if (!why.empty()) return why;
  std::ostringstream os;
  if (p.scores_stride[1] != 1 && d.Skv > 1) {
    os << "scores: the last dimension must be contiguous (" << kPath << ")";
    return os.str();
  }
  const int64_t key_blocks = (d.Skv + kBlockTiles * 64 - 1) / (kBlockTiles * 64);
  const int64_t q_blocks = (d.Sq + 3) / 4;  // the smallest query block (H_I 64: 4 queries)
  if (q_blocks * key_blocks > INT32_MAX) {
    os << "S_q x S_kv = " << d.Sq << " x " << d.Skv << " (" << kPath
       << " supports < 2^31 CTAs of 4 queries x 512 keys)";
    return os.str();
  }
  return smem_unsupported(p.device_index, smem_bytes_for(d.HI));
}

void indexer_scores(const IndexerScoresProblem& p, cudaStream_t stream) {
  const std::string why = indexer_scores_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "indexer_scores (portable): " << why);
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

}  // namespace sa::portable
