// Checkpoint IO tests. Oracles: bitwise equality after a safetensors round trip (NaN payloads and
// bf16 included); the header bytes decoded by hand; each kind of corruption rejected with the
// tensor's name; an interrupted save (a leftover .tmp-<pid> directory) leaves `latest` on the
// previous good checkpoint; the shape-mismatch message quoted in the design.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/Checksum.h"
#include "base/Error.h"
#include "base/Files.h"
#include "train/CheckpointStore.h"
#include "train/Safetensors.h"
#include "TempDir.h"

namespace dhelix {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

NamedTensors sample_tensors() {
  Tensor w = Tensor::empty({3, 4}, DType::kF32);
  for (int i = 0; i < 12; ++i) w.f32()[i] = 0.1f * static_cast<float>(i) - 0.55f;
  uint32_t nan_bits = 0x7fc01234u;  // a NaN with a payload must survive bitwise
  std::memcpy(&w.f32()[5], &nan_bits, 4);
  Tensor h = Tensor::empty({5}, DType::kBF16);
  for (int i = 0; i < 5; ++i) h.data<uint16_t>()[i] = f32_to_bf16(static_cast<float>(i) * 1.5f);
  Tensor ids = Tensor::empty({2, 2}, DType::kI32);
  for (int i = 0; i < 4; ++i) ids.data<int32_t>()[i] = -7 + 1000 * i;
  Tensor big = Tensor::empty({1}, DType::kI64);
  big.data<int64_t>()[0] = std::numeric_limits<int64_t>::min();
  Tensor empty = Tensor::empty({0, 3}, DType::kF32);
  return {{"model.layers.0.attn.w", w}, {"norm.bf16", h}, {"ids", ids}, {"counter", big}, {"empty", empty}};
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::string io_error(const std::string& path) {
  try {
    read_safetensors(path);
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

// Rewrites a file's header (keeping its data), for corruption tests.
void rewrite_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  std::string f = read_file(path);
  uint64_t n;
  std::memcpy(&n, f.data(), 8);
  nlohmann::json h = nlohmann::json::parse(f.substr(8, n));
  edit(h);
  std::string text = h.dump();
  uint64_t m = text.size();
  std::string out(reinterpret_cast<const char*>(&m), 8);
  write_file_atomic(path, out + text + f.substr(8 + n));
}

TEST(Safetensors, RoundTripIsBitwiseAndHeaderIsAsSpecified) {
  TempDir tmp;
  const std::string p = tmp / "a.safetensors";
  NamedTensors in = sample_tensors();
  write_safetensors(p, in, {{"step", "12"}});
  std::string raw = read_file(p);
  uint64_t n;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  nlohmann::json h = nlohmann::json::parse(raw.substr(8, n));
  EXPECT_EQ(h["__metadata__"]["step"], "12");
  EXPECT_EQ(h["model.layers.0.attn.w"]["dtype"], "F32");
  EXPECT_EQ(h["model.layers.0.attn.w"]["data_offsets"], nlohmann::json({0, 48}));
  EXPECT_EQ(h["norm.bf16"]["data_offsets"], nlohmann::json({48, 58}));
  EXPECT_EQ(h["norm.bf16"]["dtype"], "BF16");
  EXPECT_EQ(raw.size(), 8 + n + 48 + 10 + 16 + 8 + 0);

  SafetensorsFile out = read_safetensors(p);
  ASSERT_EQ(out.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out.tensors[i].first, in[i].first);
    EXPECT_TRUE(bitwise_equal(out.tensors[i].second, in[i].second)) << in[i].first;
  }
  EXPECT_EQ(out.metadata.at("step"), "12");
  ASSERT_NE(out.find("ids"), nullptr);
}

TEST(Safetensors, CorruptFilesAreRejectedNamingTheTensor) {
  TempDir tmp;
  const std::string p = tmp / "a.safetensors";
  auto fresh = [&] { write_safetensors(p, sample_tensors()); };

  fresh();
  std::string raw = read_file(p);
  uint64_t huge = raw.size();
  std::memcpy(raw.data(), &huge, 8);
  write_file_atomic(p, raw);
  EXPECT_NE(io_error(p).find("header length"), std::string::npos) << io_error(p);

  fresh();
  raw = read_file(p);
  raw[8] = '#';  // the header's opening brace
  write_file_atomic(p, raw);
  EXPECT_NE(io_error(p).find("not valid JSON"), std::string::npos) << io_error(p);

  fresh();
  rewrite_header(p, [](nlohmann::json& h) { h["ids"]["shape"] = {3, 2}; });
  EXPECT_NE(io_error(p).find("tensor 'ids' is I32 [3,2] = 24 bytes but its data_offsets span 16"), std::string::npos)
      << io_error(p);

  fresh();
  rewrite_header(p, [](nlohmann::json& h) { h["counter"]["data_offsets"] = {74, 9000}; });
  EXPECT_NE(io_error(p).find("tensor 'counter' has data_offsets [74, 9000] outside"), std::string::npos) << io_error(p);

  fresh();
  rewrite_header(p, [](nlohmann::json& h) { h["norm.bf16"]["dtype"] = "F8_E4M3"; });
  EXPECT_NE(io_error(p).find("tensor 'norm.bf16' has unsupported dtype"), std::string::npos) << io_error(p);

  fresh();
  rewrite_header(p, [](nlohmann::json& h) { h["ids"]["data_offsets"] = {50, 66}; });  // overlaps norm.bf16
  EXPECT_NE(io_error(p).find("overlaps"), std::string::npos) << io_error(p);

  fresh();
  fs::resize_file(p, fs::file_size(p) - 4);
  EXPECT_NE(io_error(p).find("tensor 'counter'"), std::string::npos) << io_error(p);
  EXPECT_THROW(read_safetensors(tmp / "missing.safetensors"), IoError);
}

// Oracle: CRC-32C of the bytes written (base/Checksum.h, checked against its standard vectors):
// every tensor's checksum is in the metadata as written; one flipped bit in any tensor's data is
// caught naming that tensor; a checksum naming a tensor the file lacks is refused; a file without
// checksums (another writer) still loads.
TEST(Safetensors, ChecksumsCatchAFlippedDataByte) {
  TempDir tmp;
  const std::string p = tmp / "a.safetensors";
  NamedTensors in = sample_tensors();
  write_safetensors(p, in);
  SafetensorsFile ok = read_safetensors(p);
  EXPECT_EQ(ok.checksummed, in.size());
  EXPECT_TRUE(ok.metadata.empty());  // checksum entries are not user metadata
  const std::string clean = read_file(p);
  uint64_t n;
  std::memcpy(&n, clean.data(), 8);
  nlohmann::json h = nlohmann::json::parse(clean.substr(8, n));
  for (const auto& [name, t] : in) {
    EXPECT_EQ(h["__metadata__"]["crc32c:" + name], crc32c_hex(crc32c(t.raw(), t.nbytes()))) << name;
    const auto offs = h[name]["data_offsets"].get<std::vector<uint64_t>>();
    if (offs[1] == offs[0]) continue;  // an empty tensor has no byte to flip
    std::string raw = clean;
    raw[8 + n + offs[0] + (offs[1] - offs[0]) / 2] ^= 0x10;
    write_file_atomic(p, raw);
    const std::string e = io_error(p);
    EXPECT_NE(e.find("tensor '" + name + "' fails its checksum"), std::string::npos) << e;
  }
  write_file_atomic(p, clean);
  rewrite_header(p, [](nlohmann::json& j) { j["__metadata__"]["crc32c:ghost"] = "00000000"; });
  EXPECT_NE(io_error(p).find("checksum for tensor 'ghost'"), std::string::npos) << io_error(p);
  rewrite_header(p, [](nlohmann::json& j) { j.erase("__metadata__"); });
  EXPECT_EQ(read_safetensors(p).checksummed, 0u);
}

TrainState state_at(int64_t step) {
  TrainState s;
  s.step = step;
  s.rng = {{"seed", 1}, {"counter", step * 10}};
  s.data_loader = {{"epoch", 0}, {"position", step}};
  s.config_toml = "[training]\nsteps = 10\n";
  return s;
}

// Oracle: the directory listing. A step directory without state.json (an interrupted prune of an
// older build) and .tmp-/.del- leftovers of a dead process are removed; complete checkpoints and
// a live process's (this one's) leftovers are kept; pruning after it counts complete ones only.
TEST(CheckpointStore, CleanRemovesWhatCrashesLeft) {
  TempDir tmp;
  const std::string d = tmp / "ckpt";
  CheckpointStore store(d, 2);
  store.save(state_at(1), sample_tensors(), {});
  store.save(state_at(2), sample_tensors(), {});
  fs::create_directories(d + "/step_00000000");
  write_file_atomic(d + "/step_00000000/model.safetensors", "partial");
  const std::string dead = "999999";  // no such process on a test machine
  fs::create_directories(d + "/step_00000001.del-" + dead);
  fs::create_directories(d + "/step_00000005.tmp-" + dead);
  const std::string mine = d + "/step_00000006.tmp-" + std::to_string(::getpid());
  fs::create_directories(mine);
  std::vector<std::string> removed = store.clean();
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{"step_00000000", "step_00000001.del-" + dead, "step_00000005.tmp-" + dead}));
  EXPECT_TRUE(fs::exists(mine));
  EXPECT_EQ(store.steps(), (std::vector<int64_t>{1, 2}));
  store.save(state_at(3), sample_tensors(), {});
  EXPECT_EQ(store.steps(), (std::vector<int64_t>{2, 3}));
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_EQ(e.path().filename().string().find(".del-"), std::string::npos) << e.path();
}

TEST(CheckpointStore, SaveLoadLatestAndRetention) {
  TempDir tmp;
  CheckpointStore store(tmp / "ckpt", 2);
  EXPECT_FALSE(store.latest());
  EXPECT_FALSE(store.resolve("latest"));
  EXPECT_FALSE(store.resolve(""));
  NamedTensors model = sample_tensors(), opt = {{"adam.m.w", Tensor::zeros({3, 4})}};
  for (int64_t step : {10, 20, 30}) store.save(state_at(step), model, opt);
  EXPECT_EQ(store.steps(), (std::vector<int64_t>{20, 30}));  // keep = 2
  ASSERT_TRUE(store.latest());
  EXPECT_EQ(*store.latest(), tmp / "ckpt/step_00000030");
  EXPECT_EQ(read_file(tmp / "ckpt/latest"), "step_00000030\n");

  Checkpoint c = CheckpointStore::load(*store.resolve("latest"));
  EXPECT_EQ(c.state.step, 30);
  EXPECT_EQ(c.state.rng["counter"], 300);
  EXPECT_EQ(c.state.data_loader["position"], 30);
  EXPECT_EQ(c.state.config_toml, "[training]\nsteps = 10\n");
  ASSERT_EQ(c.model.tensors.size(), model.size());
  for (size_t i = 0; i < model.size(); ++i) EXPECT_TRUE(bitwise_equal(c.model.tensors[i].second, model[i].second));
  EXPECT_TRUE(compare_tensors(model, c.model.tensors).empty());

  store.save(state_at(30), model, opt);  // re-saving a step replaces it
  EXPECT_EQ(store.steps(), (std::vector<int64_t>{20, 30}));
  EXPECT_THROW(store.resolve(tmp / "nope"), ConfigError);
}

TEST(CheckpointStore, InterruptedSaveLeavesLatestOnThePreviousGoodOne) {
  TempDir tmp;
  CheckpointStore store(tmp / "ckpt", 3);
  NamedTensors model = sample_tensors();
  store.save(state_at(1), model, {});
  // Simulate a crash mid-save of step 2 by a process that no longer exists (pid above pid_max):
  // the tmp directory holds a partial model file and no state.json; `latest` was never touched.
  const std::string crashed = tmp / "ckpt/step_00000002.tmp-4194305";
  fs::create_directories(crashed);
  write_file_atomic(crashed + "/model.safetensors", "partial");
  EXPECT_EQ(*store.latest(), tmp / "ckpt/step_00000001");
  EXPECT_EQ(store.steps(), (std::vector<int64_t>{1}));
  EXPECT_EQ(CheckpointStore::load(*store.resolve("latest")).state.step, 1);
  // A crash after the rename but before `latest` moved: a complete step_2 exists, latest still says 1.
  store.save(state_at(3), model, {});
  EXPECT_FALSE(fs::exists(crashed)) << "stale tmp directory of a dead process is cleaned on the next save";
  EXPECT_EQ(*store.latest(), tmp / "ckpt/step_00000003");
}

TEST(CheckpointStore, LoadValidatesPresenceAndVersion) {
  TempDir tmp;
  CheckpointStore store(tmp / "ckpt", 0);
  const std::string dir = store.save(state_at(5), sample_tensors(), {});
  nlohmann::json st = nlohmann::json::parse(read_file(dir + "/state.json"));
  st["version"] = 99;
  write_file_atomic(dir + "/state.json", st.dump());
  try {
    CheckpointStore::load(dir);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("format version 99; this build reads versions 1 and 2"), std::string::npos) << e.what();
  }
  const std::string dir2 = store.save(state_at(6), sample_tensors(), {});
  fs::remove(dir2 + "/optimizer.safetensors");
  EXPECT_THROW(CheckpointStore::load(dir2), IoError);
}

TEST(CheckpointStore, ShapeMismatchesAreReportedClearly) {
  NamedTensors model = {{"model.layers.0.self_attn.q_proj.weight", Tensor::zeros({512, 512})},
                        {"model.norm.weight", Tensor::zeros({512})}};
  NamedTensors ckpt = {{"model.layers.0.self_attn.q_proj.weight", Tensor::zeros({256, 256})},
                       {"model.extra", Tensor::zeros({2})}};
  auto diffs = compare_tensors(model, ckpt);
  ASSERT_EQ(diffs.size(), 3u);
  EXPECT_EQ(diffs[0], "tensor 'model.layers.0.self_attn.q_proj.weight' has shape [256,256] in the checkpoint but "
                      "[512,512] in the model");
  EXPECT_EQ(diffs[1], "tensor 'model.norm.weight' (f32[512]) is missing from the checkpoint");
  EXPECT_EQ(diffs[2], "tensor 'model.extra' (f32[2]) in the checkpoint is not in the model");
  EXPECT_THROW(check_tensors_match(model, ckpt), ConfigError);
  EXPECT_NO_THROW(check_tensors_match(model, model));
}

}  // namespace
}  // namespace dhelix
