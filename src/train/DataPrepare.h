// prepare_data: makes the three data artifacts a run needs, each only when missing or stale:
//   1. data.corpus     (text, one document per line; from the Debian `bible` program if absent)
//   2. data.tokenizer  (SentencePiece BPE with model.vocab_size pieces, trained on the corpus)
//   3. data.prefix .bin/.idx (MMIDIDX; one document per corpus line, each ending in EOS)
// Idempotent: a second call only checks timestamps and the tokenizer's vocabulary size.
// Not here: batching (DataLoader). Single-process: call it on one rank, then barrier.
#pragma once
#include <functional>
#include <string>

#include "train/Config.h"

namespace dhelix {

struct PrepareReport {
  bool made_corpus = false, trained_tokenizer = false, tokenized = false;
  int64_t documents = 0, tokens = 0;  // of the dataset (read back when it was already there)
};

// `say` receives one line per action ("corpus data/kjv.txt: present (4.4 MB)"); default log_info.
PrepareReport prepare_data(const RunConfig& cfg, const std::function<void(const std::string&)>& say = {});

// The KJV text, one verse per line, reference stripped ("Ge1:1 In the..." -> "In the...").
// Throws IoError naming the Debian package bible-kjv when the `bible` program is not installed.
std::string kjv_text_from_bible_program();

}  // namespace dhelix
