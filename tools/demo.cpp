// The demo's driver: where each operation runs, the defaults per device, the printed report.
#include "demo.hpp"

#include <cstdio>
#include <functional>

#include "common/host_numeric.hpp"
#include "tool_error.hpp"

namespace sa_tool {

// ---- shapes -------------------------------------------------------------------------------------
BsaShape default_bsa_shape(Target target) {
  BsaShape s;  // the CPU defaults: B=1 H=2 H_kv=1 S=256 D=64 block 64 density 0.5
  if (target == Target::kGpu) {
    s.Hq = 8;
    s.Hkv = 2;
    s.S = 2048;
    s.D = 128;
    s.block = 128;
  }
  return s;
}

DsaShape default_dsa_shape(Target target) {
  DsaShape s;  // the CPU defaults: S_q=32 S_kv=256 H=16 D_qk=576 topk=64
  if (target == Target::kGpu) {
    s.Sq = 1024;
    s.Skv = 1024;
    s.H = 64;
    s.topk = 512;
  }
  return s;
}

BsaShape bsa_shape(const DemoOptions& o, Target target) {
  BsaShape s = default_bsa_shape(target);
  s.B = o.batch.value_or(s.B);
  s.Hq = o.heads.value_or(s.Hq);
  s.Hkv = o.kv_heads.value_or(s.Hkv);
  s.S = o.seq.value_or(s.S);
  s.D = o.dim.value_or(s.D);
  s.block = static_cast<int32_t>(o.block.value_or(s.block));
  s.density = o.density.value_or(s.density);
  s.layout = o.layout;
  s.dtype = o.dtype;
  s.causal_blocks = o.bsa_causal_blocks;
  s.sorted_blocks = o.bsa_sorted_blocks;
  s.mask = o.bsa_mask;
  return s;
}

DsaShape dsa_shape(const DemoOptions& o, Target target) {
  DsaShape s = default_dsa_shape(target);
  s.H = o.dsa_heads.value_or(s.H);
  s.Dqk = o.dsa_dqk.value_or(s.Dqk);
  if (s.Dqk < s.Dv)
    throw ToolError(kExitBadArgument,
                    "--dsa-dqk " + std::to_string(s.Dqk) + ": the demo's D_v is " +
                        std::to_string(s.Dv) + " (SPEC's value width kv[:, :" +
                        std::to_string(s.Dv) + "], not a flag), so D_qk must be at least " +
                        std::to_string(s.Dv) + " (512 or 576)");
  s.Skv = o.dsa_seq.value_or(s.Skv);
  // S_q follows --dsa-seq on the GPU; on the CPU it stays small unless given.
  s.Sq = o.dsa_queries.value_or(target == Target::kGpu ? s.Skv : s.Sq);
  s.topk = o.topk.value_or(s.topk);
  s.topk_length = o.topk_length;
  s.sink = o.sink;
  s.dtype = o.dtype;
  return s;
}

BsaProblem make_cpu_bsa_problem(const DemoOptions& opt) {
  const BsaShape s = bsa_shape(opt, Target::kCpu);
  check_bsa_size(s, true);
  return make_bsa_problem(s, opt.seed);
}

DsaProblem make_cpu_dsa_problem(const DemoOptions& opt) {
  const DsaShape s = dsa_shape(opt, Target::kCpu);
  check_dsa_size(s, true);
  return make_dsa_problem(s, opt.seed);
}

// ---- report -------------------------------------------------------------------------------------
bool OpReport::pass() const {
  for (const Check& c : checks)
    if (!c.pass()) return false;
  return !checks.empty();
}

std::string describe_timing(const Timing& t, Target target) {
  char buf[160];
  if (target == Target::kGpu)
    std::snprintf(buf, sizeof(buf),
                  "%.3f ms per call (mean of %d calls after a checked one, "
                  "CUDA events)",
                  t.ms, t.calls);
  else
    std::snprintf(buf, sizeof(buf), "%.1f ms (1 call, wall clock)", t.ms);
  return buf;
}

sa_tensor host_place(HostTensor& t) { return t.view(); }

OpReport start_report(const char* op, std::string problem, std::string device) {
  OpReport r;
  r.op = op;
  r.problem = std::move(problem);
  r.device = std::move(device);
  return r;
}

void finish(OpReport& r, const Timing& t, Target target) {
  r.impl = sa_impl_name(t.impl);
  r.timing = describe_timing(t, target);
}

std::string describe_device(const CudaDevice& dev) {
  return "cuda:" + std::to_string(dev.index) + " " + dev.name;
}

namespace {

void print_report(const OpReport& r) {
  std::printf("\n[%s]\n", r.op.c_str());
  std::printf("  problem   %s\n", r.problem.c_str());
  std::printf("  ran       %s on %s: %s\n", r.impl.c_str(), r.device.c_str(), r.timing.c_str());
  for (const std::string& n : r.notes) std::printf("  note      %s\n", n.c_str());
  std::printf("  against   %s\n", r.compared.c_str());
  for (const Check& c : r.checks) std::printf("  check     %s\n", c.line().c_str());
  std::printf("  => %s\n", r.pass() ? "PASS" : "FAIL");
  std::fflush(stdout);
}

struct OpEntry {
  const char* name;
  std::function<OpReport(const DemoOptions&)> cpu;
  std::function<std::optional<OpReport>(const DemoOptions&, const CudaDevice&, std::string*)> gpu;
};

const OpEntry& op_entry(const std::string& name) {
  static const OpEntry entries[] = {
      {"bsa_fwd", bsa_forward_cpu, bsa_forward_gpu},
      {"bsa_bwd", bsa_backward_cpu, bsa_backward_gpu},
      {"dsa_fwd", dsa_forward_cpu, dsa_forward_gpu},
      {"dsa_bwd", dsa_backward_cpu, dsa_backward_gpu},
  };
  for (const OpEntry& e : entries)
    if (name == e.name) return e;
  throw ToolError(kExitBadArgument, "unknown operation '" + name + "'");
}

OpReport run_op(const OpEntry& e, const DemoOptions& opt, const CudaDevice& dev) {
  if (!dev.present) return e.cpu(opt);
  std::string why;
  if (std::optional<OpReport> r = e.gpu(opt, dev, &why)) return *r;
  if (opt.device == DeviceChoice::kCuda)
    throw ToolError(kExitBadArgument,
                    std::string(e.name) + " on cuda: SA_ERROR_UNSUPPORTED: " + why);
  OpReport r = e.cpu(opt);
  r.notes.insert(r.notes.begin(),
                 "no GPU implementation serves " + std::string(e.name) + " (" + why +
                     "): ran the fp64 CPU reference instead, with the CPU defaults for the shape "
                     "flags not given");
  return r;
}

}  // namespace

int run_demo(const DemoOptions& opt) {
  // The DSA shape flags are checked before anything runs.
  for (const std::string& op : opt.ops)
    if (op.rfind("dsa", 0) == 0) (void)dsa_shape(opt, Target::kCpu);
  CudaDevice dev;
  std::string where;
  if (opt.device == DeviceChoice::kCpu) {
    dev.why_not = "--device cpu";
    where = "cpu (--device cpu)";
  } else {
    dev = find_cuda_device();
    if (!dev.present && opt.device == DeviceChoice::kCuda)
      throw ToolError(kExitBadArgument, "--device cuda: " + dev.why_not);
    where = dev.present
                ? describe_device(dev) + ", and the CPU reference for what it does not serve"
                : "cpu (" + dev.why_not + ")";
  }
  std::printf("sparse-attention demo: device %s; dtype %s; seed %llu\n", where.c_str(),
              sa::dtype_name(opt.dtype), static_cast<unsigned long long>(opt.seed));
  std::fflush(stdout);

  std::vector<OpReport> reports;
  for (const std::string& op : opt.ops) {
    reports.push_back(run_op(op_entry(op), opt, dev));
    print_report(reports.back());
  }

  bool all_pass = true;
  std::printf("\nsummary:");
  for (const OpReport& r : reports) {
    std::printf("  %s %s", r.op.c_str(), r.pass() ? "PASS" : "FAIL");
    all_pass = all_pass && r.pass();
  }
  std::printf("\n%s\n", all_pass ? "all checks passed" : "SOME CHECKS FAILED");
  return all_pass ? kExitPass : kExitCheckFailed;
}

}  // namespace sa_tool
