// Data tests. Oracles: hand-computed MMIDIDX bytes; a hand-built Megatron-style index (several
// sequences per document, i32 tokens) read back; truncation -> IoError with expected vs actual
// bytes; a dataset whose token values equal their positions, so every window's content is known;
// dp sharding against the dp=1 batch; resume from JSON state against an uninterrupted loader.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "base/Error.h"
#include "base/Files.h"
#include "train/DataLoader.h"
#include "train/DataPrepare.h"
#include "train/IndexedDataset.h"
#include "train/Tokenizer.h"
#include "TempDir.h"

namespace dhelix {
namespace {

using testing::TempDir;

template <typename T>
void put(std::string& s, T v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

TEST(IndexedDataset, WriterProducesTheHandComputedIdxBytes) {
  TempDir tmp;
  const std::string prefix = tmp / "ds";
  IndexedDatasetWriter w(prefix, IndexDType::kU16);
  std::vector<int32_t> d0 = {1, 2, 3}, d1 = {4}, d2 = {65535, 0};
  w.add_document(d0);
  w.add_document(d1);
  w.add_document(d2);
  w.finish();
  std::string want("MMIDIDX\0\0", 9);
  put<uint64_t>(want, 1);                                                 // version
  put<uint8_t>(want, 8);                                                  // uint16 code
  put<uint64_t>(want, 3);                                                 // sequences
  put<uint64_t>(want, 4);                                                 // len(doc_idx) = documents + 1
  for (int32_t s : {3, 1, 2}) put<int32_t>(want, s);                      // sizes
  for (int64_t p : {0, 6, 8}) put<int64_t>(want, p);                      // byte pointers (2 B/token)
  for (int64_t d : {0, 1, 2, 3}) put<int64_t>(want, d);                   // doc_idx
  ASSERT_EQ(want.size(), 34u + 3 * 4 + 3 * 8 + 4 * 8);
  EXPECT_EQ(read_file(prefix + ".idx"), want);
  std::string bin;
  for (uint16_t t : {1, 2, 3, 4, 65535, 0}) put<uint16_t>(bin, t);
  EXPECT_EQ(read_file(prefix + ".bin"), bin);

  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.num_sequences(), 3);
  EXPECT_EQ(ds.num_documents(), 3);
  EXPECT_EQ(ds.num_tokens(), 6);
  EXPECT_EQ(ds.sequence(2), d2);
  EXPECT_EQ(ds.document_token_range(1, 3), std::make_pair(int64_t{3}, int64_t{6}));
}

TEST(IndexedDataset, ReadsAMegatronIndexWithSeveralSequencesPerDocument) {
  TempDir tmp;
  const std::string prefix = tmp / "meg";
  // 2 documents: doc 0 = sequences {10,11} and {12}; doc 1 = sequence {13,14,15}; int32 tokens.
  std::string idx("MMIDIDX\0\0", 9);
  put<uint64_t>(idx, 1);
  put<uint8_t>(idx, 4);
  put<uint64_t>(idx, 3);
  put<uint64_t>(idx, 3);
  for (int32_t s : {2, 1, 3}) put<int32_t>(idx, s);
  for (int64_t p : {0, 8, 12}) put<int64_t>(idx, p);
  for (int64_t d : {0, 2, 3}) put<int64_t>(idx, d);
  std::string bin;
  for (int32_t t : {10, 11, 12, 13, 14, 15}) put<int32_t>(bin, t);
  write_file_atomic(prefix + ".idx", idx);
  write_file_atomic(prefix + ".bin", bin);
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.dtype(), IndexDType::kI32);
  EXPECT_EQ(ds.num_documents(), 2);
  EXPECT_EQ(ds.document_token_range(1, 2), std::make_pair(int64_t{3}, int64_t{6}));
  std::vector<int32_t> all(6);
  ds.read_tokens(0, 6, all.data());
  EXPECT_EQ(all, (std::vector<int32_t>{10, 11, 12, 13, 14, 15}));
}

TEST(IndexedDataset, TruncatedOrCorruptFilesThrowIoErrorWithSizes) {
  TempDir tmp;
  const std::string prefix = tmp / "ds";
  IndexedDatasetWriter w(prefix, IndexDType::kU16);
  std::vector<int32_t> d0 = {1, 2, 3, 4, 5};
  w.add_document(d0);
  w.finish();
  std::filesystem::resize_file(prefix + ".bin", 7);
  std::string msg = error_of([&] { IndexedDataset ds(prefix); });
  EXPECT_NE(msg.find("'" + prefix + ".bin' is truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("10 bytes, the file has 7 bytes"), std::string::npos) << msg;

  std::string idx = read_file(prefix + ".idx");
  write_file_atomic(prefix + ".idx", idx.substr(0, idx.size() - 3));
  msg = error_of([&] { IndexedDataset ds(prefix); });
  EXPECT_NE(msg.find("'" + prefix + ".idx' is truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("need 62 bytes, the file has 59"), std::string::npos) << msg;

  write_file_atomic(prefix + ".idx", "MMIDIDY" + idx.substr(7));
  EXPECT_NE(error_of([&] { IndexedDataset ds(prefix); }).find("bad magic"), std::string::npos);
  EXPECT_NE(error_of([&] { IndexedDataset ds(tmp / "nothing"); }).find("does not exist"), std::string::npos);
}

// A dataset whose token at stream position p is p (i32), in documents of 7 tokens.
std::string positional_dataset(const TempDir& tmp, int64_t n_tokens) {
  const std::string prefix = tmp / "pos";
  IndexedDatasetWriter w(prefix, IndexDType::kI32);
  for (int64_t start = 0; start < n_tokens; start += 7) {
    std::vector<int32_t> doc;
    for (int64_t p = start; p < std::min(n_tokens, start + 7); ++p) doc.push_back(static_cast<int32_t>(p));
    w.add_document(doc);
  }
  w.finish();
  return prefix;
}

std::vector<int32_t> flat(const Tensor& t) { return {t.data<int32_t>(), t.data<int32_t>() + t.numel()}; }

TEST(DataLoader, WindowsAreShiftedPairsAtMultiplesOfT) {
  TempDir tmp;
  IndexedDataset ds(positional_dataset(tmp, 700));  // 100 documents
  const int64_t B = 3, T = 8;
  DataLoader dl(ds, Split::kTrain, B, T, 7, 0, 1, 0.1);  // train = first 90 docs = 630 tokens
  EXPECT_EQ(dl.token_range(), std::make_pair(int64_t{0}, int64_t{630}));
  EXPECT_EQ(dl.num_windows(), (630 - 1) / T);
  std::vector<bool> seen(static_cast<size_t>(dl.num_windows()), false);
  for (int step = 0; step < dl.num_windows() / B; ++step) {
    Batch b = dl.next();
    ASSERT_EQ(b.tokens.shape(), (Shape{B, T}));
    auto tok = flat(b.tokens), tgt = flat(b.targets);
    for (int64_t r = 0; r < B; ++r) {
      int32_t first = tok[r * T];
      ASSERT_EQ(first % T, 0);
      EXPECT_FALSE(seen[first / T]) << "window repeated within an epoch";
      seen[first / T] = true;
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(tok[r * T + t], first + t);
        EXPECT_EQ(tgt[r * T + t], first + t + 1);
      }
    }
  }
  EXPECT_EQ(dl.epoch(), 0);
  dl.next();
  EXPECT_EQ(dl.epoch(), 1);  // the tail shorter than a batch was dropped
  DataLoader val(ds, Split::kVal, 2, T, 7, 0, 1, 0.1);
  EXPECT_EQ(val.token_range(), std::make_pair(int64_t{630}, int64_t{700}));
  EXPECT_EQ(flat(val.next().tokens)[0], 630);  // validation is in order
}

TEST(DataLoader, DpRanksShareTheSerialGlobalBatch) {
  TempDir tmp;
  IndexedDataset ds(positional_dataset(tmp, 2000));
  DataLoader serial(ds, Split::kTrain, 4, 16, 99, 0, 1, 0.0);
  DataLoader r0(ds, Split::kTrain, 2, 16, 99, 0, 2, 0.0), r1(ds, Split::kTrain, 2, 16, 99, 1, 2, 0.0);
  for (int i = 0; i < 40; ++i) {  // crosses epochs: 124 windows / 4 per global batch
    auto s = flat(serial.next().tokens), a = flat(r0.next().tokens), b = flat(r1.next().tokens);
    a.insert(a.end(), b.begin(), b.end());
    ASSERT_EQ(a, s) << "global micro-batch " << i;
  }
  EXPECT_EQ(serial.epoch(), r0.epoch());
}

TEST(DataLoader, StateRoundTripResumesBitwise) {
  TempDir tmp;
  IndexedDataset ds(positional_dataset(tmp, 1000));
  DataLoader a(ds, Split::kTrain, 4, 8, 5, 0, 1, 0.05);
  for (int i = 0; i < 37; ++i) a.next();  // past one epoch (118 windows / 4)
  nlohmann::json saved = nlohmann::json::parse(a.state().dump());
  DataLoader b(ds, Split::kTrain, 4, 8, 5, 0, 1, 0.05);
  b.set_state(saved);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(flat(a.next().tokens), flat(b.next().tokens)) << i;
  DataLoader other_seed(ds, Split::kTrain, 4, 8, 6, 0, 1, 0.05);
  EXPECT_THROW(other_seed.set_state(saved), ConfigError);
  DataLoader c(ds, Split::kTrain, 4, 8, 5, 0, 1, 0.05);
  EXPECT_NE(flat(c.next().tokens), flat(DataLoader(ds, Split::kTrain, 4, 8, 6, 0, 1, 0.05).next().tokens));
}

TEST(DataLoader, SplitTooSmallForOneBatchIsAConfigError) {
  TempDir tmp;
  IndexedDataset ds(positional_dataset(tmp, 100));
  try {
    DataLoader dl(ds, Split::kVal, 4, 16, 1, 0, 1, 0.1);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than one global micro-batch"), std::string::npos) << e.what();
  }
}

void write_small_corpus(const std::string& path) {
  std::ofstream f(path);
  const char* lines[] = {"In the beginning God created the heaven and the earth.",
                         "And the earth was without form, and void; and darkness was upon the face of the deep.",
                         "And God said, Let there be light: and there was light.",
                         "And God saw the light, that it was good: and God divided the light from the darkness."};
  for (int rep = 0; rep < 50; ++rep)
    for (const char* l : lines) f << l << " " << rep << "\n";
}

TEST(Tokenizer, TrainsEncodesAndDecodes) {
  TempDir tmp;
  write_small_corpus(tmp / "c.txt");
  train_bpe_tokenizer(tmp / "c.txt", tmp / "bpe", 120);
  Tokenizer tok(tmp / "bpe.model");
  EXPECT_EQ(tok.vocab_size(), 120);
  EXPECT_EQ(tok.eos_id(), 2);
  const std::string s = "And God said, Let there be light.";
  auto ids = tok.encode(s);
  EXPECT_GT(ids.size(), 3u);
  EXPECT_EQ(tok.decode(ids), s);
  EXPECT_THROW(Tokenizer(tmp / "missing.model"), IoError);
  EXPECT_THROW(train_bpe_tokenizer(tmp / "c.txt", tmp / "huge", 100000), ConfigError);
}

TEST(DataPrepare, BuildsOnceThenSkips) {
  TempDir tmp;
  RunConfig cfg;
  cfg.model.vocab_size = 120;
  cfg.data.corpus = tmp / "c.txt";
  cfg.data.tokenizer = tmp / "tok/bpe.model";
  cfg.data.prefix = tmp / "ds/corpus";
  write_small_corpus(cfg.data.corpus);
  std::vector<std::string> said;
  auto say = [&](const std::string& s) { said.push_back(s); };
  PrepareReport r1 = prepare_data(cfg, say);
  EXPECT_TRUE(r1.trained_tokenizer && r1.tokenized && !r1.made_corpus);
  EXPECT_EQ(r1.documents, 200);
  PrepareReport r2 = prepare_data(cfg, say);
  EXPECT_FALSE(r2.trained_tokenizer || r2.tokenized);
  EXPECT_EQ(r2.tokens, r1.tokens);
  IndexedDataset ds(cfg.data.prefix);
  Tokenizer tok(cfg.data.tokenizer);
  auto first = ds.sequence(0);
  EXPECT_EQ(first.back(), tok.eos_id());  // every document ends in EOS
  first.pop_back();
  EXPECT_EQ(tok.decode(first), "In the beginning God created the heaven and the earth. 0");
  cfg.model.vocab_size = 130;  // tokenizer on disk no longer matches
  EXPECT_THROW(prepare_data(cfg, say), ConfigError);
}

TEST(DataPrepare, KjvFromTheBibleProgram) {
  if (!file_exists("/usr/bin/bible")) GTEST_SKIP() << "bible-kjv is not installed";
  std::string text = kjv_text_from_bible_program();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 31102);  // verses (ecosystem.md §5)
  EXPECT_EQ(text.substr(0, text.find('\n')), "In the beginning God created the heaven and the earth.");
}

}  // namespace
}  // namespace dhelix
