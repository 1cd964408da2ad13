// safetensors files: u64 little-endian N | N bytes of JSON header | raw data. The header maps each
// tensor name to {"dtype": "F32"|"BF16"|"F64"|"I32"|"I64"|"U16", "shape": [...],
// "data_offsets": [begin, end]} (byte offsets into the data section) plus an optional
// "__metadata__" map of strings. Not here: which tensors a checkpoint holds (CheckpointStore).
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/Tensor.h"

namespace dhelix {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using TensorMetadata = std::map<std::string, std::string>;

// Checksums ride in __metadata__ as "crc32c:<tensor name>" -> eight hex digits (base/Checksum.h),
// a form other safetensors readers pass over as plain metadata.
inline constexpr const char* kChecksumKeyPrefix = "crc32c:";

struct SafetensorsFile {
  NamedTensors tensors;  // in data-offset order
  TensorMetadata metadata;  // without the checksum entries
  size_t checksummed = 0;   // tensors whose stored checksum was verified
  const Tensor* find(const std::string& name) const;
};

// Writes tensors in the given order (names must be unique and not "__metadata__"), header padded
// with spaces to a multiple of 8 bytes, each tensor's CRC-32C in the metadata. Written to a
// temporary, fsynced, then renamed: atomic.
void write_safetensors(const std::string& path, const NamedTensors& tensors, const TensorMetadata& metadata = {});

// Reads and validates: header length within the file, JSON well-formed, known dtype, shape x dtype
// size == offsets span, offsets inside the data section, contiguous and non-overlapping, data
// section fully covered, every stored checksum matching its tensor's bytes (files from elsewhere
// may have none). Any violation -> IoError naming the file (and the tensor).
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace dhelix
