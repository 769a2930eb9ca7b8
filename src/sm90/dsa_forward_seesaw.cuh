// The Hopper DSA forward's "seesaw" schedule (designed in session 12; +9-10% over the older
// lockstep schedule at H 64 / 128 in session 13, +25-31% at H 16 / 32 in session 17, when the
// lockstep one was retired; bench/notes-archive). Included by dsa_forward_kernel.cuh, whose traits,
// shared storage, parameters and epilogue it uses.
//
// The lockstep schedule split every 64-key block between the consumer warpgroups and ran both in
// lockstep: the tensor pipe idled through every softmax. Here (the public FlashMLA sparse
// prefill's structure) each consumer owns whole blocks: warpgroup 0 the even 64-key blocks
// (buffer 0), warpgroup 1 the odd ones (buffer 1), so one iteration covers 128 keys. Per
// iteration:
//
//   WG0  S0 = Q K0^T (m64n64, all of D_qk) | m0 = max(m, rowmax S0) -> smem, arrive max_full[0] |
//        O *= 2^(m - m0); P0 = 2^(S0 - m0) | O += P0 V0[:, 0:256] (RS) | release half 0 of buf 0 |
//        wait max_full[1]: m1 (the joint maximum) | P0 *= 2^(m0 - m1) -> sP0 (bf16), release
//        half 1 of buf 0 (sP0's stores), arrive kP0 | bar.sync kP1 | O *= 2^(m0 - m1) |
//        O += sP1 V1[:, 0:256] (SS), the next S0's half-0 part queued behind it (FlashMLA's
//        order: half 0 of buffer 0 is the first half released and refilled) | release half 0 of
//        buf 1
//   WG1  S1 = Q K1^T | wait max_full[0]: m0 | m1 = max(m0, rowmax S1) -> smem, arrive
//        max_full[1] | O *= 2^(m - m1); P1 = 2^(S1 - m1) | O += P1 V1[:, 256:512] (RS);
//        P1 -> sP1 | bar.sync kP0 | O += sP0 V0[:, 256:512] (SS) | arrive kP1 | release half 1
//        of buf 1, then of buf 0
//
// so warpgroup 1's softmax runs under warpgroup 0's P V and the reverse. Both end an iteration
// with the joint maximum m1; each warpgroup's row sums cover its own P, and the shared epilogue
// adds the two. sP1 is the P tile, sP0 the rope tile of buffer 0 (dead once S0 is done; it is
// refilled only after warpgroup 1's last read of sP0). Without rope (D_qk 512) the tile is unused
// anyway. The maxima cross on mbarriers that every thread of the writing warpgroup arrives on
// (compute-sanitizer's racecheck does not follow a bar.arrive -> bar.sync hand-off of data
// written with plain stores; the P tiles are read by wgmma only).
//
// Producer: the buffers are filled in halves (columns 0-255 | 256-511 and the rope), each with its
// own full / empty mbarriers, in the order the consumers need them (buf 0 half 0, buf 1 half 1,
// buf 0 half 1, buf 1 half 0); each half's copies complete on its full barrier by
// cp.async.mbarrier.arrive.noinc (no wait in the producer). A block's bias (0 / -inf per key)
// comes with the first half filled, on its own barrier. A missing odd block (odd chunk count) is
// an all-inactive chunk: zero rows, bias -inf, P = 0. Each thread computes its 8 rows' sources
// of the iteration before its first wait (seesaw_row_sources), so a fill is its copies alone
// (+5-8% over a per-row walk, bench/notes-archive session 17).
//
// The running maximum moves lazily (kLazyRescaleLog2: P <= 2^8), and O is rescaled only by warps
// whose rows' maximum moved.
//
// Persistent CTAs (one per SM; the kernel says how a CTA finds its items): the buffers' barrier
// parities run on over the CTA's iterations (it0), and the next item's Q is gathered once every
// consumer thread has passed its last S of the previous item (q_empty), during that item's last
// P V and epilogue.
#pragma once

namespace sa::sm90::dsa_fwd {

// cp.async completions of the executing thread arrive on `bar` (its expected count not
// incremented: the barrier is initialised with one arrival per producer thread).
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar))
               : "memory");
}

// The producer thread t's (0..127) rows of an iteration's two 64-key blocks (FlashMLA's producer
// layout): 16-byte chunk t % 8 of rows 16 r + t / 8 (r = 0..3) of each block. The four rows share
// one swizzle phase (row % 8 = (t / 8) % 8), so their destinations are one register plus
// immediates, and their sources are computed once per iteration, before the producer's first
// wait: each fill is then its copies and nothing else. (The warp-row walk with shuffled indices,
// the backward's gather_chunk, recomputed each row's source in every half: ~32 instructions per
// row and half with a shuffle, compare and 64-bit multiply on the chain to the copies, and the
// consumers waited on the fills a third of their time; ncu, bench/notes-archive session 17.)
struct SeesawRowSources {
  // Block b, row r: this lane's chunk of the kv row (row 0's when inactive: never read).
  const DsaElement* src[2][4];
  uint32_t active;  // bit 4 b + r: the row's index is in [0, S_kv)
  __device__ __forceinline__ bool is_active(int b, int r) const {
    return (active >> (4 * b + r)) & 1u;
  }
};

// idx_lane: this thread's first slot of the iteration (128 it + t / 8); its rows' slots follow
// every 16 (idx_step = 16 slots).
__device__ __forceinline__ SeesawRowSources seesaw_row_sources(const DsaFwdSm90Params& p,
                                                               const int32_t* idx_lane,
                                                               int64_t idx_step, int slot0,
                                                               int n_slots, int t) {
  SeesawRowSources rs;
  rs.active = 0;
  const DsaElement* const kv = static_cast<const DsaElement*>(p.kv) + (t % 8) * 8;
#pragma unroll
  for (int k = 0; k < 8; ++k) {  // block k / 4, row k % 4: slot slot0 + 16 k
    const int32_t j = slot0 + 16 * k < n_slots ? __ldg(idx_lane + k * idx_step) : -1;
    const bool a = j >= 0 && j < p.skv;
    rs.src[k / 4][k % 4] = kv + (a ? j * p.kv_ss : int64_t{0});
    rs.active |= static_cast<uint32_t>(a) << k;
  }
  return rs;
}

// Columns [256 half, 256 half + 256) (and, half 1, the rope panel) of block kBuf's rows of this
// thread (seesaw_row_sources) into buffer kBuf; inactive rows are zero-filled without a read.
template <bool kRope, int kBuf, int kHalf>
__device__ __forceinline__ void gather_half(uint32_t nope, uint32_t rope,
                                            const SeesawRowSources& rs) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    // Opaque (opaque_ptr): each panel's source is this pointer plus an immediate.
    const DsaElement* const src = opaque_ptr(rs.src[kBuf][r]);
    const int bytes = rs.is_active(kBuf, r) ? 16 : 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int pnl = 4 * kHalf + q;
      cp_async_16_zfill(nope + r * 16 * 128 + pnl * 64 * 64 * 2, src + pnl * 64, bytes);
    }
    if constexpr (kRope && kHalf == 1) cp_async_16_zfill(rope + r * 16 * 128, src + 512, bytes);
  }
}

// P (fp32 accumulator fragment of 64 x 64) -> the A fragment of an RS wgmma (bf16 pairs in the
// same order).
template <class FragS, class FragP>
__device__ __forceinline__ void convert_p_bf16(const FragS& sc, FragP& pf) {
  auto p32 = cute::recast<uint32_t>(pf);
  CUTE_UNROLL
  for (int j = 0; j < cute::size(p32); ++j) p32(j) = pack_bf16x2(sc(2 * j), sc(2 * j + 1));
}

// P * f (per row) -> bf16 -> a 64 x 64 K-major 128B-swizzled tile at `tile`, by stmatrix: per
// warp (rows 16 w .. + 15) four x4 stores, each two column chunks x the two 8-row halves (matrix
// m: rows + 8 (m % 2), chunk + m / 2); a matrix's 8 rows land in 8 different 16-byte bank groups
// (the swizzle), so no conflicts. Fragment index of column tile j, row slot r: 4 j + 2 r.
template <class FragS>
__device__ __forceinline__ void store_p(const FragS& sc, const float (&f)[2], uint8_t* tile,
                                        int frag_row, int lane) {
  const int m = lane / 8;
  const int row = (frag_row - lane / 4) + 8 * (m % 2) + lane % 8;  // frag_row - lane / 4 = 16 w
  const uint32_t base = smem_u32(tile);
  auto word = [&](int j, int r) {
    return pack_bf16x2(sc(4 * j + 2 * r) * f[r], sc(4 * j + 2 * r + 1) * f[r]);
  };
  CUTE_UNROLL
  for (int j = 0; j < 8; j += 2)
    stmatrix_x4(base + swz(row, j + m / 2), word(j, 0), word(j, 1), word(j + 1, 0),
                word(j + 1, 1));
}

// Iterations (128 keys: two 64-key blocks) of an item with n_slots active slots.
template <class T>
__device__ __forceinline__ uint32_t seesaw_iterations(int n_slots) {
  const int n_chunks = (n_slots + T::kBlockN - 1) / T::kBlockN;
  return static_cast<uint32_t>((n_chunks + 1) / 2);
}

// it0: the CTA's iterations before this item; kq: its items with iterations before it (persistent
// CTAs: see the kernel).
template <class T>
__device__ __forceinline__ void producer_seesaw(const DsaFwdSm90Params& p, SharedStorage<T>& s,
                                                int64_t tok, int h0, int n_slots, uint32_t it0,
                                                uint32_t kq) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;  // threads 0..127 (Q gather)
  const int n_iter = static_cast<int>(seesaw_iterations<T>(n_slots));
  if (n_iter == 0) return;
  // The previous item's S are done with Q.
  mbarrier_wait(&s.q_empty, (kq & 1) ^ 1);
  gather_head_rows<T::kRope, T::kPadHeads>(smem_u32(s.q_nope), smem_u32(s.q_rope),
                                           static_cast<const DsaElement*>(p.q) + tok * p.q_ss,
                                           p.q_sh, h0, warp, lane, p.heads - h0);
  const int t = threadIdx.x;  // 0..127
  const uint32_t lane_dst = swz(t / 8, t % 8);
  const int64_t idx_step = 16 * p.idx_si;
  const int32_t* idx_lane = p.idx + tok * p.idx_ss + (t / 8) * p.idx_si;
#pragma unroll 1
  for (int it = 0; it < n_iter; ++it, idx_lane += 8 * idx_step) {
    const uint32_t parity = (it0 + it) & 1;
    // Both blocks' row sources, before any wait.
    const SeesawRowSources rs =
        seesaw_row_sources(p, idx_lane, idx_step, 128 * it + t / 8, n_slots, t);
    auto fill = [&](auto buf_tag, auto half_tag) {
      constexpr int kBuf = decltype(buf_tag)::value, kHalf = decltype(half_tag)::value;
      constexpr bool kWithBias = kHalf == kBuf;  // each block's first half (see below)
      mbarrier_wait(&s.half_empty[kBuf][kHalf], parity ^ 1);
      gather_half<T::kRope, kBuf, kHalf>(smem_u32(s.kv_nope + kBuf * T::kNopeElems) + lane_dst,
                                         smem_u32(s.kv_rope + kBuf * T::kPanelElems) + lane_dst,
                                         rs);
      if constexpr (kWithBias) {
        if (t % 8 == 0) {
#pragma unroll
          for (int r = 0; r < 4; ++r)
            st_shared_f32(smem_u32(&s.bias[kBuf][16 * r + t / 8]),
                          rs.is_active(kBuf, r) ? 0.f : -INFINITY);
        }
        mbarrier_arrive(&s.bias_full[kBuf]);  // releases this thread's bias stores
      }
      cp_async_arrive_noinc(&s.half_full[kBuf][kHalf]);
    };
    // In the order the consumers release and need them; each block's bias comes with its first
    // half (buffer 0: half 0, buffer 1: half 1).
    fill(cute::Int<0>{}, cute::Int<0>{});
    fill(cute::Int<1>{}, cute::Int<1>{});
    fill(cute::Int<0>{}, cute::Int<1>{});
    fill(cute::Int<1>{}, cute::Int<0>{});
  }
  // Every copy completes on a half_full barrier that a consumer waits for before the CTA ends.
}

template <class T>
__device__ __forceinline__ void consumer_seesaw(const DsaFwdSm90Params& p, SharedStorage<T>& s,
                                                int64_t tok, int h0, int n_slots, int wg,
                                                uint32_t it0) {
  using namespace cute;
  using Element = typename T::Element;
  const int ctid = threadIdx.x - 128;  // 0..255
  const int wtid = ctid % 128;
  const int lane = threadIdx.x % 32;
  const int warp_in_wg = wtid / 32;
  const int frag_row = 16 * warp_in_wg + lane / 4;  // + 8 r
  const int n_iter = static_cast<int>(seesaw_iterations<T>(n_slots));
  const int other = 1 - wg;

  typename T::TiledMmaQK64 mma_qk;
  typename T::TiledMmaPVrs mma_rs;
  typename T::TiledMmaPV mma_ss;
  auto thr_qk = mma_qk.get_thread_slice(wtid);
  auto thr_rs = mma_rs.get_thread_slice(ctid);
  auto thr_ss = mma_ss.get_thread_slice(ctid);
  // S of this warpgroup's own buffer: Q (64 x D_qk) against the buffer's 64 rows.
  Tensor sQn = make_tensor(make_smem_ptr(s.q_nope), typename T::SmemLayoutQNope{});
  Tensor sQr = make_tensor(make_smem_ptr(s.q_rope), typename T::SmemLayoutQRope{});
  Tensor sKn = make_tensor(make_smem_ptr(s.kv_nope + wg * T::kNopeElems),
                           typename T::SmemLayoutQNope{});
  Tensor sKr = make_tensor(make_smem_ptr(s.kv_rope + wg * T::kPanelElems),
                           typename T::SmemLayoutQRope{});
  Tensor tSrQn = thr_qk.partition_fragment_A(sQn);  // descriptors (MMA, 1, 32)
  Tensor tSrQr = thr_qk.partition_fragment_A(sQr);  // (MMA, 1, 4)
  Tensor tSrKn = thr_qk.partition_fragment_B(sKn);  // (MMA, 1, 32)
  Tensor tSrKr = thr_qk.partition_fragment_B(sKr);  // (MMA, 1, 4)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<typename T::H64, typename T::H64>{});  // 32
  static_assert(decltype(size(tSrS))::value == 32, "S fragment: 64 x 64 per warpgroup");
  // P V: this warpgroup's 256 columns of V in both buffers; its own P from registers, the other
  // warpgroup's from shared memory (sP1: the P tile; sP0: buffer 0's rope tile).
  Tensor sVown = make_tensor(make_smem_ptr(s.kv_nope + wg * T::kNopeElems),
                             typename T::SmemLayoutVt1{});
  Tensor sVother = make_tensor(make_smem_ptr(s.kv_nope + other * T::kNopeElems),
                               typename T::SmemLayoutVt1{});
  Tensor tOrVrs = thr_rs.partition_fragment_B(sVown);    // (MMA, 1, 4)
  Tensor tOrVss = thr_ss.partition_fragment_B(sVother);  // (MMA, 1, 4)
  Element* const sp_own = wg == 0 ? s.kv_rope : s.p;  // sP0: buffer 0's rope tile; sP1: P tile
  Element* const sp_other = wg == 0 ? s.p : s.kv_rope;
  Tensor sPo = make_tensor(make_smem_ptr(sp_other), typename T::SmemLayoutP{});
  Tensor tOrPo = thr_ss.partition_fragment_A(sPo);    // (MMA, 1, 4): the other's P
  Tensor tOrP = make_tensor<Element>(partition_shape_A(mma_rs, Shape<typename T::H64,
                                                                     typename T::H64>{}));
  static_assert(decltype(size(tOrP))::value == 32, "P fragment: 64 x 64 per warpgroup");
  Tensor tOrO = partition_fragment_C(mma_ss, Shape<typename T::H64, typename T::D512>{});  // 128
  uint8_t* const my_p = reinterpret_cast<uint8_t*>(sp_own);

  const float scale_log2 = p.scale_log2;
  const bool releaser = lane < T::kReleaseLanes;
  // Shared-memory addresses (explicit ld/st.shared) of this thread's bias pairs (+ 32 k bytes:
  // columns 8 k, 8 k + 1) and of red_max[own / other warpgroup][frag_row] (+ 32 bytes: row slot 1).
  const uint32_t bias_at = smem_u32(s.bias[wg]) + 8 * (lane % 4);
  const uint32_t max_own = smem_u32(&s.red_max[wg][frag_row]);
  const uint32_t max_other = smem_u32(&s.red_max[other][frag_row]);
  float m_run[2] = {-INFINITY, -INFINITY};  // the joint running maximum (log2 units)
  float l_run[2] = {0.f, 0.f};              // this thread's part of its own P's row sums
  clear(tOrO);

  // [S] Own block: the half that arrives first (warpgroup 0: half 0, warpgroup 1: half 1), then
  // the other. (Compile-time k-block ranges: a runtime index into the descriptor fragments would
  // put them in local memory.)
  auto issue_half = [&](auto half_tag, uint32_t par) {
    constexpr int kHalf = decltype(half_tag)::value;
    mbarrier_wait(&s.half_full[wg][kHalf], par);
    fence_proxy_async_shared();
    CUTE_UNROLL
    for (int k = 0; k < 16; ++k) {
      cute::gemm(mma_qk, tSrQn(_, _, 16 * kHalf + k), tSrKn(_, _, 16 * kHalf + k), tSrS);
      mma_qk.accumulate_ = SM90::GMMA::ScaleOut::One;
    }
    if constexpr (T::kRope && kHalf == 1) {
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k) cute::gemm(mma_qk, tSrQr(_, _, k), tSrKr(_, _, k), tSrS);
    }
  };
  // Warpgroup 0's half-0 part of S is always issued one step early, as its own commit group: here
  // for the first iteration, at the end of the previous iteration for the others (behind its SS
  // P V, FlashMLA's order). Every entry of the loop then has that group in flight (a loop entered
  // with and without it made ptxas inject a full wgmma wait before the back edge).
  if (wg == 0 && n_iter > 0) {
    warpgroup_fence_operand(tSrS);
    mma_qk.accumulate_ = SM90::GMMA::ScaleOut::Zero;
    warpgroup_arrive();
    issue_half(cute::Int<0>{}, it0 & 1u);
    warpgroup_commit_batch();
  }

#pragma unroll 1
  for (int it = 0; it < n_iter; ++it) {
    const uint32_t parity = (it0 + it) & 1;
    warpgroup_fence_operand(tSrS);
    // (Each branch commits its own batch: a commit after the join compiled to an extra empty
    // HGMMA that both warpgroups issued.)
    if (wg == 0) {
      warpgroup_arrive();
      issue_half(cute::Int<1>{}, parity);
      warpgroup_commit_batch();
    } else {
      mma_qk.accumulate_ = SM90::GMMA::ScaleOut::Zero;
      warpgroup_arrive();
      issue_half(cute::Int<1>{}, parity);
      issue_half(cute::Int<0>{}, parity);
      warpgroup_commit_batch();
    }
    mbarrier_wait(&s.bias_full[wg], parity);
    // The bias of this thread's 16 columns (pairs 8 k, 8 k + 1), loaded while S completes
    // (explicit ld.shared: through the generic pointer they were generic LD.E after the wait).
    float2 bias2[8];
    CUTE_UNROLL
    for (int k = 0; k < 8; ++k) bias2[k] = ld_shared_f32x2(bias_at + 32 * k);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    if (it == n_iter - 1) mbarrier_arrive(&s.q_empty);  // the item's last read of Q

    // [M] Scale, mask, row maximum of the own block; warpgroup 1 folds in warpgroup 0's.
    float mx[2] = {-INFINITY, -INFINITY};
    CUTE_UNROLL
    for (int i = 0; i < 32; ++i) {
      tSrS(i) = fmaf(tSrS(i), scale_log2, i % 2 ? bias2[i / 4].y : bias2[i / 4].x);
      mx[(i / 2) % 2] = fmaxf(mx[(i / 2) % 2], tSrS(i));
    }
    if (wg == 1) mbarrier_wait(&s.max_full[0], parity);
    float m_new[2], m_use[2];
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float base = wg == 0 ? m_run[r] : ld_shared_f32(max_other + 32 * r);
      // Lazy (kLazyRescaleLog2): the maximum moves only when exceeded by more than 2^8.
      const float m_block = quad_max(mx[r]);
      m_new[r] = m_block > base + kLazyRescaleLog2 ? m_block : base;
      if (lane % 4 == 0) st_shared_f32(max_own + 32 * r, m_new[r]);
      m_use[r] = m_new[r] == -INFINITY ? 0.f : m_new[r];  // no key yet: 2^(-inf - 0) = 0
    }
    mbarrier_arrive(&s.max_full[wg]);  // after this thread's red_max accesses
    // [P] O *= 2^(m_run - m_new); P = 2^(x - m_new); own row sums.
    float alpha[2], rs[2] = {0.f, 0.f};
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r)
      alpha[r] = m_new[r] == m_run[r] ? 1.f : exp2_approx(m_run[r] - m_use[r]);
    CUTE_UNROLL
    for (int i = 0; i < 32; ++i) {
      tSrS(i) = exp2_approx(tSrS(i) - m_use[(i / 2) % 2]);
      rs[(i / 2) % 2] += tSrS(i);
    }
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + rs[r];
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= alpha[(i / 2) % 2];
    }
    convert_p_bf16(tSrS, tOrP);
    // [PV own] O += P_own V_own (RS), this warpgroup's 256 columns.
    warpgroup_fence_operand(tOrO);
    warpgroup_fence_operand(tOrP);
    warpgroup_arrive();
    gemm_ss(mma_rs, tOrP, tOrVrs, tOrO, false);
    warpgroup_commit_batch();

    if (wg == 0) {
      // Warpgroup 0: its half of buffer 0 is free once this batch is done; then the joint
      // maximum, the rescaled P0 for warpgroup 1, and O += sP1 V1.
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      __syncwarp();  // the warp's reads of the buffer (and bias) precede its lanes' releases
      if (releaser) mbarrier_arrive(&s.half_empty[0][0]);
      mbarrier_wait(&s.max_full[1], parity);
      float sf[2];
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const float m1 = ld_shared_f32(max_other + 32 * r);
        sf[r] = m1 == m_new[r] ? 1.f : exp2_approx(m_new[r] - (m1 == -INFINITY ? 0.f : m1));
        m_run[r] = m1;
        l_run[r] *= sf[r];
      }
      store_p(tSrS, sf, my_p, frag_row, lane);
      fence_proxy_async_shared();  // sP0 is read by wgmma (async proxy)
      mbarrier_arrive(&s.half_empty[0][1]);  // with warpgroup 1's: sP0 may be refilled
      named_barrier_arrive(id(NamedBarrier::kP0), T::kConsumerThreads);
      named_barrier_sync(id(NamedBarrier::kP1), T::kConsumerThreads);
      if (__any_sync(0xffffffffu, sf[0] != 1.f || sf[1] != 1.f)) {
        CUTE_UNROLL
        for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= sf[(i / 2) % 2];
      }
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
      gemm_ss(mma_ss, tOrPo, tOrVss, tOrO, false);
      warpgroup_commit_batch();
      if (it + 1 < n_iter) {
        // The next block's S over half 0 goes in behind this P V (FlashMLA's order), so the
        // tensor pipe has it queued when the P V ends: half 0 of buffer 0 was released first in
        // this iteration and is the producer's first fill, and S is dead (P went to tOrP and sP0).
        warpgroup_fence_operand(tSrS);
        mma_qk.accumulate_ = SM90::GMMA::ScaleOut::Zero;
        warpgroup_arrive();
        issue_half(cute::Int<0>{}, parity ^ 1);
        warpgroup_commit_batch();
        warpgroup_wait<1>();  // the P V (the older group) is done
      } else {
        warpgroup_wait<0>();
      }
      warpgroup_fence_operand(tOrO);
      __syncwarp();  // the warp's reads of the buffer (and bias) precede its lanes' releases
      if (releaser) mbarrier_arrive(&s.half_empty[1][0]);
    } else {
      // Warpgroup 1: P1 (already at the joint maximum) -> sP1 while its own batch runs; then
      // O += sP0 V0; its halves of buffers 1 and 0 are free when those batches are done.
      const float one[2] = {1.f, 1.f};
      store_p(tSrS, one, my_p, frag_row, lane);
      fence_proxy_async_shared();
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) m_run[r] = m_new[r];
      named_barrier_sync(id(NamedBarrier::kP0), T::kConsumerThreads);
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
      gemm_ss(mma_ss, tOrPo, tOrVss, tOrO, false);
      warpgroup_commit_batch();
      named_barrier_arrive(id(NamedBarrier::kP1), T::kConsumerThreads);
      warpgroup_wait<1>();
      __syncwarp();  // the warp's reads of the buffer (and bias) precede its lanes' releases
      if (releaser) mbarrier_arrive(&s.half_empty[1][1]);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      __syncwarp();  // the warp's reads of the buffer (and bias) precede its lanes' releases
      if (releaser) mbarrier_arrive(&s.half_empty[0][1]);
    }
  }
  // Persistent CTAs: this epilogue rewrites red_sum, which the other warpgroup may still read for
  // the previous item. With iterations, this item's max_full exchange orders the two (each reader
  // arrives on it after its reads); without (an item without active slots: topk_length), a
  // barrier of both warpgroups does.
  if (n_iter == 0) named_barrier_sync(id(NamedBarrier::kSumReady), T::kConsumerThreads);
  consumer_epilogue<T>(p, s, tok, h0, wg, lane, frag_row, m_run, l_run, tOrO);
}

}  // namespace sa::sm90::dsa_fwd
