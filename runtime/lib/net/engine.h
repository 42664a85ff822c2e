//===- engine.h - Message matching and collectives of lib/net -------------===//
//
// The part of the control plane that does not care how bytes move: messages
// matched to receives by (communicator, source, tag) in arrival order per
// sender, eager sends, and collectives built from point-to-point messages
// on a communicator's own context. A Transport moves messages between
// processes (lib/net/tcp_transport.cpp); a one-process world needs none.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_NET_ENGINE_H
#define PLANRT_LIB_NET_ENGINE_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace planrt_net {

/// The fixed part of every message on the wire.
struct Header {
  uint64_t context = 0; // communicator context (collectives: high bit set)
  int32_t source = 0;   // world rank of the sender
  int32_t tag = 0;
  uint64_t bytes = 0;
  int32_t kind = 0; // 0: a message; transport kinds above (abort, bye)
  int32_t code = 0; // abort's exit code
};

struct Message {
  Header header;
  std::vector<char> data;
};

/// Moves messages between the processes of one world.
class Transport {
public:
  virtual ~Transport() = default;
  /// Queues a message to world rank `dest` (never this process); the bytes
  /// are copied.
  virtual void send(int dest, const Header &h, const void *data) = 0;
  /// Reads what has arrived (waiting at most `timeout_ms`, 0: not at all)
  /// and hands each message to deliver(); writes what is queued.
  virtual void poll(int timeout_ms) = 0;
  /// Whether every queued message has been written.
  virtual bool flushed() const = 0;
  /// Tells every peer that this process aborts with `code` (best effort).
  virtual void abort_all(int code) = 0;
  /// Orderly shutdown: flushes, says goodbye to each peer and closes.
  virtual void close() = 0;
};

/// Called by the transport for every message that arrives.
void deliver(Message &&m);

/// The launch this process was started by (environment variables), and the
/// transport for it; implemented in tcp_transport.cpp.
struct Launch {
  int rank = 0, size = 1, local_rank = 0;
  std::string launcher; // "none", "torchrun", "slurm", "mpirun"
  std::string master_addr;
  int master_port = 0;
};
/// Reads the launcher's variables; on a contradiction or a malformed value
/// prints an error naming the variable and exits with code 2.
Launch detect_launch();
std::unique_ptr<Transport> connect(const Launch &launch);

} // namespace planrt_net

#endif // PLANRT_LIB_NET_ENGINE_H
