// Resuming from `latest` when the newest checkpoint is missing or broken (issue 36 item 2): the
// trainer falls back to the newest checkpoint that loads and says which one it skipped and why;
// when none loads it says so, naming each. Oracle: the uninterrupted run -- resumed from the older
// checkpoint, the next losses are bitwise the straight run's (the checkpoint restores everything).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "TinyRun.h"
#include "base/Error.h"
#include "train/Trainer.h"

namespace dhelix {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

struct Saved {
  std::vector<double> losses;  // steps 1..4
  std::string step2, step4;    // their checkpoint directories
};

Saved train_and_save(const RunConfig& cfg) {
  Saved s;
  Trainer t(cfg, nullptr, Quiet::kYes);
  for (int i = 0; i < 2; ++i) s.losses.push_back(t.train_step().loss);
  s.step2 = t.save_checkpoint();
  for (int i = 0; i < 2; ++i) s.losses.push_back(t.train_step().loss);
  s.step4 = t.save_checkpoint();
  return s;
}

void truncate_file(const std::string& path) {
  const auto n = fs::file_size(path);
  fs::resize_file(path, n / 2);
}

TEST(ResumeFallback, LatestNamingAMissingStepResumesFromTheNewestIntact) {
  TempDir dir;
  testing::write_synthetic_dataset(dir.path() + "/data", 200, 300, 21);
  const RunConfig cfg = testing::tiny_config(dir.path(), "llama");
  const Saved s = train_and_save(cfg);
  fs::remove_all(s.step4);  // `latest` still names it
  Trainer t(cfg, nullptr, Quiet::kYes);
  std::string note;
  EXPECT_EQ(t.load_resume("latest", true, &note), s.step2);
  EXPECT_EQ(t.step(), 2);
  EXPECT_NE(note.find("names 'step_00000004', which is missing"), std::string::npos) << note;
  EXPECT_EQ(t.train_step().loss, s.losses[2]);
  EXPECT_EQ(t.train_step().loss, s.losses[3]);
}

TEST(ResumeFallback, ABrokenNewestCheckpointIsSkippedNamingWhy) {
  TempDir dir;
  testing::write_synthetic_dataset(dir.path() + "/data", 200, 300, 22);
  const RunConfig cfg = testing::tiny_config(dir.path(), "gpt");
  const Saved s = train_and_save(cfg);
  truncate_file(s.step4 + "/model.safetensors");
  Trainer t(cfg, nullptr, Quiet::kYes);
  std::string note;
  EXPECT_EQ(t.load_resume("latest", true, &note), s.step2);
  EXPECT_NE(note.find("'" + s.step4 + "' does not load"), std::string::npos) << note;
  EXPECT_EQ(t.train_step().loss, s.losses[2]);
  // The weights only (`dhelix sample`): the same fallback.
  Trainer w(cfg, nullptr, Quiet::kYes, Trainer::Data::kNone);
  EXPECT_EQ(w.load_resume("latest", false), s.step2);
}

TEST(ResumeFallback, NoCheckpointLoadingSaysSoNamingEach) {
  TempDir dir;
  testing::write_synthetic_dataset(dir.path() + "/data", 200, 300, 23);
  const RunConfig cfg = testing::tiny_config(dir.path(), "llama");
  const Saved s = train_and_save(cfg);
  truncate_file(s.step4 + "/model.safetensors");
  truncate_file(s.step2 + "/optimizer.safetensors");
  Trainer t(cfg, nullptr, Quiet::kYes);
  try {
    t.load_resume("latest", true);
    FAIL() << "a broken checkpoint loaded";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no checkpoint in"), std::string::npos) << msg;
    EXPECT_NE(msg.find(s.step4 + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(s.step2 + ": "), std::string::npos) << msg;
  }
  // A checkpoint named explicitly is not replaced by another: its own error.
  EXPECT_THROW(t.load_resume(s.step4, true), IoError);
}

// A metrics file that cannot be written (/dev/full: every write fails with ENOSPC) while the
// checkpoints have room (issue 36 item 3): the run saves the step first, then stops with an IoError
// (exit 2) naming the metrics path and the checkpoint. Oracle: the saved checkpoint resumes
// bitwise -- the next losses are the uninterrupted run's.
TEST(RecordsFailure, AMetricsWriteFailureSavesTheStepFirst) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  TempDir dir;
  testing::write_synthetic_dataset(dir.path() + "/data", 200, 300, 24);
  RunConfig cfg = testing::tiny_config(dir.path(), "llama");
  std::vector<double> straight;
  {
    Trainer t(cfg, nullptr, Quiet::kYes);
    for (int i = 0; i < 3; ++i) straight.push_back(t.train_step().loss);
  }
  RunConfig full = cfg;
  full.output.metrics = "/dev/full";
  {
    Trainer t(full, nullptr, Quiet::kNo);  // the logging rank writes the metrics
    try {
      t.run();
      FAIL() << "the run went on without its metrics";
    } catch (const IoError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("writing metrics to '/dev/full' failed"), std::string::npos) << msg;
      EXPECT_NE(msg.find("(step 1) before stopping"), std::string::npos) << msg;
    }
  }
  Trainer r(cfg, nullptr, Quiet::kYes);
  r.load_resume("latest", true);
  EXPECT_EQ(r.step(), 1);
  EXPECT_EQ(r.train_step().loss, straight[1]);
  EXPECT_EQ(r.train_step().loss, straight[2]);
}

}  // namespace
}  // namespace dhelix
