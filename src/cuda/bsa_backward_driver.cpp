// The BSA backward driver: the plan and the steps around a policy's kernels (see
// bsa_backward_driver.hpp). Host code; the kernels it launches are in bsa_backward_aux.cu,
// reverse_map_gpu.cu and the arch folders.
#include "cuda/bsa_backward_driver.hpp"

#include "common/stream_fork.hpp"
#include "cuda/bsa_backward_aux.hpp"

namespace sa::portable::bsa_bwd {

// Deterministic mode: one owner per row and dQ from the query-major kernel (no accumulator).
BsaBwdPlan plan(const BsaBwdProblem& p, const KernelPolicy& kernel) {
  const bool deterministic = p.options.deterministic != 0;
  const bool auto_bucket = !deterministic && p.options.bucket_size <= 0;
  const int32_t tail = kernel.tail_items != nullptr ? kernel.tail_items(p) : 0;
  return make_bsa_backward_plan(p, auto_bucket ? kernel.cta_slots(p) : 0, deterministic,
                                !deterministic, tail);
}

size_t workspace_bytes(const BsaBwdProblem& p, const KernelPolicy& kernel) {
  return plan(p, kernel).total;
}

void run(const BsaBwdProblem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
         const KernelPolicy& kernel) {
  const BsaBwdPlan pl = plan(p, kernel);
  const BsaBwdBuffers buf = carve_bsa_backward_workspace(pl, workspace, workspace_bytes, kernel.op);

  // Steps 1 and 2 side by side: the reverse map's small, latency-bound kernels on a side stream
  // beside the DRAM-bound zeroing and preprocess, instead of after them.
  StreamFork fork(stream);
  // 2. The reverse map (GPU, no host synchronisation).
  const ReverseMapDevice map = build_reverse_map_gpu(p.dims, p.meta, pl.bucket, buf.map,
                                                     pl.map_bytes, fork.side(), pl.tail_items);
  // 1. Accumulators, delta, lse2.
  zero_bsa_backward_accumulators(pl, buf, stream);
  launch_bwd_preprocess(p, pl.Sq_pad, buf.lse2, buf.delta, buf.dq_accum, buf.dq_ready,
                        pl.dq_ready_count, stream);
  fork.join();

  // 3. dK, dV (and dQ into its accumulator unless deterministic; dq itself when the policy's
  //    launch says so).
  const bool dq_written = kernel.launch(p, pl, buf, map, stream);

  // 4. dq.
  if (!dq_written) {
    if (pl.dq_accumulator)
      launch_bwd_convert_dq(p, pl.Sq_pad, buf.dq_accum, kernel.dq_tiled, stream);
    else
      kernel.launch_dq(p, pl, buf, stream);
  }

  // 5. dk, dv of the rows with several groups.
  if (pl.several_owners)
    launch_bwd_convert_dkv(p, pl.Skv_pad, buf.dk_accum, buf.dv_accum, map.row_groups, stream);
}

}  // namespace sa::portable::bsa_bwd
