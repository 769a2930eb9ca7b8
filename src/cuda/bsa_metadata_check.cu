// GPU check of BSA metadata values. One thread block per query-block row; each thread checks
// slots of the row (range, distinctness against every earlier slot); the smallest bad position,
// in (row, slot) order, wins through atomicMin so that "first" is deterministic. kv_block_len is
// checked by a grid-stride loop first. The host then reads the offending values back and words
// the error like the CPU check.
#include <cstdint>
#include <vector>

#include "common/cuda_check.hpp"
#include "cuda/bsa_metadata_check.hpp"

namespace sa::portable {
namespace {

constexpr unsigned long long kNone = ~0ull;

struct Verdict {
  unsigned long long first_bad_len;    // b * Nkv + n
  unsigned long long first_bad_entry;  // row * (Kmax + 1) + (slot + 1); slot -1 = the count
};

__global__ void check_kernel(BsaDims d, BsaMeta meta, Verdict* out) {
  const int64_t rows = d.B * d.Hq * d.Nq;
  // kv_block_len: values in [1, block].
  if (meta.kv_block_len.data != nullptr) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < d.B * d.Nkv;
         i += int64_t(gridDim.x) * blockDim.x) {
      int32_t len = meta.kv_block_len.at(i / d.Nkv, i % d.Nkv);
      if (len < 1 || len > d.block) atomicMin(&out->first_bad_len, (unsigned long long)i);
    }
  }
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t b = r / (d.Hq * d.Nq), h = (r / d.Nq) % d.Hq, m = r % d.Nq;
    const unsigned long long base = (unsigned long long)r * (d.Kmax + 1);
    int32_t count = meta.count(b, h, m);
    if (count < 0 || count > d.Kmax) {
      if (threadIdx.x == 0) atomicMin(&out->first_bad_entry, base);
      continue;
    }
    for (int32_t s = threadIdx.x; s < count; s += blockDim.x) {
      int32_t e = meta.q2k_index.at(b, h, m, s);
      bool bad = e < 0 || e >= d.Nkv;
      for (int32_t t = 0; t < s && !bad; ++t) bad = meta.q2k_index.at(b, h, m, t) == e;
      if (bad) atomicMin(&out->first_bad_entry, base + 1 + s);
    }
  }
}

int32_t read_int(const IntView& v, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  int32_t value = 0;
  const int32_t* p = v.data + i0 * v.stride[0] + i1 * v.stride[1] + i2 * v.stride[2] +
                     i3 * v.stride[3];
  SA_CUDA_CHECK(cudaMemcpy(&value, p, sizeof(value), cudaMemcpyDeviceToHost));
  return value;
}

}  // namespace

void check_bsa_metadata_gpu(const BsaDims& d, const BsaMeta& meta, cudaStream_t stream) {
  Verdict init{kNone, kNone}, result{};
  Verdict* dev = nullptr;
  SA_CUDA_CHECK(cudaMallocAsync(&dev, sizeof(Verdict), stream));
  SA_CUDA_CHECK(cudaMemcpyAsync(dev, &init, sizeof(Verdict), cudaMemcpyHostToDevice, stream));
  const int64_t rows = d.B * d.Hq * d.Nq;
  const int grid = static_cast<int>(rows < 65535 ? rows : 65535);
  check_kernel<<<grid, 128, 0, stream>>>(d, meta, dev);
  SA_CUDA_CHECK_LAUNCH();
  SA_CUDA_CHECK(cudaMemcpyAsync(&result, dev, sizeof(Verdict), cudaMemcpyDeviceToHost, stream));
  SA_CUDA_CHECK(cudaFreeAsync(dev, stream));
  SA_CUDA_CHECK(cudaStreamSynchronize(stream));

  if (result.first_bad_len != kNone) {
    int64_t b = result.first_bad_len / d.Nkv, n = result.first_bad_len % d.Nkv;
    int32_t len = read_int(meta.kv_block_len, b, n, 0, 0);
    SA_FAIL(SA_ERROR_INVALID_METADATA, "sparsity.kv_block_len[b=" << b << ", n=" << n << "] = " << len
                                           << ": expected [1, " << d.block << "]");
  }
  if (result.first_bad_entry == kNone) return;
  const int64_t row = result.first_bad_entry / (d.Kmax + 1);
  const int64_t slot = static_cast<int64_t>(result.first_bad_entry % (d.Kmax + 1)) - 1;
  const int64_t b = row / (d.Hq * d.Nq), h = (row / d.Nq) % d.Hq, m = row % d.Nq;
  if (slot < 0) {
    int32_t count = read_int(meta.q2k_count, b, h, m, 0);
    SA_FAIL(SA_ERROR_INVALID_METADATA, "sparsity.q2k_count[b=" << b << ", h=" << h << ", m=" << m
                                                      << "] = " << count << ": expected [0, "
                                                      << d.Kmax << "]");
  }
  int32_t e = read_int(meta.q2k_index, b, h, m, slot);
  if (e < 0 || e >= d.Nkv)
    SA_FAIL(SA_ERROR_INVALID_METADATA, "sparsity.q2k_index[b=" << b << ", h=" << h << ", m=" << m
                                                      << ", slot=" << slot << "] = " << e
                                                      << ": expected a KV block in [0, "
                                                      << d.Nkv << ")");
  for (int64_t t = 0; t < slot; ++t) {
    if (read_int(meta.q2k_index, b, h, m, t) == e)
      SA_FAIL(SA_ERROR_INVALID_METADATA,
              "sparsity.q2k_index[b=" << b << ", h=" << h << ", m=" << m << ", slot=" << slot << "] = "
                             << e << " repeats slot " << t
                             << ": entries of a row must be distinct");
  }
  SA_FAIL(SA_ERROR_INTERNAL, "metadata check: inconsistent verdict");
}

}  // namespace sa::portable
