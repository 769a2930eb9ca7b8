// The demo's BSA forward and backward, on the CPU reference and on the GPU.
#include "demo.hpp"
#include "oracle.hpp"
#include "reference_sample.hpp"

namespace sa_tool {
namespace api = sparse_attention;

namespace {

constexpr int kFiniteDifferencePicks = 4;  // per differentiable input

const char* kDenseOracle =
    "the tool's dense oracle: masked softmax attention in double over the densified [S_q, S_kv] "
    "mask, every element";

}  // namespace

// ---- CPU ----------------------------------------------------------------------------------------
OpReport bsa_forward_cpu(const DemoOptions& opt) {
  BsaProblem p = make_cpu_bsa_problem(opt);
  OpReport r = start_report("bsa_fwd", p.shape.describe(), "cpu");
  const api::BsaForwardArgs args = bsa_forward_args(p.shape, bsa_views(p, host_place));
  finish(r,
         cpu_call([&](const sa_context& c) { return api::bsa_forward(args, c); }, "bsa_fwd on cpu"),
         Target::kCpu);

  const BsaDenseResult want = bsa_dense_attention(p, bsa_dense_inputs(p), false);
  r.compared = kDenseOracle;
  r.checks.push_back(rel_l2_check("o", p.logical(p.o), want.o, count_nan(p.o)));
  r.checks.push_back(lse_check("lse", values(p.lse.view()), want.lse, count_nan(p.lse)));
  return r;
}

OpReport bsa_backward_cpu(const DemoOptions& opt) {
  BsaProblem p = make_cpu_bsa_problem(opt);
  OpReport r = start_report("bsa_bwd", p.shape.describe(), "cpu");
  const BsaViews v = bsa_views(p, host_place);
  const api::BsaForwardArgs fwd = bsa_forward_args(p.shape, v);
  cpu_call([&](const sa_context& c) { return api::bsa_forward(fwd, c); }, "bsa_fwd on cpu");
  r.notes.push_back("o and lse (inputs of the backward) from the reference forward");
  const api::BsaBackwardArgs bwd = bsa_backward_args(p.shape, v);
  finish(r,
         cpu_call([&](const sa_context& c) { return api::bsa_backward(bwd, c); }, "bsa_bwd on cpu"),
         Target::kCpu);

  const BsaDenseInputs x = bsa_dense_inputs(p);
  const BsaDenseResult want = bsa_dense_attention(p, x, true);
  r.compared = std::string(kDenseOracle) +
               "; its backward (dense softmax derivative, Delta = rowsum(P * dP)) checked by "
               "central differences of sum(dO * O)";
  r.checks.push_back(rel_l2_check("dq", p.logical(p.dq), want.dq, count_nan(p.dq)));
  r.checks.push_back(rel_l2_check("dk", p.logical(p.dk), want.dk, count_nan(p.dk)));
  r.checks.push_back(rel_l2_check("dv", p.logical(p.dv), want.dv, count_nan(p.dv)));
  const FiniteDifferenceCheck fd =
      bsa_finite_differences(p, x, want, kFiniteDifferencePicks, opt.seed);
  r.checks.push_back(finite_difference_check(fd.rel_error, fd.elements));
  return r;
}

// ---- GPU ----------------------------------------------------------------------------------------
std::optional<OpReport> bsa_forward_gpu(const DemoOptions& opt, const CudaDevice& dev,
                                        std::string* why) {
  BsaProblem p = make_bsa_problem(bsa_shape(opt, Target::kGpu), opt.seed);
  DeviceArena arena(dev.index);
  const BsaViews dv = bsa_views(p, [&](HostTensor& t) { return arena.upload(t); });
  const api::BsaForwardArgs args = bsa_forward_args(p.shape, dv);
  const GpuCall call{[&](size_t* ws) { return api::bsa_forward_workspace_size(args, ws); },
                     [&](const sa_context& c) { return api::bsa_forward(args, c); },
                     "bsa_fwd on cuda"};
  size_t ws = 0;
  if (!gpu_supported(call, &ws, why)) return std::nullopt;

  OpReport r = start_report("bsa_fwd", p.shape.describe(), describe_device(dev));
  finish(r, gpu_run(call, ws, arena, {{dv.o, &p.o}, {dv.lse, &p.lse}}, opt.repeats), Target::kGpu);
  SampledComparison c = bsa_forward_vs_reference(p, opt.seed);
  r.compared = c.what;
  r.checks = c.checks;
  return r;
}

std::optional<OpReport> bsa_backward_gpu(const DemoOptions& opt, const CudaDevice& dev,
                                         std::string* why) {
  BsaProblem p = make_bsa_problem(bsa_shape(opt, Target::kGpu), opt.seed);
  DeviceArena arena(dev.index);
  const BsaViews dv = bsa_views(p, [&](HostTensor& t) { return arena.upload(t); });
  const api::BsaBackwardArgs bwd_args = bsa_backward_args(p.shape, dv);
  const GpuCall bwd{[&](size_t* ws) { return api::bsa_backward_workspace_size(bwd_args, ws); },
                    [&](const sa_context& c) { return api::bsa_backward(bwd_args, c); },
                    "bsa_bwd on cuda"};
  size_t ws = 0;
  if (!gpu_supported(bwd, &ws, why)) return std::nullopt;
  OpReport r = start_report("bsa_bwd", p.shape.describe(), describe_device(dev));

  // The backward's inputs o and lse: from the GPU forward, else from the CPU reference.
  const api::BsaForwardArgs fwd_args = bsa_forward_args(p.shape, dv);
  const GpuCall fwd{[&](size_t* w) { return api::bsa_forward_workspace_size(fwd_args, w); },
                    [&](const sa_context& c) { return api::bsa_forward(fwd_args, c); },
                    "bsa_fwd on cuda"};
  size_t fwd_ws = 0;
  std::string fwd_why;
  if (gpu_supported(fwd, &fwd_ws, &fwd_why)) {
    const Timing t = gpu_run(fwd, fwd_ws, arena, {{dv.o, &p.o}, {dv.lse, &p.lse}}, 0);
    r.notes.push_back(std::string("o and lse (inputs of the backward) from the GPU forward (") +
                      sa_impl_name(t.impl) + ")");
  } else {
    const api::BsaForwardArgs host_fwd = bsa_forward_args(p.shape, bsa_views(p, host_place));
    cpu_call([&](const sa_context& c) { return api::bsa_forward(host_fwd, c); }, "bsa_fwd on cpu");
    upload_into(p.o, dv.o);
    upload_into(p.lse, dv.lse);
    r.notes.push_back(
        "o and lse (inputs of the backward) from the CPU reference forward: no GPU "
        "forward (" +
        fwd_why + ")");
  }

  finish(r, gpu_run(bwd, ws, arena, {{dv.dq, &p.dq}, {dv.dk, &p.dk}, {dv.dv, &p.dv}}, opt.repeats),
         Target::kGpu);
  SampledComparison c = bsa_backward_vs_reference(p, opt.seed);
  r.compared = c.what;
  r.checks = c.checks;
  return r;
}

}  // namespace sa_tool
