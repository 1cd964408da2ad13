// The shipped TOML configs resolved with the real model presets; `dhelix data prepare` end to end.
// Oracles: the demo shape stated in configs/demo.toml; round trip through to_toml; the prepared KJV
// dataset read back (31,102 verses = documents, every one ending in EOS) and batched.
#include <gtest/gtest.h>

#include <filesystem>

#include "Commands.h"
#include "base/Error.h"
#include "base/Files.h"
#include "train/Config.h"
#include "train/DataLoader.h"
#include "train/IndexedDataset.h"
#include "train/Tokenizer.h"
#include "TempDir.h"

namespace dhelix {
namespace {

const std::string kDir = DHELIX_SOURCE_DIR;

TEST(ShippedConfigs, DemoIsTheSmallLlama) {
  RunConfig c = load_config(kDir + "/configs/demo.toml", {});
  EXPECT_EQ(c.model.family, ModelFamily::kLlama);
  EXPECT_EQ(c.model.vocab_size, 2000);
  EXPECT_EQ(c.model.seq_len, 128);
  EXPECT_EQ(c.model.d_model, 256);
  EXPECT_EQ(c.model.n_layers, 4);
  EXPECT_EQ(c.model.n_heads, 8);
  EXPECT_EQ(c.model.n_kv_heads, 4);
  EXPECT_EQ(c.model.ffn_hidden, 688);
  EXPECT_TRUE(c.schedule.strand_interleaving);
  EXPECT_EQ(c.output.metrics, "runs/demo/metrics.jsonl");
  RunConfig again = load_config_text(to_toml(c), "resolved", {});
  EXPECT_EQ(to_toml(again), to_toml(c));
}

TEST(ShippedConfigs, Gpt2SmallKeepsTheGpt2Shape) {
  RunConfig c = load_config(kDir + "/configs/gpt2-124m.toml", {});
  EXPECT_EQ(c.model.family, ModelFamily::kGPT);
  EXPECT_EQ(c.model.d_model, 768);
  EXPECT_EQ(c.model.n_layers, 12);
  EXPECT_EQ(c.model.n_heads, 12);
  EXPECT_EQ(c.model.ffn_hidden, 3072);
  EXPECT_EQ(c.model.vocab_size, 8192);
}

TEST(ShippedConfigs, ModelValidateMessagesAreCollectedWithOurs) {
  try {
    load_config(kDir + "/configs/demo.toml", {{"model.n_heads", "7"}, {"parallel.tp", "3"}, {"model.preset", "nope"}});
    FAIL();
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("model.d_model=256 is not divisible by model.n_heads=7"), std::string::npos) << m;
    EXPECT_NE(m.find("model.n_heads=7 is not divisible by parallel.tp=3"), std::string::npos) << m;
    EXPECT_NE(m.find("unknown model preset 'nope'"), std::string::npos) << m;
  }
}

TEST(CmdData, PreparesTheKjvOnceThenSkips) {
  if (!file_exists("/usr/bin/bible")) GTEST_SKIP() << "bible-kjv is not installed";
  testing::TempDir tmp;
  std::vector<std::string> words = {"data", "prepare", "--config", kDir + "/configs/demo.toml",
                                    "--data.corpus", tmp / "kjv.txt", "--data.tokenizer", tmp / "kjv_bpe.model",
                                    "--data.prefix", tmp / "kjv"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  ASSERT_EQ(cmd_data(static_cast<int>(argv.size()), argv.data()), 0);
  auto stamp = std::filesystem::last_write_time(tmp / "kjv.bin");
  ASSERT_EQ(cmd_data(static_cast<int>(argv.size()), argv.data()), 0);
  EXPECT_EQ(std::filesystem::last_write_time(tmp / "kjv.bin"), stamp) << "second run must not rewrite";

  IndexedDataset ds(tmp / "kjv");
  Tokenizer tok(tmp / "kjv_bpe.model");
  EXPECT_EQ(ds.num_documents(), 31102);
  EXPECT_EQ(tok.vocab_size(), 2000);
  auto verse = ds.sequence(0);
  EXPECT_EQ(verse.back(), tok.eos_id());
  verse.pop_back();
  EXPECT_EQ(tok.decode(verse), "In the beginning God created the heaven and the earth.");
  DataLoader dl(ds, Split::kTrain, 8, 128, 1234, 0, 1, 0.05);
  EXPECT_GT(dl.num_windows(), 5000);
  Batch b = dl.next();
  EXPECT_EQ(b.tokens.shape(), (Shape{8, 128}));

  std::vector<std::string> bad = {"data", "prepare", "--config", kDir + "/configs/demo.toml", "--data.corpsu", "x"};
  std::vector<char*> bad_argv;
  for (auto& w : bad) bad_argv.push_back(w.data());
  EXPECT_THROW(cmd_data(static_cast<int>(bad_argv.size()), bad_argv.data()), ConfigError);
}

}  // namespace
}  // namespace dhelix
