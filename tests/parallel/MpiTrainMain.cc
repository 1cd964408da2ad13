// Parallel equals serial over real Open MPI processes (the threads-as-ranks tests cover the other
// layouts): launched as `mpirun -np 4 dhelix_parallel_mpi_test DIR` (dp 2 x tp 2). Every rank
// trains both model families for 20 steps (plain dp, then ZeRO-1); rank 0 then trains the
// single-process reference on the same data and compares. Oracle and tolerances: ParallelHarness.h.
// Exit 0 when every check holds; 1 (from rank 0) otherwise.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "ParallelHarness.h"
#include "comm/MpiBackend.h"

namespace dhelix::testing {
namespace {

// The world of 4 ranks for `layout` (named `what` in the error), with the dataset written by
// rank 0 into `dir` (emptied first); returns once every rank can read it.
std::unique_ptr<CommContext> world_with_data(const LayoutConfig& layout, const char* what, const std::string& dir) {
  const int world = mpi_world_size();
  DHX_CHECK(world == 4, ConfigError, "run under mpirun -np 4 ({}), got {} ranks", what, world);
  std::unique_ptr<CommContext> comm = make_mpi_world(layout);
  if (comm->rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    write_walk_dataset(dir);
  }
  comm->world().barrier();
  return comm;
}

// `mpirun -np 4 dhelix_parallel_mpi_test DIR 3d`: the 3D grid Gx = 2 x Gz = 2 over real processes
// (Gloo collectives on x, z and the x-y-z block), both families, against the single-process run.
int run_3d(const std::string& dir) {
  LayoutConfig layout;
  layout.tp_x = 2, layout.tp_z = 2;
  std::unique_ptr<CommContext> comm = world_with_data(layout, "tp_x 2 x tp_z 2", dir);
  const bool rank0 = comm->rank() == 0;
  const std::string prefix = dir + "/walk";
  int failures = 0;
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {
    RunResult par = run_on(tiny_config_3d(f, 1, 2, 1, 2, prefix, dir + "/par"), comm.get(), Grads::kCollect);
    if (!rank0) continue;
    RunResult serial = run_serial(tiny_config_3d(f, 1, 1, 1, 1, prefix, dir + "/serial"), Grads::kCollect);
    std::string worst;
    const double grad_dev = max_grad_deviation(par.first_grads, serial.first_grads, &worst);
    const double loss_dev = max_rel_deviation(par.losses, serial.losses);
    const bool ok = grad_dev <= kGradRelTol && loss_dev <= kLossRelTol && par.first_grads.size() == serial.first_grads.size();
    failures += !ok;
    fmt::print("{} mpi 3D Gx=2 Gz=2 {}: grad max rel dev {:.2e} ({}; tol {:.0e}), 20-step loss max rel dev {:.2e} "
               "(tol {:.0e}); loss {:.4f} -> {:.4f}\n",
               ok ? "PASS" : "FAIL", family_name(f), grad_dev, worst, kGradRelTol, loss_dev, kLossRelTol,
               serial.losses.front(), serial.losses.back());
  }
  std::fflush(stdout);
  comm->world().barrier();
  return failures == 0 ? 0 : 1;
}

int run(const std::string& dir) {
  LayoutConfig layout;
  layout.dp = 2, layout.tp = 2, layout.sequence_parallel = true;
  std::unique_ptr<CommContext> comm = world_with_data(layout, "dp 2 x tp 2", dir);
  const bool rank0 = comm->rank() == 0;
  const std::string prefix = dir + "/walk";
  int failures = 0;
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {
    RunResult par = run_on(tiny_config(f, 2, 2, 0, prefix, dir + "/par"), comm.get(), Grads::kCollect);
    RunResult zero = run_on(tiny_config(f, 2, 2, 1, prefix, dir + "/zero"), comm.get(), Grads::kSkip);
    if (!rank0) continue;
    RunResult serial = run_serial(tiny_config(f, 1, 1, 0, prefix, dir + "/serial"), Grads::kCollect);
    std::string worst;
    const double grad_dev = max_grad_deviation(par.first_grads, serial.first_grads, &worst);
    const double loss_dev = max_rel_deviation(par.losses, serial.losses);
    const double zero_dev = max_rel_deviation(zero.losses, par.losses);
    const bool ok = grad_dev <= kGradRelTol && loss_dev <= kLossRelTol && zero.losses == par.losses &&
                    par.first_grads.size() == serial.first_grads.size();
    failures += !ok;
    fmt::print("{} mpi dp=2 tp=2 {}: grad max rel dev {:.2e} ({}; tol {:.0e}), 20-step loss max rel dev {:.2e} "
               "(tol {:.0e}), ZeRO-1 vs plain {:.2e} (must be bitwise); loss {:.4f} -> {:.4f}\n",
               ok ? "PASS" : "FAIL", family_name(f), grad_dev, worst, kGradRelTol, loss_dev, kLossRelTol, zero_dev, serial.losses.front(), serial.losses.back());
  }
  std::fflush(stdout);
  comm->world().barrier();
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dhelix::testing

int main(int argc, char** argv) {
  if (argc != 2 && !(argc == 3 && std::string(argv[2]) == "3d")) {
    std::fputs("usage: mpirun -np 4 dhelix_parallel_mpi_test DIR [3d]\n", stderr);
    return 2;
  }
  try {
    return argc == 3 ? dhelix::testing::run_3d(argv[1]) : dhelix::testing::run(argv[1]);
  } catch (const std::exception& e) {
    dhelix::abort_world(e.what());
  }
}
