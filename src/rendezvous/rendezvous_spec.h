// RendezvousSpec: where the ranks of a job meet, and who this process is among them.
//
// parse_rendezvous turns an init_method string, the rank and world size given in the options (or
// -1), and the process environment into a complete, validated spec. It reads nothing itself: the
// environment arrives through `env`, so the parser is a pure function that unit tests can drive.
// The precedence is that of torch.distributed, extended to the launchers users meet in practice:
// options, then the init_method's ?rank=&world_size= query, then torchrun's RANK/WORLD_SIZE, then
// mpirun's OMPI_COMM_WORLD_*, then Slurm's SLURM_*.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace ddp::rendezvous {

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// The real process environment (getenv); empty values count as unset.
EnvLookup process_environment();

enum class Method { kEnv, kTcp, kFile };

struct RendezvousSpec {
  Method method = Method::kEnv;
  std::string host;  // kEnv, kTcp: the store's address (rank 0 hosts it)
  int port = -1;     // kEnv, kTcp
  std::string path;  // kFile
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;             // -1 when no launcher said
  std::string rank_source;         // "options", "RANK/WORLD_SIZE", ... for messages
  bool use_agent_store = false;    // torchrun's static rendezvous: every rank is a store client
  int restart_count = 0;           // TORCHELASTIC_RESTART_COUNT
  std::string run_id = "job";      // TORCHELASTIC_RUN_ID: names the job's shared-memory segments
  std::string gloo_socket_ifname;  // GLOO_SOCKET_IFNAME, read here, at the edge
  std::string host_id;  // DDP_CPP_HOST_ID: a testing aid, ranks of one machine posing as hosts
  bool init_barrier = false;  // TORCH_DIST_INIT_BARRIER=1: torch.distributed 2.x's barrier

  std::string describe() const;  // "tcp://127.0.0.1:29500" or "file:///tmp/x", for messages
};

/// Throws DistributedError naming what is wrong (malformed init_method, missing variable, rank out
/// of range, ...) and how to fix it.
RendezvousSpec parse_rendezvous(const std::string& init_method, int rank, int world_size,
                                const EnvLookup& env);

/// This process's index on its host, from the launcher's environment: LOCAL_RANK (ddprun,
/// torchrun), OMPI_COMM_WORLD_LOCAL_RANK (mpirun), SLURM_LOCALID (Slurm); nullopt without one.
std::optional<int> local_rank_from(const EnvLookup& env);

/// The first host of a Slurm node list: "node[03-05,9],login1" -> "node03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace ddp::rendezvous
