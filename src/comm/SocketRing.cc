// The ring's set-up (listen, exchange endpoints, connect right, accept left) and its three
// collectives over non-blocking sockets waited on with poll().
#include "comm/SocketRing.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "base/Clock.h"
#include "base/Error.h"
#include "comm/Reduce.h"

namespace dhelix {

CommTransport comm_transport_from_env() {
  const char* v = std::getenv("DHELIX_COMM_TRANSPORT");
  if (!v || !*v || std::strcmp(v, "socket") == 0) return CommTransport::kSocket;
  if (std::strcmp(v, "mpi") == 0) return CommTransport::kMpi;
  throw ConfigError(fmt::format("DHELIX_COMM_TRANSPORT='{}' must be socket or mpi (hint: unset it for socket)", v));
}

namespace {

constexpr uint32_t kHelloMagic = 0x64686c78;  // "dhlx"
constexpr int kMaxAddrs = 16;

// What a rank publishes about itself: where it listens, and enough to tell whether a peer shares
// its network namespace (then it is reached over loopback, which every namespace has).
struct Endpoint {
  char machine[48];   // boot id: same kernel
  uint64_t netns;     // inode of /proc/self/ns/net: same network namespace
  uint16_t port;
  uint16_t n_addrs;
  uint32_t addrs[kMaxAddrs];  // IPv4, network order, non-loopback interfaces that are up
};

std::string errno_text(const char* what) { return fmt::format("{}: {}", what, std::strerror(errno)); }

Endpoint local_endpoint(uint16_t port) {
  Endpoint e{};
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!(boot >> id)) {
    char host[64] = {};
    ::gethostname(host, sizeof host - 1);
    id = host;
  }
  std::strncpy(e.machine, id.c_str(), sizeof e.machine - 1);
  struct stat st{};
  e.netns = ::stat("/proc/self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  e.port = port;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a && e.n_addrs < kMaxAddrs; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
      if (!(a->ifa_flags & IFF_UP) || (a->ifa_flags & IFF_LOOPBACK)) continue;
      e.addrs[e.n_addrs++] = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr;
    }
    ::freeifaddrs(list);
  }
  return e;
}

void set_nonblocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

int remaining_ms(double deadline) { return std::max(0, static_cast<int>((deadline - now_seconds()) * 1e3)); }

// Blocking-with-deadline full transfer, for the hello messages.
bool io_all(int fd, void* buf, size_t n, bool send, double deadline) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    pollfd pfd{fd, static_cast<short>(send ? POLLOUT : POLLIN), 0};
    if (::poll(&pfd, 1, remaining_ms(deadline)) <= 0) return false;
    ssize_t k = send ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (k <= 0) return false;
    p += k, n -= static_cast<size_t>(k);
  }
  return true;
}

// Connects to ip:port before the deadline; -1 on failure (reason in *why).
int connect_to(uint32_t ip, uint16_t port, double deadline, std::string* why) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = errno_text("socket");
    return -1;
  }
  set_nonblocking(fd, true);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = ip;
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd pfd{fd, POLLOUT, 0};
    int err = ETIMEDOUT;
    if (::poll(&pfd, 1, std::min(remaining_ms(deadline), 2000)) > 0) {
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    *why = errno_text("connect");
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string ip_text(uint32_t ip) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &ip, text, sizeof text);
  return text;
}

// Block c of n elements split into `parts` nearly equal blocks: [begin, begin + len).
struct Block {
  int64_t begin, len;
};
Block block_of(int64_t n, int parts, int c) {
  int64_t base = n / parts, rem = n % parts;
  return Block{c * base + std::min<int64_t>(c, rem), base + (c < rem ? 1 : 0)};
}

int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

SocketRing::SocketRing(int rank, int size, std::string what,
                       const std::function<void(const void*, void*, size_t)>& exchange, double connect_timeout_s)
    : rank_(rank), size_(size), what_(std::move(what)) {
  DHX_ASSERT(size >= 2 && rank >= 0 && rank < size, "SocketRing rank {} of {}", rank, size);
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof sa;
  bool listening = listener >= 0 && ::bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
                   ::listen(listener, size + 4) == 0 &&
                   ::getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len) == 0;
  std::string listen_error = listening ? "" : errno_text("listen");
  // Every rank takes part in the exchange even when it could not listen (port 0 says so), so that
  // no peer waits in the collective for it.
  Endpoint mine = local_endpoint(listening ? ntohs(sa.sin_port) : 0);
  std::vector<Endpoint> all(static_cast<size_t>(size));
  exchange(&mine, all.data(), sizeof(Endpoint));
  auto fail = [&](const std::string& why) {
    if (listener >= 0) ::close(listener);
    if (right_fd_ >= 0) ::close(right_fd_);
    if (left_fd_ >= 0) ::close(left_fd_);
    throw CommError(fmt::format("{}: socket ring set-up failed: {}", what_, why));
  };
  if (!listening) fail(listen_error);
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  const Endpoint& r = all[static_cast<size_t>(right)];
  if (r.port == 0) fail(fmt::format("rank {} could not listen", right));
  const double deadline = now_seconds() + connect_timeout_s;

  // Right: loopback when the peer shares our kernel and network namespace, else its addresses.
  std::vector<uint32_t> candidates;
  if (std::strncmp(r.machine, mine.machine, sizeof r.machine) == 0 && r.netns == mine.netns)
    candidates.push_back(htonl(INADDR_LOOPBACK));
  for (int i = 0; i < r.n_addrs; ++i) candidates.push_back(r.addrs[i]);
  std::string tried;
  while (right_fd_ < 0 && now_seconds() < deadline) {
    for (uint32_t ip : candidates) {
      std::string why;
      int fd = connect_to(ip, r.port, deadline, &why);
      if (fd < 0) {
        if (tried.find(ip_text(ip)) == std::string::npos) tried += fmt::format(" {}:{} ({})", ip_text(ip), r.port, why);
        continue;
      }
      uint32_t hello[2] = {kHelloMagic, static_cast<uint32_t>(rank)};
      if (!io_all(fd, hello, sizeof hello, true, deadline)) {
        ::close(fd);
        continue;
      }
      right_fd_ = fd;
      right_addr_ = fmt::format("{}:{}", ip_text(ip), r.port);
      break;
    }
    if (right_fd_ < 0) ::usleep(100000);
  }
  if (right_fd_ < 0)
    fail(fmt::format("rank {} cannot reach its right neighbour rank {}; tried{}", rank, right,
                     tried.empty() ? " no address" : tried));

  // Left: accept until the connection that says it comes from rank `left`.
  set_nonblocking(listener, true);
  while (left_fd_ < 0) {
    pollfd pfd{listener, POLLIN, 0};
    if (::poll(&pfd, 1, remaining_ms(deadline)) <= 0)
      fail(fmt::format("rank {} got no connection from its left neighbour rank {} within {:.0f} s", rank, left,
                       connect_timeout_s));
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    set_nonblocking(fd, true);
    uint32_t hello[2] = {0, 0};
    if (io_all(fd, hello, sizeof hello, false, deadline) && hello[0] == kHelloMagic &&
        hello[1] == static_cast<uint32_t>(left))
      left_fd_ = fd;
    else
      ::close(fd);
  }
  ::close(listener);
  for (int fd : {right_fd_, left_fd_}) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_nonblocking(fd, true);
  }
}

SocketRing::~SocketRing() {
  if (right_fd_ >= 0) ::close(right_fd_);
  if (left_fd_ >= 0) ::close(left_fd_);
}

constexpr size_t kMaxRcvLowat = 1 << 20;

void SocketRing::exchange_step(const void* sbuf, size_t sbytes, void* rbuf, size_t rbytes) {
  const char* s = static_cast<const char*>(sbuf);
  char* r = static_cast<char*>(rbuf);
  while (sbytes > 0 || rbytes > 0) {
    pollfd pfd[2];
    int n = 0, si = -1, ri = -1;
    if (sbytes > 0) si = n, pfd[n++] = pollfd{right_fd_, POLLOUT, 0};
    if (rbytes > 0) {
      ri = n, pfd[n++] = pollfd{left_fd_, POLLIN, 0};
      // Wake when the rest of the message is there, not at every segment: a 393 KB tp message
      // otherwise woke the comm thread ~50 times, each a switch away from compute on its core
      // (si-overlap's comm-only step: 0.16 -> 0.13 s of CPU). Linux (>= 4.18) grows the receive
      // buffer to hold the mark and caps it at half the buffer's limit, which only means more
      // wakeups; a failed setsockopt likewise.
      const int mark = static_cast<int>(std::min<size_t>(rbytes, kMaxRcvLowat));
      if (mark != rcvlowat_ && ::setsockopt(left_fd_, SOL_SOCKET, SO_RCVLOWAT, &mark, sizeof mark) == 0)
        rcvlowat_ = mark;
    }
    int rc = ::poll(pfd, static_cast<nfds_t>(n), -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      throw CommError(fmt::format("{}: {}", what_, errno_text("poll")));
    }
    if (si >= 0 && (pfd[si].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t k = ::send(right_fd_, s, sbytes, MSG_NOSIGNAL);
      if (k < 0 && errno != EAGAIN && errno != EINTR)
        throw CommError(fmt::format("{}: sending to rank {}: {}", what_, (rank_ + 1) % size_, std::strerror(errno)));
      if (k > 0) s += k, sbytes -= static_cast<size_t>(k);
    }
    if (ri >= 0 && (pfd[ri].revents & (POLLIN | POLLERR | POLLHUP))) {
      ssize_t k = ::recv(left_fd_, r, rbytes, 0);
      if (k == 0)
        throw CommError(fmt::format("{}: rank {} closed its connection (it exited or failed)", what_,
                                    (rank_ + size_ - 1) % size_));
      if (k < 0 && errno != EAGAIN && errno != EINTR)
        throw CommError(fmt::format("{}: receiving from rank {}: {}", what_, (rank_ + size_ - 1) % size_,
                                    std::strerror(errno)));
      if (k > 0) r += k, rbytes -= static_cast<size_t>(k);
    }
  }
}

void SocketRing::all_reduce(void* buf, int64_t n, DType dtype, ReduceOp op) {
  const size_t es = dtype_size(dtype);
  char* b = static_cast<char*>(buf);
  scratch_.resize(static_cast<size_t>(block_of(n, size_, 0).len) * es);
  // Reduce-scatter: after step s, block (rank - s - 1) holds the sum over ranks rank-s-1 .. rank.
  for (int s = 0; s < size_ - 1; ++s) {
    Block out = block_of(n, size_, mod(rank_ - s, size_)), in = block_of(n, size_, mod(rank_ - s - 1, size_));
    exchange_step(b + out.begin * static_cast<int64_t>(es), static_cast<size_t>(out.len) * es, scratch_.data(),
                  static_cast<size_t>(in.len) * es);
    combine_into(scratch_.data(), b + in.begin * static_cast<int64_t>(es), in.len, dtype, op);
  }
  // All-gather: rank now owns the full block (rank + 1); pass complete blocks around the ring.
  for (int s = 0; s < size_ - 1; ++s) {
    Block out = block_of(n, size_, mod(rank_ + 1 - s, size_)), in = block_of(n, size_, mod(rank_ - s, size_));
    exchange_step(b + out.begin * static_cast<int64_t>(es), static_cast<size_t>(out.len) * es,
                  b + in.begin * static_cast<int64_t>(es), static_cast<size_t>(in.len) * es);
  }
}

void SocketRing::reduce_scatter(const void* in, void* out, int64_t n, DType dtype, ReduceOp op) {
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  const char* src = static_cast<const char*>(in);
  scratch_.resize(2 * bytes);
  char* acc = scratch_.data();          // the partial sum this rank sends next
  char* recv = scratch_.data() + bytes;  // the partial sum arriving from the left
  // Step s sends the partial of block (rank - s - 1) and receives that of block (rank - s - 2),
  // adding this rank's own contribution; the last block received is block `rank`, so the last step
  // receives straight into `out` (when `out` is not inside `in`), saving a copy of the result.
  char* dst = static_cast<char*>(out);
  const auto at = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const bool direct = at(dst) + bytes <= at(src) || at(dst) >= at(src) + static_cast<size_t>(size_) * bytes;
  for (int s = 0; s < size_ - 1; ++s) {
    const char* send = s == 0 ? src + static_cast<size_t>(mod(rank_ - 1, size_)) * bytes : acc;
    if (direct && s == size_ - 2) recv = dst;
    exchange_step(send, bytes, recv, bytes);
    combine_into(src + static_cast<size_t>(mod(rank_ - s - 2, size_)) * bytes, recv, n, dtype, op);
    std::swap(acc, recv);
  }
  if (acc != dst) std::memcpy(dst, acc, bytes);
}

void SocketRing::all_gather(const void* in, void* out, int64_t n, DType dtype) {
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  char* o = static_cast<char*>(out);
  char* mine = o + static_cast<size_t>(rank_) * bytes;
  if (mine != in) std::memcpy(mine, in, bytes);
  for (int s = 0; s < size_ - 1; ++s)
    exchange_step(o + static_cast<size_t>(mod(rank_ - s, size_)) * bytes, bytes,
                  o + static_cast<size_t>(mod(rank_ - s - 1, size_)) * bytes, bytes);
}

}  // namespace dhelix
