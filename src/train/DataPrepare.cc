// Corpus -> tokenizer -> MMIDIDX dataset, each step skipped when its output is present and newer.
#include "train/DataPrepare.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "base/Error.h"
#include "base/Files.h"
#include "base/Log.h"
#include "base/Signals.h"
#include "train/IndexedDataset.h"
#include "train/Tokenizer.h"

namespace dhelix {
namespace {

namespace fs = std::filesystem;

// Modification time in nanoseconds; -1 when absent.
int64_t mtime_ns(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

std::string find_in_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    std::string p = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

void make_parent_dirs(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  DHX_CHECK(!ec, IoError, "cannot create directory '{}': {}", parent.string(), ec.message());
}

std::string mb(int64_t bytes) { return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6); }

}  // namespace

std::string kjv_text_from_bible_program() {
  std::string bible = find_in_path("bible");
  DHX_CHECK(!bible.empty(), IoError,
            "the `bible` program is not installed, so the KJV corpus cannot be produced; install the Debian "
            "packages bible-kjv and bible-kjv-text (scripts/setup --no-build does), or set data.corpus to an "
            "existing text file");
  std::string cmd = bible + " -f 'Gen1:1-Rev22:21'";
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  DHX_CHECK(pipe != nullptr, IoError, "cannot run `{}`", cmd);
  std::string raw;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) raw.append(buf, n);
  int rc = ::pclose(pipe);
  DHX_CHECK(rc == 0 && !raw.empty(), IoError, "`{}` failed (status {}, {} bytes of output)", cmd, rc, raw.size());
  // Equivalent of sed 's/^[^ ]* //': drop everything up to and including the first space.
  std::string out;
  out.reserve(raw.size());
  std::istringstream in(raw);
  std::string line;
  while (std::getline(in, line)) {
    size_t sp = line.find(' ');
    out += sp == std::string::npos ? line : line.substr(sp + 1);
    out += '\n';
  }
  return out;
}

PrepareReport prepare_data(const RunConfig& cfg, const std::function<void(const std::string&)>& say_fn) {
  auto say = [&](const std::string& s) { say_fn ? say_fn(s) : log_info("{}", s); };
  const DataConfig& d = cfg.data;
  PrepareReport report;

  // 1. Corpus.
  if (file_exists(d.corpus)) {
    say(fmt::format("corpus {}: present ({})", d.corpus, mb(static_cast<int64_t>(fs::file_size(d.corpus)))));
  } else {
    say(fmt::format("corpus {}: missing; dumping the King James Bible with `bible -f 'Gen1:1-Rev22:21'`", d.corpus));
    std::string text = kjv_text_from_bible_program();
    make_parent_dirs(d.corpus);
    stop_point(fmt::format("data prepare (dumping the corpus; {} not written)", d.corpus));
    write_file_atomic(d.corpus, text);
    say(fmt::format("corpus {}: wrote {}", d.corpus, mb(static_cast<int64_t>(text.size()))));
    report.made_corpus = true;
  }

  // 2. Tokenizer: <prefix>.model where tokenizer = "<prefix>.model".
  const std::string& tok_path = d.tokenizer;
  const int64_t vocab = cfg.model.vocab_size;
  if (!file_exists(tok_path) || mtime_ns(tok_path) < mtime_ns(d.corpus)) {
    const std::string suffix = ".model";
    DHX_CHECK(tok_path.size() > suffix.size() && tok_path.ends_with(suffix), ConfigError,
              "data.tokenizer='{}' must end in .model (SentencePiece writes <prefix>.model)", tok_path);
    DHX_CHECK(vocab <= 65535 * 16, ConfigError, "model.vocab_size={} is too large to train here", vocab);
    say(fmt::format("tokenizer {}: training a {}-piece BPE on {}", tok_path, vocab, d.corpus));
    make_parent_dirs(tok_path);
    stop_point(fmt::format("data prepare (before training the tokenizer {})", tok_path));
    train_bpe_tokenizer(d.corpus, tok_path.substr(0, tok_path.size() - suffix.size()), vocab);
    report.trained_tokenizer = true;
  } else {
    say(fmt::format("tokenizer {}: present", tok_path));
  }
  Tokenizer tok(tok_path);
  DHX_CHECK(tok.vocab_size() == vocab, ConfigError,
            "tokenizer '{}' has {} pieces but model.vocab_size={}; delete it (and {}.bin/.idx) to retrain, or set "
            "model.vocab_size={}", tok_path, tok.vocab_size(), vocab, d.prefix, tok.vocab_size());

  // 3. Dataset.
  const std::string bin = d.prefix + ".bin", idx = d.prefix + ".idx";
  const int64_t inputs_time = std::max(mtime_ns(d.corpus), mtime_ns(tok_path));
  if (file_exists(bin) && file_exists(idx) && mtime_ns(bin) >= inputs_time && mtime_ns(idx) >= inputs_time) {
    IndexedDataset ds(d.prefix);  // validates it
    report.documents = ds.num_documents();
    report.tokens = ds.num_tokens();
    say(fmt::format("dataset {}.bin/.idx: present ({} documents, {} tokens)", d.prefix, report.documents,
                    report.tokens));
    return report;
  }
  say(fmt::format("dataset {}.bin/.idx: tokenizing {} (one document per line, EOS-terminated)", d.prefix, d.corpus));
  make_parent_dirs(d.prefix);
  const IndexDType dtype = vocab <= 65536 ? IndexDType::kU16 : IndexDType::kI32;
  IndexedDatasetWriter writer(d.prefix, dtype);
  std::istringstream in(read_file(d.corpus));
  std::string line;
  while (std::getline(in, line)) {
    // The writer's temporary .bin is removed as the stop unwinds; the dataset is not written.
    if (stop_signal() != 0)
      stop_point(fmt::format("data prepare (tokenizing, {} documents done; {}.bin/.idx not written)", report.documents,
                             d.prefix));
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are not documents
    std::vector<int32_t> ids = tok.encode(line);
    if (tok.eos_id() >= 0) ids.push_back(tok.eos_id());
    writer.add_document(ids);
    ++report.documents;
    report.tokens += static_cast<int64_t>(ids.size());
  }
  DHX_CHECK(report.documents > 0, IoError, "corpus '{}' has no non-blank lines", d.corpus);
  writer.finish();
  report.tokenized = true;
  say(fmt::format("dataset {}.bin/.idx: wrote {} documents, {} tokens (dtype {})", d.prefix, report.documents,
                  report.tokens, dtype == IndexDType::kU16 ? "u16" : "i32"));
  return report;
}

}  // namespace dhelix
