// The GPU reverse-map builder (cuda/reverse_map_gpu.hpp) against the CPU builder that defines
// the map (common/reverse_map.hpp), field by field:
//  * random patterns: per-row counts with empty rows, KV blocks nobody attends, fixed counts,
//    full rows, MHA / GQA (G = 2, 3, 4) / MQA, blocks 64 and 128, buckets 1, 2, 3, auto (0) and
//    larger than any row, and S = 32768 shapes (Nq = 512) for the large case;
//  * step 6's order of the last work items (longest first);
//  * a CUDA-graph capture of the build, replayed after the metadata VALUES change on the device;
//  * metadata that breaks the contract: nothing is written outside the workspace, and the map is
//    that of the metadata with the documented fixes (clamped counts, dropped out-of-range and
//    repeated entries).
// Every test skips itself where there is no CUDA device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "bsa_problem_builder.hpp"
#include "common/error.hpp"
#include "common/reverse_map.hpp"
#include "cuda/reverse_map_gpu.hpp"
#include "gpu_test_util.hpp"
#include "test_util.hpp"

namespace {

using sa_test::BsaPattern;
using sa_test::BsaPatternSpec;
using sa_test::BsaShape;

// The builder reads no head dim: D = D_v = 8.
BsaShape make_shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Skv, int32_t block,
                    int64_t Kmax) {
  return sa_test::shape_of(B, Hq, Hkv, Sq, Skv, /*D=*/8, block, Kmax);
}

BsaPatternSpec make_spec(bool per_row_count, bool empty_rows, int64_t unattended_block,
                         int32_t fixed_count = -1) {
  return sa_test::spec_of(per_row_count, fixed_count, empty_rows, /*len=*/false,
                          /*len_per_batch=*/false, unattended_block);
}

// Device memory owned for one test; a failed allocation fails the test (non-fatally).
class TestBuffer : public sa_test::DeviceBuffer {
 public:
  explicit TestBuffer(size_t bytes) : DeviceBuffer(bytes) {
    EXPECT_TRUE(ok()) << "cudaMalloc of " << bytes << " bytes failed";
  }
};

// A pattern's q2k_index / q2k_count on the device, behind a BsaMeta with the pattern's strides.
class DeviceMeta {
 public:
  explicit DeviceMeta(const BsaPattern& pat)
      : index_(pat.q2k_index.bytes().size()),
        count_(pat.has_count ? pat.q2k_count.bytes().size() : 0) {
    meta_ = pat.meta();
    meta_.q2k_index.data = static_cast<const int32_t*>(index_.get());
    meta_.q2k_count.data = pat.has_count ? static_cast<const int32_t*>(count_.get()) : nullptr;
    meta_.kv_block_len.data = nullptr;  // not read by the builder
    upload(pat, nullptr);
  }
  // New values, same shapes (stream-ordered; synchronises the stream).
  void upload(const BsaPattern& pat, cudaStream_t stream) {
    ASSERT_EQ(pat.q2k_index.bytes().size(), index_.bytes());
    ASSERT_EQ(cudaMemcpyAsync(index_.get(), pat.q2k_index.data(), index_.bytes(),
                              cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    if (pat.has_count) {
      ASSERT_EQ(pat.q2k_count.bytes().size(), count_.bytes());
      ASSERT_EQ(cudaMemcpyAsync(count_.get(), pat.q2k_count.data(), count_.bytes(),
                                cudaMemcpyHostToDevice, stream),
                cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  const sa::BsaMeta& meta() const { return meta_; }

 private:
  TestBuffer index_, count_;
  sa::BsaMeta meta_;
};

// The first position where two int vectors differ, or success.
::testing::AssertionResult same_ints(const char* field, const std::vector<int32_t>& gpu,
                                     const std::vector<int32_t>& cpu) {
  if (gpu.size() != cpu.size())
    return ::testing::AssertionFailure()
           << field << ": GPU has " << gpu.size() << " values, CPU " << cpu.size();
  for (size_t i = 0; i < gpu.size(); ++i)
    if (gpu[i] != cpu[i])
      return ::testing::AssertionFailure()
             << field << "[" << i << "]: GPU " << gpu[i] << ", CPU " << cpu[i];
  return ::testing::AssertionSuccess();
}

// Field by field; the bucket only where it was asked for (bucket > 0): for bucket <= 0 the CPU
// map's bucket is the longest row and the GPU map's is G * Nq, with the same groups and items.
void expect_same_map(const sa::ReverseMap& gpu, const sa::ReverseMap& cpu, int32_t bucket) {
  EXPECT_EQ(gpu.num_rows, cpu.num_rows);
  if (bucket > 0) {
    EXPECT_EQ(gpu.bucket, cpu.bucket);
  }
  EXPECT_TRUE(same_ints("row_offsets", gpu.row_offsets, cpu.row_offsets));
  EXPECT_TRUE(same_ints("entries", gpu.entries, cpu.entries));
  EXPECT_TRUE(same_ints("row_groups", gpu.row_groups, cpu.row_groups));
  EXPECT_TRUE(same_ints("item_row", gpu.item_row, cpu.item_row));
  EXPECT_TRUE(same_ints("item_begin", gpu.item_begin, cpu.item_begin));
  EXPECT_TRUE(same_ints("item_end", gpu.item_end, cpu.item_end));
}

// The returned struct: shape-derived fields, pointers 256-byte aligned inside the workspace.
void expect_well_placed(const sa::portable::ReverseMapDevice& map, const BsaShape& s,
                        int32_t bucket, const void* workspace, size_t bytes) {
  EXPECT_EQ(map.num_rows, s.B * s.Hkv * s.Nkv());
  EXPECT_EQ(map.bucket, bucket > 0 ? bucket : static_cast<int32_t>(s.group() * s.Nq()));
  const char* lo = static_cast<const char*>(workspace);
  const char* hi = lo + bytes;
  const int32_t* pointers[] = {map.row_offsets, map.entries,  map.row_groups, map.item_row,
                               map.item_begin,  map.item_end, map.num_items};
  for (const int32_t* p : pointers) {
    const char* c = reinterpret_cast<const char*>(p);
    EXPECT_TRUE(c >= lo && c < hi) << "pointer outside the workspace";
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % sa::portable::kReverseMapAlignment, 0u);
  }
}

// ---------------------------------------------------------------------------------------------
// Random patterns.
// ---------------------------------------------------------------------------------------------
struct GpuRevCase {
  std::string name;
  BsaShape shape;
  BsaPatternSpec spec;
  int32_t bucket;
};

void PrintTo(const GpuRevCase& c, std::ostream* os) { *os << c.name; }

class GpuReverseMap : public ::testing::TestWithParam<GpuRevCase> {};

TEST_P(GpuReverseMap, MatchesCpuBuilder) {
  SA_SKIP_WITHOUT_GPU();
  const GpuRevCase& c = GetParam();
  const BsaShape& s = c.shape;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  const BsaPattern pat = sa_test::random_bsa_pattern(s, c.spec, rng);
  const sa::ReverseMap want = sa::build_reverse_map_cpu(s.dims(), pat.meta(), c.bucket);

  DeviceMeta dev(pat);
  const size_t bytes = sa::portable::reverse_map_workspace_bytes(s.dims(), c.bucket, 0, false);
  TestBuffer workspace(bytes);
  // Stale contents must not matter.
  ASSERT_EQ(cudaMemset(workspace.get(), 0xff, bytes), cudaSuccess);
  const sa::portable::ReverseMapDevice map = sa::portable::build_reverse_map_gpu(
      s.dims(), dev.meta(), c.bucket, workspace.get(), bytes, nullptr);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  expect_well_placed(map, s, c.bucket, workspace.get(), bytes);
  const sa::ReverseMap got = sa::portable::download_reverse_map(map, nullptr);
  expect_same_map(got, want, c.bucket);
  EXPECT_LE(static_cast<int64_t>(got.item_row.size()), map.max_items);
  EXPECT_LE(static_cast<int64_t>(got.entries.size()), map.entries_capacity);
}

std::vector<GpuRevCase> gpu_reverse_map_cases() {
  struct Pattern {
    std::string name;
    BsaShape shape;
    BsaPatternSpec spec;
    std::vector<int32_t> buckets;
  };
  const std::vector<int32_t> small_buckets = {1, 2, 3, 0, 1000};
  const Pattern patterns[] = {
      // G = 1, Nq = 16 != Nkv = 19.
      {"MhaEmptyRowsUnattended", make_shape(2, 3, 3, 1000, 1200, 64, 6),
       make_spec(true, true, 5), small_buckets},
      {"Gqa2EmptyRowsUnattended", make_shape(2, 4, 2, 640, 640, 64, 4),
       make_spec(true, true, 2), small_buckets},
      // G * Nq = 64: two words per reverse row.
      {"Gqa4TwoWords", make_shape(1, 8, 2, 1024, 1500, 64, 7), make_spec(true, true, -1),
       small_buckets},
      // G * Nq = 33: the second word holds one bit.
      {"Gqa3PartialWord", make_shape(1, 6, 2, 700, 900, 64, 5), make_spec(true, true, 3),
       small_buckets},
      {"MqaBlock128", make_shape(2, 4, 1, 2048, 1920, 128, 5), make_spec(true, true, 0),
       small_buckets},
      {"FixedCountUnattended", make_shape(1, 4, 2, 512, 768, 64, 3), make_spec(false, false, 1),
       small_buckets},
      // Every forward row lists every KV block: every reverse row is full (G * Nq entries).
      {"DenseAllBlocks", make_shape(1, 4, 1, 1024, 1024, 64, 16), make_spec(false, false, -1),
       small_buckets},
      // S = 32768, block 64: Nq = Nkv = 512; G * Nq = 2048 bits = 64 words per row.
      {"S32768Block64Gqa4", make_shape(1, 32, 8, 32768, 32768, 64, 48),
       make_spec(true, true, 100), {0, 3, 64}},
      // MQA: 128 words per row.
      {"S32768Block64Mqa", make_shape(1, 8, 1, 32768, 32768, 64, 32), make_spec(true, true, 7),
       {0, 16}},
      {"S32768Block128Mha", make_shape(1, 32, 32, 32768, 32768, 128, 32),
       make_spec(true, true, -1), {0, 2}},
  };
  std::vector<GpuRevCase> cases;
  for (const Pattern& p : patterns)
    for (int32_t bucket : p.buckets)
      cases.push_back({p.name + "Bucket" + (bucket > 0 ? std::to_string(bucket) : "Auto"),
                       p.shape, p.spec, bucket});
  return cases;
}

// Step 6: the last min(tail, n) launch slots take the tail's items longest first, ties by index
// (a tail of 5, 265: one past two waves at block 128 on 132 SMs, and the most the step orders).
TEST_P(GpuReverseMap, OrdersTheTailLongestFirst) {
  SA_SKIP_WITHOUT_GPU();
  const GpuRevCase& c = GetParam();
  const BsaShape& s = c.shape;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  const BsaPattern pat = sa_test::random_bsa_pattern(s, c.spec, rng);
  DeviceMeta dev(pat);
  for (const int32_t tail : {5, 265, sa::portable::kMaxTailItems}) {
    SCOPED_TRACE("tail " + std::to_string(tail));
    const size_t bytes = sa::portable::reverse_map_workspace_bytes(s.dims(), c.bucket, tail, false);
    TestBuffer workspace(bytes);
    ASSERT_EQ(cudaMemset(workspace.get(), 0xff, bytes), cudaSuccess);
    const sa::portable::ReverseMapDevice map = sa::portable::build_reverse_map_gpu(
        s.dims(), dev.meta(), c.bucket, workspace.get(), bytes, nullptr, tail);
    ASSERT_EQ(map.tail_items, tail);
    const sa::ReverseMap got = sa::portable::download_reverse_map(map, nullptr);
    const int32_t n = static_cast<int32_t>(got.item_row.size());
    const int32_t count = std::min(n, tail);
    std::vector<int32_t> order(static_cast<size_t>(count));
    ASSERT_EQ(cudaMemcpy(order.data(), map.item_order, order.size() * sizeof(int32_t),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    // The expected order: the tail's item indices by (length descending, index ascending).
    std::vector<int32_t> want(static_cast<size_t>(count));
    for (int32_t i = 0; i < count; ++i) want[static_cast<size_t>(i)] = n - count + i;
    const auto len = [&](int32_t i) {
      return got.item_end[static_cast<size_t>(i)] - got.item_begin[static_cast<size_t>(i)];
    };
    std::stable_sort(want.begin(), want.end(),
                     [&](int32_t a, int32_t b) { return len(a) > len(b); });
    EXPECT_EQ(order, want);
  }
}

INSTANTIATE_TEST_SUITE_P(Patterns, GpuReverseMap, ::testing::ValuesIn(gpu_reverse_map_cases()),
                         [](const ::testing::TestParamInfo<GpuRevCase>& i) {
                           return i.param.name;
                         });

// ---------------------------------------------------------------------------------------------
// CUDA graph: capture once, replay with new metadata values.
// ---------------------------------------------------------------------------------------------
TEST(GpuReverseMapGraph, ReplayFollowsNewMetadataValues) {
  SA_SKIP_WITHOUT_GPU();
  const BsaShape s = make_shape(2, 8, 2, 4096, 4096, 64, 12);
  const BsaPatternSpec spec = make_spec(true, true, 9);
  const int32_t bucket = 3;
  std::mt19937_64 rng(20240611);
  const BsaPattern first = sa_test::random_bsa_pattern(s, spec, rng);
  const BsaPattern second = sa_test::random_bsa_pattern(s, make_spec(true, true, 40), rng);

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  DeviceMeta dev(first);
  const size_t bytes = sa::portable::reverse_map_workspace_bytes(s.dims(), bucket, 0, false);
  TestBuffer workspace(bytes);

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  sa::portable::ReverseMapDevice map;
  try {
    map = sa::portable::build_reverse_map_gpu(s.dims(), dev.meta(), bucket, workspace.get(),
                                              bytes, stream);
  } catch (const sa::Error& e) {
    cudaStreamEndCapture(stream, &graph);
    FAIL() << "build failed during capture: " << e.what();
  }
  // An illegal call during capture (a synchronisation, say) invalidates it and fails here.
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (const BsaPattern* pat : {&first, &second, &first}) {
    SCOPED_TRACE(pat == &first ? "first pattern" : "second pattern");
    dev.upload(*pat, stream);
    ASSERT_EQ(cudaMemsetAsync(workspace.get(), 0xff, bytes, stream), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const sa::ReverseMap got = sa::portable::download_reverse_map(map, stream);
    expect_same_map(got, sa::build_reverse_map_cpu(s.dims(), pat->meta(), bucket), bucket);
  }

  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// ---------------------------------------------------------------------------------------------
// Metadata outside the contract.
// ---------------------------------------------------------------------------------------------
// The metadata the GPU builder effectively uses: counts clamped to [0, Kmax], entries outside
// [0, Nkv) dropped, repeats kept once (first occurrence); per-row counts.
BsaPattern sanitized(const BsaShape& s, const BsaPattern& raw) {
  BsaPattern out;
  out.q2k_index = sa_test::HostTensor(SA_DTYPE_INT32, raw.q2k_index.shape());
  out.q2k_count = sa_test::HostTensor(SA_DTYPE_INT32, {s.B, s.Hq, s.Nq()});
  out.has_count = true;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t m = 0; m < s.Nq(); ++m) {
        const int64_t count = std::clamp<int64_t>(raw.count(b, h, m), 0, s.Kmax);
        std::vector<int32_t> kept;
        for (int64_t slot = 0; slot < count; ++slot) {
          const int32_t n = raw.index(b, h, m, slot);
          if (n >= 0 && n < s.Nkv() && std::find(kept.begin(), kept.end(), n) == kept.end())
            kept.push_back(n);
        }
        for (int64_t slot = 0; slot < s.Kmax; ++slot)
          out.index(b, h, m, slot) =
              slot < static_cast<int64_t>(kept.size()) ? kept[static_cast<size_t>(slot)] : -1;
        out.q2k_count.i32()[(b * s.Hq + h) * s.Nq() + m] = static_cast<int32_t>(kept.size());
      }
  return out;
}

TEST(GpuReverseMapBadMetadata, StaysInsideWorkspaceAndDropsBadEntries) {
  SA_SKIP_WITHOUT_GPU();
  const BsaShape s = make_shape(2, 4, 2, 640, 900, 64, 6);  // Nq = 10, Nkv = 15
  std::mt19937_64 rng(7);
  BsaPattern raw = sa_test::random_bsa_pattern(s, make_spec(true, true, -1), rng);
  std::uniform_int_distribution<int32_t> bad_count(-3, static_cast<int32_t>(s.Kmax) + 3);
  std::uniform_int_distribution<int32_t> bad_index(-20, static_cast<int32_t>(s.Nkv()) + 20);
  for (int64_t i = 0; i < raw.q2k_count.numel(); ++i) raw.q2k_count.i32()[i] = bad_count(rng);
  for (int64_t i = 0; i < raw.q2k_index.numel(); ++i) raw.q2k_index.i32()[i] = bad_index(rng);
  raw.q2k_index.i32()[1] = raw.q2k_index.i32()[0];  // a repeat in row (0, 0, 0)
  const BsaPattern fixed = sanitized(s, raw);

  for (int32_t bucket : {1, 4, 0}) {
    SCOPED_TRACE("bucket " + std::to_string(bucket));
    DeviceMeta dev(raw);
    const size_t bytes = sa::portable::reverse_map_workspace_bytes(s.dims(), bucket, 0, false);
    const size_t guard = 4096;
    TestBuffer buffer(bytes + 2 * guard);
    ASSERT_EQ(cudaMemset(buffer.get(), 0xa5, bytes + 2 * guard), cudaSuccess);
    void* workspace = static_cast<char*>(buffer.get()) + guard;
    const sa::portable::ReverseMapDevice map =
        sa::portable::build_reverse_map_gpu(s.dims(), dev.meta(), bucket, workspace, bytes,
                                            nullptr);
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);

    std::vector<uint8_t> host(bytes + 2 * guard);
    ASSERT_EQ(cudaMemcpy(host.data(), buffer.get(), host.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (size_t i = 0; i < guard; ++i) {
      ASSERT_EQ(host[i], 0xa5) << "written before the workspace at " << i;
      ASSERT_EQ(host[guard + bytes + i], 0xa5) << "written after the workspace at " << i;
    }
    expect_same_map(sa::portable::download_reverse_map(map, nullptr),
                    sa::build_reverse_map_cpu(s.dims(), fixed.meta(), bucket), bucket);
  }
}

TEST(GpuReverseMapArguments, RefusesSmallOrMisalignedWorkspace) {
  SA_SKIP_WITHOUT_GPU();
  const BsaShape s = make_shape(1, 4, 2, 512, 512, 64, 3);
  std::mt19937_64 rng(3);
  const BsaPattern pat = sa_test::random_bsa_pattern(s, make_spec(true, true, -1), rng);
  DeviceMeta dev(pat);
  const size_t bytes = sa::portable::reverse_map_workspace_bytes(s.dims(), 2, 0, false);
  TestBuffer workspace(bytes + 256);
  EXPECT_THROW(sa::portable::build_reverse_map_gpu(s.dims(), dev.meta(), 2, workspace.get(),
                                                   bytes - 1, nullptr),
               sa::Error);
  EXPECT_THROW(sa::portable::build_reverse_map_gpu(s.dims(), dev.meta(), 2,
                                                   static_cast<char*>(workspace.get()) + 4,
                                                   bytes + 252, nullptr),
               sa::Error);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
}

}  // namespace
