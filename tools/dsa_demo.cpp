// The demo's DSA forward and backward, on the CPU reference and on the GPU.
#include "demo.hpp"
#include "oracle.hpp"
#include "reference_sample.hpp"

namespace sa_tool {
namespace api = sparse_attention;

namespace {

constexpr int kFiniteDifferencePicks = 4;  // per differentiable input

const char* kDenseOracle =
    "the tool's dense oracle: softmax attention with the sink in double over the densified "
    "[S_q, S_kv] mask of active slots, every element";

}  // namespace

// ---- CPU ----------------------------------------------------------------------------------------
OpReport dsa_forward_cpu(const DemoOptions& opt) {
  DsaProblem p = make_cpu_dsa_problem(opt);
  OpReport r = start_report("dsa_fwd", p.shape.describe(), "cpu");
  const api::DsaForwardArgs args = dsa_forward_args(p.shape, dsa_views(p, host_place));
  finish(r,
         cpu_call([&](const sa_context& c) { return api::dsa_forward(args, c); }, "dsa_fwd on cpu"),
         Target::kCpu);

  const DsaDenseResult want = dsa_dense_attention(p, dsa_dense_inputs(p), false);
  r.compared = kDenseOracle;
  r.checks.push_back(rel_l2_check("out", values(p.out.view()), want.out, count_nan(p.out)));
  r.checks.push_back(lse_check("lse", values(p.lse.view()), want.lse, count_nan(p.lse)));
  return r;
}

OpReport dsa_backward_cpu(const DemoOptions& opt) {
  DsaProblem p = make_cpu_dsa_problem(opt);
  OpReport r = start_report("dsa_bwd", p.shape.describe(), "cpu");
  const DsaViews v = dsa_views(p, host_place);
  const api::DsaForwardArgs fwd = dsa_forward_args(p.shape, v);
  cpu_call([&](const sa_context& c) { return api::dsa_forward(fwd, c); }, "dsa_fwd on cpu");
  r.notes.push_back("out and lse (inputs of the backward) from the reference forward");
  const api::DsaBackwardArgs bwd = dsa_backward_args(p.shape, v);
  finish(r,
         cpu_call([&](const sa_context& c) { return api::dsa_backward(bwd, c); }, "dsa_bwd on cpu"),
         Target::kCpu);

  const DsaDenseInputs x = dsa_dense_inputs(p);
  const DsaDenseResult want = dsa_dense_attention(p, x, true);
  r.compared = std::string(kDenseOracle) +
               "; its backward (dense softmax derivative, the sink a key without value) "
               "checked by central differences of sum(dout * out)";
  r.checks.push_back(rel_l2_check("dq", values(p.dq.view()), want.dq, count_nan(p.dq)));
  r.checks.push_back(rel_l2_check("dkv", values(p.dkv.view()), want.dkv, count_nan(p.dkv)));
  r.checks.push_back(
      rel_l2_check("d_sink", values(p.d_sink.view()), want.d_sink, count_nan(p.d_sink)));
  const FiniteDifferenceCheck fd =
      dsa_finite_differences(p, x, want, kFiniteDifferencePicks, opt.seed);
  r.checks.push_back(finite_difference_check(fd.rel_error, fd.elements));
  return r;
}

// ---- GPU ----------------------------------------------------------------------------------------
std::optional<OpReport> dsa_forward_gpu(const DemoOptions& opt, const CudaDevice& dev,
                                        std::string* why) {
  DsaProblem p = make_dsa_problem(dsa_shape(opt, Target::kGpu), opt.seed);
  DeviceArena arena(dev.index);
  const DsaViews dv = dsa_views(p, [&](HostTensor& t) { return arena.upload(t); });
  const api::DsaForwardArgs args = dsa_forward_args(p.shape, dv);
  const GpuCall call{[&](size_t* ws) { return api::dsa_forward_workspace_size(args, ws); },
                     [&](const sa_context& c) { return api::dsa_forward(args, c); },
                     "dsa_fwd on cuda"};
  size_t ws = 0;
  if (!gpu_supported(call, &ws, why)) return std::nullopt;

  OpReport r = start_report("dsa_fwd", p.shape.describe(), describe_device(dev));
  finish(r, gpu_run(call, ws, arena, {{dv.out, &p.out}, {dv.lse, &p.lse}}, opt.repeats),
         Target::kGpu);
  SampledComparison c = dsa_forward_vs_reference(p, opt.seed);
  r.compared = c.what;
  r.checks = c.checks;
  return r;
}

std::optional<OpReport> dsa_backward_gpu(const DemoOptions& opt, const CudaDevice& dev,
                                         std::string* why) {
  DsaProblem p = make_dsa_problem(dsa_shape(opt, Target::kGpu), opt.seed);
  DeviceArena arena(dev.index);
  const DsaViews dv = dsa_views(p, [&](HostTensor& t) { return arena.upload(t); });
  const api::DsaBackwardArgs bwd_args = dsa_backward_args(p.shape, dv);
  const GpuCall bwd{[&](size_t* ws) { return api::dsa_backward_workspace_size(bwd_args, ws); },
                    [&](const sa_context& c) { return api::dsa_backward(bwd_args, c); },
                    "dsa_bwd on cuda"};
  size_t ws = 0;
  if (!gpu_supported(bwd, &ws, why)) return std::nullopt;
  OpReport r = start_report("dsa_bwd", p.shape.describe(), describe_device(dev));

  // The backward's inputs out and lse: from the GPU forward, else from the CPU reference.
  const api::DsaForwardArgs fwd_args = dsa_forward_args(p.shape, dv);
  const GpuCall fwd{[&](size_t* w) { return api::dsa_forward_workspace_size(fwd_args, w); },
                    [&](const sa_context& c) { return api::dsa_forward(fwd_args, c); },
                    "dsa_fwd on cuda"};
  size_t fwd_ws = 0;
  std::string fwd_why;
  if (gpu_supported(fwd, &fwd_ws, &fwd_why)) {
    const Timing t = gpu_run(fwd, fwd_ws, arena, {{dv.out, &p.out}, {dv.lse, &p.lse}}, 0);
    r.notes.push_back(std::string("out and lse (inputs of the backward) from the GPU forward (") +
                      sa_impl_name(t.impl) + ")");
  } else {
    const api::DsaForwardArgs host_fwd = dsa_forward_args(p.shape, dsa_views(p, host_place));
    cpu_call([&](const sa_context& c) { return api::dsa_forward(host_fwd, c); }, "dsa_fwd on cpu");
    upload_into(p.out, dv.out);
    upload_into(p.lse, dv.lse);
    r.notes.push_back(
        "out and lse (inputs of the backward) from the CPU reference forward: no "
        "GPU forward (" +
        fwd_why + ")");
  }

  finish(r,
         gpu_run(bwd, ws, arena, {{dv.dq, &p.dq}, {dv.dkv, &p.dkv}, {dv.d_sink, &p.d_sink}},
                 opt.repeats),
         Target::kGpu);
  SampledComparison c = dsa_backward_vs_reference(p, opt.seed);
  r.compared = c.what;
  r.checks = c.checks;
  return r;
}

}  // namespace sa_tool
