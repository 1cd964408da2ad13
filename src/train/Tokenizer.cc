// SentencePiece wrapper and BPE training.
#include "train/Tokenizer.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "base/Error.h"
#include "base/Files.h"

namespace dhelix {

Tokenizer::Tokenizer(const std::string& model_path)
    : path_(model_path), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  DHX_CHECK(file_exists(model_path), IoError,
            "tokenizer model '{}' does not exist (run `dhelix data prepare` to train it)", model_path);
  auto status = sp_->Load(model_path);
  DHX_CHECK(status.ok(), IoError, "cannot load tokenizer model '{}': {}", model_path, status.ToString());
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  auto status = sp_->Encode(text, &ids);
  DHX_CHECK(status.ok(), InternalError, "SentencePiece encode failed: {}", status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<int> v(ids.begin(), ids.end());
  for (int id : v)
    DHX_CHECK(id >= 0 && id < sp_->GetPieceSize(), ConfigError, "token id {} is outside the vocabulary [0, {}) of '{}'",
              id, sp_->GetPieceSize(), path_);
  std::string out;
  auto status = sp_->Decode(v, &out);
  DHX_CHECK(status.ok(), InternalError, "SentencePiece decode failed: {}", status.ToString());
  return out;
}

int64_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int32_t Tokenizer::eos_id() const { return sp_->eos_id(); }
int32_t Tokenizer::bos_id() const { return sp_->bos_id(); }

void train_bpe_tokenizer(const std::string& corpus, const std::string& model_prefix, int64_t vocab_size,
                         int threads) {
  DHX_CHECK(file_exists(corpus), IoError, "tokenizer corpus '{}' does not exist", corpus);
  // unk=0 bos=1 eos=2 (SentencePiece defaults), no pad; every character kept (the KJV has ~80).
  std::string args = fmt::format(
      "--input={} --model_prefix={} --vocab_size={} --model_type=bpe --character_coverage=1.0 "
      "--num_threads={} --minloglevel=2 --input_sentence_size=2000000 --shuffle_input_sentence=false",
      corpus, model_prefix, vocab_size, threads);
  auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok()) {
    throw ConfigError(fmt::format("training a {}-token BPE vocabulary on '{}' failed: {} (model.vocab_size must "
                                  "fit the corpus)", vocab_size, corpus, status.ToString()));
  }
}

}  // namespace dhelix
