// The flag tables of profile, plan and simulate (VerbFlags.h): name, type, default, help.
#include "VerbFlags.h"

namespace dhelix {

FlagSpec compute_slowdown_flag() {
  return {"--compute-slowdown", FlagType::kNumber, "",
          "co-execution interference: a compute op beside a collective runs K times\nslower (default: the "
          "preset's device.compute_slowdown, else 1; `dhelix\nsimulate --profile` fits it on a profile)",
          "K", 1, 100};
}

namespace {

// --ranks and --sm-split: how `profile` and `plan` run the layout's ranks for timing.
FlagSpec ranks_flag() {
  return {"--ranks", FlagType::kChoice, "processes",
          "processes: this process is one rank (under mpirun for more than one);\nthreads: every rank a thread of "
          "this one process (no mpirun): ranks that share\none GPU (their collectives staged through host memory, "
          "paced by\ncomm.emulated_link_gbit), or a check on the CPU (collectives in memory)",
          "processes|threads"};
}

FlagSpec sm_split_flag() {
  return {"--sm-split", FlagType::kChoice, "ranks",
          "with --ranks threads on a GPU: ranks, each rank thread in its own share of\nthe GPU's SMs (a smaller GPU "
          "of its own, as one GPU per rank is); off, the\nranks share all of them",
          "ranks|off"};
}

}  // namespace

FlagSpec comm_slowdown_flag() {
  return {"--comm-slowdown", FlagType::kNumber, "",
          "a collective in flight while its rank computes runs K times slower\n(default: the preset's "
          "device.comm_slowdown, else 1; fitted alike)",
          "K", 1, 100};
}

const FlagTable& profile_flags() {
  static const FlagTable t{
      "profile",
      "usage: dhelix profile --config C.toml [--out FILE] [--repeats R] [--warmup W] [--max-window N]\n"
      "                      [--ranks processes|threads] [--sm-split ranks|off] [--section.key value ...]\n"
      "       mpirun -np N dhelix profile --config C.toml --parallel.tp T ...\n"
      "       dhelix profile --config C.toml --parallel.tp T --ranks threads --training.device cuda ...\n"
      "Times every forward window, backward window and legal (fwd, bwd) window pair of the\n"
      "transformer-layer pair on the real executor and process groups; writes the profile JSON.\n",
      {
          {"--out", FlagType::kText, "<output.dir>/profile.json", "the profile JSON", "FILE"},
          {"--repeats", FlagType::kInt, "5", "timed runs of each window", "R", 1, 1e6},
          {"--warmup", FlagType::kInt, "1", "untimed runs before them", "W", 0},
          {"--max-window", FlagType::kInt, "0", "longest window in ops (0: no bound)", "N", 0},
          ranks_flag(),
          sm_split_flag(),
      },
      ConfigWords::kPassedOn};
  return t;
}

const FlagTable& plan_flags() {
  static const FlagTable t{
      "plan",
      "usage: dhelix plan --config C.toml (--profile FILE | --cost-model PRESET|FILE.json)\n"
      "                   [--top-k K] [--out FILE] [--repeats R] [--warmup W] [--no-validate]\n"
      "                   [--max-window N] [--min-gain G] [--json FILE] [--section.key value ...]\n"
      "Searches the best Strand-Interleaving plan (DP, top K); with --profile the K candidates and the\n"
      "default plan are timed on the real layer pair (run it like `dhelix profile`: under mpirun for\n"
      "tp > 1, or with --ranks threads); the fastest is kept if it beats the default plan by the fraction G.\n"
      "Writes the plan JSON, an SVG beside it and prints the plan as a table. --cost-model prices blocks\n"
      "from a cluster preset (configs/clusters: a40-pcie, h100-8gpu, perlmutter-a100, cpu-emulated, or a\n"
      ".toml path; GPUs in bf16) or a JSON file of the pricer's fields; no hardware needed: with a preset\n"
      "each candidate is simulated in the whole training step (the step simulator, the config's batch\n"
      "and schedule) and the fastest, the default plan included, is kept.\n",
      {
          {"--profile", FlagType::kText, "", "a `dhelix profile` of this config's layer pair", "FILE"},
          {"--cost-model", FlagType::kText, "", "a cluster preset or a JSON file of the pricer's fields",
           "PRESET|FILE.json"},
          {"--top-k", FlagType::kInt, "4", "candidates the search keeps", "K", 1},
          {"--out", FlagType::kText, "<output.dir>/plan.json", "the plan JSON (an SVG is written beside it)", "FILE"},
          {"--repeats", FlagType::kInt, "5", "timed runs of each candidate (--profile)", "R", 1},
          {"--warmup", FlagType::kInt, "1", "untimed runs before them", "W", 0},
          {"--no-validate", FlagType::kSwitch, "", "keep the searched plans untimed"},
          {"--max-window", FlagType::kInt, "0", "longest window in ops (0: no bound)", "N", 0},
          {"--min-gain", FlagType::kNumber, "0.03", "the fraction a candidate must beat the default plan by, in [0, 1)",
           "G", 0, 1},
          {"--json", FlagType::kText, "",
           "also write every candidate's predicted, simulated and measured time, the kept\none and the fitted "
           "interference",
           "FILE"},
          ranks_flag(),
          sm_split_flag(),
      },
      ConfigWords::kPassedOn};
  return t;
}

const FlagTable& simulate_flags() {
  static const FlagTable t{
      "simulate",
      "usage: dhelix simulate --config C.toml --cluster PRESET [--gpus N] [--layout L] [--precision native|fp32|bf16]\n"
      "         [--compute-slowdown K] [--comm-slowdown K] [--trace FILE] [--json FILE] [--section.key value ...]\n"
      "Simulates one training step of the config's model, layout, batch and schedule (Strand\n"
      "Interleaving, its plan file, ZeRO-1) on a cluster preset, op by op with the executor's rules:\n"
      "step time, tokens/s, model FLOP/s per rank and its share of the preset's peak, exposed\n"
      "communication, the gradient tail, memory per rank; --trace writes the simulated step as a Chrome\n"
      "trace (ui.perfetto.dev). Any pipeline (schedule.pipeline, parallel.pp): the step runner's slots.\n",
      {
          {"--cluster", FlagType::kText, "",
           "cluster preset (cpu-emulated, perlmutter-a100, h100-8gpu, ...; looked up in\nsim.clusters_dir, else "
           "<exe>/../configs/clusters) or a .toml path",
           "PRESET", {}, {},
           Need::kRequired},
          {"--gpus", FlagType::kInt, "",
           "the layout's rank count, checked (default: the layout's); with --layout\nand no dp in it, dp = N / (the "
           "other axes)",
           "N", 1},
          {"--layout", FlagType::kText, "",
           "the layout, as `dhelix tune` prints it (\"tp=2 pp=2 dp=2\": keys tp pp dp cp ep,\nor x y z dp for a 3D "
           "grid; ep is carved out of dp); unnamed axes are 1. Replaces\nthe config's "
           "parallel.{tp,pp,dp,cp,ep,tp_x,tp_y,tp_z}",
           "L"},
          {"--precision", FlagType::kChoice, "native",
           "the preset's GEMM rate and element size; native (the default): the preset's\nown (bf16 where it has a bf16 rate, "
           "as every GPU preset), as `plan --cost-model`",
           "native|fp32|bf16"},
          compute_slowdown_flag(),
          comm_slowdown_flag(),
          {"--profile", FlagType::kText, "",
           "fit both slowdowns from a `dhelix profile` of this config's layer pair\n(its pairs timed alone and "
           "together; excludes the two flags above)",
           "FILE"},
          {"--profile-op-times", FlagType::kSwitch, "",
           "with --profile: the layer's compute ops at the profile's single-op times\n(the embedding's, the head's "
           "and every collective still from the preset)"},
          {"--measure-gemm", FlagType::kSwitch, "",
           "time every GEMM op's shape on this machine instead of the preset's rate\n(one core, shared as the "
           "preset's device.core_share says)"},
          {"--trace", FlagType::kText, "", "write the simulated step as a Chrome trace", "FILE"},
          {"--json", FlagType::kText, "", "also write the figures as JSON", "FILE"},
          {"--flops", FlagType::kChoice, "dhelix",
           "how model FLOPs (and MFU) are counted: dhelix 6N + 6LTd per token (causal\nattention once), megatron 6N + "
           "12LTd (Narayanan et al. 2021), axonn 8N_l + 6Vd +\n16LTd (Megatron's with the layers' forward twice: full "
           "recompute)",
           "dhelix|megatron|axonn"},
          {"--straggler", FlagType::kText, "",
           "RANK:FACTOR: that rank computes FACTOR (1..100) times slower (\"what if one GPU\nis 10% slow\": 5:1.1); "
           "its stage's collectives wait for it",
           "R:F"},
          {"--moe-imbalance", FlagType::kNumber, "1",
           "MoE with ep > 1: the busiest ep rank's routed rows over the mean (1..ep; the\ntrainer's "
           "\"busiest/mean\" per expert bounds it): its expert GEMMs and row\nall-to-alls take that much longer and "
           "pace its ep group",
           "F"},
          {"--allow-oom", FlagType::kSwitch, "",
           "print the step of a layout that needs more memory per rank than the\npreset's device has (otherwise "
           "exit 2 with the figures, as `tune` excludes it)"},
      },
      ConfigWords::kPassedOn};
  return t;
}

}  // namespace dhelix
