// File helpers: whole-file reads, and atomic writes (write to a temporary in the same
// directory, fsync, rename) so a crash never leaves a half-written file under the real name.
#pragma once
#include <string>
#include <string_view>

namespace dhelix {

// Reads a whole file; throws IoError naming the path when it cannot.
std::string read_file(const std::string& path);

// Writes `data` to `path` atomically (tmp + fsync + rename). Throws IoError.
void write_file_atomic(const std::string& path, std::string_view data);

bool file_exists(const std::string& path);

}  // namespace dhelix
