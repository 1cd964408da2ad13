// Token (+ position) embedding on the GPU (kernels/cuda/Ops.h) against cpu::embedding_fwd/bwd<float>
// on the same bf16-rounded tables and gradients. Outputs poisoned; accumulated gradients start from
// random values. Token sets with many repeats (V = 5, 7) exercise the backward's runs.
//
// Bounds, all exact: the forward's output is a bitwise copy of a wte row, or the CPU's fp32 sum
// wte + wpe rounded to nearest even once (to_bf16's rule). The backward adds the same fp32 values
// (bf16 dy widened exactly) in the CPU's order, bt ascending from the old value, so dwte and dwpe
// must equal the CPU's bit for bit (and hence be the same run to run).
#include <algorithm>
#include <cstring>

#include "CudaTest.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cuda/Ops.h"

namespace dhelix::cuda::test {
namespace {

struct Shape { int64_t B, T, C, V, pos; };
// The last: three tokens over 100 rows (runs of ~33: the backward's 8-row loads and their tails)
// and C = 200 (two 128-column slices, the second ragged).
const Shape kShapes[] = {{1, 1, 8, 5, 0},   {2, 7, 13, 11, 3},      {4, 64, 768, 1000, 0}, {3, 33, 64, 7, 5},
                         {2, 300, 40, 50257, 1}, {2, 50, 200, 3, 0}};

template <typename T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(CudaOpsEmbedding, ForwardEqualsCpuRoundedOnce) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 1;
  for (const Shape& d : kShapes) {
    const int64_t BT = d.B * d.T, maxT = d.pos + d.T + 2;
    const auto tokens = randint(BT, seed++, static_cast<int32_t>(d.V));
    const auto wte = round_bf16(randn(d.V * d.C, seed++)), wpe = round_bf16(randn(maxT * d.C, seed++, 0.1f));
    DevBuf<int32_t> gtok(tokens);
    DevBuf<bf16> gwte(to_bf16(wte)), gwpe(to_bf16(wpe)), gy(BT * d.C);
    for (bool with_wpe : {true, false}) {
      std::vector<float> y(BT * d.C);
      cpu::embedding_fwd<float>(tokens.data(), wte.data(), with_wpe ? wpe.data() : nullptr, y.data(), d.B, d.T, d.C,
                                d.pos);
      gy.poison();
      embedding_fwd(gtok.get(), gwte.get(), with_wpe ? gwpe.get() : nullptr, gy.get(), d.B, d.T, d.C, d.V, d.pos,
                    nullptr);
      EXPECT_TRUE(same_bits(gy.download(), to_bf16(y)))
          << "B=" << d.B << " T=" << d.T << " C=" << d.C << " V=" << d.V << " wpe=" << with_wpe;
    }
  }
}

TEST(CudaOpsEmbedding, BackwardEqualsCpuBitwiseAndIsDeterministic) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const Shape& d : kShapes) {
    const int64_t BT = d.B * d.T, maxT = d.pos + d.T + 2;
    const auto tokens = randint(BT, seed++, static_cast<int32_t>(d.V));
    const auto dy = round_bf16(randn(BT * d.C, seed++));
    const auto dwte0 = randn(d.V * d.C, seed++), dwpe0 = randn(maxT * d.C, seed++);  // accumulated into
    std::vector<float> dwte = dwte0, dwpe = dwpe0;
    cpu::embedding_bwd<float>(tokens.data(), dy.data(), dwte.data(), dwpe.data(), d.B, d.T, d.C, d.pos);
    DevBuf<int32_t> gtok(tokens);
    DevBuf<bf16> gdy(to_bf16(dy));
    DevBuf<float> gdwte(dwte0.size()), gdwpe(dwpe0.size());
    for (int rep = 0; rep < 2; ++rep) {  // twice: the same bits, the CPU's
      gdwte.upload(dwte0), gdwpe.upload(dwpe0);
      embedding_bwd(gtok.get(), gdy.get(), gdwte.get(), gdwpe.get(), d.B, d.T, d.C, d.V, d.pos, nullptr);
      EXPECT_TRUE(same_bits(gdwte.download(), dwte)) << "dwte rep " << rep << " B=" << d.B << " T=" << d.T
                                                      << " C=" << d.C << " V=" << d.V;
      EXPECT_TRUE(same_bits(gdwpe.download(), dwpe)) << "dwpe rep " << rep << " B=" << d.B << " T=" << d.T
                                                      << " C=" << d.C;
    }
  }
}

// A token outside [0, V) cannot throw on the device: its forward row is NaN and its backward row
// adds nothing (the other tokens' sums are the CPU's on the valid positions, bitwise).
TEST(CudaOpsEmbedding, OutOfRangeTokensGiveNanRowsAndNoGradient) {
  DHX_REQUIRE_GPU();
  const int64_t B = 2, T = 6, C = 16, V = 9;
  auto tokens = randint(B * T, 7, static_cast<int32_t>(V));
  tokens[2] = -1, tokens[7] = static_cast<int32_t>(V);
  const auto wte = round_bf16(randn(V * C, 8));
  auto dy = round_bf16(randn(B * T * C, 9));
  DevBuf<int32_t> gtok(tokens);
  DevBuf<bf16> gwte(to_bf16(wte)), gy(B * T * C), gdy(to_bf16(dy));
  gy.poison();
  embedding_fwd(gtok.get(), gwte.get(), nullptr, gy.get(), B, T, C, V, 0, nullptr);
  const auto y = to_f32(gy.download());
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t c = 0; c < C; ++c) {
      const bool bad = bt == 2 || bt == 7;
      if (bad) {
        EXPECT_TRUE(std::isnan(y[bt * C + c])) << "bt=" << bt << " c=" << c;
      } else {
        EXPECT_EQ(y[bt * C + c], wte[tokens[bt] * C + c]) << "bt=" << bt << " c=" << c;
      }
    }
  // The oracle: the bad positions' dy rows zeroed and their tokens set to 0 (adding +0 keeps bits).
  const auto dwte0 = randn(V * C, 10);
  std::vector<float> dwte = dwte0;
  auto ok_tokens = tokens;
  for (int64_t bt : {2, 7}) {
    ok_tokens[bt] = 0;
    for (int64_t c = 0; c < C; ++c) dy[bt * C + c] = 0.0f;
  }
  cpu::embedding_bwd<float>(ok_tokens.data(), dy.data(), dwte.data(), nullptr, B, T, C, 0);
  DevBuf<float> gdwte(dwte0);
  embedding_bwd(gtok.get(), gdy.get(), gdwte.get(), nullptr, B, T, C, V, 0, nullptr);
  EXPECT_TRUE(same_bits(gdwte.download(), dwte));
  EXPECT_THROW(embedding_fwd(gtok.get(), gwte.get(), nullptr, gy.get(), B, T, C, 0, 0, nullptr), InternalError);
  EXPECT_THROW(embedding_bwd(gtok.get(), gdy.get(), gdwte.get(), nullptr, B, -T, C, V, 0, nullptr), InternalError);
}

// Megatron's vocabulary-parallel embedding (tp > 1). Oracle: the CPU's op_embed / op_embed_bwd
// semantics written out here -- rank r's table holds rows [r Vl, (r + 1) Vl) of the padded
// vocabulary; its output row is a bitwise copy of the row for the tokens it holds and zeros for the
// others; its gradient adds the bf16 dy row (widened exactly) to row token - v0 in n order from the
// old value. Exact, so bitwise. The shards' outputs summed (fp32, as the tp reduce does) give the
// whole table's rows: checked too. Shapes: 3 ranks over a vocabulary of 50 (the last shard ragged:
// ids 34..49 real, a padding row past them), C = 8, 13 (unaligned: the scalar path) and 768.
TEST(CudaOpsEmbedding, VocabularyShardsGiveTheirRowsAndZerosAndAddTheirGradients) {
  DHX_REQUIRE_GPU();
  const int64_t V = 50, ranks = 3, Vl = 17, N = 97;
  uint64_t seed = 300;
  for (int64_t C : {8, 13, 768}) {
    auto tokens = randint(N, seed++, static_cast<int32_t>(V));
    tokens[5] = tokens[6] = tokens[40];  // a run of one token in every shard's sort
    const auto table = round_bf16(randn(ranks * Vl * C, seed++));
    const auto dy = round_bf16(randn(N * C, seed++));
    DevBuf<int32_t> gtok(tokens);
    DevBuf<bf16> gdy(to_bf16(dy)), gy(N * C);
    std::vector<float> sum(N * C, 0.0f);
    for (int64_t r = 0; r < ranks; ++r) {
      const int64_t v0 = r * Vl;
      const std::vector<float> shard(table.begin() + v0 * C, table.begin() + (v0 + Vl) * C);
      DevBuf<bf16> gw(to_bf16(shard));
      gy.poison();
      embedding_shard_fwd(gtok.get(), gw.get(), gy.get(), N, C, Vl, v0, nullptr);
      const auto y = to_f32(gy.download());
      std::vector<float> want(N * C, 0.0f);
      for (int64_t n = 0; n < N; ++n)
        if (tokens[n] >= v0 && tokens[n] < v0 + Vl)
          std::copy_n(shard.begin() + (tokens[n] - v0) * C, C, want.begin() + n * C);
      EXPECT_TRUE(same_bits(y, want)) << "C=" << C << " rank " << r;
      for (int64_t i = 0; i < N * C; ++i) sum[i] += y[i];
      const auto g0 = randn(Vl * C, seed++);  // accumulated into
      std::vector<float> g = g0;
      for (int64_t n = 0; n < N; ++n)
        if (tokens[n] >= v0 && tokens[n] < v0 + Vl)
          for (int64_t c = 0; c < C; ++c) g[(tokens[n] - v0) * C + c] += dy[n * C + c];
      DevBuf<float> gg(g0);
      embedding_shard_bwd(gtok.get(), gdy.get(), gg.get(), N, C, Vl, v0, nullptr);
      EXPECT_TRUE(same_bits(gg.download(), g)) << "C=" << C << " rank " << r;
    }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c)
        ASSERT_EQ(sum[n * C + c], table[tokens[n] * C + c]) << "C=" << C << " n=" << n << " c=" << c;
  }
}

// Learned positions on a sequence shard (sequence parallelism: this rank holds rows [row0, row0 +
// rows) of the micro-batch's B*T). Oracle: the CPU's op_pos_embed / op_pos_embed_bwd written out:
// y[i] = to_bf16(e[i] + wpe[(row0 + i) mod T]) (fp32 sum rounded once: exact rule), dwpe[t] += dy[i]
// over i ascending from the old value (the same fp32 adds in the same order): bitwise. Shapes: a
// shard shorter than T starting mid-sequence and wrapping (rows 5 from row 3 of T = 7), whole
// sequences (64 rows from 64, T = 32), a shard spanning parts of three sequences (20 from 12, T =
// 8), unaligned C = 13 and C = 64; in place (y = e) once.
TEST(CudaOpsEmbedding, PositionsOnASequenceShardEqualTheCpuBitwise) {
  DHX_REQUIRE_GPU();
  struct P { int64_t rows, T, row0, C; };
  uint64_t seed = 400;
  for (const P& d : {P{5, 7, 3, 13}, P{64, 32, 64, 64}, P{20, 8, 12, 13}, P{20, 8, 12, 64}}) {
    const auto e = round_bf16(randn(d.rows * d.C, seed++));
    const auto wpe = round_bf16(randn(d.T * d.C, seed++, 0.1f));
    const auto dy = round_bf16(randn(d.rows * d.C, seed++));
    const auto g0 = randn(d.T * d.C, seed++);
    std::vector<float> want(d.rows * d.C), g = g0;
    for (int64_t i = 0; i < d.rows; ++i)
      for (int64_t c = 0; c < d.C; ++c) {
        const int64_t t = (d.row0 + i) % d.T;
        want[i * d.C + c] = e[i * d.C + c] + wpe[t * d.C + c];
        g[t * d.C + c] += dy[i * d.C + c];
      }
    DevBuf<bf16> ge(to_bf16(e)), gw(to_bf16(wpe)), gy(d.rows * d.C), gdy(to_bf16(dy));
    gy.poison();
    position_add(ge.get(), gw.get(), gy.get(), d.rows, d.C, d.T, d.row0, nullptr);
    EXPECT_TRUE(same_bits(gy.download(), to_bf16(want))) << "rows=" << d.rows << " T=" << d.T << " row0=" << d.row0;
    position_add(ge.get(), gw.get(), ge.get(), d.rows, d.C, d.T, d.row0, nullptr);  // in place
    EXPECT_TRUE(same_bits(ge.download(), to_bf16(want))) << "in place, rows=" << d.rows;
    DevBuf<float> gg(g0);
    position_grad(gdy.get(), gg.get(), d.rows, d.C, d.T, d.row0, nullptr);
    EXPECT_TRUE(same_bits(gg.download(), g)) << "rows=" << d.rows << " T=" << d.T << " row0=" << d.row0;
  }
  DevBuf<bf16> b(8);
  DevBuf<float> f(8);
  EXPECT_THROW(position_add(b.get(), b.get(), b.get(), 1, 8, 0, 0, nullptr), InternalError);
  EXPECT_THROW(position_grad(b.get(), f.get(), 1, 8, 1, -1, nullptr), InternalError);
}

}  // namespace
}  // namespace dhelix::cuda::test
