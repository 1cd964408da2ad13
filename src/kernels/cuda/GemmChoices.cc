// The GEMM algorithm choices file (GemmChoices.h).
#include "kernels/cuda/GemmChoices.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "base/Error.h"
#include "base/Files.h"

namespace dhelix::cuda {

namespace {

constexpr const char* kFormat = "dhelix-gemm-choices";
constexpr int kVersion = 1;
constexpr const char* kEpilogues[] = {"none", "bias", "gelu_aux", "gelu_aux_bias", "dgelu"};

using json = nlohmann::json;

// One field of `j` as T, ConfigError naming the file, the place and the field when it is missing
// or of another type.
template <typename T> T field(const json& j, const char* name, const std::string& where) {
  DHX_CHECK(j.is_object() && j.contains(name), ConfigError, "{}: '{}' is missing", where, name);
  try {
    return j.at(name).get<T>();
  } catch (const json::exception&) {
    throw ConfigError(fmt::format("{}: '{}' is {}, not a {}", where, name, j.at(name).dump(),
                                  std::is_same_v<T, bool> ? "boolean" : std::is_same_v<T, std::string> ? "string"
                                                                                                         : "number"));
  }
}

bool power_of_two_or_zero(int a) { return a == 0 || (a > 0 && a <= 256 && (a & (a - 1)) == 0); }

}  // namespace

bool known_epilogue(const std::string& name) {
  for (const char* e : kEpilogues)
    if (name == e) return true;
  return false;
}

GemmChoices load_gemm_choices(const std::string& path) {
  const std::string text = read_file(path);
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  DHX_CHECK(!j.is_discarded() && j.is_object(), ConfigError,
            "GEMM choices file '{}' is not a JSON object (training.gemm_choices: remove it to choose anew)", path);
  const std::string format = field<std::string>(j, "format", path);
  DHX_CHECK(format == kFormat, ConfigError, "GEMM choices file '{}': format is '{}', expected '{}'", path, format,
            kFormat);
  const int version = field<int>(j, "version", path);
  DHX_CHECK(version == kVersion, ConfigError, "GEMM choices file '{}': version {} (this build reads version {})", path,
            version, kVersion);
  GemmChoices c;
  c.device = field<std::string>(j, "device", path);
  c.sms = field<int>(j, "sms", path);
  c.sm_target = field<int>(j, "sm_target", path);
  c.cublaslt_version = field<int64_t>(j, "cublaslt_version", path);
  DHX_CHECK(j.contains("choices") && j["choices"].is_array(), ConfigError,
            "GEMM choices file '{}': 'choices' must be an array", path);
  for (size_t i = 0; i < j["choices"].size(); ++i) {
    const json& e = j["choices"][i];
    const std::string where = fmt::format("GEMM choices file '{}', choice {}", path, i);
    GemmChoice g;
    g.m = field<int64_t>(e, "m", where), g.n = field<int64_t>(e, "n", where), g.k = field<int64_t>(e, "k", where);
    g.lda = field<int64_t>(e, "lda", where), g.ldb = field<int64_t>(e, "ldb", where);
    g.ldc = field<int64_t>(e, "ldc", where);
    g.trans_a = field<bool>(e, "trans_a", where), g.trans_b = field<bool>(e, "trans_b", where);
    g.c_f32 = field<bool>(e, "c_f32", where), g.beta0 = field<bool>(e, "beta0", where);
    g.epilogue = field<std::string>(e, "epilogue", where);
    DHX_CHECK(known_epilogue(g.epilogue), ConfigError, "{}: epilogue '{}' is not one of none, bias, gelu_aux, "
              "gelu_aux_bias, dgelu", where, g.epilogue);
    DHX_CHECK(e.contains("align") && e["align"].is_array() && e["align"].size() == 6, ConfigError,
              "{}: 'align' must be the 6 alignments [a, b, c, d, aux, bias]", where);
    int* al[] = {&g.align_a, &g.align_b, &g.align_c, &g.align_d, &g.align_aux, &g.align_bias};
    for (size_t a = 0; a < 6; ++a) {
      DHX_CHECK(e["align"][a].is_number_integer(), ConfigError, "{}: align[{}] is {}, not a whole number", where, a,
                e["align"][a].dump());
      *al[a] = e["align"][a].get<int>();
      DHX_CHECK(power_of_two_or_zero(*al[a]), ConfigError, "{}: align[{}] = {} is not 0 or a power of two up to 256",
                where, a, *al[a]);
    }
    if (e.contains("batch")) {
      g.batch = field<int>(e, "batch", where);
      DHX_CHECK(g.batch >= 2, ConfigError, "{}: batch = {} (a batch entry has at least 2 problems; one problem has "
                "no 'batch')", where, g.batch);
      DHX_CHECK(e.contains("strides") && e["strides"].is_array() && e["strides"].size() == 3, ConfigError,
                "{}: a batch needs 'strides', the 3 strides [a, b, c] in elements", where);
      int64_t* st[] = {&g.stride_a, &g.stride_b, &g.stride_c};
      for (size_t a = 0; a < 3; ++a) {
        DHX_CHECK(e["strides"][a].is_number_integer() && e["strides"][a].get<int64_t>() >= 0, ConfigError,
                  "{}: strides[{}] is {}, not a whole number >= 0", where, a, e["strides"][a].dump());
        *st[a] = e["strides"][a].get<int64_t>();
      }
    } else {
      DHX_CHECK(!e.contains("strides"), ConfigError, "{}: 'strides' without 'batch'", where);
    }
    g.answer = field<int>(e, "answer", where), g.split = field<int>(e, "split", where);
    g.ms = field<double>(e, "ms", where);
    DHX_CHECK(g.m > 0 && g.n > 0 && g.k > 0 && g.lda > 0 && g.ldb > 0 && g.ldc > 0, ConfigError,
              "{}: sizes m={} n={} k={} and strides lda={} ldb={} ldc={} must be positive", where, g.m, g.n, g.k,
              g.lda, g.ldb, g.ldc);
    DHX_CHECK(g.answer >= 0 && g.split >= 1 && g.ms >= 0, ConfigError,
              "{}: answer={} split={} ms={} (need answer >= 0, split >= 1, ms >= 0)", where, g.answer, g.split, g.ms);
    c.choices.push_back(std::move(g));
  }
  return c;
}

void save_gemm_choices(const std::string& path, const GemmChoices& c) {
  json j = {{"format", kFormat},
            {"version", kVersion},
            {"device", c.device},
            {"sms", c.sms},
            {"sm_target", c.sm_target},
            {"cublaslt_version", c.cublaslt_version},
            {"choices", json::array()}};
  for (const GemmChoice& g : c.choices) {
    json e = {{"m", g.m}, {"n", g.n}, {"k", g.k}, {"lda", g.lda}, {"ldb", g.ldb}, {"ldc", g.ldc},
              {"trans_a", g.trans_a}, {"trans_b", g.trans_b}, {"c_f32", g.c_f32}, {"beta0", g.beta0},
              {"epilogue", g.epilogue},
              {"align", {g.align_a, g.align_b, g.align_c, g.align_d, g.align_aux, g.align_bias}},
              {"answer", g.answer}, {"split", g.split}, {"ms", g.ms}};
    if (g.batch > 1) {
      e["batch"] = g.batch;
      e["strides"] = {g.stride_a, g.stride_b, g.stride_c};
    }
    j["choices"].push_back(std::move(e));
  }
  write_file_atomic(path, j.dump(1) + "\n");
}

std::string gemm_choices_mismatch(const GemmChoices& file, const GemmChoices& here) {
  auto where = [](const GemmChoices& c) {
    return fmt::format("{} ({} SMs{}), cuBLASLt {}", c.device, c.sms,
                       c.sm_target > 0 ? fmt::format(", planned for {}", c.sm_target) : "", c.cublaslt_version);
  };
  if (file.device == here.device && file.sms == here.sms && file.sm_target == here.sm_target &&
      file.cublaslt_version == here.cublaslt_version)
    return "";
  return fmt::format("made on {}, this is {}", where(file), where(here));
}

}  // namespace dhelix::cuda
