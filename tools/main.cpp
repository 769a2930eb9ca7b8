// sparse-attention: the command-line tool. Parses the arguments and dispatches to a subcommand:
//   demo   BSA and DSA forward/backward on a random problem, timed and checked (demo.hpp)
//   bench  the benchmark mode (bench.hpp)
// Exit status: 0 all checks passed, 1 a check failed, 2 a bad argument (ours or the library's).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <iomanip>
#include <limits>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "demo.hpp"
#include "flashmla_anchor.hpp"
#include "tool_error.hpp"

namespace sa_tool {
namespace {

std::string usage() {
  const BsaShape bc = default_bsa_shape(Target::kCpu), bg = default_bsa_shape(Target::kGpu);
  const DsaShape dc = default_dsa_shape(Target::kCpu), dg = default_dsa_shape(Target::kGpu);
  std::ostringstream os;
  auto flag = [&](const std::string& name, const std::string& text) {
    os << "  " << std::left << std::setw(22) << name << text << "\n";
  };
  auto more = [&](const std::string& text) { os << std::string(24, ' ') << text << "\n"; };
  auto both = [](auto cpu, auto gpu) {
    std::ostringstream d;
    d << " (" << cpu << " cpu, " << gpu << " gpu)";
    return d.str();
  };
  os << "usage: sparse-attention <command> [flags]\n\n"
     << "commands:\n"
     << "  demo     run BSA and DSA forward and backward on a random problem, time them and\n"
     << "           check them against an fp64 oracle; exit 0 when every check passes\n"
     << "  bench    time our implementations on the GPU (BENCHMARKING.md method) with the\n"
     << "           demo's problem flags plus: --variants \"impl=portable/impl=sm90\" (keys impl=,\n"
     << "           bucket=, deterministic=, and the library's internal tuning:\n"
     << "           tune.fwd_splits=auto|1..16, tune.fwd_dyn=auto|0|1|2,\n"
     << "           tune.bwd_tail=auto|0..1024,\n"
     << "           tune.sm90_bsa_bwd_stats=0|1, tune.sm90_bsa_bwd_full=0|1, tune.dsa_bwd=0..7,\n"
     << "           tune.sm90_dsa_bwd_groups=0|1, tune.sm90_dsa_bwd_det_binned=0..2,\n"
     << "           tune.dsa_fwd_pad=0|1, tune.topk=0..4,\n"
     << "           tune.ptopk=0..4, tune.sm90_indexer_target=0..3,\n"
     << "           tune.sm90_indexer_loss_kernel=0..4; bsa_fwd: mask=none|causal\n"
     << "           (tools/bench.hpp));\n"
     << "           ',' joins keys, '/' separates variants; the first is the A/B\n"
     << "           anchor), --warmup N (10), --rounds N (5 per pass, 2 passes), --calls N\n"
     << "           (20 per round), --json FILE (append records), --no-check;\n"
     << "           anchor=flashmla: FlashMLA's Hopper sparse prefill on the same tensors\n"
     << "           (dsa_fwd; built in: " << (sa_tool::flashmla_anchor_built() ? "yes" : "no")
     << ", -DSA_FLASHMLA_DIR)\n"
     << "           bench also times the lightning indexer: --op indexer_scores |\n"
     << "           indexer_topk | indexer_loss (flags below)\n"
     << "  help     this text (also --help, -h)\n\n"
     << "demo flags (--flag VALUE or --flag=VALUE):\n";
  flag("--op OPS", "bsa_fwd | bsa_bwd | dsa_fwd | dsa_bwd | all, or a comma list (all)");
  flag("--device DEV", "auto | cpu | cuda (auto). auto: each op runs on the GPU when a CUDA");
  more("device is present and the library serves it there (checked against");
  more("the fp64 CPU reference on exact sub-problems), else on the fp64 CPU");
  more("reference at the CPU size (checked against the tool's dense oracle)");
  flag("--dtype T", "bf16 | fp16 (bf16)");
  flag("--seed N", "random seed of inputs and sparsity (1)");
  flag("--repeats N", "timed calls per op on the GPU (10)");
  os << " BSA (S_q = S_kv, D = D_v; defaults on the CPU and on the GPU):\n";
  flag("--batch N", "B" + both(bc.B, bg.B));
  flag("--heads N", "H_q" + both(bc.Hq, bg.Hq));
  flag("--kv-heads N", "H_kv, dividing H_q" + both(bc.Hkv, bg.Hkv));
  flag("--seq N", "S_q = S_kv" + both(bc.S, bg.S));
  flag("--dim N", "D = D_v" + both(bc.D, bg.D));
  flag("--block N", "block size; the library takes 64 or 128" + both(bc.block, bg.block));
  flag("--density X", "fraction of the KV blocks each query block attends, in (0, 1];");
  more("distinct, uniformly random blocks" + both(bc.density, bg.density));
  flag("--layout L", "bhsd | bshd (bhsd)");
  flag("--blocks P", "bench: random | sorted | causal (random). sorted: the random blocks of");
  more("each row in ascending order. causal (bsa_fwd only): query block m lists its");
  more("diagonal block and round(density * m) distinct random earlier blocks (the");
  more("MoBA pattern; per-row counts)");
  flag("--mask M", "bench, bsa_fwd only: options.mask, none | causal (none)");
  os << " DSA (D_v = 512):\n";
  flag("--dsa-heads N", "H" + both(dc.H, dg.H));
  flag("--dsa-dqk N", "D_qk, 512 or 576" + both(dc.Dqk, dg.Dqk));
  flag("--dsa-seq N", "S_kv" + both(dc.Skv, dg.Skv));
  flag("--dsa-queries N", "S_q" + both(dc.Sq, "= --dsa-seq on the"));
  flag("--topk N", "slots per query, distinct random keys" + both(dc.topk, dg.topk));
  flag("--topk-length on|off", "random topk_length in [1, topk] per query (on)");
  flag("--sink on|off", "per-head attention sink, random in [-1, 4] (on)");
  os << " the indexer (bench only; D_I = 128, bf16 q_I and k_I, fp32 w; tools/bench_indexer.cpp):\n";
  flag("--seq N", "S = S_q = S_kv (8192; indexer_loss 4096)");
  flag("--indexer-heads N", "H_I: 16, 32 or 64 (64)");
  flag("--topk N", "k of indexer_topk and of the sparse loss's top-k (2048)");
  flag("--causal on|off", "ranges k_start = 0, k_end = t + 1, as in DeepSeek-V3.2's prefill (on);");
  more("off: every key in range");
  flag("--loss-mode M", "sparse | dense: indexer_loss on our top-k (with the DSA forward's lse)");
  more("or over each whole range (the warm-up stage) (sparse)");
  flag("--dsa-heads N", "H of the loss's attention (128)");
  flag("--dsa-dqk N", "D_qk of the loss's attention, 512 or 576 (576)");
  os << "\nexit status: 0 every check passed; 1 a check failed (or a run-time failure);\n"
     << "2 a bad argument: an unknown flag or value, or a call the library refused\n"
     << "(invalid argument, unsupported), with its message on stderr.\n";
  return os.str();
}

[[noreturn]] void bad(const std::string& flag, const std::string& expected,
                      const std::string& got) {
  throw ToolError(kExitBadArgument, flag + ": expected " + expected + ", got '" + got + "'");
}

// A positive integer up to `max` (the range of the C++ type the value goes into).
int64_t parse_positive(const std::string& flag, const std::string& v,
                       int64_t max = std::numeric_limits<int64_t>::max()) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < 1 || x > max)
    bad(flag, "a positive integer <= " + std::to_string(max), v);
  return x;
}

// For flags stored as int or int32_t.
int parse_positive_int(const std::string& flag, const std::string& v) {
  return static_cast<int>(parse_positive(flag, v, std::numeric_limits<int32_t>::max()));
}

uint64_t parse_seed(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || *end != '\0' || errno != 0)
    bad(flag, "a non-negative integer", v);
  return x;
}

double parse_fraction(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(x > 0.0 && x <= 1.0)) bad(flag, "a number in (0, 1]", v);
  return x;
}

template <class T>
T parse_choice(const std::string& flag, const std::string& v,
               std::initializer_list<std::pair<const char*, T>> choices) {
  std::string names;
  for (const auto& c : choices) {
    if (v == c.first) return c.second;
    names += (names.empty() ? "" : " | ") + std::string(c.first);
  }
  bad(flag, "one of " + names, v);
}

bool parse_on_off(const std::string& flag, const std::string& v) {
  return parse_choice<bool>(flag, v, {{"on", true}, {"off", false}});
}

// The demo's operations; with `bench`, also the indexer's.
std::vector<std::string> parse_ops(const std::string& flag, const std::string& v, bool bench) {
  if (v == "all") return all_ops();
  const std::string expected = bench ? "bsa_fwd, bsa_bwd, dsa_fwd, dsa_bwd, indexer_scores, "
                                       "indexer_topk, indexer_loss or all"
                                     : "bsa_fwd, bsa_bwd, dsa_fwd, dsa_bwd or all";
  std::vector<std::string> known = all_ops();
  if (bench) known.insert(known.end(), indexer_ops().begin(), indexer_ops().end());
  std::vector<std::string> ops;
  std::stringstream ss(v);
  for (std::string op; std::getline(ss, op, ',');) {
    if (std::find(known.begin(), known.end(), op) == known.end()) {
      if (!bench && std::find(indexer_ops().begin(), indexer_ops().end(), op) != indexer_ops().end())
        bad(flag, expected + " (the indexer's operations are bench's)", v);
      bad(flag, expected, v);
    }
    ops.push_back(op);
  }
  if (ops.empty()) bad(flag, expected, v);
  return ops;
}

// Parses the demo's flags into *o (with `bench`, also the indexer's); returns false when --help
// was asked for.
bool parse_demo(const std::vector<std::string>& args, DemoOptions* o, bool bench = false) {
  using Setter = std::function<void(const std::string& flag, const std::string& value)>;
  const std::vector<std::pair<std::string, Setter>> flags = {
      {"--op", [&](auto& f, auto& v) { o->ops = parse_ops(f, v, bench); }},
      {"--device",
       [&](auto& f, auto& v) {
         o->device = parse_choice<DeviceChoice>(f, v,
                                                {{"auto", DeviceChoice::kAuto},
                                                 {"cpu", DeviceChoice::kCpu},
                                                 {"cuda", DeviceChoice::kCuda}});
       }},
      {"--dtype",
       [&](auto& f, auto& v) {
         o->dtype =
             parse_choice<sa_dtype>(f, v, {{"bf16", SA_DTYPE_BF16}, {"fp16", SA_DTYPE_FP16}});
       }},
      {"--seed", [&](auto& f, auto& v) { o->seed = parse_seed(f, v); }},
      {"--repeats", [&](auto& f, auto& v) { o->repeats = parse_positive_int(f, v); }},
      {"--batch", [&](auto& f, auto& v) { o->batch = parse_positive(f, v); }},
      {"--heads", [&](auto& f, auto& v) { o->heads = parse_positive(f, v); }},
      {"--kv-heads", [&](auto& f, auto& v) { o->kv_heads = parse_positive(f, v); }},
      {"--seq", [&](auto& f, auto& v) { o->seq = parse_positive(f, v); }},
      {"--dim", [&](auto& f, auto& v) { o->dim = parse_positive(f, v); }},
      {"--block", [&](auto& f, auto& v) { o->block = parse_positive_int(f, v); }},
      {"--density", [&](auto& f, auto& v) { o->density = parse_fraction(f, v); }},
      {"--layout",
       [&](auto& f, auto& v) {
         o->layout =
             parse_choice<sa_layout>(f, v, {{"bhsd", SA_LAYOUT_BHSD}, {"bshd", SA_LAYOUT_BSHD}});
       }},
      {"--dsa-heads", [&](auto& f, auto& v) { o->dsa_heads = parse_positive(f, v); }},
      {"--dsa-dqk", [&](auto& f, auto& v) { o->dsa_dqk = parse_positive(f, v); }},
      {"--dsa-seq", [&](auto& f, auto& v) { o->dsa_seq = parse_positive_int(f, v); }},
      {"--dsa-queries", [&](auto& f, auto& v) { o->dsa_queries = parse_positive(f, v); }},
      {"--topk", [&](auto& f, auto& v) { o->topk = parse_positive_int(f, v); }},
      {"--topk-length", [&](auto& f, auto& v) { o->topk_length = parse_on_off(f, v); }},
      {"--sink", [&](auto& f, auto& v) { o->sink = parse_on_off(f, v); }},
  };
  const std::vector<std::pair<std::string, Setter>> bench_flags = {
      {"--indexer-heads", [&](auto& f, auto& v) { o->indexer_heads = parse_positive(f, v); }},
      {"--causal", [&](auto& f, auto& v) { o->causal = parse_on_off(f, v); }},
      {"--loss-mode",
       [&](auto& f, auto& v) {
         o->dense_loss = parse_choice<bool>(f, v, {{"sparse", false}, {"dense", true}});
       }},
      {"--blocks",
       [&](auto& f, auto& v) {
         const int p = parse_choice<int>(f, v, {{"random", 0}, {"causal", 1}, {"sorted", 2}});
         o->bsa_causal_blocks = p == 1;
         o->bsa_sorted_blocks = p == 2;
       }},
      {"--mask",
       [&](auto& f, auto& v) {
         o->bsa_mask = parse_choice<sa_mask>(f, v,
                                             {{"none", SA_MASK_NONE}, {"causal", SA_MASK_CAUSAL}});
       }},
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") return false;
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const Setter* set = nullptr;
    for (const auto& f : flags)
      if (f.first == name) set = &f.second;
    if (bench)
      for (const auto& f : bench_flags)
        if (f.first == name) set = &f.second;
    if (set == nullptr || name.rfind("--", 0) != 0)
      throw ToolError(kExitBadArgument, "unknown flag '" + arg + "' (see --help)");
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw ToolError(kExitBadArgument, name + ": missing value");
    }
    (*set)(name, value);
  }
  return true;
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(usage().c_str(), stderr);
    return kExitBadArgument;
  }
  const std::string command = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (command == "help" || command == "--help" || command == "-h") {
    std::fputs(usage().c_str(), stdout);
    return kExitPass;
  }
  if (command == "demo") {
    DemoOptions options;
    if (!parse_demo(rest, &options)) {
      std::fputs(usage().c_str(), stdout);
      return kExitPass;
    }
    return run_demo(options);
  }
  if (command == "bench") {
    // Bench flags are taken out first; the rest are the demo's problem flags.
    BenchOptions bench;
    std::vector<std::string> problem_args;
    for (size_t i = 0; i < rest.size(); ++i) {
      const std::string& arg = rest[i];
      const size_t eq = arg.find('=');
      const std::string name = arg.substr(0, eq);
      const bool known = name == "--variants" || name == "--warmup" || name == "--rounds" ||
                         name == "--calls" || name == "--json" || name == "--no-check";
      if (!known) {
        problem_args.push_back(arg);
        continue;
      }
      if (name == "--no-check") {
        bench.check = false;
        continue;
      }
      std::string value;
      if (eq != std::string::npos) value = arg.substr(eq + 1);
      else if (i + 1 < rest.size()) value = rest[++i];
      else throw ToolError(kExitBadArgument, name + ": missing value");
      if (name == "--variants") bench.variants = parse_variants(value);
      else if (name == "--warmup") bench.warmup = parse_positive_int(name, value);
      else if (name == "--rounds") bench.rounds = parse_positive_int(name, value);
      else if (name == "--calls") bench.calls = parse_positive_int(name, value);
      else bench.json = value;
    }
    DemoOptions options;
    if (!parse_demo(problem_args, &options, /*bench=*/true)) {
      std::fputs(usage().c_str(), stdout);
      return kExitPass;
    }
    return run_bench(options, bench);
  }
  throw ToolError(kExitBadArgument, "unknown command '" + command + "' (see --help)");
}

}  // namespace
}  // namespace sa_tool

int main(int argc, char** argv) {
  try {
    return sa_tool::run(argc, argv);
  } catch (const sa_tool::ToolError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: out of host memory for the problem's tensors (std::bad_alloc); "
                         "use smaller sizes\n");
    return sa_tool::kExitCheckFailed;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: internal: %s\n", e.what());
    return sa_tool::kExitCheckFailed;
  }
}
