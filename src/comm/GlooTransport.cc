// Gloo data plane of a process group (GlooTransport.h).
#include "comm/GlooTransport.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "base/Error.h"
#include "comm/CommContext.h"
#include "comm/Reduce.h"

namespace dhelix {
namespace {

// Gloo's rendezvous store, served by collective exchanges: each set() all-gathers every rank's
// pair, so get() and wait() find every key already there. All ranks of a group make the same
// sequence of set() calls (connectFullMesh publishes each rank's hostname, then its pair
// addresses; the gets between differ by rank), so the exchanges line up across ranks.
class ExchangeStore final : public gloo::rendezvous::Store {
 public:
  explicit ExchangeStore(const GlooTransport::Exchange& exchange, int size) : exchange_(exchange), size_(size) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    known_[key] = data;
    pending_.emplace_back(key, data);
    round();
  }
  std::vector<char> get(const std::string& key) override {
    auto it = known_.find(key);
    DHX_CHECK(it != known_.end(), CommError, "gloo rendezvous: no rank published '{}'", key);
    return it->second;
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) get(k);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }
  const std::vector<char>* find(const std::string& key) const {
    auto it = known_.find(key);
    return it == known_.end() ? nullptr : &it->second;
  }

 private:
  // Every rank's pending pairs, length-prefixed, padded to the largest blob (one fixed-size all-gather
  // of the sizes, then one of the blobs).
  void round() {
    std::string blob;
    for (const auto& [k, v] : pending_) {
      const uint64_t kl = k.size(), vl = v.size();
      blob.append(reinterpret_cast<const char*>(&kl), 8).append(k);
      blob.append(reinterpret_cast<const char*>(&vl), 8).append(v.data(), v.size());
    }
    pending_.clear();
    uint64_t mine = blob.size();
    std::vector<uint64_t> sizes(static_cast<size_t>(size_));
    exchange_(&mine, sizes.data(), 8);
    const uint64_t width = *std::max_element(sizes.begin(), sizes.end());
    blob.resize(width, '\0');
    std::vector<char> all(width * static_cast<size_t>(size_));
    if (width > 0) exchange_(blob.data(), all.data(), width);
    for (int r = 0; r < size_; ++r) {
      const char* p = all.data() + width * static_cast<size_t>(r);
      const char* end = p + sizes[static_cast<size_t>(r)];
      while (p < end) {
        uint64_t kl, vl;
        std::memcpy(&kl, p, 8);
        std::string k(p + 8, kl);
        p += 8 + kl;
        std::memcpy(&vl, p, 8);
        known_[k] = std::vector<char>(p + 8, p + 8 + vl);
        p += 8 + vl;
      }
    }
  }

  GlooTransport::Exchange exchange_;
  int size_;
  std::map<std::string, std::vector<char>> known_;
  std::vector<std::pair<std::string, std::vector<char>>> pending_;
};

// Who this process is on the network: the machine (boot id) and the network namespace (inode of
// /proc/self/ns/net); ranks alike in both reach each other over loopback.
struct HostId {
  char machine[40] = {};
  uint64_t netns = 0;
  int64_t pid = 0;
};
HostId host_id() {
  HostId h;
  std::string id;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) id = buf;
    std::fclose(f);
  }
  if (id.empty()) {
    char host[64] = {};
    ::gethostname(host, sizeof host - 1);
    id = host;
  }
  std::strncpy(h.machine, id.c_str(), sizeof h.machine - 1);
  struct stat st {};
  h.netns = ::stat("/proc/self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  h.pid = ::getpid();
  return h;
}

std::string first_external_ipv4() {
  std::vector<std::string> addrs;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
      if (!(a->ifa_flags & IFF_UP) || (a->ifa_flags & IFF_LOOPBACK)) continue;
      char text[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
      addrs.push_back(text);
    }
    ::freeifaddrs(list);
  }
  return addrs.empty() ? "127.0.0.1" : addrs.front();
}

// One Gloo TCP device (one event-loop thread) per listening address, shared by the groups.
std::shared_ptr<gloo::transport::Device> device_for(const std::string& host) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<gloo::transport::Device>> devices;
  std::lock_guard lk(mu);
  auto& d = devices[host];
  if (!d) {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    attr.ai_family = AF_INET;
    d = gloo::transport::tcp::CreateDevice(attr);
  }
  return d;
}

// Gloo's reduce function for one dtype and op: c[i] = a[i] op b[i] (c may alias a or b), by
// Reduce.h's combine_into (inout = in op inout; bf16 in f32 with one rounding).
gloo::AllreduceOptions::Func reduce_fn(DType dtype, ReduceOp op) {
  return [dtype, op](void* c, const void* a, const void* b, size_t n) {
    const int64_t k = static_cast<int64_t>(n);
    if (c == a) return combine_into(b, c, k, dtype, op);
    if (c != b) std::memcpy(c, b, n * dtype_size(dtype));
    combine_into(a, c, k, dtype, op);
  };
}

int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

int64_t GlooTransport::piece_elems(size_t esize, int64_t per_rank_multiplier) const {
  const size_t limit = std::max<size_t>(max_message_bytes_ / static_cast<size_t>(per_rank_multiplier), esize);
  return static_cast<int64_t>(limit / esize);
}

GlooTransport::GlooTransport(int rank, int size, std::string what, const Exchange& exchange,
                             const CommOptions& options)
    : rank_(rank),
      size_(size),
      what_(std::move(what)),
      timeout_(std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000))),
      max_message_bytes_(options.max_message_bytes > 0 ? static_cast<size_t>(options.max_message_bytes)
                                                       : size_t{1} << 30) {
  const double timeout_s = options.timeout_s;
  std::vector<HostId> ids(static_cast<size_t>(size_));
  HostId me = host_id();
  exchange(&me, ids.data(), sizeof(HostId));
  const bool one_host = std::all_of(ids.begin(), ids.end(), [&](const HostId& h) {
    return h.netns == me.netns && std::strncmp(h.machine, me.machine, sizeof h.machine) == 0;
  });
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && std::strncmp(ids[r].machine, me.machine, sizeof me.machine) == 0)
      same_machine_pids_.emplace_back(r, ids[r].pid);
  host_ = !options.gloo_host.empty() ? options.gloo_host : one_host ? "127.0.0.1" : first_external_ipv4();
  try {
    auto dev = device_for(host_);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    ctx->setTimeout(timeout_);
    ExchangeStore store(exchange, size_);
    ctx->connectFullMesh(store, dev);
    ctx_ = ctx;
    // Every peer's listening address ("[ip]:port", as Gloo's errors print it): the first of the
    // pair addresses it published (all share its device's socket address).
    for (int r = 0; r < size_; ++r) {
      const std::vector<char>* blob = r == rank_ ? nullptr : store.find(std::to_string(r));
      if (!blob || blob->empty()) continue;
      const size_t one = blob->size() / static_cast<size_t>(size_ - 1);
      const std::string addr = gloo::transport::tcp::Address(std::vector<char>(blob->begin(), blob->begin() + one)).str();
      peer_addresses_.emplace_back(addr.substr(0, addr.rfind(' ')), r);  // str() may append " $seq"
    }
  } catch (const gloo::Exception& e) {
    throw CommError(fmt::format("{}: the gloo mesh did not connect within {:.3g} s (listening on {}): {}", what_,
                                timeout_s, host_, e.what()));
  }
}

GlooTransport::~GlooTransport() = default;

void GlooTransport::check_alive(const char* op) const {
  DHX_CHECK(!failed_, CommError, "{}: {} after an earlier failure on this group: {}", what_, op, failure_);
}

namespace {
// Whether process `pid` of this machine has exited (gone, or a zombie not yet reaped).
bool process_gone(int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::ifstream st(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(st, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}
}  // namespace

std::string GlooTransport::explain(const std::string& gloo_error) const {
  // Which peer failed: a process of this machine that has exited, else the peer whose listening
  // address the error names.
  // A peer's sockets close while its process is still exiting: look for up to ~0.3 s.
  std::vector<int> gone;
  for (int tries = 0; tries < 30 && gone.empty() && !same_machine_pids_.empty(); ++tries) {
    if (tries > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (const auto& [r, pid] : same_machine_pids_)
      if (process_gone(pid)) gone.push_back(r);
  }
  if (!gone.empty())
    return fmt::format("{} (group rank{} {} of {} exited)", gloo_error, gone.size() == 1 ? "" : "s",
                       fmt::join(gone, ", "), what_);
  for (const auto& [addr, r] : peer_addresses_)
    if (const size_t at = gloo_error.find(addr);
        at != std::string::npos && !std::isdigit(static_cast<unsigned char>(gloo_error[at + addr.size()])))
      return fmt::format("{} (that is group rank {} of {})", gloo_error, r, what_);
  return gloo_error;
}

// Runs `body`; a Gloo failure becomes a CommError naming the group and the op, and marks the group
// failed (Gloo's context is unusable after an I/O error or a timeout).
template <typename F>
void GlooTransport::run(const char* op, F&& body) {
  check_alive(op);
  try {
    body();
  } catch (const gloo::Exception& e) {
    failed_ = true;
    const std::string why = explain(e.what());
    failure_ = fmt::format("{} failed: {}", op, why);
    throw CommError(fmt::format("{}: gloo {} failed: {}", what_, op, why));
  }
}

void GlooTransport::all_reduce(void* buf, int64_t n, DType dtype, ReduceOp op) {
  if (size_ == 1 || n == 0) return;
  const size_t es = dtype_size(dtype);
  const int64_t piece = piece_elems(es);
  auto fn = reduce_fn(dtype, op);
  char* p = static_cast<char*>(buf);
  run("all_reduce", [&] {
    for (int64_t at = 0; at < n; at += piece) {
      const size_t k = static_cast<size_t>(std::min(piece, n - at));
      gloo::AllreduceOptions o(ctx_);
      void* q = p + static_cast<size_t>(at) * es;
      switch (dtype) {  // the element type sets Gloo's element size; the function does the arithmetic
        case DType::kF32: o.setOutput(static_cast<float*>(q), k); break;
        case DType::kF64: o.setOutput(static_cast<double*>(q), k); break;
        case DType::kI32: o.setOutput(static_cast<int32_t*>(q), k); break;
        case DType::kI64: o.setOutput(static_cast<int64_t*>(q), k); break;
        case DType::kU16:
        case DType::kBF16: o.setOutput(static_cast<uint16_t*>(q), k); break;
      }
      o.setReduceFunction(fn);
      o.setTag(++tag_);
      o.setTimeout(timeout_);
      o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      gloo::allreduce(o);
    }
  });
}

void GlooTransport::reduce_scatter(const void* in, void* out, int64_t n, DType dtype, ReduceOp op) {
  const size_t es = dtype_size(dtype), bytes = static_cast<size_t>(n) * es;
  if (size_ == 1) {
    if (out != in) std::memmove(out, in, bytes);
    return;
  }
  if (n == 0) return;
  // A ring over pieces of at most the message limit: step s sends the partial of block
  // (rank - s - 1) to the right and receives the partial of block (rank - s - 2) from the left,
  // adding this rank's own contribution; after size - 1 steps the partial held is block `rank`,
  // summed in ring order starting at rank + 1 -- the same order for a block on every run. A step's
  // transfer goes in segments of at most 4 MiB, all posted at once, each added as it arrives, so
  // the additions run under the rest of the transfer.
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  const int right = mod(rank_ + 1, size_), left = mod(rank_ - 1, size_);
  const int64_t piece = piece_elems(es);
  const int64_t seg = std::max<int64_t>(1, std::min<int64_t>(piece, static_cast<int64_t>((4u << 20) / es)));
  // The partials live in two scratch halves kept across calls (no fresh, zero-filled pages per
  // op); the last step receives straight into `out` unless `out` lies inside `in`.
  const auto at_of = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const bool direct = at_of(dst) + bytes <= at_of(src) || at_of(dst) >= at_of(src) + static_cast<size_t>(size_) * bytes;
  run("reduce_scatter", [&] {
    for (int64_t at = 0; at < n; at += piece) {
      const int64_t k = std::min(piece, n - at);
      const size_t kb = static_cast<size_t>(k) * es, off = static_cast<size_t>(at) * es;
      if (scratch_.size() < 2 * kb) scratch_.resize(2 * kb);
      char* acc = scratch_.data();
      char* recv = scratch_.data() + kb;
      char* send_from = const_cast<char*>(src + static_cast<size_t>(mod(rank_ - 1, size_)) * bytes + off);
      const uint32_t tag = ++tag_;
      for (int s = 0; s < size_ - 1; ++s) {
        const char* mine = src + static_cast<size_t>(mod(rank_ - s - 2, size_)) * bytes + off;
        if (direct && s == size_ - 2) recv = dst + off;
        std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends, recvs;
        for (int64_t e = 0, q = 0; e < k; e += seg, ++q) {
          const size_t b0 = static_cast<size_t>(e) * es, len = static_cast<size_t>(std::min(seg, k - e)) * es;
          const uint64_t slot = gloo::Slot::build(0x20, tag) + static_cast<uint8_t>((s * 37 + q) % 251);
          recvs.push_back(ctx_->createUnboundBuffer(recv + b0, len));
          recvs.back()->recv(left, slot);
          sends.push_back(ctx_->createUnboundBuffer(send_from + b0, len));
          sends.back()->send(right, slot);
        }
        for (int64_t e = 0, q = 0; e < k; e += seg, ++q) {
          recvs[static_cast<size_t>(q)]->waitRecv(timeout_);
          const size_t b0 = static_cast<size_t>(e) * es;
          combine_into(mine + b0, recv + b0, std::min(seg, k - e), dtype, op);
        }
        for (auto& x : sends) x->waitSend(timeout_);
        std::swap(acc, recv);
        send_from = acc;
      }
      if (acc != dst + off) std::memcpy(dst + off, acc, kb);
    }
  });
}

void GlooTransport::all_gather(const void* in, void* out, int64_t n, DType dtype) {
  const size_t es = dtype_size(dtype), bytes = static_cast<size_t>(n) * es;
  char* o = static_cast<char*>(out);
  if (n > 0 && o + static_cast<size_t>(rank_) * bytes != in) std::memmove(o + static_cast<size_t>(rank_) * bytes, in, bytes);
  if (size_ == 1 || n == 0) return;
  // A ring on unbound buffers straight into `out` (Gloo's own all-gather ran at ~0.6-0.7 of the
  // link's rate here, its ring all-reduce at ~0.95): step s forwards block (rank - s) to the right
  // and receives block (rank - s - 1) from the left, each block in pieces within the message limit,
  // all of a step's pieces posted at once so the link stays busy.
  const int right = mod(rank_ + 1, size_), left = mod(rank_ - 1, size_);
  const size_t piece = static_cast<size_t>(piece_elems(es)) * es;
  run("all_gather", [&] {
    const uint32_t tag = ++tag_;
    for (int s = 0; s < size_ - 1; ++s) {
      char* send_block = o + static_cast<size_t>(mod(rank_ - s, size_)) * bytes;
      char* recv_block = o + static_cast<size_t>(mod(rank_ - s - 1, size_)) * bytes;
      std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends, recvs;
      for (size_t at = 0, k = 0; at < bytes; at += piece, ++k) {
        const size_t len = std::min(piece, bytes - at);
        const uint64_t slot = gloo::Slot::build(0x21, tag) + static_cast<uint8_t>((s * 37 + k) % 251);
        recvs.push_back(ctx_->createUnboundBuffer(recv_block + at, len));
        recvs.back()->recv(left, slot);
        sends.push_back(ctx_->createUnboundBuffer(send_block + at, len));
        sends.back()->send(right, slot);
      }
      for (auto& r : recvs) r->waitRecv(timeout_);
      for (auto& x : sends) x->waitSend(timeout_);
    }
  });
}

void GlooTransport::all_to_all(const void* in, void* out, int64_t n, DType dtype) {
  std::vector<int64_t> counts(static_cast<size_t>(size_), n);
  all_to_all_v(in, counts, out, counts, dtype);
}

void GlooTransport::all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                                 const std::vector<int64_t>& recv_counts, DType dtype) {
  DHX_CHECK(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(recv_counts.size()) == size_,
            InternalError, "{}: all_to_all_v needs {} counts each way", what_, size_);
  const size_t es = dtype_size(dtype);
  int64_t total_in = 0, total_out = 0;
  for (int64_t c : send_counts) total_in += c;
  for (int64_t c : recv_counts) total_out += c;
  if (size_ == 1) {
    if (total_in > 0 && out != in) std::memmove(out, in, static_cast<size_t>(total_in) * es);
    return;
  }
  // Pieces: round k moves elements [k*piece, (k+1)*piece) of every block, so no message exceeds
  // the limit; blocks shorter than that send nothing more.
  int64_t longest = 0;
  for (int r = 0; r < size_; ++r) longest = std::max({longest, send_counts[r], recv_counts[r]});
  const int64_t piece = piece_elems(es, size_);
  std::vector<int64_t> sbase(static_cast<size_t>(size_)), rbase(static_cast<size_t>(size_));
  for (int r = 1; r < size_; ++r) {
    sbase[r] = sbase[r - 1] + send_counts[r - 1];
    rbase[r] = rbase[r - 1] + recv_counts[r - 1];
  }
  std::vector<char> sbuf, rbuf;
  run("all_to_all", [&] {
    for (int64_t at = 0; at < std::max<int64_t>(longest, 1); at += piece) {
      std::vector<int64_t> sc(static_cast<size_t>(size_)), rc(static_cast<size_t>(size_));
      int64_t st = 0, rt = 0;
      for (int r = 0; r < size_; ++r) {
        sc[r] = std::clamp<int64_t>(send_counts[r] - at, 0, piece);
        rc[r] = std::clamp<int64_t>(recv_counts[r] - at, 0, piece);
        st += sc[r], rt += rc[r];
      }
      sbuf.resize(static_cast<size_t>(std::max<int64_t>(st, 1)) * es);
      rbuf.resize(static_cast<size_t>(std::max<int64_t>(rt, 1)) * es);
      size_t pos = 0;
      for (int r = 0; r < size_; ++r) {
        std::memcpy(sbuf.data() + pos, static_cast<const char*>(in) + static_cast<size_t>(sbase[r] + at) * es,
                    static_cast<size_t>(sc[r]) * es);
        pos += static_cast<size_t>(sc[r]) * es;
      }
      gloo::AlltoallvOptions opt(ctx_);
      std::vector<int64_t> sbytes(sc), rbytes(rc);  // moved as bytes: any dtype
      for (auto& x : sbytes) x *= static_cast<int64_t>(es);
      for (auto& x : rbytes) x *= static_cast<int64_t>(es);
      opt.setInput(sbuf.data(), sbytes);
      opt.setOutput(rbuf.data(), rbytes);
      opt.setTag(++tag_);
      opt.setTimeout(timeout_);
      gloo::alltoallv(opt);
      pos = 0;
      for (int r = 0; r < size_; ++r) {
        std::memcpy(static_cast<char*>(out) + static_cast<size_t>(rbase[r] + at) * es, rbuf.data() + pos,
                    static_cast<size_t>(rc[r]) * es);
        pos += static_cast<size_t>(rc[r]) * es;
      }
    }
  });
}

void GlooTransport::broadcast(void* buf, int64_t n, DType dtype, int root) {
  if (size_ == 1 || n == 0) return;
  const size_t es = dtype_size(dtype);
  const int64_t piece = piece_elems(es);
  char* p = static_cast<char*>(buf);
  run("broadcast", [&] {
    for (int64_t at = 0; at < n; at += piece) {
      const size_t kb = static_cast<size_t>(std::min(piece, n - at)) * es;
      gloo::BroadcastOptions opt(ctx_);
      if (rank_ == root) opt.setInput(p + static_cast<size_t>(at) * es, kb);
      opt.setOutput(p + static_cast<size_t>(at) * es, kb);
      opt.setRoot(root);
      opt.setTag(++tag_);
      opt.setTimeout(timeout_);
      gloo::broadcast(opt);
    }
  });
}

void GlooTransport::barrier() {
  if (size_ == 1) return;
  run("barrier", [&] {
    gloo::BarrierOptions opt(ctx_);
    opt.setTag(++tag_);
    opt.setTimeout(timeout_);
    gloo::barrier(opt);
  });
}

std::unique_ptr<gloo::transport::UnboundBuffer> GlooTransport::post_send(const void* buf, size_t bytes, int peer,
                                                                         uint64_t slot) {
  std::unique_ptr<gloo::transport::UnboundBuffer> b;
  run("send", [&] {
    b = ctx_->createUnboundBuffer(const_cast<void*>(buf), bytes);
    b->send(peer, slot);
  });
  return b;
}

std::unique_ptr<gloo::transport::UnboundBuffer> GlooTransport::post_recv(void* buf, size_t bytes, int peer,
                                                                         uint64_t slot) {
  std::unique_ptr<gloo::transport::UnboundBuffer> b;
  run("recv", [&] {
    b = ctx_->createUnboundBuffer(buf, bytes);
    b->recv(peer, slot);
  });
  return b;
}

}  // namespace dhelix
