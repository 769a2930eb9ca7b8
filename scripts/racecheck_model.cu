// What compute-sanitizer's racecheck follows: the hand-off patterns of our Hopper kernels, each
// alone in a minimal kernel (bench/notes-archive, session 13, with the results). Not part of the
// build.
//   nvcc -arch=sm_90a -lineinfo -O2 -o racecheck_model scripts/racecheck_model.cu
//   for m in 0 1 2 3 4 5; do compute-sanitizer --tool racecheck ./racecheck_model $m; done
// 384 threads: warps 0-3 a "producer", warps 4-11 two "consumer" warpgroups (WG0, WG1).
//   0 named:    WG1 stores, bar.sync 6,256; WG0 loads; bar.sync 7,256; looped (clean)
//   1 mbar8:    ring of 2 buffers: the producer waits "empty", stores buf[g%2], arrives "full"
//               (128); the consumers wait "full", load, bar.sync 5,256, lane 0 of each warp
//               arrives "empty" (count 8) (8 hazards)
//   2 mbar256:  as 1, every consumer thread arrives "empty" (count 256) (clean)
//   3 mbar8s:   as 1, with __syncwarp() before lane 0's arrive (8 hazards)
//   4 arrive:   mode 0 through bar.arrive -> bar.sync pairs: WG1 stores, bar.arrive 6; WG0
//               bar.sync 6, loads, bar.arrive 7; WG1 bar.sync 7 (4 hazards, both directions)
//   5 pingpong: mode 0 plus a schedule token passed with bar.sync own / bar.arrive other (ids 2,
//               3) each iteration, as the BSA forward's two consumer warpgroups do (clean)
// Every mode is correct under the PTX memory model; racecheck orders two threads' accesses only
// through a barrier both pass with bar.sync, or an mbarrier the accessing thread arrives on.
#include <cstdio>
#include <cstdint>
#include <cstdlib>

__device__ __forceinline__ uint32_t sa(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mb_init(uint64_t* b, int n) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(sa(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mb_arrive(uint64_t* b) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared.b64 st, [%0]; }" ::"r"(sa(b)) : "memory");
}
__device__ __forceinline__ void mb_wait(uint64_t* b, uint32_t parity) {
  asm volatile(
      "{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" ::"r"(
          sa(b)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

template <int kMode>  // 0 named, 1 mbar8, 2 mbar256, 3 mbar8s, 4 arrive, 5 pingpong
__global__ void __launch_bounds__(384) repro(float* out, int iters) {
  __shared__ float buf[2][256];
  __shared__ uint64_t full, empty;
  const int t = threadIdx.x;
  if (t == 0) {
    mb_init(&full, 128);
    mb_init(&empty, kMode == 2 ? 256 : 8);
  }
  __syncthreads();
  float acc = 0.f;
  if (kMode == 4) {
    if (t < 128) return;
    const int wg = (t - 128) / 128, w = (t - 128) % 128;
    for (int i = 0; i < iters; ++i) {
      if (wg == 1) {
        buf[0][w] = float(i + w);
        bar_arrive(6, 256);
        bar_sync(7, 256);
      } else {
        bar_sync(6, 256);
        acc += buf[0][w];
        bar_arrive(7, 256);
      }
    }
  } else if (kMode == 0 || kMode == 5) {
    if (t < 128) return;
    const int wg = (t - 128) / 128, w = (t - 128) % 128;
    if (kMode == 5 && wg == 1) bar_arrive(2, 256);
    for (int i = 0; i < iters; ++i) {
      if (kMode == 5) {
        for (int k = 0; k < 3; ++k) {
          bar_sync(2 + wg, 256);
          acc += 1.f;
          bar_arrive(3 - wg, 256);
        }
      }
      if (wg == 1) {
        buf[0][w] = float(i + w);
        buf[0][128 + w] = float(i - w);
      }
      bar_sync(6, 256);
      if (wg == 0) acc += buf[0][w] + buf[0][128 + w];
      bar_sync(7, 256);
    }
  } else {
    if (t < 128) {
      for (int g = 0; g < iters; ++g) {
        mb_wait(&empty, (g & 1) ^ 1);
        buf[g & 1][t] = float(g + t);
        buf[g & 1][128 + t] = float(g - t);
        mb_arrive(&full);
      }
      return;
    }
    const int w = t - 128;
    for (int g = 0; g < iters; ++g) {
      mb_wait(&full, g & 1);
      acc += buf[g & 1][w] + buf[g & 1][(w + 37) % 256];
      bar_sync(5, 256);
      if (kMode == 3) __syncwarp();
      if (kMode == 2 || (t % 32) == 0) mb_arrive(&empty);
    }
  }
  out[blockIdx.x * 384 + t] = acc;
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  float* out;
  cudaMalloc(&out, 4 * 384 * 4);
  if (mode == 0) repro<0><<<4, 384>>>(out, 64);
  if (mode == 1) repro<1><<<4, 384>>>(out, 64);
  if (mode == 2) repro<2><<<4, 384>>>(out, 64);
  if (mode == 3) repro<3><<<4, 384>>>(out, 64);
  if (mode == 4) repro<4><<<4, 384>>>(out, 64);
  if (mode == 5) repro<5><<<4, 384>>>(out, 64);
  const cudaError_t e = cudaDeviceSynchronize();
  printf("mode %d: %s\n", mode, cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
