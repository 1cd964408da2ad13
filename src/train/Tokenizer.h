// Tokenizer: a SentencePiece model (BPE, trained on the corpus by DataPrepare) behind a small
// interface; sentencepiece headers stay out of this header. Not here: dataset files.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece { class SentencePieceProcessor; }

namespace dhelix {

class Tokenizer {
 public:
  // Missing or unreadable model file -> IoError naming the path.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const int32_t> ids) const;  // ids outside the vocabulary -> ConfigError
  int64_t vocab_size() const;
  int32_t eos_id() const;  // appended after every document in the dataset; -1 if the model has none
  int32_t bos_id() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

// Trains a BPE SentencePiece model on `corpus` (one sentence per line) and writes
// <model_prefix>.model and .vocab. A vocabulary that does not fit the corpus -> ConfigError with
// SentencePiece's reason; unreadable corpus -> IoError.
void train_bpe_tokenizer(const std::string& corpus, const std::string& model_prefix, int64_t vocab_size,
                         int threads = 1);

}  // namespace dhelix
