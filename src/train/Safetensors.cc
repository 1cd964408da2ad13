// safetensors reader/writer (format in Safetensors.h).
#include "train/Safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/Checksum.h"
#include "base/Error.h"
#include "base/Files.h"

namespace dhelix {
namespace {

const char* st_dtype(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF64: return "F64";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU16: return "U16";
  }
  return "?";
}

bool parse_st_dtype(const std::string& s, DType& d) {
  for (DType c : {DType::kF32, DType::kBF16, DType::kF64, DType::kI32, DType::kI64, DType::kU16})
    if (s == st_dtype(c)) return d = c, true;
  return false;
}

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    DHX_CHECK(w >= 0, IoError, "write to '{}' failed: {}", path, std::strerror(errno));
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void read_exact(int fd, void* p, size_t n, uint64_t off, const std::string& path) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::pread(fd, c, n, static_cast<off_t>(off));
    DHX_CHECK(r > 0, IoError, "read of '{}' at byte {} failed: {}", path, off, r == 0 ? "end of file" : std::strerror(errno));
    c += r, off += static_cast<uint64_t>(r), n -= static_cast<size_t>(r);
  }
}

}  // namespace

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

void write_safetensors(const std::string& path, const NamedTensors& tensors, const TensorMetadata& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  TensorMetadata meta = metadata;
  for (const auto& [name, t] : tensors)
    if (t.defined()) meta[kChecksumKeyPrefix + name] = crc32c_hex(crc32c(t.raw(), t.nbytes()));
  if (!meta.empty()) header["__metadata__"] = meta;
  uint64_t offset = 0;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    DHX_CHECK(name != "__metadata__" && seen.insert(name).second, InternalError,
              "safetensors '{}': tensor name '{}' is reserved or repeated", path, name);
    DHX_CHECK(t.defined(), InternalError, "safetensors '{}': tensor '{}' is undefined", path, name);
    header[name] = {{"dtype", st_dtype(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  DHX_CHECK(fd >= 0, IoError, "cannot create '{}': {}", tmp, std::strerror(errno));
  try {
    write_all(fd, &n, 8, tmp);
    write_all(fd, text.data(), text.size(), tmp);
    for (const auto& [name, t] : tensors) write_all(fd, t.raw(), t.nbytes(), tmp);
    DHX_CHECK(::fsync(fd) == 0, IoError, "fsync of '{}' failed: {}", tmp, std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw IoError(fmt::format("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(e)));
  }
}

SafetensorsFile read_safetensors(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  DHX_CHECK(fd >= 0, IoError, "cannot open safetensors file '{}': {}", path, std::strerror(errno));
  struct Closer { int fd; ~Closer() { ::close(fd); } } closer{fd};
  const off_t end = ::lseek(fd, 0, SEEK_END);
  DHX_CHECK(end >= 8, IoError, "'{}' is truncated: {} bytes, fewer than the 8-byte header length", path, end);
  const uint64_t file_bytes = static_cast<uint64_t>(end);
  uint64_t n = 0;
  read_exact(fd, &n, 8, 0, path);
  DHX_CHECK(n <= file_bytes - 8, IoError, "'{}': header length {} exceeds the {} bytes after the length field", path,
            n, file_bytes - 8);
  std::string text(n, '\0');
  read_exact(fd, text.data(), n, 8, path);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(fmt::format("'{}': header is not valid JSON: {}", path, e.what()));
  }
  DHX_CHECK(header.is_object(), IoError, "'{}': header is not a JSON object", path);
  const uint64_t data_start = 8 + n, data_bytes = file_bytes - data_start;

  SafetensorsFile out;
  std::map<std::string, std::string> checksums;  // tensor name -> crc32c hex
  struct Entry { uint64_t begin, end; std::string name; DType dtype; Shape shape; };
  std::vector<Entry> entries;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      DHX_CHECK(v.is_object(), IoError, "'{}': __metadata__ is not an object", path);
      for (const auto& [k, s] : v.items()) {
        DHX_CHECK(s.is_string(), IoError, "'{}': __metadata__['{}'] is not a string", path, k);
        if (k.rfind(kChecksumKeyPrefix, 0) == 0) checksums[k.substr(std::strlen(kChecksumKeyPrefix))] = s.get<std::string>();
        else out.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    Entry e{0, 0, name, DType::kF32, {}};
    try {
      DHX_CHECK(parse_st_dtype(v.at("dtype").get<std::string>(), e.dtype), IoError,
                "'{}': tensor '{}' has unsupported dtype {}", path, name, v.at("dtype").dump());
      // Integers only: nlohmann's get<int64_t> / get<uint64_t> of a float such as 1e30 is undefined.
      auto integers = [](const nlohmann::json& a) {
        return a.is_array() && std::all_of(a.begin(), a.end(), [](const nlohmann::json& x) { return x.is_number_integer(); });
      };
      DHX_CHECK(integers(v.at("shape")) && integers(v.at("data_offsets")), IoError,
                "'{}': tensor '{}' has a shape or data_offsets that is not a list of integers: {}", path, name, v.dump());
      e.shape = v.at("shape").get<Shape>();
      auto offs = v.at("data_offsets").get<std::vector<uint64_t>>();
      DHX_CHECK(offs.size() == 2, IoError, "'{}': tensor '{}' has data_offsets {}", path, name, v.at("data_offsets").dump());
      e.begin = offs[0], e.end = offs[1];
    } catch (const nlohmann::json::exception& ex) {
      throw IoError(fmt::format("'{}': tensor '{}' has a malformed entry {}: {}", path, name, v.dump(), ex.what()));
    }
    for (int64_t d : e.shape)
      DHX_CHECK(d >= 0 && d < (int64_t{1} << 40), IoError, "'{}': tensor '{}' has shape {}", path, name, shape_str(e.shape));
    DHX_CHECK(e.begin <= e.end && e.end <= data_bytes, IoError,
              "'{}': tensor '{}' has data_offsets [{}, {}] outside the {}-byte data section", path, name, e.begin, e.end,
              data_bytes);
    // Elements and bytes with overflow checks: shape [2^32, 2^32] wrapped to 0 elements and passed as 0 bytes.
    int64_t numel = 1;
    uint64_t need = 0;
    bool wraps = false;
    for (int64_t d : e.shape) wraps |= __builtin_mul_overflow(numel, d, &numel);
    wraps |= __builtin_mul_overflow(static_cast<uint64_t>(numel), uint64_t{dtype_size(e.dtype)}, &need);
    DHX_CHECK(!wraps, IoError, "'{}': tensor '{}' has shape {}, whose size overflows 64 bits", path, name,
              shape_str(e.shape));
    DHX_CHECK(e.end - e.begin == need, IoError,
              "'{}': tensor '{}' is {} {} = {} bytes but its data_offsets span {} bytes", path, name,
              st_dtype(e.dtype), shape_str(e.shape), need, e.end - e.begin);
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t expect = 0;
  for (const Entry& e : entries) {
    DHX_CHECK(e.begin == expect, IoError, "'{}': tensor '{}' starts at data byte {}, expected {} ({})", path, e.name,
              e.begin, expect, e.begin < expect ? "it overlaps the previous tensor" : "there is a gap");
    expect = e.end;
  }
  DHX_CHECK(expect == data_bytes, IoError, "'{}': tensors cover {} data bytes but the file holds {}", path, expect,
            data_bytes);
  for (const auto& [name, crc] : checksums)
    DHX_CHECK(std::any_of(entries.begin(), entries.end(), [&n = name](const Entry& e) { return e.name == n; }), IoError,
              "'{}': __metadata__ has a checksum for tensor '{}', which the file does not hold", path, name);
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    read_exact(fd, t.raw(), t.nbytes(), data_start + e.begin, path);
    auto it = checksums.find(e.name);
    if (it != checksums.end()) {
      const std::string got = crc32c_hex(crc32c(t.raw(), t.nbytes()));
      DHX_CHECK(got == it->second, IoError,
                "'{}': tensor '{}' fails its checksum (crc32c {} stored at save, {} read now): the file is corrupt; "
                "use an earlier checkpoint",
                path, e.name, it->second, got);
      ++out.checksummed;
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace dhelix
