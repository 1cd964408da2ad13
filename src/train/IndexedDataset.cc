// MMIDIDX reader (mmap + validation) and writer. Layout in IndexedDataset.h.
#include "train/IndexedDataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "base/Error.h"
#include "base/Files.h"

namespace dhelix {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

template <typename T>
T load_le(const char* p) {  // little-endian host (x86-64, aarch64)
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool is_integer_dtype(uint8_t code) { return code == 1 || code == 2 || code == 3 || code == 4 || code == 5 || code == 8; }

}  // namespace

size_t index_dtype_size(IndexDType d) {
  switch (d) {
    case IndexDType::kU8: case IndexDType::kI8: return 1;
    case IndexDType::kI16: case IndexDType::kU16: return 2;
    case IndexDType::kI32: case IndexDType::kF32: return 4;
    case IndexDType::kI64: case IndexDType::kF64: return 8;
  }
  return 0;
}

const char* index_dtype_name(IndexDType d) {
  switch (d) {
    case IndexDType::kU8: return "u8";
    case IndexDType::kI8: return "i8";
    case IndexDType::kI16: return "i16";
    case IndexDType::kU16: return "u16";
    case IndexDType::kI32: return "i32";
    case IndexDType::kI64: return "i64";
    case IndexDType::kF32: return "f32";
    case IndexDType::kF64: return "f64";
  }
  return "?";
}

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  DHX_CHECK(file_exists(idx_path), IoError, "dataset index '{}' does not exist (run `dhelix data prepare`)", idx_path);
  DHX_CHECK(file_exists(bin_path), IoError, "dataset tokens '{}' do not exist (run `dhelix data prepare`)", bin_path);
  const std::string idx = read_file(idx_path);
  DHX_CHECK(idx.size() >= kIndexHeaderBytes, IoError,
            "'{}' is truncated: the MMIDIDX header needs {} bytes, the file has {}", idx_path, kIndexHeaderBytes,
            idx.size());
  DHX_CHECK(std::memcmp(idx.data(), kMagic, 9) == 0, IoError,
            "'{}' is not a Megatron MMIDIDX index (bad magic in the first 9 bytes)", idx_path);
  uint64_t version = load_le<uint64_t>(idx.data() + 9);
  DHX_CHECK(version == 1, IoError, "'{}' has MMIDIDX version {}; only version 1 is supported", idx_path, version);
  uint8_t code = static_cast<uint8_t>(idx[17]);
  DHX_CHECK(is_integer_dtype(code), IoError,
            "'{}' stores tokens with dtype code {}; expected an integer code (1,2,3,4,5,8)", idx_path, code);
  dtype_ = static_cast<IndexDType>(code);
  const uint64_t S = load_le<uint64_t>(idx.data() + 18), D1 = load_le<uint64_t>(idx.data() + 26);
  DHX_CHECK(S < (uint64_t{1} << 40) && D1 >= 1 && D1 < (uint64_t{1} << 40), IoError,
            "'{}' has implausible counts: {} sequences, {} document-index entries", idx_path, S, D1);
  const uint64_t expect = kIndexHeaderBytes + 4 * S + 8 * S + 8 * D1;
  DHX_CHECK(idx.size() == expect, IoError,
            "'{}' is {}: {} sequences and {} document-index entries need {} bytes, the file has {}", idx_path,
            idx.size() < expect ? "truncated" : "longer than its header says", S, D1, expect, idx.size());
  sizes_.resize(S);
  pointers_.resize(S);
  doc_idx_.resize(D1);
  const char* p = idx.data() + kIndexHeaderBytes;
  if (S > 0) {  // an empty vector's data() may be null, and memcpy from/to null is UB even for 0 bytes
    std::memcpy(sizes_.data(), p, 4 * S);
    std::memcpy(pointers_.data(), p + 4 * S, 8 * S);
  }
  std::memcpy(doc_idx_.data(), p + 12 * S, 8 * D1);

  DHX_CHECK(doc_idx_.front() == 0 && doc_idx_.back() == static_cast<int64_t>(S), IoError,
            "'{}': document index must run from 0 to {} (sequences), found {} .. {}", idx_path, S, doc_idx_.front(),
            doc_idx_.back());
  for (size_t d = 1; d < D1; ++d)
    DHX_CHECK(doc_idx_[d] >= doc_idx_[d - 1], IoError, "'{}': document index decreases at entry {} ({} < {})",
              idx_path, d, doc_idx_[d], doc_idx_[d - 1]);
  const int64_t item = static_cast<int64_t>(index_dtype_size(dtype_));
  int64_t expect_ptr = 0;
  for (size_t i = 0; i < S; ++i) {
    DHX_CHECK(sizes_[i] >= 0 && pointers_[i] == expect_ptr, IoError,
              "'{}': sequence {} has size {} at byte {}, expected a size >= 0 at byte {} (sequences must be "
              "contiguous)", idx_path, i, sizes_[i], pointers_[i], expect_ptr);
    expect_ptr += sizes_[i] * item;
  }
  num_tokens_ = expect_ptr / item;

  int fd = ::open(bin_path.c_str(), O_RDONLY);
  DHX_CHECK(fd >= 0, IoError, "cannot open '{}': {}", bin_path, std::strerror(errno));
  struct stat st;
  ::fstat(fd, &st);
  bin_bytes_ = static_cast<size_t>(st.st_size);
  if (bin_bytes_ != static_cast<size_t>(expect_ptr)) {
    ::close(fd);
    throw IoError(fmt::format("'{}' is {}: its index '{}' describes {} tokens = {} bytes, the file has {} bytes",
                              bin_path, bin_bytes_ < static_cast<size_t>(expect_ptr) ? "truncated" : "too long",
                              idx_path, num_tokens_, expect_ptr, bin_bytes_));
  }
  if (bin_bytes_ > 0) {
    void* m = ::mmap(nullptr, bin_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    ::close(fd);
    DHX_CHECK(m != MAP_FAILED, IoError, "cannot mmap '{}' ({} bytes): {}", bin_path, bin_bytes_, std::strerror(e));
    bin_ = static_cast<const char*>(m);
  } else {
    ::close(fd);
  }
}

IndexedDataset::~IndexedDataset() {
  if (bin_) ::munmap(const_cast<char*>(bin_), bin_bytes_);
}

int64_t IndexedDataset::sequence_start(int64_t i) const {
  DHX_CHECK(i >= 0 && i <= num_sequences(), InternalError, "sequence {} out of range [0, {}]", i, num_sequences());
  if (i == num_sequences()) return num_tokens_;
  return pointers_[i] / static_cast<int64_t>(index_dtype_size(dtype_));
}

std::pair<int64_t, int64_t> IndexedDataset::document_token_range(int64_t first_doc, int64_t last_doc) const {
  DHX_CHECK(0 <= first_doc && first_doc <= last_doc && last_doc <= num_documents(), InternalError,
            "documents [{}, {}) out of range [0, {})", first_doc, last_doc, num_documents());
  return {sequence_start(doc_idx_[first_doc]), sequence_start(doc_idx_[last_doc])};
}

void IndexedDataset::read_tokens(int64_t start, int64_t count, int32_t* out) const {
  DHX_CHECK(start >= 0 && count >= 0 && start + count <= num_tokens_, InternalError,
            "tokens [{}, {}) out of range of '{}' ({} tokens)", start, start + count, prefix_, num_tokens_);
  const size_t item = index_dtype_size(dtype_);
  const char* p = bin_ + static_cast<size_t>(start) * item;
  for (int64_t i = 0; i < count; ++i, p += item) {
    switch (dtype_) {
      case IndexDType::kU8: out[i] = load_le<uint8_t>(p); break;
      case IndexDType::kI8: out[i] = load_le<int8_t>(p); break;
      case IndexDType::kI16: out[i] = load_le<int16_t>(p); break;
      case IndexDType::kU16: out[i] = load_le<uint16_t>(p); break;
      case IndexDType::kI32: out[i] = load_le<int32_t>(p); break;
      case IndexDType::kI64: out[i] = static_cast<int32_t>(load_le<int64_t>(p)); break;
      default: throw InternalError("non-integer token dtype");
    }
  }
}

std::optional<IndexedDataset::TokenAt> IndexedDataset::first_id_outside(int64_t lo, int64_t hi) const {
  const size_t item = index_dtype_size(dtype_);
  const char* p = bin_;
  for (int64_t i = 0; i < num_tokens_; ++i, p += item) {
    int64_t v = 0;
    switch (dtype_) {
      case IndexDType::kU8: v = load_le<uint8_t>(p); break;
      case IndexDType::kI8: v = load_le<int8_t>(p); break;
      case IndexDType::kI16: v = load_le<int16_t>(p); break;
      case IndexDType::kU16: v = load_le<uint16_t>(p); break;
      case IndexDType::kI32: v = load_le<int32_t>(p); break;
      case IndexDType::kI64: v = load_le<int64_t>(p); break;
      default: throw InternalError("non-integer token dtype");
    }
    if (v >= lo && v < hi) continue;
    // The sequence holding position i: the last whose first token is at or before it.
    const int64_t byte = i * static_cast<int64_t>(item);
    const auto it = std::upper_bound(pointers_.begin(), pointers_.end(), byte);
    return TokenAt{i, static_cast<int64_t>(it - pointers_.begin()) - 1, v};
  }
  return std::nullopt;
}

std::vector<int32_t> IndexedDataset::sequence(int64_t i) const {
  std::vector<int32_t> out(static_cast<size_t>(sizes_.at(i)));
  read_tokens(sequence_start(i), sizes_[i], out.data());
  return out;
}

// ---------------------------------------------------------------------------------------------

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, IndexDType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  DHX_CHECK(is_integer_dtype(static_cast<uint8_t>(dtype)), InternalError,
            "the writer stores integer tokens (u8, i8, i16, u16, i32, i64), not code {}", static_cast<int>(dtype));
  bin_tmp_ = prefix_ + ".bin.tmp." + std::to_string(::getpid());
  fd_ = ::open(bin_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  DHX_CHECK(fd_ >= 0, IoError, "cannot create '{}': {}", bin_tmp_, std::strerror(errno));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(bin_tmp_.c_str());
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  DHX_CHECK(!finished_, InternalError, "add_document after finish()");
  const size_t item = index_dtype_size(dtype_);
  buf_.resize(tokens.size() * item);
  // Little-endian stores (the format's byte order; load_le's inverse on this host).
  auto put = [&](size_t i, auto v, int64_t t, int64_t lo, int64_t hi) {
    DHX_CHECK(t >= lo && t <= hi, InternalError, "token {} does not fit dataset '{}' (ids {} .. {})", t, prefix_, lo,
              hi);
    std::memcpy(buf_.data() + item * i, &v, sizeof v);
  };
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    switch (dtype_) {
      case IndexDType::kU8: put(i, static_cast<uint8_t>(t), t, 0, 255); break;
      case IndexDType::kI8: put(i, static_cast<int8_t>(t), t, -128, 127); break;
      case IndexDType::kI16: put(i, static_cast<int16_t>(t), t, -32768, 32767); break;
      case IndexDType::kU16: put(i, static_cast<uint16_t>(t), t, 0, 65535); break;
      case IndexDType::kI32: put(i, t, t, INT32_MIN, INT32_MAX); break;
      case IndexDType::kI64: put(i, static_cast<int64_t>(t), t, INT32_MIN, INT32_MAX); break;
      default: throw InternalError("non-integer token dtype");
    }
  }
  size_t off = 0;
  while (off < buf_.size()) {
    ssize_t n = ::write(fd_, buf_.data() + off, buf_.size() - off);
    DHX_CHECK(n >= 0, IoError, "write to '{}' failed: {}", bin_tmp_, std::strerror(errno));
    off += static_cast<size_t>(n);
  }
  sizes_.push_back(static_cast<int32_t>(tokens.size()));
  bytes_ += static_cast<int64_t>(buf_.size());
}

void IndexedDatasetWriter::finish() {
  DHX_CHECK(!finished_, InternalError, "finish() called twice");
  const uint64_t S = sizes_.size(), D1 = S + 1;
  const int64_t item = static_cast<int64_t>(index_dtype_size(dtype_));
  std::string idx(kIndexHeaderBytes + 12 * S + 8 * D1, '\0');
  char* p = idx.data();
  std::memcpy(p, kMagic, 9);
  uint64_t version = 1;
  std::memcpy(p + 9, &version, 8);
  p[17] = static_cast<char>(dtype_);
  std::memcpy(p + 18, &S, 8);
  std::memcpy(p + 26, &D1, 8);
  p += kIndexHeaderBytes;
  if (S > 0) std::memcpy(p, sizes_.data(), 4 * S);  // no documents: data() may be null
  int64_t ptr = 0;
  for (uint64_t i = 0; i < S; ++i) {  // pointers[i] = bytes of sequences before i
    std::memcpy(p + 4 * S + 8 * i, &ptr, 8);
    ptr += sizes_[i] * item;
  }
  for (uint64_t d = 0; d < D1; ++d) {  // one sequence per document: doc_idx = 0, 1, ..., S
    int64_t v = static_cast<int64_t>(d);
    std::memcpy(p + 12 * S + 8 * d, &v, 8);
  }
  ::fsync(fd_);
  ::close(fd_);
  fd_ = -1;
  const std::string bin_path = prefix_ + ".bin";
  DHX_CHECK(::rename(bin_tmp_.c_str(), bin_path.c_str()) == 0, IoError, "cannot rename '{}' to '{}': {}", bin_tmp_,
            bin_path, std::strerror(errno));
  write_file_atomic(prefix_ + ".idx", idx);
  finished_ = true;
}

}  // namespace dhelix
