// The trainer's pre-start token check (train/Preflight.h check_tokens) on datasets of every integer
// dtype the MMIDIDX format allows, each made here with one id outside [0, vocab) written at its
// stored width. Oracle: the position and value written -- the check must name exactly them. Before
// this check read ids at their stored width, an i64 id of 2^32 + 5 was narrowed to 5 and trained as
// that id, and a negative id passed (only the largest id was compared with the vocabulary).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "TinyRun.h"
#include "base/Error.h"
#include "comm/LocalBackend.h"
#include "tensor/DeviceMemory.h"
#include "train/IndexedDataset.h"
#include "train/Preflight.h"

namespace dhelix {
namespace {

using testing::TempDir;

constexpr int64_t kVocab = 100;
constexpr int64_t kBadAt = 57;  // token 57: the second sequence (40 tokens each)

// Three sequences of 40 ids in [0, kVocab) in `dtype`.
void write_valid(const std::string& prefix, IndexDType dtype) {
  IndexedDatasetWriter w(prefix, dtype);
  for (int d = 0; d < 3; ++d) {
    std::vector<int32_t> t(40);
    for (int i = 0; i < 40; ++i) t[i] = (d * 7 + i * 3) % static_cast<int32_t>(kVocab);
    w.add_document(t);
  }
  w.finish();
}

// Overwrites token `at` of the .bin with `value`, little-endian at the dtype's width.
void patch(const std::string& prefix, IndexDType dtype, int64_t at, int64_t value) {
  const size_t item = index_dtype_size(dtype);
  std::fstream f(prefix + ".bin", std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good());
  f.seekp(static_cast<std::streamoff>(at * static_cast<int64_t>(item)));
  char bytes[8];
  std::memcpy(bytes, &value, 8);  // the low `item` bytes of a little-endian int64 are its value at that width
  f.write(bytes, static_cast<std::streamsize>(item));
}

RunConfig config_for(const std::string& dir, const std::string& prefix) {
  RunConfig c = testing::tiny_config(dir, "llama");
  c.model.vocab_size = kVocab;
  c.data.prefix = prefix;
  c.training.sample_tokens = 0;
  return c;
}

struct Case {
  IndexDType dtype;
  int64_t value;
};

TEST(Preflight, TokenIdsAreCheckedAtTheirStoredWidthBothEnds) {
  const Case cases[] = {{IndexDType::kU8, 100},          {IndexDType::kU8, 255},
                        {IndexDType::kI8, -1},           {IndexDType::kI8, -128},
                        {IndexDType::kI16, -2},          {IndexDType::kI16, 100},
                        {IndexDType::kU16, 65535},       {IndexDType::kI32, INT32_MIN},
                        {IndexDType::kI32, 100},         {IndexDType::kI64, (int64_t{1} << 32) + 5},
                        {IndexDType::kI64, -1},          {IndexDType::kI64, INT64_MAX}};
  for (const Case& k : cases) {
    TempDir dir;
    const std::string prefix = dir.path() + "/d", what = std::string(index_dtype_name(k.dtype)) + " " +
                                                             std::to_string(k.value);
    write_valid(prefix, k.dtype);
    const RunConfig cfg = config_for(dir.path(), prefix);
    {
      IndexedDataset ok(prefix);
      EXPECT_NO_THROW(check_tokens(cfg, ok)) << what;
    }
    patch(prefix, k.dtype, kBadAt, k.value);
    IndexedDataset data(prefix);
    try {
      check_tokens(cfg, data);
      ADD_FAILURE() << what << ": accepted";
    } catch (const ConfigError& e) {
      const std::string msg = e.what(), want = "holds token id " + std::to_string(k.value) + " at token " +
                                               std::to_string(kBadAt) + " (sequence 1, stored as " +
                                               index_dtype_name(k.dtype) + "), outside [0, model.vocab_size=100)";
      EXPECT_NE(msg.find(want), std::string::npos) << what << ": " << msg;
    }
  }
}

// Why the width matters: the int32 reader wraps 2^32 + 5 to 5, an id inside the vocabulary, which
// the old largest-id check could not tell from a real 5.
TEST(Preflight, TheInt32ReaderWouldWrapAnI64IdIntoTheVocabulary) {
  TempDir dir;
  const std::string prefix = dir.path() + "/d";
  write_valid(prefix, IndexDType::kI64);
  patch(prefix, IndexDType::kI64, kBadAt, (int64_t{1} << 32) + 5);
  IndexedDataset data(prefix);
  int32_t t = -1;
  data.read_tokens(kBadAt, 1, &t);
  EXPECT_EQ(t, 5);
  const auto bad = data.first_id_outside(0, kVocab);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->position, kBadAt);
  EXPECT_EQ(bad->sequence, 1);
  EXPECT_EQ(bad->value, (int64_t{1} << 32) + 5);
}

// The writer stores every integer dtype and refuses an id its dtype cannot hold.
TEST(Preflight, WriterRefusesAnIdItsDtypeCannotHold) {
  TempDir dir;
  IndexedDatasetWriter w(dir.path() + "/u8", IndexDType::kU8);
  const std::vector<int32_t> big = {1, 256};
  EXPECT_THROW(w.add_document(big), InternalError);
  IndexedDatasetWriter i8(dir.path() + "/i8", IndexDType::kI8);
  const std::vector<int32_t> low = {-129};
  EXPECT_THROW(i8.add_document(low), InternalError);
}

// rank_device: where a rank runs (the trainer's and `dhelix profile` / `plan`'s placement). Oracle:
// its contract in train/Preflight.h -- training.device for every rank, except under NCCL with more
// than one rank, where rank i of the host takes the named GPU plus i, and a GPU that is not there is
// a ConfigError naming the rank, the GPU and the staged transport. Ranks are threads here (the local
// backend: the world rank is the local rank); under mpirun the launcher's local rank would decide.
TEST(Preflight, RankDeviceIsTheNamedOneButAGpuPerRankUnderNccl) {
  ASSERT_EQ(std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"), nullptr) << "run this test outside mpirun";
  RunConfig cfg;
  cfg.training.device = "cpu";
  cfg.comm.gpu_transport = "nccl";  // ignored on the host
  EXPECT_TRUE(rank_device(cfg, nullptr).is_host());
  cfg.training.device = "cuda:0";
  EXPECT_EQ(rank_device(cfg, nullptr).str(), "cuda:0");  // one rank: the named GPU, nothing checked
  const bool second_gpu = device_unavailable(Device::cuda(1)).empty();
  for (const char* transport : {"staged", "nccl"}) {
    cfg.comm.gpu_transport = transport;
    std::string got[2], err[2];
    run_local_ranks(2, [&](CommContext& comm) {
      try {
        got[comm.rank()] = rank_device(cfg, &comm).str();
      } catch (const ConfigError& e) {
        err[comm.rank()] = e.what();
      }
    });
    if (std::string(transport) == "staged") {  // ranks sharing the named GPU
      EXPECT_EQ(got[0], "cuda:0");
      EXPECT_EQ(got[1], "cuda:0");
      continue;
    }
    if (second_gpu) {
      EXPECT_EQ(got[1], "cuda:1");
    } else {  // this machine has fewer than two GPUs: rank 1's is not there
      EXPECT_TRUE(got[1].empty());
      EXPECT_NE(err[1].find("local rank 1 would take cuda:1"), std::string::npos) << err[1];
      EXPECT_NE(err[1].find("comm.gpu_transport=staged"), std::string::npos) << err[1];
    }
  }
}

}  // namespace
}  // namespace dhelix
