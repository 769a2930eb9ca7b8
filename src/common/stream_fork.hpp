// Fork / join of a side stream around independent work of one library call, e.g. the BSA
// backward's reverse map (small, latency-bound kernels) beside its preprocess (DRAM-bound).
#pragma once

#include <cuda_runtime_api.h>

namespace sa {

// On construction, work enqueued on side() waits for everything enqueued on `stream` so far;
// after join(), work enqueued on `stream` waits for everything enqueued on side(). The side
// stream and the two events belong to the calling thread and the current device (created on first
// use, destroyed at thread exit), so concurrent host threads never share them, and a stream
// capture on `stream` takes the side stream's work into the graph (the events are the fork and
// join edges). The destructor joins if join() was not called (an exception between the two), so a
// capture is never left with an unjoined stream.
class StreamFork {
 public:
  explicit StreamFork(cudaStream_t stream);
  ~StreamFork();
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;

  cudaStream_t side() const { return side_; }
  void join();

 private:
  cudaStream_t stream_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t join_event_ = nullptr;
  bool joined_ = false;
};

}  // namespace sa
