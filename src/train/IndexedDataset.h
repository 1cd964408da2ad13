// Megatron-LM's memory-mapped indexed dataset (MMIDIDX), read and written.
// <prefix>.idx, little-endian:
//   9 B  magic "MMIDIDX\0\0" | u64 version = 1 | u8 dtype code (1 u8, 2 i8, 3 i16, 4 i32, 5 i64,
//   6 f64, 7 f32, 8 u16) | u64 S = sequence count | u64 D1 = length of doc_idx (documents + 1,
//   as Megatron writes len(document_indices) with its leading 0) | i32 sizes[S] (tokens per
//   sequence) | i64 pointers[S] (byte offset of each sequence in .bin) | i64 doc_idx[D1]
//   (doc d = sequences [doc_idx[d], doc_idx[d+1])).
// <prefix>.bin: the tokens of all sequences, back to back. We write one sequence per document.
// Not here: batching (DataLoader), tokenization (Tokenizer).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dhelix {

enum class IndexDType : uint8_t { kU8 = 1, kI8 = 2, kI16 = 3, kI32 = 4, kI64 = 5, kF64 = 6, kF32 = 7, kU16 = 8 };
size_t index_dtype_size(IndexDType d);
const char* index_dtype_name(IndexDType d);  // "u8", "i8", "i16", "u16", "i32", "i64", "f32", "f64"

constexpr size_t kIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;  // = 34

// Read-only view: .bin is memory-mapped; the index arrays are copied out of .idx (they start at
// byte 34, unaligned for int32/int64, so they cannot be used in place). Validates every size on open: a missing,
// truncated or inconsistent file throws IoError naming the file and the expected vs actual bytes.
// Token dtypes must be integers (u8, i8, i16, i32, i64, u16); tokens are returned as int32.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  IndexDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(doc_idx_.size()) - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  std::span<const int32_t> sizes() const { return sizes_; }
  std::span<const int64_t> pointers() const { return pointers_; }
  std::span<const int64_t> doc_idx() const { return doc_idx_; }

  // Position of sequence i's first token in the concatenated token stream (pointer / itemsize).
  int64_t sequence_start(int64_t i) const;
  // Token-stream range [begin, end) of documents [first_doc, last_doc).
  std::pair<int64_t, int64_t> document_token_range(int64_t first_doc, int64_t last_doc) const;
  // Copies tokens [start, start+count) of the concatenated stream into `out` as int32 (ids past
  // int32 wrap: check_ids first, as the trainer's preflight does).
  void read_tokens(int64_t start, int64_t count, int32_t* out) const;
  // The first token, at its stored width (an i64 id of 2^32 + 5 is 2^32 + 5, not 5), outside
  // [lo, hi): its position in the token stream, the sequence holding it and its value; nullopt when
  // every id is inside.
  struct TokenAt {
    int64_t position = 0, sequence = 0, value = 0;
  };
  std::optional<TokenAt> first_id_outside(int64_t lo, int64_t hi) const;
  std::vector<int32_t> sequence(int64_t i) const;

 private:
  std::string prefix_;
  IndexDType dtype_ = IndexDType::kU16;
  const char* bin_ = nullptr;
  size_t bin_bytes_ = 0;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> doc_idx_;
  int64_t num_tokens_ = 0;
};

// Builds <prefix>.bin/.idx: add documents (each one sequence), then finish(). The files are
// written under temporary names and renamed on finish() (.bin first, .idx last), so a reader never
// sees a half-written pair. Throws IoError.
class IndexedDatasetWriter {
 public:
  // Any integer dtype (u8, i8, i16, u16, i32, i64); a token the dtype cannot hold is an
  // InternalError naming it.
  IndexedDatasetWriter(std::string prefix, IndexDType dtype);
  ~IndexedDatasetWriter();  // without finish(): removes the temporaries
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  void add_document(std::span<const int32_t> tokens);
  void finish();

 private:
  std::string prefix_, bin_tmp_;
  IndexDType dtype_;
  int fd_ = -1;
  std::vector<int32_t> sizes_;
  int64_t bytes_ = 0;
  std::vector<char> buf_;
  bool finished_ = false;
};

}  // namespace dhelix
