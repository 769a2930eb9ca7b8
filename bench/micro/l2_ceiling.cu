// Microbenchmark: the H100's L2 ceiling for the DSA backward kernel's memory traffic
// (src/sm90/dsa_backward_kernel.cuh), i.e. how fast the L2 can serve, per 64-key chunk and CTA,
//   (a) the gather of 64 random kv rows of 1152 bytes (bf16 [4096, 576]) into shared memory with
//       16-byte cp.async.cg, 8 lanes per row (src/sm90/dsa_common.cuh, gather_row): 73,728 B;
//   (b) the fp32 reduction of a 64 x 576 tile into an L2-resident accumulator [4096, 576]
//       (9.4 MB) at the same kind of random rows: 147,456 B,
// when a CTA on every SM does nothing else. Self-contained (no library header). Not part of the
// library build; description, run and result template: bench/micro/l2_ceiling.md.
//   nvcc -O3 -arch=sm_90a -std=c++17 -o l2_ceiling l2_ceiling.cu
//   ./l2_ceiling [target_ms_per_rep=60] [dsa_ref_ms=7.31]
//
// Tests (grid = the number of SMs, one CTA per SM, each CTA loops over `chunks` chunks; chunk c of
// CTA b takes the precomputed index set (c * grid + b) % 4096, 64 distinct random rows, like a
// token's top-k indices read from global memory lane-parallel and broadcast with __shfl_sync):
//   red.v4 Nw          red.global.add.v4.f32, 4 rows x 128 B per warp instruction (8 lanes x
//                      16 B per row: the kernel's quad-16 pattern), 288 instructions per chunk
//                      split over N warps (4, 8, 12)
//   red.v4 evict_last  the same with .L2::cache_hint and createpolicy.fractional.L2::evict_last
//   red.v2             red.global.add.v2.f32, 2 rows x 128 B per instruction (the kernel's
//                      layout before the quad-16 change)
//   red.f32            scalar red.global.add.f32, 1 row x 128 B per instruction (reference)
//   gather Nw          cp.async.cg 16 B, 4 rows x 128 B per warp instruction, double-buffered
//                      (chunk c into buffer c % 2, then cp.async.wait_group 1)
//   mixed GgRr         G gather warps (the gather test's loop) and R reducing warps (red.v4) in one
//                      CTA, both roles in step with one named barrier per chunk (the kernel's
//                      pace: one chunk gathered while one is reduced); "free": no barrier
//   bulk static        cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32, one 2,304-byte
//                      row per operation (lanes 0-7 of 8 warps, 8 rows each), from a staging tile
//                      written once; cp.async.bulk.wait_group.read 1 per chunk
//   bulk rewrite       the same, each warp's 8 rows staged in two 4-row stages rewritten with
//                      st.shared.v4 before every use (fence.proxy.async, wait_group.read 1): the
//                      cost of producing the tile in shared memory included
// Every reducing test is first checked on a small problem (3 chunks per CTA, zeroed
// accumulator) against sums computed on the host: exact, since the values are multiples of 1/16.
// Each test is then calibrated to ~target_ms per launch, run once to warm up and timed by CUDA
// events over 5 launches (median).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dsa_traffic.cuh"

constexpr int kAccRowBytes = kCols * 4;                      // 2,304
constexpr int kRedChunkBytes = kChunkRows * kAccRowBytes;    // 147,456
constexpr int kSmemBytes = 2 * kGatherChunkBytes;            // 147,456 (= kRedChunkBytes)
static_assert(kSmemBytes == kRedChunkBytes, "one shared-memory size for every test");

// ---- device helpers
// ------------------------------------------------------------------------------

// Reductions, no return value (no "memory" clobber, like src/common/device_math.cuh).
__device__ __forceinline__ void red_f32(float* a, float x) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(a), "f"(x));
}
__device__ __forceinline__ void red_f32x2(float* a, float x, float y) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(a), "f"(x), "f"(y));
}
__device__ __forceinline__ void red_f32x4_hint(float* a, float4 v, uint64_t policy) {
  asm volatile("red.global.add.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(a),
               "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "l"(policy));
}
__device__ __forceinline__ uint64_t evict_last_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}

__device__ __forceinline__ void bulk_red_f32(float* gdst, uint32_t ssrc, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(gdst),
      "r"(ssrc), "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// A chunk's 64 row indices, lane-parallel: lane i holds slots i (lo) and 32 + i (hi).
__device__ __forceinline__ int chunk_offset(int b, int c) { return 7 * b + c; }

// Warp w of nw reducing warps issues its contiguous share of the chunk's 18 x 64 / kVec warp
// instructions. Instruction i: row group rg = i / 18 (kVec rows: slots kVec rg ..), 128-byte
// segment i % 18; lane: row kVec rg + lane / (32 / kVec), floats kVec (lane % (32 / kVec)).. of
// the segment. kVec 4: 4 rows x 128 B per instruction (the kernel's quad-16 red.v4), 2: 2 rows x
// 128 B, 1: one row's 128 B.
template <int kVec, bool kHint>
__device__ __forceinline__ void reduce_chunk(float* __restrict__ acc, const Idx& ix, int w, int nw,
                                             int cb, int lane, uint64_t policy) {
  static_assert(kVec == 1 || kVec == 2 || kVec == 4, "vector width");
  static_assert(!kHint || kVec == 4, "the cache hint variant is red.v4 only");
  constexpr int kLanesPerRow = 32 / kVec;
  constexpr int kInsts = kSegs * kChunkRows / kVec;  // 288, 576, 1152 (host: nw divides it)
  const int per = kInsts / nw;
  const int sub = lane % kLanesPerRow, rsub = lane / kLanesPerRow;
  int i = w * per;
  const int end = i + per;
  while (i < end) {
    const int rg = i / kSegs;
    const int seg0 = i - rg * kSegs;
    const int n = min(kSegs - seg0, end - i);
    const int slot = rg * kVec + rsub;
    const int row = row_of(ix, rg * kVec >= 32, slot);
    const int col0 = seg0 * 32 + sub * kVec;
    float* const p = acc + static_cast<size_t>(row) * kCols + col0;
    const int t0 = cb + 3 * slot + col0 + 5 * seg0;  // h(cb, slot, col0)
#pragma unroll 2
    for (int s = 0; s < n; ++s) {
      const int t = t0 + 37 * s;  // next segment: col + 32, col >> 5 + 1
      float* const q = p + 32 * s;
      if constexpr (kVec == 4) {
        const float4 v = make_float4(val(t), val(t + 1), val(t + 2), val(t + 3));
        if constexpr (kHint)
          red_f32x4_hint(q, v, policy);
        else
          red_f32x4(q, v);
      } else if constexpr (kVec == 2) {
        red_f32x2(q, val(t), val(t + 1));
      } else {
        red_f32(q, val(t));
      }
    }
    i += n;
  }
}

// ---- kernels
// -------------------------------------------------------------------------------------

template <int kVec, bool kHint, int kWarps>
__global__ void __launch_bounds__(32 * kWarps, 1)
    red_kernel(float* __restrict__ acc, const int* __restrict__ idx, int chunks,
               unsigned long long* cycles) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint64_t policy = 0;
  if constexpr (kHint) policy = evict_last_policy();
  __syncthreads();
  const long long t0 = clock64();
  Idx next = load_idx(idx, chunk_set(blockIdx.x, 0, gridDim.x), lane);
  for (int c = 0; c < chunks; ++c) {
    const Idx ix = next;
    if (c + 1 < chunks) next = load_idx(idx, chunk_set(blockIdx.x, c + 1, gridDim.x), lane);
    reduce_chunk<kVec, kHint>(acc, ix, warp, kWarps, chunk_offset(blockIdx.x, c), lane, policy);
  }
  store_cycles(cycles, t0);
}

template <int kWarps>
__global__ void __launch_bounds__(32 * kWarps, 1)
    gather_kernel(const uint8_t* __restrict__ kv, const int* __restrict__ idx, int chunks,
                  unsigned long long* cycles) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t base = smem_u32(smem);
  __syncthreads();
  const long long t0 = clock64();
  Idx next = load_idx(idx, chunk_set(blockIdx.x, 0, gridDim.x), lane);
  for (int c = 0; c < chunks; ++c) {
    const Idx ix = next;
    if (c + 1 < chunks) next = load_idx(idx, chunk_set(blockIdx.x, c + 1, gridDim.x), lane);
    gather_chunk(base + (c & 1) * kGatherChunkBytes, kv, ix, warp, kWarps, lane);
    cp_async_commit();
    cp_async_wait<1>();  // chunk c - 1 has landed: its buffer is the next one written
  }
  cp_async_wait<0>();
  store_cycles(cycles, t0);
}

// Warps 0 .. kG - 1 gather (double-buffered), warps kG .. kG + kR - 1 reduce with red.v4. kSync:
// one named barrier per chunk for all warps (gather c in flight while chunk c is reduced, and no
// role runs ahead of the other by more than a chunk).
template <int kG, int kR, bool kSync>
__global__ void __launch_bounds__(32 * (kG + kR), 1)
    mixed_kernel(const uint8_t* __restrict__ kv, float* __restrict__ acc,
                 const int* __restrict__ idx, int chunks, unsigned long long* cycles) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kThreads = 32 * (kG + kR);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t base = smem_u32(smem);
  __syncthreads();
  const long long t0 = clock64();
  Idx next = load_idx(idx, chunk_set(blockIdx.x, 0, gridDim.x), lane);
  if (warp < kG) {
    for (int c = 0; c < chunks; ++c) {
      const Idx ix = next;
      if (c + 1 < chunks) next = load_idx(idx, chunk_set(blockIdx.x, c + 1, gridDim.x), lane);
      gather_chunk(base + (c & 1) * kGatherChunkBytes, kv, ix, warp, kG, lane);
      cp_async_commit();
      cp_async_wait<1>();
      if constexpr (kSync) named_barrier(1, kThreads);
    }
    cp_async_wait<0>();
  } else {
    for (int c = 0; c < chunks; ++c) {
      const Idx ix = next;
      if (c + 1 < chunks) next = load_idx(idx, chunk_set(blockIdx.x, c + 1, gridDim.x), lane);
      reduce_chunk<4, false>(acc, ix, warp - kG, kR, chunk_offset(blockIdx.x, c), lane, 0);
      if constexpr (kSync) named_barrier(1, kThreads);
    }
  }
  store_cycles(cycles, t0);
}

// 8 warps; a 64 x 576 fp32 staging tile (slot-major rows of 2,304 B) written once with cb = 0;
// lanes 0-7 of warp w reduce rows 8 w + lane of every chunk, one bulk operation per row.
__global__ void __launch_bounds__(256, 1)
    bulk_static_kernel(float* __restrict__ acc, const int* __restrict__ idx, int chunks,
                       unsigned long long* cycles) {
  extern __shared__ __align__(128) uint8_t smem[];
  float* const tile = reinterpret_cast<float*>(smem);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int e = threadIdx.x; e < kChunkRows * kCols; e += blockDim.x) {
    const int slot = e / kCols, col = e % kCols;
    tile[e] = val(3 * slot + col + 5 * (col >> 5));
  }
  fence_proxy_async_smem();
  __syncthreads();
  const long long t0 = clock64();
  const int slot = 8 * warp + (lane & 7);
  const uint32_t src = smem_u32(tile) + slot * kAccRowBytes;
  Idx next = load_idx(idx, chunk_set(blockIdx.x, 0, gridDim.x), lane);
  for (int c = 0; c < chunks; ++c) {
    const Idx ix = next;
    if (c + 1 < chunks) next = load_idx(idx, chunk_set(blockIdx.x, c + 1, gridDim.x), lane);
    const int row = row_of(ix, warp >= 4, slot);
    if (lane < 8) {
      bulk_red_f32(acc + static_cast<size_t>(row) * kCols, src, kAccRowBytes);
      bulk_commit();
      bulk_wait_read<1>();
    }
  }
  if (lane < 8) bulk_wait_all();
  store_cycles(cycles, t0);
}

// 8 warps; warp w owns slots 8 w .. 8 w + 7 of every chunk, staged as two halves of 4 rows in its
// own two stages (2 x 9,216 B). Per half: the stage's previous reads are done (issuing lanes 0-3:
// wait_group.read 1), the warp writes the 4 rows (18 st.shared.v4 per lane, values of this chunk),
// fence.proxy.async, lanes 0-3 each reduce one 2,304-byte row.
__global__ void __launch_bounds__(256, 1)
    bulk_rewrite_kernel(float* __restrict__ acc, const int* __restrict__ idx, int chunks,
                        unsigned long long* cycles) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kStageBytes = 4 * kAccRowBytes;  // 9,216
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t wbase = smem_u32(smem) + warp * 2 * kStageBytes;
  __syncthreads();
  const long long t0 = clock64();
  Idx next = load_idx(idx, chunk_set(blockIdx.x, 0, gridDim.x), lane);
  for (int c = 0; c < chunks; ++c) {
    const Idx ix = next;
    if (c + 1 < chunks) next = load_idx(idx, chunk_set(blockIdx.x, c + 1, gridDim.x), lane);
    const int cb = chunk_offset(blockIdx.x, c);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t stage = wbase + h * kStageBytes;
      const int slot0 = 8 * warp + 4 * h;
      const int row = row_of(ix, warp >= 4, slot0 + (lane & 3));
      if (lane < 4) bulk_wait_read<1>();
      __syncwarp();
#pragma unroll 6
      for (int k = 0; k < kStageBytes / 512; ++k) {  // 18 float4 per lane
        const int q = 32 * k + lane;                 // float4 index in the stage
        const int r = q / (kCols / 4), col = 4 * (q % (kCols / 4));
        const int t = cb + 3 * (slot0 + r) + col + 5 * (col >> 5);
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(stage + 16 * q), "f"(val(t)),
                     "f"(val(t + 1)), "f"(val(t + 2)), "f"(val(t + 3))
                     : "memory");
      }
      fence_proxy_async_smem();
      __syncwarp();
      if (lane < 4) {
        bulk_red_f32(acc + static_cast<size_t>(row) * kCols, stage + lane * kAccRowBytes,
                     kAccRowBytes);
        bulk_commit();
      }
    }
  }
  if (lane < 4) bulk_wait_all();
  store_cycles(cycles, t0);
}

// ---- host
// ----------------------------------------------------------------------------------------

struct Test {
  std::string name;
  int warps;
  double red_bytes, gather_bytes;   // per chunk
  int check;                        // 0: none, 1: values of each chunk, 2: static tile (cb = 0)
  std::function<void(int)> launch;  // chunks per CTA
};

struct Result {
  double ms = 0, gbps = 0, us_per_chunk = 0;
  long long chunks_total = 0;
  bool ok = false;
};

// The accumulator after `chunks` chunks per CTA from zero.
static std::vector<double> expected(const std::vector<int>& idx, int grid, int chunks,
                                    bool static_tile) {
  std::vector<double> e(size_t{kRows} * kCols, 0.0);
  for (int b = 0; b < grid; ++b)
    for (int c = 0; c < chunks; ++c) {
      const int set = (c * grid + b) % kSets;
      const int cb = static_tile ? 0 : 7 * b + c;
      for (int slot = 0; slot < kChunkRows; ++slot) {
        double* row = e.data() + size_t(idx[set * kChunkRows + slot]) * kCols;
        for (int col = 0; col < kCols; ++col)
          row[col] += hval(cb + 3 * slot + col + 5 * (col >> 5));
      }
    }
  return e;
}

int main(int argc, char** argv) {
  const double target_ms = argc > 1 ? std::atof(argv[1]) : 60.0;
  const double ref_ms = argc > 2 ? std::atof(argv[2]) : 7.31;
  constexpr int kCheckChunks = 3;

  const Gpu gpu = query_gpu();
  std::printf("device %s, sm_%d%d, %d SMs, L2 %.1f MB; grid %d CTAs (one per SM)\n",
              gpu.prop.name, gpu.major, gpu.minor, gpu.sms, gpu.l2 / 1e6, gpu.sms);
  if (gpu.major != 9) std::printf("warning: built for sm_90a; this is not a Hopper GPU\n");
  const int grid = gpu.sms;

  // Buffers: the fp32 accumulator (9.4 MB), the bf16 kv rows (4.7 MB), 4096 index sets (1 MB).
  const TrafficBuffers buf = alloc_traffic(size_t{kRows} * kAccRowBytes, grid);
  float* const acc = buf.acc;
  uint8_t* const kv = buf.kv;
  int* const idx = buf.idx;
  unsigned long long* const cycles = buf.cycles;
  const size_t acc_bytes = buf.acc_bytes;
  const std::vector<int>& h_idx = buf.h_idx;

  // ---- the tests ----
  std::vector<Test> tests;
  auto add_red = [&](const char* name, auto kernel, int warps) {
    tests.push_back({name, warps, double(kRedChunkBytes), 0.0, 1,
                     [=](int chunks) { kernel<<<grid, 32 * warps>>>(acc, idx, chunks, cycles); }});
  };
  add_red("red.v4 4x128B", red_kernel<4, false, 4>, 4);
  add_red("red.v4 4x128B", red_kernel<4, false, 8>, 8);
  add_red("red.v4 4x128B", red_kernel<4, false, 12>, 12);
  add_red("red.v4 4x128B evict_last", red_kernel<4, true, 8>, 8);
  add_red("red.v2 2x128B", red_kernel<2, false, 8>, 8);
  add_red("red.f32 1x128B", red_kernel<1, false, 8>, 8);
  auto add_gather = [&](const char* name, auto kernel, int warps) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    tests.push_back({name, warps, 0.0, double(kGatherChunkBytes), 0, [=](int chunks) {
                       kernel<<<grid, 32 * warps, kSmemBytes>>>(kv, idx, chunks, cycles);
                     }});
  };
  add_gather("gather cp.async 2 buf", gather_kernel<4>, 4);
  add_gather("gather cp.async 2 buf", gather_kernel<8>, 8);
  auto add_mixed = [&](const char* name, auto kernel, int warps) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    tests.push_back(
        {name, warps, double(kRedChunkBytes), double(kGatherChunkBytes), 1, [=](int chunks) {
           kernel<<<grid, 32 * warps, kSmemBytes>>>(kv, acc, idx, chunks, cycles);
         }});
  };
  add_mixed("mixed 4g+8r sync", mixed_kernel<4, 8, true>, 12);
  add_mixed("mixed 4g+4r sync", mixed_kernel<4, 4, true>, 8);
  add_mixed("mixed 4g+8r free", mixed_kernel<4, 8, false>, 12);
  auto add_bulk = [&](const char* name, auto kernel, int check) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    tests.push_back({name, 8, double(kRedChunkBytes), 0.0, check, [=](int chunks) {
                       kernel<<<grid, 256, kSmemBytes>>>(acc, idx, chunks, cycles);
                     }});
  };
  add_bulk("bulk red 2304B static", bulk_static_kernel, 2);
  add_bulk("bulk red 2304B rewrite", bulk_rewrite_kernel, 1);

  // ---- correctness: every reducing test on 3 chunks per CTA from a zeroed accumulator ----
  bool all = true;
  {
    const std::vector<double> e_dyn = expected(h_idx, grid, kCheckChunks, false);
    const std::vector<double> e_static = expected(h_idx, grid, kCheckChunks, true);
    std::vector<float> got(size_t{kRows} * kCols);
    for (const Test& t : tests) {
      if (!t.check) continue;
      CK(cudaMemset(acc, 0, acc_bytes));
      t.launch(kCheckChunks);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(got.data(), acc, acc_bytes, cudaMemcpyDeviceToHost));
      const std::vector<double>& e = t.check == 2 ? e_static : e_dyn;
      double max_err = 0, sum = 0;
      size_t bad = 0;
      for (size_t k = 0; k < got.size(); ++k) {
        const double err = std::fabs(double(got[k]) - e[k]);
        max_err = std::max(max_err, err);
        sum += e[k];
        if (err > 1e-6 * std::max(1.0, std::fabs(e[k]))) ++bad;
      }
      all = all && bad == 0;
      std::printf("check %-26s %2dw: %s (max |err| %.3g, %zu of %zu elements off, sum %.6g)\n",
                  t.name.c_str(), t.warps, bad == 0 ? "PASS" : "FAIL", max_err, bad, got.size(),
                  sum);
    }
    std::printf("check: %s\n\n", all ? "PASS" : "FAIL");
  }

  // ---- timing ----
  std::printf("%-26s %5s %10s %8s %9s %9s %9s %9s %9s %9s %8s %6s\n", "test", "warps", "chunks/CTA",
              "ms(med)", "GB moved", "GB/s tot", "GB/s red", "GB/s gth", "us/chunk", "clk/chunk",
              "B/clk/SM", "MHz");
  std::vector<Result> results(tests.size());
  for (size_t ti = 0; ti < tests.size(); ++ti) {
    const Test& t = tests[ti];
    const ChunkRun run = run_chunks(t.launch, target_ms, acc, acc_bytes, cycles, grid);
    const int chunks = run.chunks;
    const double med = run.med_ms, mean_cyc = run.mean_cyc, total = run.total;
    const double clk_chunk = run.clk_chunk;
    const double bytes = total * (t.red_bytes + t.gather_bytes);
    Result& res = results[ti];
    res = {med, bytes / med / 1e6, med * 1e3 / chunks, static_cast<long long>(total), true};
    std::printf("%-26s %5d %10d %8.3f %9.3f %9.1f %9.1f %9.1f %9.3f %9.0f %8.2f %6.0f\n",
                t.name.c_str(), t.warps, chunks, med, bytes / 1e9, bytes / med / 1e6,
                total * t.red_bytes / med / 1e6, total * t.gather_bytes / med / 1e6,
                res.us_per_chunk, clk_chunk, (t.red_bytes + t.gather_bytes) / clk_chunk,
                mean_cyc / (med * 1e3));
  }

  // ---- the DSA backward beside the ceilings ----
  {
    const double chunks = 4096.0 * 32;  // H64 D576 S4096 topk2048: 4096 tokens x 32 chunks
    const double red = chunks * kRedChunkBytes, gth = chunks * kGatherChunkBytes;
    std::printf(
        "\nDSA backward H64 D576 S4096 topk2048: %.2f ms for %.0f chunks, %.2f GB reduced "
        "+ %.2f GB gathered = %.1f GB/s (red %.1f, gather %.1f)\n",
        ref_ms, chunks, red / 1e9, gth / 1e9, (red + gth) / ref_ms / 1e6, red / ref_ms / 1e6,
        gth / ref_ms / 1e6);
    auto floor_line = [&](const char* what, size_t ti, double bytes_per_chunk) {
      const Result& r = results[ti];
      const double floor_ms = chunks * bytes_per_chunk / (r.gbps * 1e6);
      std::printf(
          "  %-44s %8.1f GB/s -> floor %.3f ms: kernel %.2fx the floor (%.1f%% of the ceiling), "
          "cuDNN-FE (-2%%) %.2fx\n",
          what, r.gbps, floor_ms, ref_ms / floor_ms, 100.0 * floor_ms / ref_ms,
          ref_ms / 1.02 / floor_ms);
    };
    auto find = [&](const char* name, int warps) {
      for (size_t i = 0; i < tests.size(); ++i)
        if (tests[i].name == name && tests[i].warps == warps) return i;
      return size_t(0);
    };
    floor_line("reductions only (red.v4 4x128B, 8 warps)", find("red.v4 4x128B", 8),
               kRedChunkBytes);
    size_t best = find("red.v4 4x128B", 8);
    for (int w : {4, 12})
      if (results[find("red.v4 4x128B", w)].gbps > results[best].gbps)
        best = find("red.v4 4x128B", w);
    floor_line("reductions only (best red.v4, 4/8/12 warps)", best, kRedChunkBytes);
    floor_line("gather + reductions (mixed 4g+8r sync)", find("mixed 4g+8r sync", 12),
               kRedChunkBytes + kGatherChunkBytes);
    floor_line("gather + reductions (mixed 4g+4r sync)", find("mixed 4g+4r sync", 8),
               kRedChunkBytes + kGatherChunkBytes);
  }
  free_traffic(buf);
  if (!all) std::printf("check FAILED: the timings above are of wrong kernels\n");
  return all ? 0 : 1;
}
