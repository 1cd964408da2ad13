// The Open MPI backend: make_mpi_world initialises MPI with MPI_THREAD_MULTIPLE, checks the layout
// against the world size, splits one communicator per group (collectively, once) and gives each
// group a comm thread. No MPI types leak out of this header; MpiBackend.cc holds them all.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/CommContext.h"

namespace dhelix {

// Collective over MPI_COMM_WORLD. Throws ConfigError listing every mismatch when the layout does
// not fit the world, CommError when MPI lacks MPI_THREAD_MULTIPLE. MPI is finalised when the
// returned context is destroyed, if this call initialised it.
std::unique_ptr<CommContext> make_mpi_world(const LayoutConfig& layout, const CommOptions& options = {});

// Whether this process was started by mpirun (Open MPI's or PMIx's rank variables are set).
bool launched_by_mpirun();

// Size of MPI_COMM_WORLD (initialising MPI if needed), for choosing a layout before make_mpi_world.
int mpi_world_size();

// Every world rank's `value`, in rank order (initialising MPI if needed; a blocking all-gather on
// MPI_COMM_WORLD, for agreeing on start-up before any group exists).
std::vector<int64_t> mpi_world_allgather(int64_t value);

// Finalises MPI when dhelix initialised it and no world from make_mpi_world is alive (a start-up
// that ends before the world is made); a no-op otherwise. Every rank must call it.
void mpi_finalize_early();

}  // namespace dhelix
