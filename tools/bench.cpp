#include "bench.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "bench_ops.hpp"
#include "flashmla_anchor.hpp"
#include "reference_sample.hpp"
#include "tool_error.hpp"

namespace sa_tool {
namespace api = sparse_attention;

// ---- shared with the per-operation set-ups (bench_ops.hpp) --------------------------------------
sa_context context_of(Subject& s) {
  sa_context c = api::context();
  c.workspace = s.workspace;
  c.workspace_bytes = s.workspace_bytes;
  c.impl_used = &s.impl;
  return c;
}

void apply(const BenchVariant& v, sa_impl* impl, int32_t* bucket, int32_t* deterministic) {
  *impl = v.impl;
  if (bucket && v.bucket >= 0) *bucket = v.bucket;
  if (deterministic && v.deterministic >= 0) *deterministic = v.deterministic;
}

double worst(const std::vector<Check>& checks, bool* ok) {
  double w = 0;
  for (const Check& c : checks) {
    *ok = *ok && c.pass();
    if (c.metric == Check::Metric::kRelL2) w = std::max(w, c.error);
  }
  return w;
}

void report_failures(const Subject& s, const std::vector<Check>& checks) {
  for (const Check& k : checks)
    if (!k.pass()) std::cout << "  " << s.variant.label << ": " << k.line() << "\n";
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw ToolError(kExitCheckFailed, std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

const char* impl_name(const Subject& s) {
  return s.impl_label != nullptr ? s.impl_label : sa_impl_name(s.impl);
}


// BENCHMARKING.md: warm-up, then rounds of `calls` calls timed with events; variants alternate
// round by round, and a second pass runs them in reverse order.
void time_subjects(std::vector<Subject*>& subjects, const BenchOptions& o) {
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&stop), "cudaEventCreate");
  for (Subject* s : subjects) {
    const sa_context c = context_of(*s);
    for (int i = 0; i < o.warmup; ++i) check_call(s->run(c), s->variant.label);
  }
  cuda_ok(cudaDeviceSynchronize(), "warm-up");
  for (int pass = 0; pass < 2; ++pass) {
    for (int r = 0; r < o.rounds; ++r) {
      for (size_t k = 0; k < subjects.size(); ++k) {
        Subject* s = subjects[pass == 0 ? k : subjects.size() - 1 - k];
        const sa_context c = context_of(*s);
        cuda_ok(cudaEventRecord(start, nullptr), "cudaEventRecord");
        for (int i = 0; i < o.calls; ++i) check_call(s->run(c), s->variant.label);
        cuda_ok(cudaEventRecord(stop, nullptr), "cudaEventRecord");
        cuda_ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float ms = 0;
        cuda_ok(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        s->rounds_ms.push_back(ms / o.calls);
      }
    }
  }
  for (Subject* s : subjects) s->median_ms = median(s->rounds_ms);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}


// ---- FLOPs (BENCHMARKING.md: attended pairs only) ---------------------------------------------
// Under --mask causal (S_q = S_kv, offset 0), the pairs (i, s) with s <= i of each listed block.
double bsa_forward_flops(const BsaProblem& p) {
  const BsaShape& s = p.shape;
  double flops = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t m = 0; m < s.Nq(); ++m) {
        const int64_t q0 = m * s.block;
        const int64_t q_tokens = std::min<int64_t>(s.block, s.S - q0);
        double pairs = 0;
        for (int32_t i = 0; i < s.row_count(m); ++i) {
          const int64_t n = p.block_at(b, h, m, i);
          const int64_t k0 = n * s.block, len = s.key_block_len(n);
          if (s.mask == SA_MASK_NONE) {
            pairs += static_cast<double>(q_tokens * len);
            continue;
          }
          for (int64_t q = q0; q < q0 + q_tokens; ++q)  // keys [k0, min(k0 + len - 1, q)]
            pairs += static_cast<double>(std::max<int64_t>(0, std::min(k0 + len - 1, q) - k0 + 1));
        }
        flops += 4.0 * pairs * s.D;
      }
  return flops;
}

double dsa_active_pairs(const DsaProblem& p) {
  double n = 0;
  for (int64_t t = 0; t < p.shape.Sq; ++t)
    for (int64_t i = 0; i < p.shape.topk; ++i) n += p.active(t, i) ? 1 : 0;
  return n * p.shape.H;
}

// ---- records -----------------------------------------------------------------------------------
std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out;
}

struct Record {
  std::string op, shape_json;
  const Subject* s;
  const Subject* anchor;
  double flops;
  std::string device;
};

std::string to_json(const Record& r) {
  std::ostringstream os;
  os << std::setprecision(6);
  double lo = *std::min_element(r.s->rounds_ms.begin(), r.s->rounds_ms.end());
  double hi = *std::max_element(r.s->rounds_ms.begin(), r.s->rounds_ms.end());
  os << "{\"op\": \"" << r.op << "\", \"impl\": \"" << impl_name(*r.s)
     << "\", \"variant\": \"" << json_escape(r.s->variant.label) << "\", \"shape\": "
     << r.shape_json << ", \"ms\": " << r.s->median_ms << ", \"ms_min\": " << lo
     << ", \"ms_max\": " << hi << ", \"tflops\": " << r.flops / (r.s->median_ms * 1e-3) / 1e12
     << ", \"anchor\": \"" << json_escape(r.anchor->variant.label) << "\", \"anchor_ms\": "
     << r.anchor->median_ms << ", \"speedup\": " << r.anchor->median_ms / r.s->median_ms
     << ", \"correct\": " << (!r.s->checked ? "null" : r.s->ok ? "true" : "false")
     << ", \"max_rel_l2\": ";
  if (r.s->checked)
    os << r.s->max_rel_l2;
  else
    os << "null";
  os << ", \"device\": \"" << json_escape(r.device) << "\", \"source\": "
     << "\"sparse-attention bench\"}";
  return os.str();
}

void append_json(const std::string& path, const std::vector<std::string>& records) {
  if (path.empty() || records.empty()) return;
  std::string existing;
  {
    std::ifstream in(path);
    if (in) existing.assign(std::istreambuf_iterator<char>(in), {});
  }
  while (!existing.empty() && (existing.back() == '\n' || existing.back() == ' '))
    existing.pop_back();
  std::ofstream out(path, std::ios::trunc);
  if (existing.size() > 2 && existing.back() == ']') {
    existing.pop_back();
    out << existing << ",\n";
  } else {
    out << "[\n";
  }
  for (size_t i = 0; i < records.size(); ++i)
    out << "  " << records[i] << (i + 1 < records.size() ? ",\n" : "\n");
  out << "]\n";
}

void print_table(const std::string& op, const std::vector<Subject>& subjects, double flops) {
  std::cout << "[" << op << "] " << std::fixed;
  std::cout << "\n  " << std::left << std::setw(34) << "variant" << std::setw(10) << "impl"
            << std::right << std::setw(10) << "ms" << std::setw(10) << "spread" << std::setw(10)
            << "TFLOPS" << std::setw(9) << "speedup" << std::setw(11) << "rel L2"
            << "  check\n";
  for (const Subject& s : subjects) {
    if (s.rounds_ms.empty()) {
      std::cout << "  " << std::left << std::setw(34) << s.variant.label << "not run\n";
      continue;
    }
    const double lo = *std::min_element(s.rounds_ms.begin(), s.rounds_ms.end());
    const double hi = *std::max_element(s.rounds_ms.begin(), s.rounds_ms.end());
    std::cout << "  " << std::left << std::setw(34) << s.variant.label << std::setw(10)
              << impl_name(s) << std::right << std::setprecision(4) << std::setw(10)
              << s.median_ms << std::setw(9) << std::setprecision(1)
              << 100.0 * (hi - lo) / s.median_ms << "%" << std::setw(10) << std::setprecision(1)
              << flops / (s.median_ms * 1e-3) / 1e12 << std::setw(8) << std::setprecision(3)
              << subjects.front().median_ms / s.median_ms << "x";
    if (s.checked)
      std::cout << std::setw(11) << std::scientific << std::setprecision(2) << s.max_rel_l2
                << std::fixed << "  " << (s.ok ? "PASS" : "FAIL") << "\n";
    else
      std::cout << std::setw(11) << "-" << "  unchecked\n";
  }
}


// ---- per operation -----------------------------------------------------------------------------
int bench_op(const OpSetup& setup, const BenchOptions& o, const CudaDevice& dev,
             std::vector<std::string>* records) {
  std::vector<Subject> subjects;
  for (const BenchVariant& v : o.variants) {
    if (!v.anchor.empty() && setup.op != "dsa_fwd") {
      // An anchor serves one operation: elsewhere the variant is reported, not run.
      Subject s;
      s.variant = v;
      s.ok = false;
      s.workspace_size = [](size_t*) {
        return api::Status(SA_ERROR_UNSUPPORTED, "anchor=flashmla serves dsa_fwd only");
      };
      subjects.push_back(std::move(s));
      continue;
    }
    Subject s = setup.make(v);
    if (v.tuned) {
      // The tuning decides the workspace size and the launches: set it around both.
      auto inner = s.run;
      const sa::detail::Tuning tuning = v.tuning;
      s.run = [inner, tuning](const sa_context& c) {
        const sa::detail::ScopedTuning scoped(tuning);
        return inner(c);
      };
      auto inner_ws = s.workspace_size;
      s.workspace_size = [inner_ws, tuning](size_t* bytes) {
        const sa::detail::ScopedTuning scoped(tuning);
        return inner_ws(bytes);
      };
    }
    subjects.push_back(std::move(s));
  }
  std::vector<Subject*> runnable;
  for (Subject& s : subjects) {
    std::string why;
    const api::Status st = s.workspace_size(&s.workspace_bytes);
    if (!st.ok()) {
      std::cout << "[" << setup.op << "] " << s.variant.label << ": " << st.to_string() << "\n";
      s.ok = false;
      continue;
    }
    if (s.workspace_bytes) cuda_ok(cudaMalloc(&s.workspace, s.workspace_bytes), "cudaMalloc");
    if (o.check) {
      setup.check(s);
      s.checked = true;
    }
    runnable.push_back(&s);
  }
  if (!runnable.empty()) time_subjects(runnable, o);
  print_table(setup.op, subjects, setup.flops);
  const Subject* anchor = runnable.empty() ? nullptr : runnable.front();
  int status = kExitPass;
  for (Subject& s : subjects) {
    if (!s.ok) status = kExitCheckFailed;
    if (!s.rounds_ms.empty())
      records->push_back(to_json({setup.op, setup.shape_json, &s, anchor, setup.flops, dev.name}));
    if (s.workspace) cudaFree(s.workspace);
  }
  return status;
}

// The FlashMLA anchor (flashmla_anchor.hpp) as a subject: FlashMLA's kernel on our device tensors
// (its max_logits output in a scratch buffer the run function owns), on the stream of the
// context; "not run" with the reason when this build or device has no anchor for the shape.
void flashmla_subject(const DsaProblem& p, const DsaViews& v, Subject* s) {
  const DsaShape& sh = p.shape;
  s->impl_label = "flashmla";
  FlashMlaFwdCall call{};
  call.q = v.q.data;
  call.kv = v.kv.data;
  call.topk_idx = static_cast<const int32_t*>(v.topk_idx.data);
  call.topk_length = static_cast<const int32_t*>(v.topk_length.data);
  call.sink = static_cast<const float*>(v.sink.data);
  call.out = v.out.data;
  call.lse = static_cast<float*>(v.lse.data);
  call.s_q = static_cast<int>(sh.Sq);
  call.s_kv = static_cast<int>(sh.Skv);
  call.h = static_cast<int>(sh.H);
  call.d_qk = static_cast<int>(sh.Dqk);
  call.topk = static_cast<int>(sh.topk);
  call.scale = 1.0f / std::sqrt(static_cast<float>(sh.Dqk));  // DsaOptions' default (scale 0)
  int dev = 0, major = 0, minor = 0, sms = 0;
  cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_ok(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "attribute");
  cuda_ok(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "attribute");
  cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "attribute");
  std::string why = flashmla_unsupported(call, major, minor);
  if (why.empty() && (sh.dtype != SA_DTYPE_BF16 || sh.Dv != 512))
    why = "FlashMLA's sparse prefill takes bf16 with D_v 512";
  if (why.empty() && (v.q.strides[0] != sh.H * sh.Dqk || v.q.strides[1] != sh.Dqk ||
                      v.kv.strides[0] != sh.Dqk || v.topk_idx.strides[0] != sh.topk ||
                      v.out.strides[0] != sh.H * sh.Dv || v.lse.strides[0] != sh.H))
    why = "FlashMLA anchor: expects contiguous tensors";
  s->workspace_size = [why](size_t* bytes) {
    *bytes = 0;
    return why.empty() ? api::Status() : api::Status(SA_ERROR_UNSUPPORTED, why);
  };
  if (!why.empty()) {
    s->run = [why](const sa_context&) { return api::Status(SA_ERROR_UNSUPPORTED, why); };
    return;
  }
  void* scratch = nullptr;
  cuda_ok(cudaMalloc(&scratch, static_cast<size_t>(sh.Sq * sh.H) * sizeof(float)), "cudaMalloc");
  std::shared_ptr<void> max_logits(scratch, [](void* q) { cudaFree(q); });
  call.max_logits = static_cast<float*>(scratch);
  s->run = [call, sms, max_logits](const sa_context& c) {
    const cudaError_t e = flashmla_sparse_fwd(call, sms, static_cast<cudaStream_t>(c.stream));
    return e == cudaSuccess ? api::Status()
                            : api::Status(SA_ERROR_CUDA, std::string("FlashMLA anchor: ") +
                                                             cudaGetErrorString(e));
  };
}

std::string bsa_shape_json(const BsaShape& s) {
  std::ostringstream os;
  os << "{\"B\": " << s.B << ", \"H\": " << s.Hq << ", \"H_kv\": " << s.Hkv << ", \"S\": " << s.S
     << ", \"D\": " << s.D << ", \"block\": " << s.block << ", \"density\": "
     << static_cast<double>(s.count()) / s.Nkv() << ", \"layout\": \""
     << (s.layout == SA_LAYOUT_BSHD ? "bshd" : "bhsd") << "\""
     << (s.causal_blocks ? ", \"blocks\": \"causal\"" : "")
     << (s.sorted_blocks ? ", \"blocks\": \"sorted\"" : "")
     << (s.mask == SA_MASK_CAUSAL ? ", \"mask\": \"causal\"" : "") << "}";
  return os.str();
}

std::string dsa_shape_json(const DsaShape& s) {
  std::ostringstream os;
  os << "{\"S\": " << s.Sq << ", \"S_kv\": " << s.Skv << ", \"H\": " << s.H << ", \"D_qk\": "
     << s.Dqk << ", \"topk\": " << s.topk << ", \"topk_length\": "
     << (s.topk_length ? "true" : "false") << ", \"sink\": " << (s.sink ? "true" : "false")
     << "}";
  return os.str();
}

// An integer in [lo, hi] for a --variants key, or `automatic` for "auto" when given.
int32_t tune_int(const std::string& key, const std::string& val, long lo, long hi,
                 const int32_t* automatic = nullptr) {
  if (automatic != nullptr && val == "auto") return *automatic;
  char* end = nullptr;
  const long x = std::strtol(val.c_str(), &end, 0);
  if (val.empty() || *end != '\0' || x < lo || x > hi) {
    std::ostringstream os;
    os << "--variants: " << key << " needs " << (automatic != nullptr ? "auto or " : "")
       << "an integer in [" << lo << ", " << hi << "], got '" << val << "'";
    throw ToolError(kExitBadArgument, os.str());
  }
  return static_cast<int32_t>(x);
}

// One tuning key (bench.hpp lists them) into `t`.
void parse_tune(const std::string& key, const std::string& val, sa::detail::Tuning* t) {
  const sa::detail::Tuning defaults;
  if (key == "tune.fwd_splits" || key == "env.SA_TUNE_SM90_FWD_SPLITS") {
    t->sm90_fwd_splits = tune_int(key, val, 1, 16, &defaults.sm90_fwd_splits);
  } else if (key == "tune.fwd_dyn") {
    t->sm90_fwd_dyn = tune_int(key, val, 0, 2, &defaults.sm90_fwd_dyn);
  } else if (key == "tune.bwd_tail" || key == "env.SA_TUNE_SM90_BWD_TAIL") {
    t->sm90_bwd_tail = tune_int(key, val, 0, 1024, &defaults.sm90_bwd_tail);
  } else if (key == "tune.sm90_bsa_bwd_stats") {
    t->sm90_bsa_bwd_stats = tune_int(key, val, 0, 1);
  } else if (key == "tune.sm90_bsa_bwd_full") {
    t->sm90_bsa_bwd_full = tune_int(key, val, 0, 1);
  } else if (key == "tune.dsa_bwd" || key == "env.SA_TUNE_SM90_DSA_BWD") {
    t->sm90_dsa_bwd_bits = tune_int(key, val, 0, 7);
  } else if (key == "tune.sm90_dsa_bwd_groups") {
    t->sm90_dsa_bwd_groups = tune_int(key, val, 0, 1);
  } else if (key == "tune.sm90_dsa_bwd_det_binned") {
    t->sm90_dsa_bwd_det_binned = tune_int(key, val, 0, 2);
  } else if (key == "tune.dsa_fwd_pad" || key == "env.SA_TUNE_SM90_DSA_FWD_PAD") {
    t->sm90_dsa_fwd_pad_h16 = tune_int(key, val, 0, 1) != 0;
  } else if (key == "tune.topk") {
    t->sm90_indexer_topk = tune_int(key, val, 0, 4);
  } else if (key == "tune.ptopk") {
    t->portable_indexer_topk = tune_int(key, val, 0, 4);
  } else if (key == "tune.sm90_indexer_target") {
    t->sm90_indexer_target = tune_int(key, val, 0, 3);
  } else if (key == "tune.sm90_indexer_loss_kernel") {
    t->sm90_indexer_loss_kernel = tune_int(key, val, 0, 4);
  } else {
    throw ToolError(kExitBadArgument,
                    "--variants: unknown tuning key '" + key +
                        "' (tune.fwd_splits=, tune.fwd_dyn=, tune.bwd_tail=, "
                        "tune.sm90_bsa_bwd_stats=, "
                        "tune.sm90_bsa_bwd_full=, tune.dsa_bwd=, tune.sm90_dsa_bwd_groups=, "
                        "tune.sm90_dsa_bwd_det_binned=, tune.dsa_fwd_pad=, "
                        "tune.topk=, tune.ptopk=, tune.sm90_indexer_target=, "
                        "tune.sm90_indexer_loss_kernel=)");
  }
}

}  // namespace

std::vector<BenchVariant> parse_variants(const std::string& text) {
  std::vector<BenchVariant> out;
  std::stringstream all(text);
  for (std::string item; std::getline(all, item, '/');) {
    BenchVariant v;
    v.label = item;
    std::stringstream kvs(item);
    for (std::string kv; std::getline(kvs, kv, ',');) {
      const size_t eq = kv.find('=');
      const std::string key = kv.substr(0, eq), val = eq == std::string::npos ? "" : kv.substr(eq + 1);
      if (key == "auto" && eq == std::string::npos) continue;
      if (key == "impl") {
        if (val == "auto") v.impl = SA_IMPL_AUTO;
        else if (val == "portable") v.impl = SA_IMPL_PORTABLE;
        else if (val == "sm90") v.impl = SA_IMPL_SM90;
        else if (val == "reference") v.impl = SA_IMPL_REFERENCE;
        else throw ToolError(kExitBadArgument, "--variants: impl must be auto, portable, sm90 "
                                               "or reference, got '" + val + "'");
      } else if (key == "bucket" || key == "deterministic") {
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(val.c_str(), &end, 10);
        if (val.empty() || *end != '\0' || errno != 0 || x < 0 || x > INT32_MAX)
          throw ToolError(kExitBadArgument, "--variants: " + key +
                                                " needs an integer in [0, 2147483647], got '" +
                                                val + "'");
        (key == "bucket" ? v.bucket : v.deterministic) = static_cast<int>(x);
      } else if (key.rfind("tune.", 0) == 0 || key.rfind("env.", 0) == 0) {
        parse_tune(key, val, &v.tuning);
        v.tuned = true;
      } else if (key == "mask") {
        if (val == "none") v.mask = SA_MASK_NONE;
        else if (val == "causal") v.mask = SA_MASK_CAUSAL;
        else throw ToolError(kExitBadArgument, "--variants: mask must be none or causal, got '" +
                                                   val + "'");
      } else if (key == "anchor") {
        if (val != "flashmla")
          throw ToolError(kExitBadArgument,
                          "--variants: anchor must be flashmla, got '" + val + "'");
        v.anchor = val;
      } else {
        throw ToolError(kExitBadArgument,
                        "--variants: unknown key '" + key +
                            "' (impl=, bucket=, deterministic=, tune.NAME=, anchor=flashmla, "
                            "mask=none|causal)");
      }
    }
    out.push_back(v);
  }
  if (out.empty()) throw ToolError(kExitBadArgument, "--variants: empty");
  return out;
}

int run_bench(const DemoOptions& demo, const BenchOptions& o) {
  const CudaDevice dev = find_cuda_device();
  if (!dev.present)
    throw ToolError(kExitBadArgument, "bench needs a CUDA device: " + dev.why_not);
  std::cout << "sparse-attention bench on " << describe_device(dev) << ": " << o.warmup
            << " warm-up calls, 2 passes x " << o.rounds << " rounds x " << o.calls
            << " calls per variant, median round\n";
  for (const BenchVariant& v : o.variants)
    for (const std::string& op : demo.ops)
      if (v.mask >= 0 && op != "bsa_fwd")
        throw ToolError(kExitBadArgument, "--variants: mask= is bsa_fwd's, not " + op +
                                              " (use --op bsa_fwd)");
  std::vector<std::string> records;
  int status = kExitPass;
  for (const std::string& op : demo.ops) {
    DeviceArena arena(dev.index);
    OpSetup setup;
    setup.op = op;
    if (op == "bsa_fwd" || op == "bsa_bwd") {
      if (op == "bsa_bwd" && (demo.bsa_causal_blocks || demo.bsa_mask != SA_MASK_NONE))
        throw ToolError(kExitBadArgument,
                        "--blocks causal and --mask are bsa_fwd's (the sampled backward check "
                        "takes neither): use --op bsa_fwd");
      auto p = std::make_shared<BsaProblem>(make_bsa_problem(bsa_shape(demo, Target::kGpu), demo.seed));
      auto dv = std::make_shared<BsaViews>(bsa_views(*p, [&](HostTensor& t) { return arena.upload(t); }));
      std::cout << "[" << op << "] " << p->shape.describe() << "\n";
      setup.shape_json = bsa_shape_json(p->shape);
      const bool fwd = op == "bsa_fwd";
      setup.flops = bsa_forward_flops(*p) * (fwd ? 1.0 : 2.5);
      if (!fwd) {  // o and lse from the GPU forward
        const api::BsaForwardArgs a = bsa_forward_args(p->shape, *dv);
        size_t ws = 0;  // split-KV forwards need workspace
        check_call(api::bsa_forward_workspace_size(a, &ws), "bsa_fwd workspace (backward inputs)");
        sa_context ctx = api::context();
        ctx.workspace = arena.allocate(ws);
        ctx.workspace_bytes = ws;
        check_call(api::bsa_forward(a, ctx), "bsa_fwd (inputs of the backward)");
        download(dv->o, p->o);
        download(dv->lse, p->lse);
      }
      setup.make = [p, dv, fwd](const BenchVariant& v) {
        Subject s;
        s.variant = v;
        if (fwd) {
          auto a = std::make_shared<api::BsaForwardArgs>(bsa_forward_args(p->shape, *dv));
          apply(v, &a->options.impl, &a->options.bucket_size, &a->options.deterministic);
          if (v.mask >= 0) a->options.mask = static_cast<sa_mask>(v.mask);
          s.run = [a](const sa_context& c) { return api::bsa_forward(*a, c); };
          s.workspace_size = [a](size_t* b) { return api::bsa_forward_workspace_size(*a, b); };
        } else {
          auto a = std::make_shared<api::BsaBackwardArgs>(bsa_backward_args(p->shape, *dv));
          apply(v, &a->options.impl, &a->options.bucket_size, &a->options.deterministic);
          s.run = [a](const sa_context& c) { return api::bsa_backward(*a, c); };
          s.workspace_size = [a](size_t* b) { return api::bsa_backward_workspace_size(*a, b); };
        }
        return s;
      };
      setup.check = [p, dv, fwd, &demo](Subject& s) {
        std::vector<std::pair<sa_tensor, HostTensor*>> outs;
        if (fwd) outs = {{dv->o, &p->o}, {dv->lse, &p->lse}};
        else outs = {{dv->dq, &p->dq}, {dv->dk, &p->dk}, {dv->dv, &p->dv}};
        for (auto& x : outs) poison(x.first);
        check_call(s.run(context_of(s)), s.variant.label);
        synchronize();
        for (auto& x : outs) download(x.first, *x.second);
        const sa_mask mask = s.variant.mask >= 0 ? static_cast<sa_mask>(s.variant.mask)
                                                 : p->shape.mask;
        SampledComparison c = fwd ? bsa_forward_vs_reference(*p, demo.seed, mask)
                                  : bsa_backward_vs_reference(*p, demo.seed);
        s.max_rel_l2 = worst(c.checks, &s.ok);
        report_failures(s, c.checks);
      };
    } else if (op == "dsa_fwd" || op == "dsa_bwd") {
      auto p = std::make_shared<DsaProblem>(make_dsa_problem(dsa_shape(demo, Target::kGpu), demo.seed));
      auto dv = std::make_shared<DsaViews>(dsa_views(*p, [&](HostTensor& t) { return arena.upload(t); }));
      std::cout << "[" << op << "] " << p->shape.describe() << "\n";
      setup.shape_json = dsa_shape_json(p->shape);
      const bool fwd = op == "dsa_fwd";
      const DsaShape& sh = p->shape;
      setup.flops = 2.0 * dsa_active_pairs(*p) * (fwd ? (sh.Dqk + sh.Dv) : (3 * sh.Dqk + 2 * sh.Dv));
      if (!fwd) {
        const api::DsaForwardArgs a = dsa_forward_args(p->shape, *dv);
        check_call(api::dsa_forward(a, api::context()), "dsa_fwd (inputs of the backward)");
        download(dv->out, p->out);
        download(dv->lse, p->lse);
      }
      setup.make = [p, dv, fwd](const BenchVariant& v) {
        Subject s;
        s.variant = v;
        if (fwd && v.anchor == "flashmla") {
          flashmla_subject(*p, *dv, &s);
        } else if (fwd) {
          auto a = std::make_shared<api::DsaForwardArgs>(dsa_forward_args(p->shape, *dv));
          apply(v, &a->options.impl, nullptr, &a->options.deterministic);
          s.run = [a](const sa_context& c) { return api::dsa_forward(*a, c); };
          s.workspace_size = [a](size_t* b) { return api::dsa_forward_workspace_size(*a, b); };
        } else {
          auto a = std::make_shared<api::DsaBackwardArgs>(dsa_backward_args(p->shape, *dv));
          apply(v, &a->options.impl, nullptr, &a->options.deterministic);
          s.run = [a](const sa_context& c) { return api::dsa_backward(*a, c); };
          s.workspace_size = [a](size_t* b) { return api::dsa_backward_workspace_size(*a, b); };
        }
        return s;
      };
      setup.check = [p, dv, fwd, &demo](Subject& s) {
        std::vector<std::pair<sa_tensor, HostTensor*>> outs;
        if (fwd) outs = {{dv->out, &p->out}, {dv->lse, &p->lse}};
        else outs = {{dv->dq, &p->dq}, {dv->dkv, &p->dkv}};
        if (!fwd && dv->d_sink.data) outs.push_back({dv->d_sink, &p->d_sink});
        for (auto& x : outs) poison(x.first);
        check_call(s.run(context_of(s)), s.variant.label);
        synchronize();
        for (auto& x : outs) download(x.first, *x.second);
        SampledComparison c = fwd ? dsa_forward_vs_reference(*p, demo.seed)
                                  : dsa_backward_vs_reference(*p, demo.seed);
        s.max_rel_l2 = worst(c.checks, &s.ok);
        report_failures(s, c.checks);
      };
    } else {
      setup = indexer_setup(op, demo, arena);
    }
    status = std::max(status, bench_op(setup, o, dev, &records));
  }
  append_json(o.json, records);
  if (!o.json.empty()) std::cout << "wrote " << records.size() << " records to " << o.json << "\n";
  return status;
}

}  // namespace sa_tool
