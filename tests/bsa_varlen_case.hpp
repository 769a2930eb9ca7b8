// A packed (THD) BSA problem on the host (SPEC 4), shared by the CPU suite (test_bsa_varlen.cpp)
// and the GPU suite (test_gpu_bsa_varlen.cpp): per-sequence lengths -> THD tensors, cu_seqlens
// and metadata with local KV block ids; rows past a sequence's query blocks and slots past a
// row's count hold garbage the library must never read.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/narrow.hpp"
#include "sparse_attention/sparse_attention.h"
#include "sparse_attention/sparse_attention.hpp"
#include "test_util.hpp"

namespace sa_test {

namespace sa_cpp = sparse_attention;

struct VarlenCase {
  std::string name;
  std::vector<int64_t> sq, skv;  // per sequence
  int64_t Hq = 2, Hkv = 1, D = 16, Dv = 16;
  int32_t block = 64;
  sa_mask mask = SA_MASK_NONE;
  bool offset_given = false;
  int64_t offset = 0, window_left = 0, window_right = 0;
  sa_dtype dtype = SA_DTYPE_FP64;
  int64_t extra_nq = 0;  // N_q_max beyond the longest sequence's query blocks
};
inline std::ostream& operator<<(std::ostream& os, const VarlenCase& c) { return os << c.name; }

inline int64_t cdiv(int64_t a, int64_t b) { return sa::ceil_div_i64(a, b); }

inline void apply_mask(const VarlenCase& c, sa_bsa_options& o) {
  o.block_size = c.block;
  o.mask = c.mask;
  o.causal_offset_given = c.offset_given ? 1 : 0;
  o.causal_offset = c.offset;
  o.window_left = c.window_left;
  o.window_right = c.window_right;
}

// One packed problem: THD tensors, cu_seqlens and per-sequence metadata with local ids.
struct Packed {
  int64_t B = 0, Tq = 0, Tkv = 0, Nq = 0, Kmax = 0;
  std::vector<int64_t> q0, k0;
  HostTensor q, k, v, o, lse, dout, dq, dk, dv, cu_q, cu_k, index, count;

  Packed(const VarlenCase& c, std::mt19937_64& rng) {
    B = static_cast<int64_t>(c.sq.size());
    for (int64_t b = 0; b < B; ++b) {
      q0.push_back(Tq);
      k0.push_back(Tkv);
      Tq += c.sq[b];
      Tkv += c.skv[b];
      Nq = std::max(Nq, cdiv(c.sq[b], c.block));
      Kmax = std::max(Kmax, cdiv(c.skv[b], c.block));
    }
    Nq = std::max<int64_t>(Nq, 1) + c.extra_nq;
    Kmax = std::max<int64_t>(Kmax, 1) + 1;  // one slot of padding the library never reads
    q = HostTensor(c.dtype, {Tq, c.Hq, c.D});
    k = HostTensor(c.dtype, {Tkv, c.Hkv, c.D});
    v = HostTensor(c.dtype, {Tkv, c.Hkv, c.Dv});
    dout = HostTensor(c.dtype, {Tq, c.Hq, c.Dv});
    for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_uniform(rng);
    o = HostTensor(c.dtype, {Tq, c.Hq, c.Dv});
    lse = HostTensor(SA_DTYPE_FP32, {c.Hq, Tq});
    dq = HostTensor(c.dtype, {Tq, c.Hq, c.D});
    dk = HostTensor(c.dtype, {Tkv, c.Hkv, c.D});
    dv = HostTensor(c.dtype, {Tkv, c.Hkv, c.Dv});
    for (HostTensor* t : {&o, &lse, &dq, &dk, &dv}) t->poison();
    cu_q = HostTensor(SA_DTYPE_INT32, {B + 1});
    cu_k = HostTensor(SA_DTYPE_INT32, {B + 1});
    for (int64_t b = 0; b <= B; ++b) {
      cu_q.i32()[b] = static_cast<int32_t>(b < B ? q0[b] : Tq);
      cu_k.i32()[b] = static_cast<int32_t>(b < B ? k0[b] : Tkv);
    }
    // Each row of a sequence: a random subset of its local KV blocks in random order; rows past
    // the sequence's query blocks and slots past a row's count hold garbage (never read).
    index = HostTensor(SA_DTYPE_INT32, {B, c.Hq, Nq, Kmax});
    count = HostTensor(SA_DTYPE_INT32, {B, c.Hq, Nq});
    for (int64_t i = 0; i < index.numel(); ++i) index.i32()[i] = -7;
    for (int64_t i = 0; i < count.numel(); ++i) count.i32()[i] = 12345;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t nkv = cdiv(c.skv[b], c.block);
      std::vector<int32_t> blocks(static_cast<size_t>(nkv));
      for (int32_t n = 0; n < nkv; ++n) blocks[static_cast<size_t>(n)] = n;
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t m = 0; m < cdiv(c.sq[b], c.block); ++m) {
          std::shuffle(blocks.begin(), blocks.end(), rng);
          // Mostly every block (so masks matter), sometimes fewer, sometimes none.
          const int64_t pick = rng() % 4 == 0 ? static_cast<int64_t>(rng() % (nkv + 1)) : nkv;
          count.i32()[(b * c.Hq + h) * Nq + m] = static_cast<int32_t>(pick);
          for (int64_t s = 0; s < pick; ++s)
            index.i32()[((b * c.Hq + h) * Nq + m) * Kmax + s] = blocks[static_cast<size_t>(s)];
        }
    }
  }

  void fwd_args(sa_bsa_fwd_args& a, const VarlenCase& c) {
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.o = o.view();
    a.lse = lse.view();
    a.sparsity.q2k_index = index.view();
    a.sparsity.q2k_count = count.view();
    apply_mask(c, a.options);
    a.options.cu_seqlens_q = cu_q.view();
    a.options.cu_seqlens_k = cu_k.view();
  }
  void bwd_args(sa_bsa_bwd_args& a, const VarlenCase& c) {
    sa_cpp::BsaForwardArgs f;
    fwd_args(f, c);
    a.q = f.q;
    a.k = f.k;
    a.v = f.v;
    a.o = f.o;
    a.lse = f.lse;
    a.dout = dout.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    a.sparsity = f.sparsity;
    a.options = f.options;
  }
};

}  // namespace sa_test
