#include "common/stream_fork.hpp"

#include <unordered_map>

#include "common/cuda_check.hpp"

namespace sa {
namespace {

struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};

// The calling thread's side streams, by device; destroyed at thread exit (errors ignored: the
// context may already be gone at process exit).
struct ThreadSideStreams {
  std::unordered_map<int, SideStream> by_device;
  ~ThreadSideStreams() {
    for (auto& [device, s] : by_device) {
      (void)device;
      if (s.fork != nullptr) (void)cudaEventDestroy(s.fork);
      if (s.join != nullptr) (void)cudaEventDestroy(s.join);
      if (s.stream != nullptr) (void)cudaStreamDestroy(s.stream);
    }
    (void)cudaGetLastError();
  }
};

SideStream& side_stream_of_this_thread() {
  thread_local ThreadSideStreams streams;
  int device = 0;
  SA_CUDA_CHECK(cudaGetDevice(&device));
  SideStream& s = streams.by_device[device];
  if (s.stream == nullptr) {
    // The highest priority: the block scheduler then dispatches the side stream's small kernels
    // ahead of the waiting blocks of a large kernel on the caller's stream. At equal priority
    // they wait for its last wave (session 27, device call 1: no gain).
    int least = 0, greatest = 0;
    SA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    SA_CUDA_CHECK(cudaStreamCreateWithPriority(&s.stream, cudaStreamNonBlocking, greatest));
    SA_CUDA_CHECK(cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming));
    SA_CUDA_CHECK(cudaEventCreateWithFlags(&s.join, cudaEventDisableTiming));
  }
  return s;
}

}  // namespace

StreamFork::StreamFork(cudaStream_t stream) : stream_(stream) {
  SideStream& s = side_stream_of_this_thread();
  SA_CUDA_CHECK(cudaEventRecord(s.fork, stream_));
  SA_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.fork, 0));
  side_ = s.stream;
  join_event_ = s.join;
}

void StreamFork::join() {
  if (joined_) return;
  joined_ = true;
  SA_CUDA_CHECK(cudaEventRecord(join_event_, side_));
  SA_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_event_, 0));
}

StreamFork::~StreamFork() {
  if (joined_) return;
  if (cudaEventRecord(join_event_, side_) == cudaSuccess)
    (void)cudaStreamWaitEvent(stream_, join_event_, 0);
}

}  // namespace sa
