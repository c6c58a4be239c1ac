#include "rendezvous/store_factory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/error_context.h"
#include "compat/libtorch_compat.h"
#include "rendezvous/file_rendezvous.h"
#include "rendezvous/listener_probe.h"
#include "rendezvous/stalled_client_limit.h"

namespace ddp::rendezvous {
namespace {

std::string first_line(const std::exception& error) {
  std::string what = error.what();
  auto newline = what.find('\n');
  return newline == std::string::npos ? what : what.substr(0, newline);
}

std::string seconds(std::chrono::milliseconds timeout) {
  return std::to_string(timeout.count() / 1000.0).substr(0, 6) + " s";
}

[[noreturn]] void fail_unreachable(const RendezvousSpec& spec, std::chrono::milliseconds timeout,
                                   const std::string& why) {
  detail::fail<StoreError>(
      "init_process_group",
      "could not reach the store hosted by rank 0 at " + spec.host + ":" +
          std::to_string(spec.port) + " within " + seconds(timeout) + ": " + why +
          ". Check that rank 0 is running and that MASTER_ADDR/MASTER_PORT (or the tcp:// "
          "address) are the same on every rank.");
}

[[noreturn]] void fail_port_in_use(const RendezvousSpec& spec) {
  detail::fail<StoreError>(
      "init_process_group",
      "rank 0 cannot host the store: port " + std::to_string(spec.port) + " on " + spec.host +
          " is already in use (another job, or a previous run still exiting). Choose another "
          "MASTER_PORT (ddprun --master-port, or --standalone for a free one) or stop the "
          "process that holds it.");
}

// `timeout` bounds this attempt; `reported` is the caller's whole timeout, the one to name.
c10::intrusive_ptr<c10d::Store> connect_tcp_store(const RendezvousSpec& spec,
                                                  std::chrono::milliseconds timeout,
                                                  std::chrono::milliseconds reported) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(spec.port);
  options.isServer = spec.rank == 0 && !spec.use_agent_store;
  options.numWorkers = spec.world_size;
  // A client's waitWorkers only counts it in the server's "init/" key, which a PyTorch rank 0
  // waits on; our own server does not wait there: the rendezvous counts arrivals itself, to report
  // who is missing.
  options.waitWorkers = !options.isServer;
  options.timeout = timeout;
  compat::use_classic_tcp_store(options);
  if (!options.isServer) {
    const std::string why =
        wait_until_listening(spec.host, spec.port, std::chrono::steady_clock::now() + timeout);
    if (!why.empty()) fail_unreachable(spec, reported, why);
  }
  const auto stall_limit = stalled_client_limit(reported);
  if (options.isServer && spec.port != 0) {  // port 0: the server picks one
    const int socket = bound_store_socket(spec.port, stall_limit);
    if (socket < 0 && errno == EADDRINUSE) fail_port_in_use(spec);
    if (socket >= 0 && !compat::hand_over_listening_socket(options, socket)) ::close(socket);
  }
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(spec.host, options);
    if (options.isServer) limit_stalled_store_clients(store->getPort(), stall_limit);
    if (!spec.use_agent_store) return store;
    return c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + std::to_string(spec.restart_count), store);
  } catch (const std::exception& error) {
    std::string what = first_line(error);
    if (options.isServer && (what.find("Address already in use") != std::string::npos ||
                             what.find("errno: 98") != std::string::npos)) {
      fail_port_in_use(spec);
    }
    if (options.isServer) {
      detail::fail<StoreError>("init_process_group",
                               "rank 0 cannot host the store at " + spec.describe() + ": " + what);
    }
    fail_unreachable(spec, reported, what);
  }
}

// The previous job's server, as the last init of this process on another rank than 0 left it: a
// connection kept open to it, to learn when rank 0 closes it (listener_probe.h).
std::mutex previous_server_mutex;
std::unique_ptr<ServerCloseWatch> previous_server;  // GUARDED_BY(previous_server_mutex)

// Before connecting again to the address of the previous job's server, waits (until `deadline`)
// for rank 0 to close that server. Connecting to it while it closes is not only wasted: on
// libtorch 1.13 a TCPStore client starts a thread that listens for key updates, and that thread
// ends the process (an uncaught "Connection reset by peer") when the server closes while the
// thread's own connection still waits in the server's queue of connections to accept.
void wait_for_previous_server(const RendezvousSpec& spec,
                              std::chrono::steady_clock::time_point deadline) {
  std::lock_guard<std::mutex> lock(previous_server_mutex);
  if (previous_server && previous_server->host() == spec.host &&
      previous_server->port() == spec.port) {
    previous_server->wait_closed(deadline);
  }
  previous_server.reset();
}

void watch_server(const RendezvousSpec& spec) {
  auto watch = ServerCloseWatch::open(spec.host, spec.port,
                                      std::chrono::steady_clock::now() + std::chrono::seconds(1));
  std::lock_guard<std::mutex> lock(previous_server_mutex);
  previous_server = std::move(watch);
}

// After destroy_process_group and a new init on the same port, a fast rank could reach rank 0's
// previous server in the moment before rank 0 closes it: it waits for that server to close
// first, where this process took part in its job. Where it did not, or that server outlives the
// wait, the server is still recognisable: a ddp-cpp rank 0 marked it (kJobStartedKey) once its
// world was complete, and where rank 0 was a PyTorch 1.13 rank, which sets no key of ours, its
// init barrier already counts every rank. A client that finds one reconnects until the new server
// answers.
c10::intrusive_ptr<c10d::Store> connect_hosted_store(const RendezvousSpec& spec,
                                                     std::chrono::milliseconds timeout) {
  if (spec.rank == 0) return connect_tcp_store(spec, timeout, timeout);
  const std::string init_barrier = std::string(kDefaultGroupPrefix) + "/store_based_barrier_key:1";
  const std::string started = std::string(kDefaultGroupPrefix) + "/" + kJobStartedKey;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  wait_for_previous_server(spec, deadline);
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      auto store = connect_tcp_store(spec, std::max(left, std::chrono::milliseconds(1)), timeout);
      if (!store->check({started}) && store->add(init_barrier, 0) < spec.world_size) {
        watch_server(spec);
        return store;
      }
    } catch (const std::exception&) {
      // The old server closed while we connected or asked: the next connection reaches the new
      // one. Out of time, the connection's own error is the one to report.
      if (std::chrono::steady_clock::now() >= deadline) throw;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      detail::fail<StoreError>(
          "init_process_group",
          "the store at " + spec.host + ":" + std::to_string(spec.port) +
              " belongs to a job that has already started (all of its ranks arrived) "
              "and did not go away within " +
              seconds(timeout) + ". Another job may be using this MASTER_PORT: choose another.");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

// file://: a c10d FileStore, joined as file_rendezvous.h says.
c10::intrusive_ptr<c10d::Store> connect_file_store(const RendezvousSpec& spec,
                                                   std::chrono::milliseconds timeout) {
  // c10d's FileStore retries opening its file until the timeout: a folder that is missing, or
  // that this rank cannot write, would cost the whole timeout before a vague error. Say so now.
  const std::string folder = spec.path.substr(0, std::max<size_t>(spec.path.rfind('/'), 1));
  struct stat info {};
  const bool exists = ::stat(folder.c_str(), &info) == 0;
  if (!exists || !S_ISDIR(info.st_mode)) {
    detail::fail<InvalidArgumentError>(
        "init_process_group", "the folder " + folder + " of the rendezvous file " + spec.path +
                                  (exists ? " is not a folder" : " does not exist") +
                                  "; create it (shared by every rank) or choose another path");
  }
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    detail::fail<InvalidArgumentError>(
        "init_process_group", "the folder " + folder + " of the rendezvous file " + spec.path +
                                  " is not writable by this process (" + std::strerror(errno) +
                                  "); every rank must be able to create and write the file");
  }
  c10::intrusive_ptr<c10d::Store> file;
  try {
    file = c10::make_intrusive<c10d::FileStore>(spec.path, spec.world_size);
    file->setTimeout(timeout);
    return join_file_rendezvous(file, spec.rank, spec.world_size);
  } catch (const MismatchError&) {
    // A FileStore counts itself among the job's finished workers when it is destroyed, and the
    // last one removes the file: a refused claimant's must not count, or the file would go while
    // the job's last rank still uses it. Its memory goes when this process exits.
    (void)file.release();
    throw;
  } catch (const std::exception& error) {
    detail::fail<StoreError>("init_process_group",
                             "cannot use the rendezvous file " + spec.path + ": " +
                                 first_line(error) +
                                 ". Its folder must exist and be writable by every rank.");
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_store(const RendezvousSpec& spec,
                                              std::chrono::milliseconds timeout) {
  if (spec.method == Method::kFile) return connect_file_store(spec, timeout);
  if (spec.use_agent_store) return connect_tcp_store(spec, timeout, timeout);
  return connect_hosted_store(spec, timeout);
}

}  // namespace ddp::rendezvous
