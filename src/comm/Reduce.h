// Element-wise reductions over raw buffers, for the local backend and the MPI bf16 user ops.
// bf16 is reduced in f32 and stored as bf16. Not here: any communication.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/ProcessGroup.h"
#include "tensor/Tensor.h"

namespace dhelix {

// dst[i] = srcs[0][i] op srcs[1][i] op ... for i < n, folded in srcs order (so every rank that
// folds the same sources gets bitwise the same result). bf16: one rounding at the end.
void reduce_buffers(const std::vector<const void*>& srcs, void* dst, int64_t n, DType dtype, ReduceOp op);

// inout[i] = in[i] op inout[i] for n elements of dtype (bf16: in f32, rounded once).
void combine_into(const void* in, void* inout, int64_t n, DType dtype, ReduceOp op);

// inout[i] = in[i] op inout[i] on bf16 values, computed in f32 and rounded to bf16 (MPI user op body).
void bf16_combine(const uint16_t* in, uint16_t* inout, int64_t n, ReduceOp op);

}  // namespace dhelix
