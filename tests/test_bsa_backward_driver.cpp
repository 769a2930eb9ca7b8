// The BSA backward driver's plan (src/cuda/bsa_backward_driver.hpp), on the CPU: for each arch's
// policy shape (portable: CTA slots, no tail order; sm90: CTA slots and a tail order) the driver's
// plan is the one the arch folders built before the driver owned it:
//   make_bsa_backward_plan(p, auto bucket ? cta_slots(p) : 0, deterministic, !deterministic, tail)
// field by field over a grid of shapes and options. CTA slots and tails are stubbed (no GPU).
// Packed batches: the row layout of cuda/bsa_packed_rows.hpp (CPU) and the packed plan's sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common/dq_tile_layout.hpp"
#include "common/problem.hpp"
#include "cuda/bsa_backward_driver.hpp"
#include "cuda/bsa_backward_plan.hpp"
#include "cuda/bsa_packed_rows.hpp"
#include "test_util.hpp"

namespace sa_test {
namespace {

namespace bsa_bwd = sa::portable::bsa_bwd;
using sa::portable::BsaBwdPlan;

int64_t g_slots = 0;
int32_t g_tail = 0;
int g_slot_calls = 0;
int64_t stub_slots(const sa::BsaBwdProblem&) { ++g_slot_calls; return g_slots; }
int32_t stub_tail(const sa::BsaBwdProblem&) { return g_tail; }

void expect_same(const BsaBwdPlan& a, const BsaBwdPlan& b) {
  EXPECT_EQ(a.bucket, b.bucket);
  EXPECT_EQ(a.tail_items, b.tail_items);
  EXPECT_EQ(a.several_owners, b.several_owners);
  EXPECT_EQ(a.dq_accumulator, b.dq_accumulator);
  EXPECT_EQ(a.Sq_pad, b.Sq_pad);
  EXPECT_EQ(a.Skv_pad, b.Skv_pad);
  EXPECT_EQ(a.lse2, b.lse2);
  EXPECT_EQ(a.delta, b.delta);
  EXPECT_EQ(a.dq_accum, b.dq_accum);
  EXPECT_EQ(a.dk_accum, b.dk_accum);
  EXPECT_EQ(a.dv_accum, b.dv_accum);
  EXPECT_EQ(a.map, b.map);
  EXPECT_EQ(a.dq_bytes, b.dq_bytes);
  EXPECT_EQ(a.dq_ready, b.dq_ready);
  EXPECT_EQ(a.dkv_bytes, b.dkv_bytes);
  EXPECT_EQ(a.map_bytes, b.map_bytes);
  EXPECT_EQ(a.dq_ready_count, b.dq_ready_count);
  EXPECT_EQ(a.total, b.total);
}

TEST(BsaBackwardDriverPlan, SameAsTheArchPlansBeforeTheDriver) {
  SA_SKIP_WITHOUT_GPU();  // the plan asks CUB for its scan's temporary bytes on the device
  const bsa_bwd::KernelPolicy portable{"portable", false, &stub_slots, nullptr, nullptr, nullptr};
  const bsa_bwd::KernelPolicy hopper{"sm90", true, &stub_slots, &stub_tail, nullptr, nullptr};
  int cases = 0;
  for (int64_t B : {1, 2, 3})
    for (int64_t Hkv : {1, 2, 8})
      for (int64_t group : {1, 4, 16})
        for (int64_t S : {1, 63, 64, 129, 1000, 4096, 32768})
          for (int64_t Skv_extra : {0, 77})
            for (int32_t block : {64, 128})
              for (int64_t D : {64, 128})
                for (int64_t Kmax : {1, 4, 16})
                  for (int32_t bucket_size : {0, 4, 100000})
                    for (int deterministic : {0, 1})
                      for (int64_t slots : {132, 264, 1024}) {
                        sa::BsaBwdProblem p;
                        sa::BsaDims& d = p.dims;
                        d.B = B;
                        d.Hkv = Hkv;
                        d.Hq = Hkv * group;
                        d.Sq = S;
                        d.Skv = S + Skv_extra;
                        d.D = d.Dv = D;
                        d.block = block;
                        d.Nq = (d.Sq + block - 1) / block;
                        d.Nkv = (d.Skv + block - 1) / block;
                        d.Kmax = Kmax;
                        p.options.bucket_size = bucket_size;
                        p.options.deterministic = deterministic;
                        g_slots = slots;
                        // Twice the slots, within the reverse map's 1024 tail items.
                        g_tail = static_cast<int32_t>(std::min<int64_t>(2 * slots, 1024));
                        const bool auto_bucket = !deterministic && bucket_size <= 0;
                        const int64_t want_slots = auto_bucket ? slots : 0;
                        g_slot_calls = 0;
                        expect_same(bsa_bwd::plan(p, portable),
                                    sa::portable::make_bsa_backward_plan(
                                        p, want_slots, deterministic != 0, deterministic == 0));
                        // CTA slots are a device query: asked only for the automatic bucket.
                        EXPECT_EQ(g_slot_calls, auto_bucket ? 1 : 0);
                        expect_same(bsa_bwd::plan(p, hopper),
                                    sa::portable::make_bsa_backward_plan(
                                        p, want_slots, deterministic != 0, deterministic == 0,
                                        g_tail));
                        EXPECT_EQ(bsa_bwd::workspace_bytes(p, hopper),
                                  bsa_bwd::plan(p, hopper).total);
                        ++cases;
                        if (::testing::Test::HasFailure()) return;
                      }
  EXPECT_EQ(cases, 3 * 3 * 3 * 7 * 2 * 2 * 2 * 3 * 3 * 2 * 3);
}

// Every sequence's rows [0, sq + block - 1) (its tiles' rows, those past its end included) lie in
// [0, packed_stat_rows), start 16-byte aligned, overlap no other sequence's, and map back to it
// (packed_seq_of_stat_row); every token maps to its sequence (packed_seq_of_token). Random
// lengths with empty and one-token sequences.
TEST(BsaPackedRows, SequencesOwnDisjointAlignedRegions) {
  std::mt19937_64 rng(38);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t block = trial % 2 == 0 ? 64 : 128;
    const int B = 1 + static_cast<int>(rng() % 12);
    std::vector<int32_t> cu(static_cast<size_t>(B) + 1, 0);
    for (int b = 0; b < B; ++b) {
      const uint64_t kind = rng() % 4;
      const int32_t len = kind == 0 ? 0 : kind == 1 ? 1 : static_cast<int32_t>(rng() % 300);
      cu[static_cast<size_t>(b) + 1] = cu[static_cast<size_t>(b)] + len;
    }
    const int64_t T = cu.back();
    if (T == 0) continue;
    const int64_t rows = sa::portable::packed_stat_rows(T, B, block);
    EXPECT_EQ(rows % 64, 0);
    std::vector<int> owner(static_cast<size_t>(rows), -1);
    for (int b = 0; b < B; ++b) {
      const int64_t q0 = cu[static_cast<size_t>(b)], sq = cu[static_cast<size_t>(b) + 1] - q0;
      const int64_t row0 = sa::portable::packed_stat_row0(b, q0, block);
      ASSERT_EQ(row0 % 4, 0);
      for (int64_t r = 0; r < sq + block - 1; ++r) {
        ASSERT_LT(row0 + r, rows) << "b=" << b << " r=" << r;
        ASSERT_EQ(owner[static_cast<size_t>(row0 + r)], -1) << "b=" << b << " r=" << r;
        owner[static_cast<size_t>(row0 + r)] = b;
        ASSERT_EQ(sa::portable::packed_seq_of_stat_row(cu.data(), 1, B, T, block, row0 + r), b);
      }
      for (int64_t t = q0; t < q0 + sq; ++t)
        ASSERT_EQ(sa::portable::packed_seq_of_token(cu.data(), 1, B, T, t), b) << "t=" << t;
    }
  }
}

// The tiled dQ order of a packed sequence (dq_tiled_index_at from the sequence's base row
// h * Sq_pad + packed_stat_row0): every (local row < sq, column) lands in the sequence's tile run
// [row_base, row_base + ceil(sq / 64) * 64) rows, once, and that run lies in the sequence's own
// buffer region (below the next sequence's base row and below packed_stat_rows), so the two dQ
// conversions read exactly what the kernel's 64-row reductions of the sequence wrote.
TEST(DqTileLayout, PackedRunsStayInTheSequence) {
  std::mt19937_64 rng(39);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t block = trial % 2 == 0 ? 64 : 128;
    const int D = trial % 4 < 2 ? 64 : 128;
    const int B = 1 + static_cast<int>(rng() % 8);
    const int64_t Hq = 1 + static_cast<int64_t>(rng() % 2);
    std::vector<int32_t> cu(static_cast<size_t>(B) + 1, 0);
    for (int b = 0; b < B; ++b) {
      const uint64_t kind = rng() % 4;
      const int32_t len = kind == 0 ? 0 : kind == 1 ? 1 : static_cast<int32_t>(rng() % 200);
      cu[static_cast<size_t>(b) + 1] = cu[static_cast<size_t>(b)] + len;
    }
    const int64_t T = cu.back();
    if (T == 0) continue;
    const int64_t Sq_pad = sa::portable::packed_stat_rows(T, B, block);
    std::vector<uint8_t> seen(static_cast<size_t>(Hq * Sq_pad * D), 0);
    for (int64_t h = 0; h < Hq; ++h)
      for (int b = 0; b < B; ++b) {
        const int64_t q0 = cu[static_cast<size_t>(b)], sq = cu[static_cast<size_t>(b) + 1] - q0;
        const int64_t base = h * Sq_pad + sa::portable::packed_stat_row0(b, q0, block);
        const int64_t next = b + 1 < B ? h * Sq_pad + sa::portable::packed_stat_row0(
                                                          b + 1, cu[static_cast<size_t>(b) + 1],
                                                          block)
                                       : (h + 1) * Sq_pad;
        const int64_t run_end = base + (sq + 63) / 64 * 64;  // rows of the sequence's tiles
        ASSERT_LE(run_end, next) << "b=" << b << " h=" << h << " block=" << block;
        ASSERT_EQ(base * D * 4 % 16, 0);  // the bulk reductions' 16-byte alignment
        for (int s = 0; s < sq; ++s)
          for (int col = 0; col < D; ++col) {
            const int64_t i = sa::dq_tiled_index_at(base, s, D, col);
            ASSERT_GE(i, base * D) << "b=" << b << " s=" << s << " col=" << col;
            ASSERT_LT(i, run_end * D) << "b=" << b << " s=" << s << " col=" << col;
            ASSERT_EQ(seen[static_cast<size_t>(i)], 0) << "b=" << b << " s=" << s;
            seen[static_cast<size_t>(i)] = 1;
          }
      }
  }
  // The dense form is the same map from the (b, h) run's base.
  for (int s : {0, 5, 63, 64, 200})
    for (int col : {0, 7, 63, 64, 127})
      EXPECT_EQ(sa::dq_tiled_index(3, 256, s, 128, col),
                sa::dq_tiled_index_at(3 * 256, s, 128, col));
}

// The packed plan: [H_q, packed rows] stats and dQ accumulator, [H_kv, T_kv] dK/dV accumulators,
// whatever cu_seqlens holds (it is never read on the host: the pointer only says "packed").
TEST(BsaBackwardDriverPlan, PackedBatchesUseThePackedRowLayout) {
  SA_SKIP_WITHOUT_GPU();  // the plan asks CUB for its scan's temporary bytes on the device
  const bsa_bwd::KernelPolicy portable{"portable", false, &stub_slots, nullptr, nullptr, nullptr};
  const int32_t fake_cu[1] = {0};
  for (int32_t block : {64, 128})
    for (int32_t bucket_size : {0, 2}) {
      sa::BsaBwdProblem p;
      sa::BsaDims& d = p.dims;
      d.B = 7;
      d.Hkv = 2;
      d.Hq = 8;
      d.Sq = 1000;  // T_q
      d.Skv = 1500;  // T_kv
      d.D = d.Dv = 128;
      d.block = block;
      d.Nq = 5;  // N_q_max
      d.Nkv = (d.Skv + block - 1) / block;
      d.Kmax = 4;
      p.meta.cu_seqlens_q = fake_cu;
      p.meta.cu_seqlens_k = fake_cu;
      p.options.bucket_size = bucket_size;
      g_slots = 132;
      const BsaBwdPlan pl = bsa_bwd::plan(p, portable);
      EXPECT_EQ(pl.Sq_pad, sa::portable::packed_stat_rows(d.Sq, d.B, block));
      EXPECT_EQ(pl.Skv_pad, d.Skv);
      EXPECT_GE(pl.delta - pl.lse2, static_cast<size_t>(d.Hq * pl.Sq_pad) * sizeof(float));
      EXPECT_EQ(pl.dq_bytes, static_cast<size_t>(d.Hq * pl.Sq_pad * d.D) * sizeof(float) +
                                 static_cast<size_t>(d.B * d.Hkv + 1) * sizeof(uint32_t));
      if (bucket_size == 2) {
        EXPECT_TRUE(pl.several_owners);
      }
      if (pl.several_owners) {
        EXPECT_EQ(pl.dkv_bytes, static_cast<size_t>(d.Hkv * d.Skv * d.D) * sizeof(float));
      }
    }
}

}  // namespace
}  // namespace sa_test
