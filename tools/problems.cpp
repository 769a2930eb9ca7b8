#include "problems.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "common/host_numeric.hpp"
#include "common/narrow.hpp"
#include "testing/bhsd_layout.hpp"
#include "tool_error.hpp"

namespace sa_tool {
namespace {

// Uniform values in [lo, hi). Headline-sized inputs hold hundreds of millions of elements, so the
// tensor is filled in fixed chunks of 2^20 elements, each with its own generator seeded from one
// draw of `rng` and the chunk number, spread over the host's threads: the values depend on the
// seed only, never on the number of threads.
void fill_uniform(HostTensor& t, std::mt19937_64& rng, double lo, double hi) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  const uint64_t base = rng();
  const int64_t n = t.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t c = next++; c < chunks; c = next++) {
      std::mt19937_64 gen(base ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(c + 1)));
      std::uniform_real_distribution<double> u(lo, hi);
      const int64_t end = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; ++i) t.set(i, u(gen));
    }
  };
  const int threads = static_cast<int>(std::min<int64_t>(
      std::max(1u, std::thread::hardware_concurrency()), std::max<int64_t>(chunks, 1)));
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& th : pool) th.join();
}

// Writes `n` distinct values of [0, pool.size()) to out: a partial Fisher-Yates shuffle of `pool`
// (any permutation of the values; it stays one), so every call costs O(n).
void draw_distinct(std::vector<int32_t>& pool, int64_t n, std::mt19937_64& rng, int32_t* out) {
  const int64_t size = static_cast<int64_t>(pool.size());
  for (int64_t i = 0; i < n; ++i) {
    std::uniform_int_distribution<int64_t> pick(i, size - 1);
    std::swap(pool[static_cast<size_t>(i)], pool[static_cast<size_t>(pick(rng))]);
    out[i] = pool[static_cast<size_t>(i)];
  }
}

const char* dtype_str(sa_dtype t) { return sa::dtype_name(t); }

// Host bytes of a problem, added up tensor by tensor with overflow checks.
class HostBytes {
 public:
  explicit HostBytes(std::string flags) : flags_(std::move(flags)) {}
  // A buffer of prod(dims) elements of `element_bytes` each.
  void add(const char* name, std::initializer_list<int64_t> dims, int64_t element_bytes) {
    int64_t n = element_bytes;
    std::string shape;
    for (int64_t d : dims) shape += (shape.empty() ? "[" : ", ") + std::to_string(d);
    for (int64_t d : dims) {
      if (d < 0 || sa::mul_overflows(n, d, &n))
        fail(std::string(name) + " " + shape + "] holds more than 2^63 - 1 bytes");
    }
    if (sa::add_overflows(total_, n, &total_))
      fail("the tensors hold more than 2^63 - 1 bytes in all");
  }
  void check_fits() const {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return;  // unknown: the allocation itself reports
    int64_t machine = 0;
    if (sa::mul_overflows(pages, page, &machine)) return;
    if (total_ > machine)
      fail("the problem needs " + std::to_string(total_) + " bytes of host memory, more than " +
           "this machine's " + std::to_string(machine));
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw ToolError(kExitBadArgument, flags_ + ": " + what + "; use smaller sizes");
  }
  std::string flags_;
  int64_t total_ = 0;
};

}  // namespace

void check_bsa_size(const BsaShape& s, bool dense_oracle) {
  HostBytes need("--batch, --heads, --kv-heads, --seq, --dim, --block");
  const int64_t e = sa::dtype_size(s.dtype);
  for (const char* t : {"q", "o", "dout", "dq"}) need.add(t, {s.B, s.Hq, s.S, s.D}, e);
  for (const char* t : {"k", "v", "dk", "dv"}) need.add(t, {s.B, s.Hkv, s.S, s.D}, e);
  need.add("lse", {s.B, s.Hq, s.S}, 4);
  need.add("q2k_index", {s.B, s.Hq, s.Nq(), s.Nkv()}, 4);
  if (dense_oracle) {
    need.add("the oracle's mask", {s.S, s.S}, 1);
    // Its double copies of q, k, v, dout and of o, dq, dk, dv.
    need.add("the oracle's inputs", {8, s.B, std::max(s.Hq, s.Hkv), s.S, s.D}, 8);
  }
  need.check_fits();
}

void check_dsa_size(const DsaShape& s, bool dense_oracle) {
  HostBytes need("--dsa-queries, --dsa-seq, --dsa-heads, --dsa-dqk, --topk");
  const int64_t e = sa::dtype_size(s.dtype);
  for (const char* t : {"q", "dq"}) need.add(t, {s.Sq, s.H, s.Dqk}, e);
  for (const char* t : {"out", "dout"}) need.add(t, {s.Sq, s.H, s.Dv}, e);
  for (const char* t : {"kv", "dkv"}) need.add(t, {s.Skv, s.Dqk}, e);
  need.add("topk_idx", {s.Sq, s.topk}, 4);
  need.add("lse", {s.Sq, s.H}, 4);
  need.add("the key pool", {s.Skv}, 4);
  if (dense_oracle) {
    need.add("the oracle's mask", {s.Sq, s.Skv}, 4);
    need.add("the oracle's inputs", {4, s.Sq, s.H, std::max(s.Dqk, s.Dv)}, 8);
    need.add("the oracle's keys", {2, s.Skv, s.Dqk}, 8);
  }
  need.check_fits();
}

// ---- BSA ----------------------------------------------------------------------------------------
int32_t BsaShape::count() const {
  if (causal_blocks) return row_count(Nq() - 1);
  const int64_t c = std::llround(density * static_cast<double>(Nkv()));
  return static_cast<int32_t>(std::min<int64_t>(std::max<int64_t>(c, 1), Nkv()));
}

int32_t BsaShape::row_count(int64_t m) const {
  if (!causal_blocks) return count();
  const int64_t earlier = std::llround(density * static_cast<double>(m));
  return static_cast<int32_t>(1 + std::min<int64_t>(std::max<int64_t>(earlier, 0), m));
}

int64_t BsaShape::key_block_len(int64_t n) const { return std::min<int64_t>(block, S - n * block); }

std::vector<int64_t> BsaShape::physical(int64_t B_, int64_t H, int64_t S_, int64_t X) const {
  return sa_testing::bsa_physical_shape(layout, B_, H, S_, X);
}

sa_tensor BsaShape::slice(const sa_tensor& t, int64_t b, int64_t h0, int64_t nh, int64_t s0,
                          int64_t ns) const {
  const int h_dim = layout == SA_LAYOUT_BSHD ? 2 : 1;
  const int s_dim = layout == SA_LAYOUT_BSHD ? 1 : 2;
  return narrow(narrow(narrow(t, 0, b, 1), h_dim, h0, nh), s_dim, s0, ns);
}

std::string BsaShape::describe() const {
  std::ostringstream os;
  os << "B=" << B << " H_q=" << Hq << " H_kv=" << Hkv << " S_q=S_kv=" << S << " D=D_v=" << D
     << " block=" << block << " density=" << std::setprecision(3)
     << static_cast<double>(count()) / Nkv() << " (" << count() << " of " << Nkv()
     << " KV blocks per query block)"
     << " layout=" << (layout == SA_LAYOUT_BSHD ? "bshd" : "bhsd") << " dtype=" << dtype_str(dtype);
  if (causal_blocks)
    os << " blocks=causal (diagonal + " << density << " of the earlier blocks; K_max " << count()
       << ")";
  if (sorted_blocks) os << " blocks=sorted";
  if (mask != SA_MASK_NONE) os << " mask=" << (mask == SA_MASK_CAUSAL ? "causal" : "other");
  return os.str();
}

int32_t BsaProblem::block_at(int64_t b, int64_t h, int64_t m, int64_t slot) const {
  const std::vector<int64_t>& s = q2k_index.shape();
  return q2k_index.i32()[((b * s[1] + h) * s[2] + m) * s[3] + slot];
}

int64_t BsaProblem::offset(const HostTensor& t, int64_t b, int64_t h, int64_t s, int64_t x) const {
  return sa_testing::bsa_index(t, shape.layout, b, h, s, x);
}

std::vector<double> BsaProblem::logical(const HostTensor& t) const {
  return sa_testing::bhsd_doubles(t, shape.layout);
}

BsaProblem make_bsa_problem(const BsaShape& s, uint64_t seed) {
  check_bsa_size(s, false);
  std::mt19937_64 rng(seed);
  BsaProblem p;
  p.shape = s;
  p.q = HostTensor(s.dtype, s.physical(s.B, s.Hq, s.S, s.D));
  p.k = HostTensor(s.dtype, s.physical(s.B, s.Hkv, s.S, s.D));
  p.v = HostTensor(s.dtype, s.physical(s.B, s.Hkv, s.S, s.D));
  p.dout = HostTensor(s.dtype, s.physical(s.B, s.Hq, s.S, s.D));
  for (HostTensor* t : {&p.q, &p.k, &p.v, &p.dout}) fill_uniform(*t, rng, -1.0, 1.0);

  const int32_t count = s.count();
  p.q2k_index = HostTensor(SA_DTYPE_INT32, {s.B, s.Hq, s.Nq(), count});
  if (s.causal_blocks) {
    // Row m: round(density * m) distinct random blocks of [0, m), then the diagonal m; the slots
    // past the row's count hold block 0 (never read).
    p.q2k_count = HostTensor(SA_DTYPE_INT32, {s.B, s.Hq, s.Nq()});
    for (int64_t row = 0; row < s.B * s.Hq * s.Nq(); ++row) {
      const int64_t m = row % s.Nq();
      const int32_t n = s.row_count(m);
      int32_t* out = p.q2k_index.i32() + row * count;
      std::fill(out, out + count, 0);
      std::vector<int32_t> earlier(static_cast<size_t>(m));
      std::iota(earlier.begin(), earlier.end(), 0);
      if (n > 1) draw_distinct(earlier, n - 1, rng, out);
      out[n - 1] = static_cast<int32_t>(m);
      p.q2k_count.i32()[row] = n;
    }
  } else {
    std::vector<int32_t> pool(static_cast<size_t>(s.Nkv()));
    std::iota(pool.begin(), pool.end(), 0);
    for (int64_t row = 0; row < s.B * s.Hq * s.Nq(); ++row) {
      int32_t* out = p.q2k_index.i32() + row * count;
      draw_distinct(pool, count, rng, out);
      if (s.sorted_blocks) std::sort(out, out + count);
    }
  }

  p.o = HostTensor(s.dtype, s.physical(s.B, s.Hq, s.S, s.D));
  p.lse = HostTensor(SA_DTYPE_FP32, {s.B, s.Hq, s.S});
  p.dq = HostTensor(s.dtype, p.q.shape());
  p.dk = HostTensor(s.dtype, p.k.shape());
  p.dv = HostTensor(s.dtype, p.v.shape());
  for (HostTensor* t : {&p.o, &p.lse, &p.dq, &p.dk, &p.dv}) t->fill_nan();
  return p;
}

BsaViews bsa_views(BsaProblem& p, const Place& place) {
  BsaViews v;
  v.q = place(p.q);
  v.k = place(p.k);
  v.v = place(p.v);
  v.q2k_index = place(p.q2k_index);
  if (p.shape.causal_blocks) v.q2k_count = place(p.q2k_count);
  v.dout = place(p.dout);
  v.o = place(p.o);
  v.lse = place(p.lse);
  v.dq = place(p.dq);
  v.dk = place(p.dk);
  v.dv = place(p.dv);
  return v;
}

sparse_attention::BsaOptions bsa_options(const BsaShape& s) {
  sparse_attention::BsaOptions o;
  o.layout = s.layout;
  o.block_size = s.block;  // passed through unchecked: the library says what it accepts
  o.count = -1;            // every row reads all K_max = count entries (or its q2k_count)
  o.mask = s.mask;         // S_q = S_kv: the default causal offset is 0
  return o;
}

sparse_attention::BsaForwardArgs bsa_forward_args(const BsaShape& s, const BsaViews& v) {
  sparse_attention::BsaForwardArgs a;
  a.q = v.q;
  a.k = v.k;
  a.v = v.v;
  a.sparsity.q2k_index = v.q2k_index;
  a.sparsity.q2k_count = v.q2k_count;
  a.o = v.o;
  a.lse = v.lse;
  a.options = bsa_options(s);
  return a;
}

sparse_attention::BsaBackwardArgs bsa_backward_args(const BsaShape& s, const BsaViews& v) {
  sparse_attention::BsaBackwardArgs a;
  a.q = v.q;
  a.k = v.k;
  a.v = v.v;
  a.o = v.o;
  a.lse = v.lse;
  a.dout = v.dout;
  a.sparsity.q2k_index = v.q2k_index;
  a.sparsity.q2k_count = v.q2k_count;
  a.dq = v.dq;
  a.dk = v.dk;
  a.dv = v.dv;
  a.options = bsa_options(s);
  return a;
}

// ---- DSA ----------------------------------------------------------------------------------------
std::string DsaShape::describe() const {
  std::ostringstream os;
  os << "S_q=" << Sq << " S_kv=" << Skv << " H=" << H << " D_qk=" << Dqk << " D_v=" << Dv
     << " topk=" << topk << " topk_length=" << (topk_length ? "on (uniform in [1, topk])" : "off")
     << " sink=" << (sink ? "on" : "off") << " dtype=" << dtype_str(dtype);
  return os.str();
}

int32_t DsaProblem::index(int64_t t, int64_t i) const { return topk_idx.i32()[t * shape.topk + i]; }

bool DsaProblem::active(int64_t t, int64_t i) const {
  if (topk_length.present() && i >= topk_length.i32()[t]) return false;
  const int32_t j = index(t, i);
  return j >= 0 && j < shape.Skv;
}

bool DsaProblem::row_empty(int64_t t) const {
  for (int64_t i = 0; i < shape.topk; ++i)
    if (active(t, i)) return false;
  return true;
}

DsaProblem make_dsa_problem(const DsaShape& s, uint64_t seed) {
  check_dsa_size(s, false);
  std::mt19937_64 rng(seed);
  DsaProblem p;
  p.shape = s;
  p.q = HostTensor(s.dtype, {s.Sq, s.H, s.Dqk});
  p.kv = HostTensor(s.dtype, {s.Skv, s.Dqk});
  p.dout = HostTensor(s.dtype, {s.Sq, s.H, s.Dv});
  for (HostTensor* t : {&p.q, &p.kv, &p.dout}) fill_uniform(*t, rng, -1.0, 1.0);

  p.topk_idx = HostTensor(SA_DTYPE_INT32, {s.Sq, s.topk});
  const int64_t distinct = std::min(s.topk, s.Skv);
  std::vector<int32_t> pool(static_cast<size_t>(s.Skv));
  std::iota(pool.begin(), pool.end(), 0);
  for (int64_t t = 0; t < s.Sq; ++t) {
    int32_t* row = p.topk_idx.i32() + t * s.topk;
    draw_distinct(pool, distinct, rng, row);
    std::fill(row + distinct, row + s.topk, -1);  // topk > S_kv: the rest is inactive
  }
  if (s.topk_length) {
    p.topk_length = HostTensor(SA_DTYPE_INT32, {s.Sq});
    std::uniform_int_distribution<int64_t> len(1, s.topk);
    for (int64_t t = 0; t < s.Sq; ++t) p.topk_length.i32()[t] = static_cast<int32_t>(len(rng));
  }
  if (s.sink) {
    p.sink = HostTensor(SA_DTYPE_FP32, {s.H});
    fill_uniform(p.sink, rng, -1.0, 4.0);
  }

  p.out = HostTensor(s.dtype, {s.Sq, s.H, s.Dv});
  p.lse = HostTensor(SA_DTYPE_FP32, {s.Sq, s.H});
  p.dq = HostTensor(s.dtype, {s.Sq, s.H, s.Dqk});
  p.dkv = HostTensor(s.dtype, {s.Skv, s.Dqk});
  p.d_sink = HostTensor(SA_DTYPE_FP32, {s.H});
  for (HostTensor* t : {&p.out, &p.lse, &p.dq, &p.dkv, &p.d_sink}) t->fill_nan();
  return p;
}

DsaViews dsa_views(DsaProblem& p, const Place& place) {
  auto optional = [&](HostTensor& t) { return t.present() ? place(t) : sa_tensor_none(); };
  DsaViews v;
  v.q = place(p.q);
  v.kv = place(p.kv);
  v.topk_idx = place(p.topk_idx);
  v.topk_length = optional(p.topk_length);
  v.sink = optional(p.sink);
  v.dout = place(p.dout);
  v.out = place(p.out);
  v.lse = place(p.lse);
  v.dq = place(p.dq);
  v.dkv = place(p.dkv);
  v.d_sink = place(p.d_sink);
  return v;
}

sparse_attention::DsaOptions dsa_options(const DsaShape& s) {
  sparse_attention::DsaOptions o;
  o.d_v = static_cast<int32_t>(s.Dv);
  return o;
}

sparse_attention::DsaForwardArgs dsa_forward_args(const DsaShape& s, const DsaViews& v) {
  sparse_attention::DsaForwardArgs a;
  a.q = v.q;
  a.kv = v.kv;
  a.topk_idx = v.topk_idx;
  a.topk_length = v.topk_length;
  a.sink = v.sink;
  a.out = v.out;
  a.lse = v.lse;
  a.options = dsa_options(s);
  return a;
}

sparse_attention::DsaBackwardArgs dsa_backward_args(const DsaShape& s, const DsaViews& v) {
  sparse_attention::DsaBackwardArgs a;
  a.q = v.q;
  a.kv = v.kv;
  a.topk_idx = v.topk_idx;
  a.topk_length = v.topk_length;
  a.sink = v.sink;
  a.out = v.out;
  a.lse = v.lse;
  a.dout = v.dout;
  a.dq = v.dq;
  a.dkv = v.dkv;
  a.d_sink = v.d_sink;
  a.options = dsa_options(s);
  return a;
}

}  // namespace sa_tool
