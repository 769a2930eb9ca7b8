#include "cuda/launch_checks.hpp"

#include <cstdint>
#include <sstream>

#include "common/cuda_device.hpp"

namespace sa::portable {

std::string smem_unsupported(int32_t device, size_t need) {
  const int optin = max_smem_optin(device);
  std::ostringstream os;
  if (optin == 0)
    os << "cannot query the shared memory of CUDA device " << device;
  else if (need > static_cast<size_t>(optin))
    os << "needs " << need << " bytes of shared memory per block (device " << device
       << " offers " << optin << ")";
  return os.str();
}

std::string check_tensor_addressing(const char* name, const Bhsd& t, int64_t B, int64_t H,
                                    int64_t S) {
  std::ostringstream os;
  if (t.data == nullptr) {
    os << name << " is missing";
  } else if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) {
    os << name << ": data pointer not 16-byte aligned";
  } else if (t.sd != 1) {
    os << name << ": last dimension not contiguous (stride " << t.sd << ")";
  } else if ((B > 1 && t.sb % 8 != 0) || (H > 1 && t.sh % 8 != 0) || (S > 1 && t.ss % 8 != 0)) {
    os << name << ": strides (" << t.sb << ", " << t.sh << ", " << t.ss
       << ") not multiples of 8 elements";
  }
  return os.str();
}

std::string dsa_sizes_unsupported(const DsaDims& d, const char* path) {
  std::ostringstream os;
  if (d.Dqk != 512 && d.Dqk != 576) {
    os << "D_qk = " << d.Dqk << " (" << path << " supports 512, 576)";
  } else if (d.Dv != 512) {
    os << "d_v = " << d.Dv << " (" << path << " supports 512)";
  } else if (d.H < 8 || d.H % 8 != 0) {
    os << "H = " << d.H << " (" << path << " supports multiples of 8: 8, 16, 32, 64, 128)";
  } else if (d.topk > INT32_MAX - 64 || d.H > INT32_MAX) {
    os << "topk = " << d.topk << ", H = " << d.H << " (" << path << " supports < 2^31 - 64)";
  }
  return os.str();
}

std::string dsa_forward_layout_unsupported(const DsaFwdProblem& p, const char* path) {
  const DsaDims& d = p.dims;
  const bool layout_ok =
      p.q.sd == 1 && p.kv.sd == 1 && p.out.sd == 1 && is_aligned(p.q.data, 16) &&
      is_aligned(p.kv.data, 16) && is_aligned(p.out.data, 4) && p.q.sh % 8 == 0 &&
      (p.q.ss % 8 == 0 || d.Sq == 1) && (p.kv.ss % 8 == 0 || d.Skv == 1) && p.out.sh % 2 == 0 &&
      (p.out.ss % 2 == 0 || d.Sq == 1);
  if (layout_ok) return "";
  return std::string("q, kv, out: the last dimension must be contiguous and q/kv rows 16-byte "
                     "aligned (") +
         path + ")";
}

}  // namespace sa::portable
