// Reading the C ABI's extensible structs (sparse_attention.h, "Extensible structs"): a caller's
// struct of any version becomes this library's struct. Fields inside the caller's `size` come
// from the caller, fields past it keep their defaults; sizes that cannot be a real struct are
// refused by name.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/error.hpp"
#include "sparse_attention/sparse_attention.h"

namespace sa::api {

// Larger sizes are taken for an uninitialised struct.
constexpr size_t kMaxStructBytes = size_t{1} << 16;

// The bytes of the first version of each struct (the end of its last field then). They never
// change: later versions only append fields.
constexpr size_t kBsaOptionsV1 = offsetof(sa_bsa_options, impl) + sizeof(sa_impl);
constexpr size_t kDsaOptionsV1 = offsetof(sa_dsa_options, impl) + sizeof(sa_impl);
constexpr size_t kIndexerOptionsV1 = offsetof(sa_indexer_options, impl) + sizeof(sa_impl);
// sa_bsa_options version 2 (token masks) starts past the first version's sizeof, padding
// included: a version-1 caller's padding bytes (any value) are never read as a new field.
static_assert(offsetof(sa_bsa_options, causal_offset) >=
                  (kBsaOptionsV1 + alignof(sa_bsa_options) - 1) / alignof(sa_bsa_options) *
                      alignof(sa_bsa_options),
              "sa_bsa_options: version-2 fields must start past the version-1 struct");
// Version 3 (packed batches) likewise starts past the version-2 struct, padding included.
constexpr size_t kBsaOptionsV2 =
    offsetof(sa_bsa_options, causal_offset_given) + sizeof(int32_t);
static_assert(offsetof(sa_bsa_options, cu_seqlens_q) >=
                  (kBsaOptionsV2 + alignof(sa_bsa_options) - 1) / alignof(sa_bsa_options) *
                      alignof(sa_bsa_options),
              "sa_bsa_options: version-3 fields must start past the version-2 struct");
constexpr size_t options_v1(const sa_bsa_options*) { return kBsaOptionsV1; }
constexpr size_t options_v1(const sa_dsa_options*) { return kDsaOptionsV1; }
constexpr size_t options_v1(const sa_indexer_options*) { return kIndexerOptionsV1; }
template <class Args>
constexpr size_t args_v1() {
  return offsetof(Args, options) + options_v1(static_cast<const decltype(Args::options)*>(nullptr));
}

// `caller` as this library's T: `size` checked (name: "args", "args.options"; init: the
// initializer to name in the message), the caller's bytes inside it copied onto `defaults`.
// `available`: how many bytes at `caller` may be read at most (the enclosing struct's bound).
template <class T>
T read_extensible(const T* caller, size_t available, const T& defaults, size_t v1,
                  const char* name, const char* init) {
  size_t size = 0;
  std::memcpy(&size, caller, sizeof(size));  // `size` is the first field of every version
  SA_CHECK_ARG(size != 0, name << ".size: 0, an uninitialised struct: start from " << init
                               << " (it sets the size and the defaults)");
  SA_CHECK_ARG(size >= v1 && size <= kMaxStructBytes,
               name << ".size: expected at least " << v1 << " (the first version's size) and "
                    << "at most " << kMaxStructBytes << ", got " << size
                    << " (start from " << init << ")");
  SA_CHECK_ARG(size <= available, name << ".size: " << size << " is larger than the "
                                       << available << " bytes that hold it");
  if (size > sizeof(T)) {
    // A newer header: its added fields must be at their defaults (0), which this library meets.
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(caller);
    const unsigned char* first_set =
        std::find_if(bytes + sizeof(T), bytes + size, [](unsigned char b) { return b != 0; });
    SA_CHECK(first_set == bytes + size, SA_ERROR_UNSUPPORTED,
             name << ": the caller's struct (" << size << " bytes) sets fields at byte "
                  << (first_set - bytes) << " that this library (" << sizeof(T)
                  << " bytes) predates: use a library at least as new as the header");
  }
  T out = defaults;
  std::memcpy(static_cast<void*>(&out), caller, std::min(size, sizeof(T)));
  out.size = sizeof(T);
  return out;
}

// An args struct of the C ABI as this library's version: the args, then its options (the last
// member, so its bytes lie inside the args' size).
template <class Args, class Options>
Args read_args(const Args* caller, const Args& defaults, const char* args_init,
               const char* options_init) {
  size_t args_size = 0;
  std::memcpy(&args_size, caller, sizeof(args_size));
  Args a = read_extensible(caller, kMaxStructBytes, defaults, args_v1<Args>(), "args",
                           args_init);
  const size_t options_at = offsetof(Args, options);
  const Options* caller_options = reinterpret_cast<const Options*>(
      reinterpret_cast<const unsigned char*>(caller) + options_at);
  a.options = read_extensible(caller_options, args_size - options_at, defaults.options,
                              options_v1(static_cast<const Options*>(nullptr)), "args.options",
                              options_init);
  return a;
}

}  // namespace sa::api
