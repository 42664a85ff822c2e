//===- tcp_transport.cpp - Launch detection and the TCP transport ---------===//
//
// How the ranks of a cuda program find each other without MPI, and how the
// control plane's messages move between them (engine.h has the split).
//
// Launch: the launcher's variables give this process's rank and the world's
// size (torchrun-style RANK/WORLD_SIZE, then Open MPI's or MPICH's mpirun,
// then Slurm's srun) and where rank 0 listens (MASTER_ADDR/MASTER_PORT, or
// a default per launcher); docs/runtime.md, "Launching without MPI".
//
// Rendezvous: rank 0 listens on MASTER_PORT; every other rank connects to it
// and says who it is and on which port it listens for its peers. When all
// have arrived, rank 0 sends everyone the table. That connection stays as
// the link between rank 0 and the rank; rank i then connects to ranks
// 1 .. i-1, so every pair of ranks shares exactly one TCP stream, which
// keeps each sender's messages in order as MPI requires.
//
// Links: non-blocking sockets. A send is written at once as far as the
// socket takes it and queued otherwise; poll() reads and writes whatever is
// ready, so two ranks that send each other hundreds of MB at once both make
// progress. A link that ends without a goodbye means its process died: the
// job ends (exit 1), as under mpirun; MPI_Abort's code reaches every rank.
// Whoever ends the job tells every other rank why before it exits, so each
// names the rank that started it rather than whichever link closed first.
//
// The wire format is the Header struct as it is in memory: every rank runs
// the same build on the same kind of machine.
//===----------------------------------------------------------------------===//

#include "engine.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/sockios.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <type_traits>

namespace planrt_net {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(sizeof(Header) == 32 && std::is_trivially_copyable<Header>(),
              "Header is sent as it is in memory");

// Kinds of Header (0 is a message for the engine).
constexpr int32_t kMessage = 0;
constexpr int32_t kAbort = 1; // source aborted with code
constexpr int32_t kBye = 2;   // the sender finished (MPI_Finalize)
constexpr int32_t kDied = 3;  // source's link closed without a goodbye

// How the launch was read and where rank 0's port came from, for error
// messages (set by detect_launch).
std::string g_launch_note = "none";
std::string g_port_note = "MASTER_PORT";

[[noreturn]] __attribute__((format(printf, 2, 3))) void
die(int code, const char *fmt, ...) {
  std::fflush(stdout);
  std::va_list ap;
  va_start(ap, fmt);
  std::fputs("planrt: error: ", stderr);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::_Exit(code);
}

//===--- Launch -----------------------------------------------------------===//

/// A variable's value; empty counts as unset (launch scripts often export
/// `VAR=${VAR:-}`).
const char *env(const char *name) {
  const char *v = std::getenv(name);
  return v && *v ? v : nullptr;
}

/// `value` of variable `name` as a decimal number; anything else (signs,
/// spaces, overflow) exits with code 2 saying what the variable is.
long long number(const char *name, const char *value, const char *meaning) {
  errno = 0;
  char *end = nullptr;
  long long v = std::strtoll(value, &end, 10);
  if (value[0] < '0' || value[0] > '9' || *end || errno == ERANGE ||
      v > INT_MAX)
    die(2, "%s=%s: not a number; %s", name, value, meaning);
  return v;
}

int port_number(const char *name, const char *value) {
  long long p = number(name, value, "it is rank 0's TCP port (1-65535)");
  if (p < 1 || p > 65535)
    die(2, "%s=%s: not a TCP port; use a free port from 1 to 65535", name,
        value);
  return (int)p;
}

/// The rank and size from a launcher's pair of variables.
void read_rank_size(Launch &l, const char *rank_var, const char *size_var,
                    const char *who) {
  const char *r = env(rank_var), *s = env(size_var);
  if (!s)
    die(2, "%s=%s is set but %s is not: %s sets both", rank_var, r, size_var,
        who);
  l.size = (int)number(size_var, s, "it must be the number of ranks");
  if (l.size < 1)
    die(2, "%s=%s: the world needs at least one rank", size_var, s);
  if (!r) {
    if (l.size > 1)
      die(2, "%s=%s is set but %s is not: %s sets both", size_var, s, rank_var,
          who);
    l.rank = 0;
    return;
  }
  std::string meaning =
      std::string("it must be this process's rank, 0 to ") + size_var + " - 1";
  l.rank = (int)number(rank_var, r, meaning.c_str());
  if (l.rank >= l.size)
    die(2, "%s=%s: not below %s=%d: ranks are 0 to %d", rank_var, r, size_var,
        l.size, l.size - 1);
}

int local_rank(const char *var) {
  const char *v = env(var);
  return v ? (int)number(var, v, "it must be this process's rank on its node")
           : 0;
}

/// The first host of a Slurm host list: "gpu[003-010,012],cpu1" -> "gpu003",
/// "a,b" -> "a", "r[1-2]-n[01-04]" -> "r1-n01" (digits kept as written, so
/// zero padding stays). False when the list is malformed.
bool first_host(const std::string &list, std::string &out) {
  out.clear();
  size_t i = 0;
  while (i < list.size() && list[i] != ',') {
    if (list[i] == ']')
      return false;
    if (list[i] != '[') {
      out += list[i++];
      continue;
    }
    size_t close = list.find(']', i);
    size_t j = i + 1;
    while (j < close && list[j] >= '0' && list[j] <= '9')
      ++j;
    if (close == std::string::npos || j == i + 1 ||
        (list[j] != '-' && list[j] != ',' && list[j] != ']'))
      return false;
    out.append(list, i + 1, j - i - 1);
    i = close + 1;
  }
  return !out.empty();
}

Launch torchrun() {
  Launch l;
  l.launcher = "torchrun";
  g_launch_note = "torchrun (RANK, WORLD_SIZE)";
  read_rank_size(l, "RANK", "WORLD_SIZE", "torchrun");
  l.local_rank = local_rank("LOCAL_RANK");
  const char *addr = env("MASTER_ADDR"), *port = env("MASTER_PORT");
  if (l.size > 1 && !addr)
    die(2,
        "MASTER_ADDR is not set: with WORLD_SIZE=%d every rank needs rank "
        "0's address in MASTER_ADDR and its port in MASTER_PORT, as "
        "torchrun sets them",
        l.size);
  if (l.size > 1 && !port)
    die(2,
        "MASTER_PORT is not set: with WORLD_SIZE=%d every rank needs the "
        "port rank 0 listens on (a free TCP port, the same on every rank)",
        l.size);
  l.master_addr = addr ? addr : "127.0.0.1";
  l.master_port = port ? port_number("MASTER_PORT", port) : 29500;
  // torchrun's agent (PyTorch 2.4 and later) serves its own store on
  // MASTER_PORT, on rank 0's node, and says so to its workers: rank 0
  // listens on the next port then.
  const char *agent = env("TORCHELASTIC_USE_AGENT_STORE");
  if (l.size > 1 && agent &&
      (strcasecmp(agent, "true") == 0 || std::strcmp(agent, "1") == 0)) {
    if (l.master_port == 65535)
      die(2,
          "MASTER_PORT=65535: torchrun's agent holds it "
          "(TORCHELASTIC_USE_AGENT_STORE=%s) and rank 0 listens on the "
          "next port, which does not exist: choose a lower MASTER_PORT",
          agent);
    ++l.master_port;
    g_port_note = "MASTER_PORT + 1: torchrun's agent holds MASTER_PORT "
                  "(TORCHELASTIC_USE_AGENT_STORE)";
  }
  return l;
}

/// Open MPI's mpirun, or MPICH's (Hydra) when `ompi` is false.
Launch mpirun(bool ompi) {
  Launch l;
  l.launcher = "mpirun";
  const char *rank_var = ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
  const char *size_var = ompi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
  const char *local_var =
      ompi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID";
  const char *local_size_var =
      ompi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS";
  g_launch_note = ompi ? "mpirun (Open MPI: OMPI_COMM_WORLD_RANK, "
                         "OMPI_COMM_WORLD_SIZE)"
                       : "mpirun (MPICH: PMI_RANK, PMI_SIZE)";
  read_rank_size(l, rank_var, size_var, "mpirun");
  l.local_rank = local_rank(local_var);
  const char *ls = env(local_size_var);
  int local_size = ls ? (int)number(local_size_var, ls,
                                    "it must be the number of ranks "
                                    "on this node")
                      : 0;
  if (const char *addr = env("MASTER_ADDR"))
    l.master_addr = addr;
  else if (l.size == 1 || local_size == l.size)
    l.master_addr = "127.0.0.1"; // every rank is on this node
  else if (ls)
    die(2,
        "MASTER_ADDR is not set and the %d ranks span several nodes "
        "(%s=%d): set MASTER_ADDR to the first node's address (where rank "
        "0 runs) and pass it to every rank (mpirun -x MASTER_ADDR)",
        l.size, local_size_var, local_size);
  else
    die(2,
        "MASTER_ADDR is not set and %s is not either, so the ranks may "
        "span several nodes: set MASTER_ADDR to the first node's address "
        "(where rank 0 runs) and pass it to every rank (mpirun -x "
        "MASTER_ADDR)",
        local_size_var);
  const char *port = env("MASTER_PORT");
  l.master_port = port ? port_number("MASTER_PORT", port) : 29500;
  if (!port)
    g_port_note = "the default; set MASTER_PORT";
  return l;
}

Launch slurm() {
  Launch l;
  l.launcher = "slurm";
  g_launch_note = "slurm (SLURM_PROCID, SLURM_STEP_NUM_TASKS)";
  // The step's count: in a batch script SLURM_NTASKS is the allocation's.
  const char *size_var = env("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS"
                         : env("SLURM_NTASKS")       ? "SLURM_NTASKS"
                                                     : nullptr;
  if (size_var)
    read_rank_size(l, "SLURM_PROCID", size_var, "srun");
  else
    l.rank = (int)number("SLURM_PROCID", env("SLURM_PROCID"),
                         "it must be this process's rank");
  if (!size_var && l.rank > 0)
    die(2,
        "SLURM_PROCID=%d is set but neither SLURM_STEP_NUM_TASKS nor "
        "SLURM_NTASKS is: start the program with srun",
        l.rank);
  if (size_var && std::strcmp(size_var, "SLURM_NTASKS") == 0 && l.size > 1)
    g_launch_note =
        "slurm (SLURM_PROCID, SLURM_NTASKS=" + std::to_string(l.size) +
        "; SLURM_STEP_NUM_TASKS is not set: if this is the batch "
        "script itself, start the program with srun)";
  l.local_rank = local_rank("SLURM_LOCALID");

  if (const char *addr = env("MASTER_ADDR")) {
    l.master_addr = addr;
  } else {
    const char *list_var = env("SLURM_STEP_NODELIST")  ? "SLURM_STEP_NODELIST"
                           : env("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                                                       : nullptr;
    if (list_var && !first_host(env(list_var), l.master_addr))
      die(2,
          "%s=%s: not a Slurm host list this program can read; set "
          "MASTER_ADDR to the first node's address",
          list_var, env(list_var));
    if (!list_var && l.size > 1)
      die(2, "MASTER_ADDR is not set and neither SLURM_STEP_NODELIST nor "
             "SLURM_JOB_NODELIST is: set MASTER_ADDR to the first node's "
             "address");
    if (!list_var)
      l.master_addr = "127.0.0.1";
  }

  if (const char *port = env("MASTER_PORT")) {
    l.master_port = port_number("MASTER_PORT", port);
    return l;
  }
  // The same on every rank of a step, different for consecutive jobs and
  // for the steps of one job (1009 is prime to 12000), and below Linux's
  // ephemeral ports (32768 and up), which outgoing connections take.
  const char *job_var = env("SLURM_JOB_ID") ? "SLURM_JOB_ID" : "SLURM_JOBID";
  const char *step_var =
      env("SLURM_STEP_ID") ? "SLURM_STEP_ID" : "SLURM_STEPID";
  const char *job = env(job_var), *step = env(step_var);
  if (!job && l.size > 1)
    die(2, "MASTER_PORT is not set and neither is SLURM_JOB_ID: set "
           "MASTER_PORT to a free TCP port, the same on every rank");
  auto unsigned_value = [](const char *name, const char *value) {
    errno = 0;
    char *end = nullptr;
    unsigned long long v = std::strtoull(value, &end, 10);
    if (value[0] < '0' || value[0] > '9' || *end || errno == ERANGE)
      die(2,
          "%s=%s: not a number; set MASTER_PORT to a free TCP port to "
          "skip it",
          name, value);
    return v;
  };
  unsigned long long j = job ? unsigned_value(job_var, job) : 0;
  unsigned long long s = step ? unsigned_value(step_var, step) : 0;
  l.master_port = 20000 + (int)((j % 12000 + 1009 * (s % 12000)) % 12000);
  g_port_note = "from SLURM_JOB_ID and SLURM_STEP_ID; set MASTER_PORT";
  return l;
}

//===--- Sockets ----------------------------------------------------------===//

int ms_until(Clock::time_point t) {
  auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(t - Clock::now())
          .count();
  if (us <= 0)
    return 0;
  return (int)std::min<long long>((us + 999) / 1000, INT_MAX);
}

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

std::string host_name() {
  char b[256] = {0};
  gethostname(b, sizeof(b) - 1);
  return b;
}

std::string numeric_address(const sockaddr *sa, socklen_t len) {
  char b[NI_MAXHOST] = {0};
  if (getnameinfo(sa, len, b, sizeof(b), nullptr, 0, NI_NUMERICHOST) != 0)
    return "?";
  // An IPv4 peer of an IPv6 socket: say 10.0.0.2, not ::ffff:10.0.0.2.
  if (std::strncmp(b, "::ffff:", 7) == 0 && std::strchr(b, '.'))
    return b + 7;
  return b;
}

void set_link_options(int fd) {
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int one = 1; // control messages are small: send each at once
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/// A non-blocking socket listening on every address of this host at `port`
/// (0: any free port), IPv6 and IPv4 where the host has IPv6; -1 and errno
/// when that fails. Every address: a node's own name may resolve to a
/// loopback address in /etc/hosts, so binding MASTER_ADDR could shut out the
/// other nodes (torchrun's store listens the same way).
int listen_any(int port, int *bound) {
  for (int family : {AF_INET6, AF_INET}) {
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
      continue;
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage ss{};
    socklen_t len;
    if (family == AF_INET6) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      auto *a = (sockaddr_in6 *)&ss;
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons((uint16_t)port);
      len = sizeof(*a);
    } else {
      auto *a = (sockaddr_in *)&ss;
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons((uint16_t)port);
      len = sizeof(*a);
    }
    if (bind(fd, (sockaddr *)&ss, len) == 0 && listen(fd, SOMAXCONN) == 0 &&
        getsockname(fd, (sockaddr *)&ss, &len) == 0) {
      *bound = ntohs(family == AF_INET6 ? ((sockaddr_in6 *)&ss)->sin6_port
                                        : ((sockaddr_in *)&ss)->sin_port);
      return fd;
    }
    int e = errno;
    ::close(fd);
    errno = e;
    if (e == EADDRINUSE || e == EACCES)
      return -1; // IPv4 would fail the same way
  }
  return -1;
}

/// Whether a connection to a port nobody listens on connected to itself
/// (TCP's simultaneous open, possible on one host when the port is in the
/// ephemeral range): then it is no connection to rank 0.
bool self_connected(int fd) {
  sockaddr_storage a{}, b{};
  socklen_t la = sizeof(a), lb = sizeof(b);
  return getsockname(fd, (sockaddr *)&a, &la) == 0 &&
         getpeername(fd, (sockaddr *)&b, &lb) == 0 && la == lb &&
         std::memcmp(&a, &b, la) == 0;
}

/// A non-blocking socket connected to host:port (each of its addresses
/// tried in turn, waiting until `until` at most), or -1 with *err an errno
/// value, or *gai a getaddrinfo error when the name does not resolve.
int connect_to(const std::string &host, int port, Clock::time_point until,
               int *err, int *gai) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  *gai = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  *err = ECONNREFUSED;
  if (*gai != 0) {
    *err = *gai == EAI_SYSTEM ? errno : 0;
    return -1;
  }
  int fd = -1;
  for (addrinfo *a = res; a && fd < 0; a = a->ai_next) {
    int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                   a->ai_protocol);
    if (s < 0) {
      *err = errno;
      continue;
    }
    int e = 0;
    if (::connect(s, a->ai_addr, a->ai_addrlen) < 0) {
      e = errno;
      if (e == EINPROGRESS) {
        pollfd p{s, POLLOUT, 0};
        int n;
        do
          n = ::poll(&p, 1, ms_until(until));
        while (n < 0 && errno == EINTR);
        socklen_t el = sizeof(e);
        if (n == 0)
          e = ETIMEDOUT;
        else if (getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
          e = errno;
      }
    }
    if (e == 0 && self_connected(s))
      e = ECONNREFUSED;
    if (e != 0) {
      *err = e;
      ::close(s);
      continue;
    }
    fd = s;
  }
  freeaddrinfo(res);
  return fd;
}

/// Writes or reads exactly n bytes on a non-blocking socket by `until`;
/// false with errno (0: the peer closed the connection) otherwise.
bool transfer(bool write, int fd, void *buf, size_t n,
              Clock::time_point until) {
  char *p = (char *)buf;
  while (n > 0) {
    ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k == 0) {
      errno = 0;
      return false;
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return false;
    pollfd q{fd, (short)(write ? POLLOUT : POLLIN), 0};
    int wait = ms_until(until);
    if (wait == 0 || ::poll(&q, 1, wait) == 0) {
      errno = ETIMEDOUT;
      return false;
    }
  }
  return true;
}

std::string why(int err) {
  return err ? std::strerror(err) : "the connection was closed";
}

/// "rank 3", "ranks 3, 5", "ranks 1-4, 7".
std::string ranks_text(const std::vector<int> &ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
      ++j;
    if (i)
      s += ", ";
    s += std::to_string(ranks[i]);
    if (j >= i + 2) {
      s += "-" + std::to_string(ranks[j]);
      i = j + 1;
    } else {
      i = i + 1;
    }
  }
  return s;
}

//===--- Rendezvous messages ----------------------------------------------===//

constexpr uint32_t kMagic = 0x544e4c50; // "PLNT"
constexpr uint32_t kVersion = 1;
constexpr size_t kName = 64;

/// A rank > 0 to rank 0.
struct Hello {
  uint32_t magic = kMagic, version = kVersion;
  int32_t rank = 0, size = 0, port = 0, pad = 0;
  char addr[kName] = {0}; // where its peers reach it
  char host[kName] = {0};
};

/// Rank 0's answer: status 0 and the table (size Entry), or status 1 and
/// `bytes` of text saying why the rendezvous failed.
struct Reply {
  uint32_t status = 0, bytes = 0;
  uint64_t token = 0; // in every link's hello: a stray connection has none
};

struct Entry {
  char addr[kName] = {0};
  char host[kName] = {0};
  int32_t port = 0, pad = 0;
};

/// Rank i to rank j (0 < j < i) on j's peer port.
struct PeerHello {
  uint32_t magic = kMagic, version = kVersion;
  int32_t rank = 0, pad = 0;
  uint64_t token = 0;
};

void copy_name(char (&dst)[kName], const std::string &src) {
  std::snprintf(dst, kName, "%s", src.c_str());
}

std::string name_of(const char (&src)[kName]) {
  return std::string(src, strnlen(src, kName));
}

//===--- The transport ----------------------------------------------------===//

struct OutBuf {
  std::vector<char> bytes;
  size_t off = 0;
  bool started = false; // part of it is on the wire: it must be finished
};

struct Link {
  int fd = -1;
  bool linked = false; // the connection was made (fd < 0 later: closed)
  std::deque<OutBuf> out;
  std::vector<char> stage; // bytes read, not parsed yet
  size_t begin = 0, end = 0;
  bool in_body = false; // cur's header is in, its bytes are coming
  Message cur;
  size_t body_got = 0;
  bool bye = false; // the peer finished (MPI_Finalize)
};

constexpr size_t kStage = 256 << 10;
constexpr size_t kReadBudget = 16 << 20; // per link and poll: others go on
constexpr uint64_t kMaxMessage = uint64_t(1) << 40; // more: a corrupt stream

/// Rank i's peer port while the ranks above it connect.
struct Accepting {
  int fd = -1;
  uint64_t token = 0;
  struct Pending {
    int fd;
    size_t got;
    PeerHello hello;
  };
  std::vector<Pending> pending;
};

class TcpTransport final : public Transport {
public:
  TcpTransport(int rank, int size, std::vector<std::string> hosts)
      : rank_(rank), size_(size), hosts_(std::move(hosts)), links_(size) {}
  ~TcpTransport() override {
    for (Link &k : links_)
      if (k.fd >= 0)
        ::close(k.fd);
  }

  void add_link(int r, int fd) {
    set_link_options(fd);
    links_[r].fd = fd;
    links_[r].linked = true;
  }
  bool linked(int r) const { return links_[r].linked; }

  void send(int dest, const Header &h, const void *data) override;
  void poll(int timeout_ms) override { poll_links(timeout_ms, nullptr); }
  bool flushed() const override {
    for (const Link &k : links_)
      if (k.fd >= 0 && !k.out.empty())
        return false;
    return true;
  }
  void abort_all(int code) override {
    Header h;
    h.kind = kAbort;
    h.source = rank_;
    h.code = code;
    tell_all(h, -1);
  }
  void close() override;

  void poll_links(int timeout_ms, Accepting *acc);

private:
  enum class Read { Again, Budget, Closed };
  Read read_link(int r);
  void parse(int r);
  void on_header(int r, const Header &h);
  void write_link(int r);
  /// Writes what link r has queued, without blocking.
  enum class Write { Sent, Blocked, Broken };
  Write send_queued(int r);
  void link_broken(int r);
  void link_closed(int r);
  void accept_ready(Accepting &acc, const std::vector<pollfd> &p, size_t first);
  [[noreturn]] void fatal(int32_t kind, int origin, int code,
                          const std::string &line);
  void tell_all(const Header &h, int skip);
  void linger(Clock::time_point until);

  int rank_, size_;
  std::vector<std::string> hosts_;
  std::vector<Link> links_;
  bool exiting_ = false;
};

void TcpTransport::send(int dest, const Header &h, const void *data) {
  Link &k = links_[(size_t)dest];
  if (k.fd < 0)
    return; // the peer finished: nothing of ours can be received any more
  size_t total = sizeof(Header) + h.bytes, sent = 0;
  if (k.out.empty()) {
    // Straight from the caller's buffer: most messages fit the socket.
    iovec iov[2] = {{const_cast<Header *>(&h), sizeof(Header)},
                    {const_cast<void *>(data), h.bytes}};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = h.bytes ? 2 : 1;
    ssize_t n;
    do
      n = ::sendmsg(k.fd, &m, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      link_broken(dest);
      return;
    }
    sent = n > 0 ? (size_t)n : 0;
    if (sent == total)
      return;
  }
  // Eager: the rest is copied, the caller may reuse its buffer at once.
  OutBuf b;
  b.started = sent > 0;
  b.bytes.resize(total - sent);
  char *o = b.bytes.data();
  if (sent < sizeof(Header)) {
    std::memcpy(o, (const char *)&h + sent, sizeof(Header) - sent);
    if (h.bytes)
      std::memcpy(o + sizeof(Header) - sent, data, h.bytes);
  } else {
    std::memcpy(o, (const char *)data + (sent - sizeof(Header)), total - sent);
  }
  k.out.push_back(std::move(b));
}

void TcpTransport::poll_links(int timeout_ms, Accepting *acc) {
  // Output first: what could not be written at once goes on now.
  for (int r = 0; r < size_; ++r)
    if (links_[r].fd >= 0 && !links_[r].out.empty())
      write_link(r);
  std::vector<pollfd> p;
  std::vector<int> who;
  for (int r = 0; r < size_; ++r) {
    const Link &k = links_[r];
    if (k.fd < 0)
      continue;
    p.push_back({k.fd, (short)(POLLIN | (k.out.empty() ? 0 : POLLOUT)), 0});
    who.push_back(r);
  }
  size_t first = p.size();
  if (acc) {
    p.push_back({acc->fd, POLLIN, 0});
    for (const Accepting::Pending &q : acc->pending)
      p.push_back({q.fd, POLLIN, 0});
  }
  int n = ::poll(p.data(), p.size(), timeout_ms);
  if (n <= 0)
    return;
  for (size_t i = 0; i < first; ++i) {
    int r = who[i];
    if (p[i].revents & (POLLIN | POLLHUP | POLLERR))
      read_link(r);
    if (links_[r].fd >= 0 && (p[i].revents & POLLOUT))
      write_link(r);
  }
  if (acc)
    accept_ready(*acc, p, first);
}

TcpTransport::Read TcpTransport::read_link(int r) {
  Link &k = links_[r];
  size_t budget = kReadBudget;
  while (k.fd >= 0) {
    if (budget == 0)
      return Read::Budget;
    ssize_t n;
    if (k.in_body && k.begin == k.end &&
        k.cur.data.size() - k.body_got >= kStage) {
      // A large body: straight into the message, no staging copy.
      n = ::recv(k.fd, k.cur.data.data() + k.body_got,
                 k.cur.data.size() - k.body_got, 0);
      if (n > 0) {
        k.body_got += (size_t)n;
        budget -= std::min(budget, (size_t)n);
        parse(r);
        continue;
      }
    } else {
      if (k.stage.empty())
        k.stage.resize(kStage);
      n = ::recv(k.fd, k.stage.data() + k.end, k.stage.size() - k.end, 0);
      if (n > 0) {
        k.end += (size_t)n;
        budget -= std::min(budget, (size_t)n);
        parse(r);
        continue;
      }
    }
    if (n == 0) {
      link_closed(r);
      return Read::Closed;
    }
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return Read::Again;
    link_closed(r); // reset: as good as closed
    return Read::Closed;
  }
  return Read::Closed;
}

void TcpTransport::parse(int r) {
  Link &k = links_[r];
  for (;;) {
    if (k.in_body) {
      size_t take = std::min(k.end - k.begin, k.cur.data.size() - k.body_got);
      if (take)
        std::memcpy(k.cur.data.data() + k.body_got, k.stage.data() + k.begin,
                    take);
      k.begin += take;
      k.body_got += take;
      if (k.body_got < k.cur.data.size())
        break;
      Message m = std::move(k.cur);
      k.cur = Message();
      k.in_body = false;
      deliver(std::move(m));
      continue;
    }
    if (k.end - k.begin < sizeof(Header))
      break;
    Header h;
    std::memcpy(&h, k.stage.data() + k.begin, sizeof(Header));
    k.begin += sizeof(Header);
    on_header(r, h);
  }
  // What is left is part of a header: move it to the front.
  if (k.begin > 0) {
    std::memmove(k.stage.data(), k.stage.data() + k.begin, k.end - k.begin);
    k.end -= k.begin;
    k.begin = 0;
  }
}

void TcpTransport::on_header(int r, const Header &h) {
  Link &k = links_[r];
  bool valid_source = h.source >= 0 && h.source < size_;
  if (h.kind == kMessage && h.source == r && h.bytes <= kMaxMessage) {
    k.cur = Message();
    k.cur.header = h;
    if (h.bytes == 0) {
      Message m = std::move(k.cur);
      k.cur = Message();
      deliver(std::move(m));
      return;
    }
    k.cur.data.resize(h.bytes);
    k.in_body = true;
    k.body_got = 0;
    return;
  }
  if (h.kind == kBye && h.source == r) {
    k.bye = true;
    return;
  }
  if (h.kind == kAbort && valid_source)
    fatal(kAbort, h.source, h.code,
          "rank " + std::to_string(h.source) + " aborted (exit code " +
              std::to_string(h.code) + ")");
  if (h.kind == kDied && valid_source)
    fatal(kDied, h.source, 1,
          "rank " + std::to_string(h.source) + " (host " + hosts_[h.source] +
              ") closed its connection without finishing: it died or was "
              "killed");
  die(1,
      "rank %d (host %s) sent something that is not a planrt control "
      "message (kind %d, %llu bytes): the stream is corrupt",
      r, hosts_[r].c_str(), h.kind, (unsigned long long)h.bytes);
}

TcpTransport::Write TcpTransport::send_queued(int r) {
  Link &k = links_[r];
  while (!k.out.empty()) {
    OutBuf &b = k.out.front();
    ssize_t n = ::send(k.fd, b.bytes.data() + b.off, b.bytes.size() - b.off,
                       MSG_NOSIGNAL);
    if (n > 0) {
      b.off += (size_t)n;
      b.started = true;
      if (b.off == b.bytes.size())
        k.out.pop_front();
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return Write::Blocked;
    return Write::Broken;
  }
  return Write::Sent;
}

void TcpTransport::write_link(int r) {
  if (send_queued(r) == Write::Broken)
    link_broken(r);
}

/// A write failed: the peer is gone. What it sent before (a goodbye, an
/// abort) says why; read it all before deciding.
void TcpTransport::link_broken(int r) {
  Link &k = links_[r];
  k.out.clear();
  Read res;
  do
    res = read_link(r);
  while (res == Read::Budget);
  if (k.fd >= 0) {
    if (k.bye) {
      ::close(k.fd);
      k.fd = -1;
      return;
    }
    link_closed(r);
  }
}

void TcpTransport::link_closed(int r) {
  Link &k = links_[r];
  if (k.bye) {
    ::close(k.fd);
    k.fd = -1;
    k.out.clear();
    return;
  }
  fatal(kDied, r, 1,
        "rank " + std::to_string(r) + " (host " + hosts_[r] +
            ") closed its connection without finishing: it died or was "
            "killed");
}

void TcpTransport::fatal(int32_t kind, int origin, int code,
                         const std::string &line) {
  if (exiting_) // reentered while telling the others: they know enough
    std::_Exit(code);
  std::fflush(stdout);
  std::fprintf(stderr, "planrt: error: %s\n", line.c_str());
  std::fflush(stderr);
  Header h;
  h.kind = kind;
  h.source = origin;
  h.code = code;
  tell_all(h, origin);
  std::_Exit(code);
}

/// Sends `h` to every peer but `skip` (ahead of anything still queued that
/// has not started), then waits until they have it (bounded): a process
/// that exits with unread input resets its connections, and a reset
/// discards what the kernel has not sent yet.
void TcpTransport::tell_all(const Header &h, int skip) {
  exiting_ = true;
  for (int r = 0; r < size_; ++r) {
    Link &k = links_[r];
    if (k.fd < 0)
      continue;
    if (r != skip && !k.out.empty() && k.out.front().started)
      k.out.erase(k.out.begin() + 1, k.out.end());
    else
      k.out.clear();
    if (r == skip)
      continue;
    OutBuf b;
    b.bytes.assign((const char *)&h, (const char *)&h + sizeof(Header));
    k.out.push_back(std::move(b));
  }
  linger(after(2.0));
}

void TcpTransport::linger(Clock::time_point until) {
  std::vector<char> scratch(64 << 10);
  std::vector<char> done((size_t)size_, 0);
  for (;;) {
    std::vector<pollfd> p;
    std::vector<int> who;
    for (int r = 0; r < size_; ++r) {
      Link &k = links_[r];
      if (k.fd < 0 || done[r])
        continue;
      if (send_queued(r) == Write::Broken)
        done[r] = 1; // the peer is gone
      int unsent = 0;
#ifdef SIOCOUTQ
      if (ioctl(k.fd, SIOCOUTQ, &unsent) < 0)
        unsent = 0;
#endif
      if (done[r] || (k.out.empty() && unsent == 0)) {
        done[r] = 1;
        continue;
      }
      p.push_back({k.fd, (short)(POLLIN | (k.out.empty() ? 0 : POLLOUT)), 0});
      who.push_back(r);
    }
    int wait = ms_until(until);
    if (p.empty() || wait == 0)
      return;
    // Short waits: the kernel's acknowledgements raise no event.
    if (::poll(p.data(), p.size(), std::min(wait, 5)) <= 0)
      continue;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i].revents & (POLLERR | POLLHUP)) {
        done[who[i]] = 1;
      } else if (p[i].revents & POLLIN) {
        ssize_t n = ::recv(p[i].fd, scratch.data(), scratch.size(), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                       errno != EINTR))
          done[who[i]] = 1;
      }
    }
  }
}

void TcpTransport::close() {
  // Everything this rank sent must arrive: a root's last results, a gather's
  // parts. Reading goes on meanwhile, so a peer that sends to this rank
  // while it sends to the peer also progresses.
  while (!flushed())
    poll(100);
  Header h;
  h.kind = kBye;
  h.source = rank_;
  for (int r = 0; r < size_; ++r)
    if (links_[r].fd >= 0)
      send(r, h, nullptr);
  // Wait (bounded) for every peer's goodbye: closing with its last messages
  // unread would reset the connection and could lose our own last bytes.
  Clock::time_point until = after(5.0);
  for (;;) {
    bool done = true;
    for (const Link &k : links_)
      if (k.fd >= 0 && (!k.bye || !k.out.empty()))
        done = false;
    int wait = ms_until(until);
    if (done || wait == 0)
      break;
    poll(std::min(wait, 100));
  }
  for (Link &k : links_)
    if (k.fd >= 0) {
      ::close(k.fd);
      k.fd = -1;
    }
}

void TcpTransport::accept_ready(Accepting &acc, const std::vector<pollfd> &p,
                                size_t first) {
  // Finish the hellos that were pending when poll() was called first: the
  // indices of p follow that list.
  std::vector<Accepting::Pending> still;
  for (size_t i = 0; i < acc.pending.size(); ++i) {
    Accepting::Pending q = acc.pending[i];
    if (p[first + 1 + i].revents) {
      ssize_t n =
          ::recv(q.fd, (char *)&q.hello + q.got, sizeof(PeerHello) - q.got, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                     errno != EINTR)) {
        ::close(q.fd); // gone before it said who it is: not one of ours
        continue;
      }
      if (n > 0)
        q.got += (size_t)n;
    }
    if (q.got < sizeof(PeerHello)) {
      still.push_back(q);
      continue;
    }
    const PeerHello &h = q.hello;
    if (h.magic != kMagic || h.version != kVersion || h.token != acc.token ||
        h.rank <= rank_ || h.rank >= size_ || linked(h.rank)) {
      ::close(q.fd); // a stray connection, not a rank of this job
      continue;
    }
    add_link(h.rank, q.fd);
  }
  acc.pending = std::move(still);
  if (p[first].revents & POLLIN)
    for (;;) {
      int fd = accept4(acc.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0)
        break;
      acc.pending.push_back({fd, 0, PeerHello()});
    }
}

//===--- Rendezvous -------------------------------------------------------===//

double rendezvous_timeout() {
  const char *v = env("PLANRT_RENDEZVOUS_TIMEOUT");
  if (!v)
    return 300;
  char *end = nullptr;
  double s = std::strtod(v, &end);
  if (end == v || *end || !(s > 0) || s > 1e7)
    die(2,
        "PLANRT_RENDEZVOUS_TIMEOUT=%s: not a positive number of seconds; "
        "it bounds how long the ranks wait for each other at start "
        "(default 300)",
        v);
  return s;
}

/// Tells the ranks that arrived why rank 0 gives up, then exits 1.
[[noreturn]] void give_up(const std::vector<int> &fds, const std::string &msg) {
  Reply rep;
  rep.status = 1;
  rep.bytes = (uint32_t)msg.size();
  Clock::time_point until = after(2.0);
  for (int fd : fds)
    if (fd >= 0 && transfer(true, fd, &rep, sizeof(rep), until))
      transfer(true, fd, const_cast<char *>(msg.data()), msg.size(), until);
  die(1, "%s", msg.c_str());
}

/// Rank 0: waits for every rank, checks them, sends the table. fds[r] is
/// then the connection to rank r.
void rendezvous_root(const Launch &l, double timeout, const std::string &me,
                     std::vector<int> &fds, std::vector<std::string> &hosts) {
  const std::string at = l.master_addr + ":" + std::to_string(l.master_port);
  int port = 0;
  int lfd = listen_any(l.master_port, &port);
  if (lfd < 0)
    die(1,
        "rank 0 (host %s): cannot listen on port %d (%s): %s; another job, "
        "or a process left from an earlier run, may use it: choose another "
        "MASTER_PORT",
        me.c_str(), l.master_port, g_port_note.c_str(), std::strerror(errno));
  Clock::time_point until = after(timeout);
  struct Pending {
    int fd;
    size_t got;
    Hello hello;
    std::string from;
  };
  std::vector<Pending> pending;
  std::vector<Hello> hellos((size_t)l.size);
  int arrived = 1;
  bool warned = false;
  auto all_fds = [&] { // every connection that is told why rank 0 gives up
    std::vector<int> v = fds;
    for (const Pending &q : pending)
      v.push_back(q.fd);
    return v;
  };
  while (arrived < l.size) {
    int wait = ms_until(until);
    if (wait == 0) {
      std::vector<int> missing;
      for (int r = 1; r < l.size; ++r)
        if (fds[r] < 0)
          missing.push_back(r);
      char t[32];
      std::snprintf(t, sizeof(t), "%g", timeout);
      give_up(all_fds(), "rendezvous at " + at + ": " + ranks_text(missing) +
                             " of " + std::to_string(l.size) +
                             " did not arrive within " + t +
                             " s (launcher: " + g_launch_note + ")");
    }
    std::vector<pollfd> p{{lfd, POLLIN, 0}};
    for (const Pending &q : pending)
      p.push_back({q.fd, POLLIN, 0});
    if (::poll(p.data(), p.size(), wait) <= 0)
      continue;
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending &q = pending[i];
      if (p[i + 1].revents) {
        ssize_t n =
            ::recv(q.fd, (char *)&q.hello + q.got, sizeof(Hello) - q.got, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                       errno != EINTR)) {
          ::close(q.fd); // a probe of the port, not a rank
          q.fd = -1;
          continue;
        }
        if (n > 0)
          q.got += (size_t)n;
      }
      if (q.got < sizeof(Hello))
        continue;
      const Hello &h = q.hello;
      std::string host = name_of(h.host);
      std::string who =
          "rank " + std::to_string(h.rank) + " (host " + host + ")";
      if (h.magic != kMagic) {
        if (!warned)
          std::fprintf(stderr,
                       "planrt: warning: rendezvous at %s: ignored a "
                       "connection from %s that is not a planrt rank\n",
                       at.c_str(), q.from.c_str());
        warned = true;
        ::close(q.fd);
        q.fd = -1;
        continue;
      }
      if (h.version != kVersion)
        give_up(all_fds(), "rendezvous at " + at + ": " + who +
                               " runs another version of planrt (protocol " +
                               std::to_string(h.version) + ", rank 0 " +
                               std::to_string(kVersion) +
                               "): start every rank from the same build");
      if (h.size != l.size)
        give_up(all_fds(),
                "rendezvous at " + at + ": " + who + " was started for " +
                    std::to_string(h.size) + " ranks, rank 0 for " +
                    std::to_string(l.size) +
                    ": start every rank with the same world size (or is "
                    "another job using port " +
                    std::to_string(l.master_port) + "?)");
      if (h.rank <= 0 || h.rank >= l.size || fds[h.rank] >= 0)
        give_up(all_fds(),
                "rendezvous at " + at + ": rank " + std::to_string(h.rank) +
                    " arrived twice (hosts " +
                    (h.rank > 0 && h.rank < l.size
                         ? name_of(hellos[h.rank].host)
                         : me) +
                    " and " + host +
                    "): the launcher gave two processes the same rank, or "
                    "two jobs use port " +
                    std::to_string(l.master_port));
      fds[h.rank] = q.fd;
      hellos[h.rank] = h;
      q.fd = -1; // moved to fds
      ++arrived;
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const Pending &q) { return q.fd < 0; }),
                  pending.end());
    if (p[0].revents & POLLIN)
      for (;;) {
        sockaddr_storage ss{};
        socklen_t len = sizeof(ss);
        int fd =
            accept4(lfd, (sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
          break;
        pending.push_back(
            {fd, 0, Hello(), numeric_address((sockaddr *)&ss, len)});
      }
  }
  ::close(lfd);
  for (const Pending &q : pending)
    ::close(q.fd);

  // Every rank is in: the table, and the token their links will show.
  Reply rep;
  std::random_device rd;
  rep.token = ((uint64_t)rd() << 32) ^ rd() ^
              (uint64_t)Clock::now().time_since_epoch().count() ^
              ((uint64_t)getpid() << 16);
  std::vector<Entry> table((size_t)l.size);
  copy_name(table[0].addr, l.master_addr);
  copy_name(table[0].host, me);
  for (int r = 1; r < l.size; ++r) {
    std::memcpy(table[r].addr, hellos[r].addr, kName);
    std::memcpy(table[r].host, hellos[r].host, kName);
    table[r].port = hellos[r].port;
    hosts[r] = name_of(hellos[r].host);
  }
  Clock::time_point send_until = after(timeout);
  for (int r = 1; r < l.size; ++r)
    if (!transfer(true, fds[r], &rep, sizeof(rep), send_until) ||
        !transfer(true, fds[r], table.data(), table.size() * sizeof(Entry),
                  send_until))
      die(1,
          "rendezvous at %s: rank %d (host %s) closed its connection "
          "before it got the table of ranks: it died or was killed",
          at.c_str(), r, hosts[r].c_str());
}

/// Rank > 0: reaches rank 0 (retrying until it listens), says where its
/// peers reach it, and gets the table. Returns the connection to rank 0.
int rendezvous_member(const Launch &l, double timeout, const std::string &me,
                      int peer_port, std::vector<Entry> &table,
                      uint64_t &token) {
  const std::string at = l.master_addr + ":" + std::to_string(l.master_port);
  Clock::time_point until = after(timeout);
  int fd = -1, err = 0, gai = 0;
  for (;;) {
    fd = connect_to(l.master_addr, l.master_port, until, &err, &gai);
    if (fd >= 0)
      break;
    if (gai != 0 && gai != EAI_AGAIN && gai != EAI_SYSTEM)
      die(1,
          "rank %d (host %s): cannot resolve MASTER_ADDR=%s: %s; set it "
          "to rank 0's host name or address",
          l.rank, me.c_str(), l.master_addr.c_str(), gai_strerror(gai));
    if (ms_until(until) == 0) {
      std::string reason = gai ? gai_strerror(gai) : why(err);
      die(1,
          "rank %d (host %s): cannot reach rank 0 at %s within %g s "
          "(%s; launcher: %s): is rank 0 running, with the same "
          "MASTER_ADDR and MASTER_PORT, and can this node reach it?",
          l.rank, me.c_str(), at.c_str(), timeout, reason.c_str(),
          g_launch_note.c_str());
    }
    // Rank 0 is not up yet (refused) or the name does not resolve yet.
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::min(100, ms_until(until))));
  }

  Hello h;
  h.rank = l.rank;
  h.size = l.size;
  h.port = peer_port;
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  // The address this node reaches rank 0 from: the other ranks reach it
  // there too (any node that can reach rank 0 can reach this one).
  getsockname(fd, (sockaddr *)&ss, &len);
  copy_name(h.addr, numeric_address((sockaddr *)&ss, len));
  copy_name(h.host, me);
  // Rank 0 answers when every rank is in, which may take its whole timeout
  // counted from its own start.
  Clock::time_point reply_until = after(timeout + 10);
  Reply rep;
  if (!transfer(true, fd, &h, sizeof(h), reply_until) ||
      !transfer(false, fd, &rep, sizeof(rep), reply_until)) {
    if (errno == ETIMEDOUT)
      die(1,
          "rank %d (host %s): rank 0 at %s did not answer within %g s "
          "(launcher: %s)",
          l.rank, me.c_str(), at.c_str(), timeout + 10, g_launch_note.c_str());
    die(1,
        "rank %d (host %s): rank 0 at %s ended the rendezvous without an "
        "answer (%s): see its error",
        l.rank, me.c_str(), at.c_str(), why(errno).c_str());
  }
  if (rep.status != 0) {
    std::string text(std::min<uint32_t>(rep.bytes, 4096), '\0');
    if (!transfer(false, fd, &text[0], text.size(), reply_until))
      text = "(its reason was lost)";
    die(1, "rank 0 gave up: %s", text.c_str());
  }
  token = rep.token;
  table.resize((size_t)l.size);
  if (!transfer(false, fd, table.data(), table.size() * sizeof(Entry),
                reply_until))
    die(1,
        "rank %d (host %s): rank 0 at %s closed the connection while "
        "sending the table of ranks (%s): see its error",
        l.rank, me.c_str(), at.c_str(), why(errno).c_str());
  return fd;
}

} // namespace

//===--- The entry points -------------------------------------------------===//

Launch detect_launch() {
  if (env("RANK") || env("WORLD_SIZE"))
    return torchrun();
  if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE"))
    return mpirun(true);
  // srun's PMI plugins set PMI_RANK too, but not MPICH's MPI_LOCALRANKID:
  // under srun the Slurm variables say more (the node list).
  if ((env("PMI_RANK") || env("PMI_SIZE")) &&
      (env("MPI_LOCALRANKID") || !env("SLURM_PROCID")))
    return mpirun(false);
  if (env("SLURM_PROCID"))
    return slurm();
  Launch l;
  l.launcher = "none";
  g_launch_note = "none";
  return l;
}

std::unique_ptr<Transport> connect(const Launch &l) {
  double timeout = rendezvous_timeout();
  std::string me = host_name();
  // One connection per other rank, plus what the program opens itself: raise
  // the soft limit on open files (often 1024) as far as the hard one allows.
  rlimit rl{};
  rlim_t need = (rlim_t)l.size + 256;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      rl.rlim_cur < need) {
    rlim_t soft = rl.rlim_cur;
    rl.rlim_cur =
        rl.rlim_max == RLIM_INFINITY ? need : std::min(need, rl.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
      rl.rlim_cur = soft;
    if (rl.rlim_cur < (rlim_t)l.size + 32)
      die(1,
          "rank %d (host %s): %d ranks need about %llu open files (one "
          "connection per rank) but this process may open %llu (ulimit "
          "-n): raise the limit",
          l.rank, me.c_str(), l.size, (unsigned long long)need,
          (unsigned long long)rl.rlim_cur);
  }
  std::vector<std::string> hosts((size_t)l.size, "?");
  hosts[(size_t)l.rank] = me;
  if (l.rank == 0) {
    std::vector<int> fds((size_t)l.size, -1);
    rendezvous_root(l, timeout, me, fds, hosts);
    auto t = std::make_unique<TcpTransport>(0, l.size, hosts);
    for (int r = 1; r < l.size; ++r)
      t->add_link(r, fds[r]);
    return t;
  }

  // Ranks above this one connect to it on this port.
  Accepting acc;
  int peer_port = 0;
  if (l.rank < l.size - 1) {
    acc.fd = listen_any(0, &peer_port);
    if (acc.fd < 0)
      die(1, "rank %d (host %s): cannot listen for the other ranks: %s", l.rank,
          me.c_str(), std::strerror(errno));
  }
  std::vector<Entry> table;
  int fd0 = rendezvous_member(l, timeout, me, peer_port, table, acc.token);
  for (int r = 0; r < l.size; ++r)
    if (r != l.rank)
      hosts[(size_t)r] = name_of(table[(size_t)r].host);
  auto t = std::make_unique<TcpTransport>(l.rank, l.size, hosts);
  t->add_link(0, fd0);

  Clock::time_point until = after(timeout);
  for (int j = 1; j < l.rank; ++j) {
    std::string addr = name_of(table[j].addr);
    int err = 0, gai = 0;
    int fd = connect_to(addr, table[j].port, until, &err, &gai);
    PeerHello h;
    h.rank = l.rank;
    h.token = acc.token;
    if (fd >= 0 && !transfer(true, fd, &h, sizeof(h), until)) {
      err = errno;
      ::close(fd);
      fd = -1;
    }
    if (fd < 0)
      die(1,
          "rank %d (host %s): cannot connect to rank %d (host %s) at "
          "%s:%d: %s; every rank must reach the others on the address it "
          "reaches rank 0 from, on any TCP port (a firewall between the "
          "nodes?)",
          l.rank, me.c_str(), j, hosts[j].c_str(), addr.c_str(), table[j].port,
          gai ? gai_strerror(gai) : why(err).c_str());
    t->add_link(j, fd);
  }
  // Links of ranks above this one. Links already made are served meanwhile
  // (a rank that is done connecting may send at once, or die).
  for (;;) {
    std::vector<int> missing;
    for (int r = l.rank + 1; r < l.size; ++r)
      if (!t->linked(r))
        missing.push_back(r);
    if (missing.empty())
      break;
    int wait = ms_until(until);
    if (wait == 0)
      die(1,
          "rank %d (host %s): %s did not connect to this rank within %g s "
          "after the rendezvous",
          l.rank, me.c_str(), ranks_text(missing).c_str(), timeout);
    t->poll_links(std::min(wait, 100), &acc);
  }
  if (acc.fd >= 0)
    ::close(acc.fd);
  for (const Accepting::Pending &q : acc.pending)
    ::close(q.fd);
  return t;
}

} // namespace planrt_net
